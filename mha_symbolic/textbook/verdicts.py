"""Verdicts: a printed answer judged against the exact value at the precision its
digits state (exact, correctly rounded, an approximation within rtol, or wrong)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .._text import echo, expr_text
from ..errors import ClaimError
from .claims import PrintedAnswer

#: The verdict of a claim that certified arithmetic could not decide within its
#: precision cap: never counted as holding (ok is False), never called wrong.
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Judgement:
    verdict: str
    ok: bool
    rounded: str | None = None
    error_units: str | None = None
    detail: str | None = None  # why an undecided claim could not be decided


def _fraction_text(x: Fraction, unit: Fraction) -> str:
    """Exact decimal text of x, a multiple of ``unit`` (a power of ten)."""
    from ..exact.certified import _format_fraction
    from .claims import _places

    return _format_fraction(x, max(_places(unit), 0))


def decimal_text(x: Fraction) -> str:
    """A terminating decimal Fraction as its exact decimal text."""
    from ..exact.certified import certify

    return certify(x).digits(60)


def _judge_decimal(value: Any, p: PrintedAnswer) -> Judgement:
    from ..exact.certified import certify

    assert p.value is not None and p.unit is not None
    cv = certify(value)
    if cv.compare(p.value) == 0:
        return Judgement("exact", True)
    from .claims import _places

    places = _places(p.unit)
    rounded = cv.round_places(places)
    text = _fraction_text(rounded, p.unit)
    if rounded == p.value:
        return Judgement("correctly rounded", True, text)
    # An exact tie: both neighbours are correct roundings (half-up and half-even).
    # An exact tie (the value half-way between the printed answer and its neighbour, also
    # as a rational in disguise) accepts both neighbours. compare() is 0 only for an exact
    # equality; the costly exact algebra runs only when the enclosures cannot separate.
    half = p.unit / 2
    if cv.compare(p.value + half) == 0 or cv.compare(p.value - half) == 0:
        return Judgement("correctly rounded", True, text)
    exact = cv.exact
    err = certify((p.value - cv.expr) / p.unit if exact is None else (p.value - exact) / p.unit)
    return Judgement("wrong", False, text, _signed(err))


def _signed(cv: Any) -> str:
    """A signed error size with 2 significant digits, for any magnitude (no float overflow)."""
    return _two_digits(cv.round_significant(2), "+")


def _two_digits(x: Fraction, sign: str = "") -> str:
    """x (already rounded to 2 significant digits) as ``1.6e-28`` / ``+0.77``, for any
    magnitude: never ``float(x)`` of a number beyond the float range."""
    if x == 0:
        return f"{sign}0"
    from ..exact.certified import _exponent10

    k = _exponent10(x)
    if -4 <= k <= 15:
        return f"{float(x):{sign}.2g}"
    m = x / Fraction(10) ** k
    return f"{float(m):{sign}.2g}e{k:+d}"


def _judge_expression(value: Any, p: PrintedAnswer, rtol: Fraction) -> Judgement:
    from ..exact.certified import certify

    diff = certify(value - p.expr)
    d = diff.sign()
    if d == 0:
        return Judgement("exact", True)
    if p.approx:
        v = certify(value).sign()
        if v == 0:
            return Judgement("wrong", False)
        # |value − claim| / |value| with the signs already decided: no sp.Abs, whose
        # evaluation asks SymPy for signs (minimal_polynomial on algebraic numbers)
        rel = certify((value - p.expr) * d / (value * v))
        ok = rel.compare(rtol) <= 0
        size = rel.round_significant(2)
        return Judgement("approximation" if ok else "wrong", ok,
                          error_units=f"relative error {_two_digits(size)}")
    return Judgement("wrong", False)


def special_value(value: Any) -> str | None:
    """'-inf' for a masked (−∞) entry, 'nan' for a NaN one, else None."""
    import sympy as sp

    if value == -sp.oo:
        return "-inf"
    if value is sp.nan:
        return "nan"
    return None


def judge(value: Any, p: PrintedAnswer, rtol: Fraction) -> Judgement:
    """The verdict on one printed answer; ``undecided`` (ok False) when certified
    arithmetic cannot decide it within its precision cap."""
    from ..errors import PrecisionError

    try:
        return _judge(value, p, rtol)
    except PrecisionError as exc:
        return Judgement(UNDECIDED, False, detail=str(exc))


def _judge(value: Any, p: PrintedAnswer, rtol: Fraction) -> Judgement:
    special = special_value(value)
    if special is not None or p.kind == "special":
        ok = special == p.expr
        return Judgement("exact" if ok else "wrong", ok,
                          None if ok else {"-inf": "−∞", "nan": "NaN"}.get(special or ""))
    if p.kind == "decimal":
        return _judge_decimal(value, p)
    if p.kind == "expression":
        return _judge_expression(value, p, rtol)
    raise ClaimError(f"claimed={echo(p.text)} cannot be compared with a single number")


def holds(value: Any, p: PrintedAnswer, rtol: Fraction, *, exactly: bool = False) -> bool:
    """Whether the printed answer holds for ``value`` (``exactly``: with verdict exact)."""
    def ok(v: Any, part: PrintedAnswer) -> bool:
        j = judge(v, part, rtol)
        return j.verdict == "exact" if exactly else j.ok

    if p.kind == "tuple":
        if not isinstance(value, tuple) or len(value) != len(p.parts):
            return False
        return all(ok(v, part) for v, part in zip(value, p.parts, strict=True))
    if isinstance(value, tuple):
        return False
    return ok(value, p)


def describe(value: Any, sig: int) -> tuple[str, str]:
    """(certified digits, short exact form) of a value."""
    import sympy as sp

    from ..exact.certified import certify

    special = special_value(value)
    if special is not None:
        return ("−∞" if special == "-inf" else "NaN"), ""
    from ..errors import PrecisionError

    cv = certify(value)
    try:
        digits = cv.digits(sig)
    except PrecisionError:
        digits = "(digits undecided)"
    form = expr_text(sp.together(value) if value.is_Add and len(value.args) <= 12 else value, 61)
    if len(form) > 60 or form == digits or form.startswith("<"):
        form = ""
    return digits, form
