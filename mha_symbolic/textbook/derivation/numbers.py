"""Exact values and certified digits as LaTeX: SymPy's printer with the book's
conventions, certified decimals."""

from __future__ import annotations

import functools
from typing import Any

from ...errors import MhaSymbolicError
from .model import DIGITS, ORDERED_LEAVES, TIDY_CHARS

# ---------------------------------------------------------------------------
# Number formatting
# ---------------------------------------------------------------------------


def _terminating_places(q: int) -> int | None:
    """Decimal places of 1/q when q = 2^a 5^b, else None."""
    a = b = 0
    while q % 2 == 0:
        q //= 2
        a += 1
    while q % 5 == 0:
        q //= 5
        b += 1
    return max(a, b) if q == 1 else None


_PRINTER: Any = None


def _tex(expr: Any) -> str:
    """LaTeX of an exact value.  Terminating rationals with at most six decimals
    print as decimals (1/2 as 0.5: the same exact number, as a book writes it)."""
    global _PRINTER
    import sympy as sp

    if _PRINTER is None:
        from sympy.printing.latex import LatexPrinter

        class _Printer(LatexPrinter):
            def _as_ordered_terms(self, expr: Any, order: Any = None) -> Any:
                # SymPy orders a sum's terms by evaluating every numeric factor (seconds
                # for a long sum of exponentials); a long sum keeps its canonical order
                if _leaves(expr, ORDERED_LEAVES) > ORDERED_LEAVES:
                    return list(expr.args)
                return super()._as_ordered_terms(expr, order=order)

            def _print_Integer(self, e: Any) -> str:
                return _decimal(int(e.p))  # no 4300-digit limit (python-flint)

            def _print_Rational(self, e: Any) -> str:
                p, q = int(e.p), int(e.q)
                if max(p.bit_length(), q.bit_length()) > 3000:  # beyond str()'s comfort
                    sign = "-" if p < 0 else ""
                    return (sign + _decimal(abs(p)) if q == 1
                            else rf"{sign}\frac{{{_decimal(abs(p))}}}{{{_decimal(q)}}}")
                places = _terminating_places(q)
                if q != 1 and places is not None and places <= 6:
                    sign = "-" if p < 0 else ""
                    scaled = abs(p) * 10**places // q
                    digits = str(scaled).rjust(places + 1, "0")
                    return f"{sign}{digits[:-places]}.{digits[-places:]}"
                return str(super()._print_Rational(e))

        _PRINTER = _Printer()
    if isinstance(expr, int):
        return _decimal(expr)
    return str(_PRINTER.doprint(sp.sympify(expr)))


def _decimal(n: int) -> str:
    """The exact decimal digits of n, also beyond Python's 4300-digit limit on str()."""
    from ...exact.certified import _decimal as digits

    return ("-" + digits(-n)) if n < 0 else digits(n)


@functools.lru_cache(maxsize=8192)
def _certified(expr: Any) -> Any:
    """One CertifiedValue per exact value, so that the enclosures and exact-algebra
    results it caches serve every step and check that prints or tests the value."""
    from ...exact.certified import certify

    return certify(expr)


def _sign(expr: Any) -> int:
    """The sign of an exact value, certified: first from one Arb enclosure (a ball
    that excludes 0 settles it), else by :meth:`CertifiedValue.sign`'s full strategy."""
    from ...exact.certified import to_arb

    if _is_rational(expr):
        return int(bool(expr > 0)) - int(bool(expr < 0))
    try:
        ball = to_arb(expr, 128)
        if ball > 0:
            return 1
        if ball < 0:
            return -1
    except MhaSymbolicError:
        pass
    return int(_certified(expr).sign())


def _has_symbols(expr: Any) -> bool:
    return bool(getattr(expr, "free_symbols", None))


def _digits(expr: Any, significant: int = DIGITS) -> str | None:
    """Certified leading digits as LaTeX (``…`` as ``\\ldots``); None if symbolic.

    A value just below a power of ten (``0.99999999999998733…``) gets digits
    until four past its run of nines, so that the digits say how far from 1 it is."""

    if _has_symbols(expr):
        return None
    try:
        c = _certified(expr)
        text = c.digits(significant)
        n = significant
        while n < 60 and _nines_only(text):
            n += 10
            text = c.digits(n)
        if n > significant:
            text = c.digits(_nines_run(text) + 4)
    except MhaSymbolicError:
        return None
    return _digits_tex(text)


def _nines_only(text: str) -> bool:
    body = text.rstrip("…").lstrip("-").replace(".", "").lstrip("0")
    return "…" in text and bool(body) and set(body) == {"9"}


def _nines_run(text: str) -> int:
    body = text.rstrip("…").lstrip("-").replace(".", "").lstrip("0")
    return len(body) - len(body.lstrip("9"))


def _digits_tex(text: str) -> str:
    text = text.replace("…", r"\ldots")
    return text if not text.startswith("-") else "-" + text[1:]


def _is_rational(expr: Any) -> bool:
    return bool(getattr(expr, "is_Rational", False)) or isinstance(expr, int)


def _leaves(expr: Any, cap: int) -> int:
    """The number of atoms of ``expr``, counted up to ``cap + 1``.  Each atom prints as at
    least one character, so more than ``cap`` atoms means more than ``cap`` characters:
    a cheap test before printing, which for a long numeric sum costs seconds (SymPy's
    printers order the terms by evaluating each of them numerically)."""
    import sympy as sp

    if not isinstance(expr, sp.Basic):
        return 1
    n = 0
    for node in sp.preorder_traversal(expr):
        if not node.args:
            n += 1
            if n > cap:
                break
    return n


def _tex_if_short(expr: Any, limit: int) -> str | None:
    """``_tex(expr)`` when it has at most ``limit`` characters, else None (decided first
    by counting atoms, so that a long expression is never printed)."""
    if _leaves(expr, limit) > limit:
        return None
    text = _tex(expr)
    return text if len(text) <= limit else None


def _tidy(expr: Any) -> Any:
    """The shortest of a few exact rewritings (sum of fractions -> one fraction)."""
    import sympy as sp

    if (not isinstance(expr, sp.Basic) or not expr.is_Add or len(expr.args) > 12
            or _leaves(expr, TIDY_CHARS) > TIDY_CHARS):
        return expr  # rewriting a long sum costs more than it can gain on the page
    best, best_len = expr, len(_tex(expr))
    try:
        # together() only combines fractions; factor()/cancel() would run polynomial gcds,
        # which can hang (or crash under python-flint ground types) on exponentials
        candidates = [sp.together(expr)]
    except Exception:  # SymPy rewriting is best effort; the original stays exact
        return expr
    for cand in candidates:
        n = len(_tex(cand))
        if n < best_len:
            best, best_len = cand, n
    return best


