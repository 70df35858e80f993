"""Exact values and certified digits as LaTeX: SymPy's printer with the book's
conventions, certified decimals."""

from __future__ import annotations

import functools
import re
from typing import Any

from ...errors import MhaSymbolicError
from .model import DIGITS, ORDERED_LEAVES, TIDY_CHARS

# ---------------------------------------------------------------------------
# Number formatting: a textbook's conventions, as siunitx sets them
#
# * digit grouping: a run of five or more digits is grouped in threes by a thin
#   space, counted from the decimal point both ways (siunitx's group-minimum-digits
#   = 5): 1\,048\,576 and 0.669\,761\,549\ldots, but 1024 and 0.7071;
# * scientific notation below 10^-3 and from 10^7 on (non-integers): the certified
#   digit string is only shifted, 0.000000002061153613... = 2.061153613... x 10^-9,
#   so every printed digit stays a certified digit of the exact value.
# ---------------------------------------------------------------------------

#: A value 0.999… with more nines than this is written 1 - (its distance from 1).
NINES = 15
#: Thin space between digit groups (siunitx's default group separator).
GROUP = r"\,"
#: Decimals below 10^-SMALL_EXPONENT are written in scientific notation.
SMALL_EXPONENT = 3
#: Non-integers with more integer digits than this are written in scientific notation.
LARGE_DIGITS = 7


def _sub(i: int) -> str:
    """A head or row index as a book writes it (from 1)."""
    return str(i + 1)


def group_digits(digits: str, *, from_left: bool = False) -> str:
    r"""A run of digits grouped in threes by thin spaces when it has five or more.

    Integer parts are grouped from the right, fractional parts from the left
    (``from_left=True``), as siunitx does.

    >>> group_digits("1048576")
    '1\\,048\\,576'
    >>> group_digits("1024"), group_digits("66976154", from_left=True)
    ('1024', '669\\,761\\,54')
    """
    if len(digits) < 5:
        return digits
    if from_left:
        return GROUP.join(digits[k:k + 3] for k in range(0, len(digits), 3))
    head = len(digits) % 3 or 3
    return GROUP.join([digits[:head]] + [digits[k:k + 3] for k in range(head, len(digits), 3)])


_DECIMAL = re.compile(r"(-?)(\d+)(?:\.(\d+))?(…|\\ldots)?")


def decimal_latex(text: str) -> str:
    r"""One decimal as a textbook prints it: digits grouped, ``…`` as ``\ldots``,
    scientific notation when it is smaller than 10^-3 or has more than seven integer
    digits and a fractional part.  Only the decimal point moves: the digits are the
    ones given.

    >>> decimal_latex("0.000000002061153613…")
    '2.061\\,153\\,613\\ldots \\times 10^{-9}'
    >>> decimal_latex("1048576"), decimal_latex("-0.25")
    ('1\\,048\\,576', '-0.25')
    """
    m = _DECIMAL.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"text={text!r} is not a decimal")
    sign, whole, frac, more = m.group(1), m.group(2), m.group(3) or "", m.group(4)
    dots = r"\ldots" if more else ""
    if whole.strip("0") == "" and frac.strip("0"):
        zeros = len(frac) - len(frac.lstrip("0"))
        if zeros >= SMALL_EXPONENT:
            body = frac[zeros:]
            return sign + _mantissa(body, dots) + rf" \times 10^{{{-(zeros + 1)}}}"
    whole = whole.lstrip("0") or "0"
    if len(whole) > LARGE_DIGITS and (frac or more):
        return sign + _mantissa(whole + frac, dots) + rf" \times 10^{{{len(whole) - 1}}}"
    text = group_digits(whole) + ("." + group_digits(frac, from_left=True) if frac else "")
    return sign + text + dots


def _mantissa(digits: str, dots: str) -> str:
    """d.ddd… from a digit string whose first digit is not 0."""
    rest = digits[1:].rstrip("0") if not dots else digits[1:]
    return digits[0] + ("." + group_digits(rest, from_left=True) if rest else "") + dots


def digits_latex(text: str) -> str:
    r"""Math-mode LaTeX of a line of certified digits as the checker prints it: every
    decimal through :func:`decimal_latex`; parentheses, commas and spaces kept; any
    other character escaped (``\text{...}``), so nothing in ``text`` acts as TeX.

    >>> digits_latex("(0.6604769013…, 2.679)")
    '(0.660\\,476\\,901\\,3\\ldots,\\ 2.679)'
    """
    from ..._latex import latex_escape

    out: list[str] = []
    pos = 0
    for m in re.finditer(r"-?\d+(?:\.\d+)?…?", text):
        out.append(_digits_between(text[pos:m.start()], latex_escape))
        out.append(decimal_latex(m.group(0)))
        pos = m.end()
    out.append(_digits_between(text[pos:], latex_escape))
    return "".join(out)


def _digits_between(text: str, escape: Any) -> str:
    out = []
    for ch in text:
        if ch in "()[]":
            out.append(ch)
        elif ch == ",":
            out.append(",")
        elif ch == " ":
            out.append(r"\ " if out and out[-1] == "," else "")
        elif ch == "…":
            out.append(r"\ldots")
        elif ch in "×":
            out.append(r"\times ")
        else:
            out.append(r"\text{" + escape(ch) + "}")
    return "".join(out)


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

            def _print_Mul(self, expr: Any) -> str:
                # SymPy orders a product's factors by sort_key, which orders the terms
                # of every sum among them by evaluating them numerically (evalf raising
                # its precision through cancellations: minutes for a gradient entry with
                # masked keys; found by the long fuzz run): a long product keeps its
                # canonical order
                if _leaves(expr, ORDERED_LEAVES) <= ORDERED_LEAVES:
                    return str(super()._print_Mul(expr))
                saved = self._settings["order"]
                self._settings["order"] = "none"
                try:
                    return str(super()._print_Mul(expr))
                finally:
                    self._settings["order"] = saved

            def _print_Integer(self, e: Any) -> str:
                n = int(e.p)  # no 4300-digit limit (python-flint), grouped in threes
                return ("-" if n < 0 else "") + group_digits(_decimal(abs(n)))

            def _print_Symbol(self, e: Any, style: str = "plain") -> str:
                return symbol_latex(e.name)

            def _print_ExpBase(self, e: Any, exp: Any = None) -> str:
                tex = exp_latex(e.args[0])
                return str(self._do_exponent(tex, exp))

            def _print_Rational(self, e: Any) -> str:
                p, q = int(e.p), int(e.q)
                if max(p.bit_length(), q.bit_length()) > 3000:  # beyond str()'s comfort
                    sign = "-" if p < 0 else ""
                    num, den = group_digits(_decimal(abs(p))), group_digits(_decimal(q))
                    return sign + num if q == 1 else rf"{sign}\frac{{{num}}}{{{den}}}"
                places = _terminating_places(q)
                if q != 1 and places is not None and places <= 6:
                    sign = "-" if p < 0 else ""
                    scaled = abs(p) * 10**places // q
                    digits = str(scaled).rjust(places + 1, "0")
                    return sign + decimal_latex(f"{digits[:-places]}.{digits[-places:]}")
                return str(super()._print_Rational(e))

        _PRINTER = _Printer()
    if isinstance(expr, int):
        return ("-" if expr < 0 else "") + group_digits(_decimal(abs(expr)))
    return str(_PRINTER.doprint(sp.sympify(expr)))


def shape_latex(shape: Any) -> str:
    r"""A :class:`~mha_symbolic.exact.shapes.Shape` as ``rows \times cols`` (sizes by
    :func:`_tex`: grouped digits, upright multi-letter names).

    >>> from mha_symbolic.exact.shapes import Shape
    >>> shape_latex(Shape(3, 64))
    '3 \\times 64'
    """
    return rf"{_tex(shape.rows)} \times {_tex(shape.cols)}"


def symbol_latex(name: str) -> str:
    r"""A size's name as a textbook sets it: a multi-letter name or subscript upright.

    >>> symbol_latex("d_model"), symbol_latex("d_k"), symbol_latex("kdim")
    ('d_{\\mathrm{model}}', 'd_{k}', '\\mathrm{kdim}')
    """
    base, _, sub = name.partition("_")

    def part(s: str) -> str:
        if re.fullmatch(r"[A-Za-z]", s) or re.fullmatch(r"\d+", s):
            return s
        if re.fullmatch(r"[A-Za-z]+\d*", s):
            return rf"\mathrm{{{s}}}"
        from ..._latex import latex_escape

        return rf"\text{{{latex_escape(s)}}}"

    return part(base) + (f"_{{{part(sub)}}}" if sub else "")


#: An exponent printed with one of these is too tall for a superscript.
_TALL = (r"\frac", r"\tanh", "^", r"\log", r"\exp")


#: A superscript holding a slashed fraction prints at most this many symbols.
SUPERSCRIPT_SYMBOLS = 12


def exp_latex(arg: Any) -> str:
    r"""e to the power ``arg``, one notation for every exponent a softmax meets:
    ``e^{2}``, ``e^{\\sqrt{2}}``, and a fraction slashed in the superscript,
    ``e^{\\sqrt{2}/2}`` (so that e^{√2/2} and e^{√2} stand side by side in one
    notation); ``\\exp`` only when the exponent stays tall even slashed (a nested power
    or function) or is long (more than SUPERSCRIPT_SYMBOLS symbols).

    >>> import sympy as sp
    >>> exp_latex(sp.Integer(20)), exp_latex(sp.sqrt(2) / 2), exp_latex(sp.sqrt(2))
    ('e^{20}', 'e^{\\sqrt{2}/2}', 'e^{\\sqrt{2}}')
    >>> exp_latex(sp.tanh(sp.sqrt(2)))
    '\\exp\\left(\\tanh{\\left(\\sqrt{2} \\right)}\\right)'
    """
    text = _tex(arg)
    if not any(mark in text for mark in _TALL):
        return f"e^{{{text}}}"
    slashed = _slashed(arg)
    plain = slashed.replace(r"\left(", "(").replace(r"\right)", ")")
    if (not any(mark in plain for mark in _TALL)
            and len(re.sub(r"\\[A-Za-z]+|[{} ]", "", plain)) <= SUPERSCRIPT_SYMBOLS):
        return f"e^{{{plain}}}"
    return rf"\exp\left({slashed}\right)"


def _slashed(expr: Any) -> str:
    r"""An exact value with its outer fraction written p/q on the line (for \exp)."""
    import sympy as sp

    expr = sp.sympify(expr)
    num, den = expr.as_numer_denom()
    if den == 1:
        return _tex(expr)
    sign = ""
    if num.could_extract_minus_sign():
        sign, num = "-", -num
    top, bottom = _tex(num), _tex(den)
    if not (num.is_Atom or num.is_Pow or num.is_Function or (num.is_Mul and not
                                                             any(a.is_Add for a in num.args))):
        top = rf"\left({top}\right)"
    if not (den.is_Atom or den.is_Pow or den.is_Function):
        bottom = rf"\left({bottom}\right)"
    return f"{sign}{top}/{bottom}"


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
    """Whether an exact value holds a free symbol (then it has no digits)."""
    if getattr(expr, "is_Add", False) or getattr(expr, "is_Mul", False) or getattr(
            expr, "is_Pow", False):
        return _symbolic(expr)
    return bool(getattr(expr, "free_symbols", None))


@functools.lru_cache(maxsize=1 << 16)
def _symbolic(e: Any) -> bool:
    """``bool(e.free_symbols)``, memoized per subexpression: a row's softmax denominator,
    shared by each of its weights and head-output entries, is walked once, where
    ``free_symbols`` walks it again for every entry (n_k times per row)."""
    if e.is_Add or e.is_Mul or e.is_Pow or getattr(e, "is_Function", False):
        return any(_symbolic(a) for a in e.args)
    return bool(e.free_symbols)


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
            run = _nines_run(text)
            if run > NINES and text.startswith("0.9"):
                # 0.999…9 with more nines than a reader counts: 1 - (certified digits of
                # 1 - x), e.g. 1 - 5.148… x 10^-131 for e^300/(1 + e^300)
                rest = _certified(1 - expr).digits(significant)
                return "1 - " + decimal_latex(rest)
            text = c.digits(run + 4)
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
    return decimal_latex(text)


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
    """The form a textbook prints: a softmax quotient in its canonical form
    (:func:`canonical_softmax`), else the shortest of a few exact rewritings (a sum of
    fractions -> one fraction)."""
    import sympy as sp

    if (not isinstance(expr, sp.Basic) or _leaves(expr, TIDY_CHARS) > TIDY_CHARS):
        return expr  # rewriting a long expression costs more than it can gain on the page
    canonical = canonical_softmax(expr)
    if canonical is not None:
        return canonical
    if not expr.is_Add or len(expr.args) > 12:
        return expr
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
    return canonical_softmax(best) or best


def _exp_terms(expr: Any) -> list[tuple[Any, Any]] | None:
    """``expr`` as a sum of ``c · e^a`` (c free of exponentials, a rational or a
    number without symbols): the list of (c, a); None when it is not of that form."""
    import sympy as sp

    out = []
    for term in sp.Add.make_args(expr):
        factors = sp.Mul.make_args(term)
        exps = [f for f in factors if isinstance(f, sp.exp) or f is sp.E]
        if len(exps) > 1:
            return None
        coeff = sp.Mul(*[f for f in factors if f not in exps])
        if coeff.has(sp.exp) or coeff.has(sp.E) or coeff.free_symbols or coeff == 0:
            return None
        power = (sp.Integer(0) if not exps else sp.Integer(1) if exps[0] is sp.E
                 else exps[0].args[0])
        if power.free_symbols or power.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
            return None
        out.append((coeff, power))
    return out


def canonical_softmax(expr: Any) -> Any | None:
    r"""A softmax quotient :math:`\sum_k c_k e^{a_k} / \sum_j d_j e^{b_j}` written as a
    textbook does, every exponent shifted by the smallest exponent :math:`m` of the
    denominator: :math:`\sum_k c_k e^{a_k - m} / \sum_j d_j e^{b_j - m}` (the same
    number: numerator and denominator are both multiplied by :math:`e^{-m}`).  So the
    denominator's smallest term is a plain number and every exponent is :math:`\ge 0`:
    :math:`e^{-3}/(e^{-3} + e)` becomes :math:`1/(1 + e^{4})`.  None when ``expr`` is
    not such a quotient (or has symbols).  Which exponent is smallest is judged on
    floats; a wrong pick still gives an exactly equal form, only a less tidy one.

    >>> import sympy as sp
    >>> canonical_softmax(sp.exp(-3) / (sp.exp(-3) + sp.E))
    1/(1 + exp(4))
    """
    import sympy as sp

    if not isinstance(expr, sp.Basic) or expr.free_symbols or not expr.has(sp.exp, sp.E):
        return None
    # numerator and denominator as the engine builds them: n · D^(-1), D a sum (not
    # sp.fraction, which would move e^(-3) into the denominator as e^3); a factor
    # (D e^3)^(-1) -- together()'s output -- is split into D^(-1) and e^(-3)
    num_parts: list[Any] = []
    sums: list[Any] = []
    for f in sp.Mul.make_args(expr):
        if f.is_Pow and f.exp == -1 and f.base.is_Add:
            sums.append(f.base)
        elif f.is_Pow and f.exp == -1 and f.base.is_Mul:
            inner = [g for g in f.base.args if g.is_Add]
            if len(inner) != 1:
                return None
            sums.append(inner[0])
            num_parts += [sp.Pow(g, -1) for g in f.base.args if g is not inner[0]]
        else:
            num_parts.append(f)
    if len(sums) != 1:
        return None
    num, den = sp.Mul(*num_parts), sums[0]
    top, bottom = _exp_terms(num), _exp_terms(den)
    if top is None or bottom is None:
        return None
    try:
        m = min((a for _, a in bottom), key=lambda a: float(a) if a.is_Rational
                else _certified(a).to_float())
    except (MhaSymbolicError, TypeError, ValueError):
        return None
    new_num = sp.Add(*[c * sp.exp(a - m) for c, a in top])
    new_den = sp.Add(*[d * sp.exp(b - m) for d, b in bottom])
    if new_den.free_symbols or new_num.free_symbols:
        return None
    return sp.Mul(new_num, sp.Pow(new_den, -1), evaluate=False) if new_num != 1 else 1 / new_den


