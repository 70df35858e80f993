"""Verdicts: a printed answer judged against the exact value at the precision its
digits state (exact, correctly rounded, an approximation within rtol, or wrong)."""

from __future__ import annotations

import functools
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
    detail: str | None = None  # why, where the verdict needs a word (magnitude analysis)
    error_value: float | None = None  # the signed error in last-digit units, as a number


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
    err = _error_units(p.value, cv.expr if exact is None else exact, p.unit)
    return Judgement("wrong", False, text, _signed(err), error_value=_float_of(err))


def _error_units(claimed: Fraction, value: Any, unit: Fraction) -> Fraction:
    """(claimed − value)/unit correctly rounded to 2 significant digits (certified).

    A wrong claim is at least half a unit away, so the error is non-zero and its
    enclosure soon excludes 0; the question is put to the enclosure directly, without
    asking SymPy whether the expression is zero (which can cost seconds)."""
    from ..exact.certified import CertifiedValue, certify

    if isinstance(value, Fraction):
        err = (claimed - value) / unit
        return _two_digits(err) if err else Fraction(0)
    import sympy as sp

    expr = (sp.Rational(claimed.numerator, claimed.denominator) - value) / sp.Rational(
        unit.numerator, unit.denominator)
    if expr.is_Rational:
        return certify(expr).round_significant(2)

    def question(x: Fraction) -> Fraction | None:
        return _two_digits(x) if x else None

    return Fraction(CertifiedValue(expr)._decide(question, "the error in last-digit units"))


def _two_digits(x: Fraction) -> Fraction:
    from ..exact.certified import _exponent10, _pow10, _round_half_even

    k = _exponent10(x) - 1
    n, _ = _round_half_even(x / _pow10(k))
    return n * _pow10(k)


def _float_of(x: Fraction) -> float | None:
    """A two-significant-digit error as a float (None beyond float range)."""
    try:
        return float(x)
    except OverflowError:
        return None


def _signed(x: Fraction) -> str:
    """A signed error size with 2 significant digits, for any magnitude (no float overflow)."""
    return _two_digit_text(x, "+")


def _two_digit_text(x: Fraction, sign: str = "") -> str:
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
        from ..errors import PrecisionError

        try:
            return _approximation(value, p, rtol, d)
        except PrecisionError:
            if not _negligible(value, p.expr):
                raise
            # |value| < |claim|/2, so |value − claim|/|value| > 1 > rtol: wrong, whatever
            # the value's exact size (beyond the range of certified evaluation)
            return Judgement("wrong", False, error_units="relative error above 1")
    return Judgement("wrong", False)


def _approximation(value: Any, p: PrintedAnswer, rtol: Fraction, d: int) -> Judgement:
    """An approximation formula judged by its certified relative error; ``d`` is the
    sign of value − claim (non-zero)."""
    from ..exact.certified import certify

    v = certify(value).sign()
    if v == 0:
        return Judgement("wrong", False)
    import sympy as sp

    # |value − claim| / |value| with the signs already decided: no sp.Abs, whose
    # evaluation asks SymPy for signs (minimal_polynomial on algebraic numbers); built
    # unevaluated, since Pow(Add, −1) asks whether the sum is infinite, which runs evalf
    # at a cost nothing bounds (a fuzzed gradient claim took minutes)
    num = sp.Mul(sp.Integer(d * v), sp.Add(value, -p.expr, evaluate=False), evaluate=False)
    rel = certify(sp.Mul(num, sp.Pow(value, -1, evaluate=False), evaluate=False))
    ok = rel.compare(rtol) <= 0
    size = rel.round_significant(2)
    return Judgement("approximation" if ok else "wrong", ok,
                     error_units=f"relative error {_two_digit_text(size)}")


def _negligible(value: Any, claim: Any) -> bool:
    """Whether |value| < |claim|/2, shown by 64-bit Arb enclosures (False if not shown)."""
    from ..errors import MhaSymbolicError
    from ..exact.certified import to_arb

    try:
        v, c = to_arb(value, 64), to_arb(claim, 64)
    except MhaSymbolicError:
        return False
    return bool(v.is_finite() and c.is_finite() and 2 * abs(v).upper() < abs(c).lower())


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
    dom = _dominated(value)
    if dom is not None and p.kind in ("decimal", "expression"):
        judged = _judge_dominated(dom, p, rtol)
        if judged is not None:
            return judged
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


def _dominated(value: Any) -> Any:
    """The magnitude split of a value with e^(−huge) terms (masked keys), else None.

    A quick structural filter first: only exponentials whose argument has a constant
    term below −1000 (a finite mask such as −1e6) are candidates."""
    import sympy as sp

    if not isinstance(value, sp.Basic) or not value.has(sp.exp):
        return None
    if not any(a.args[0].as_coeff_Add()[0] < -1000 for a in value.atoms(sp.exp)
               if a.args[0].as_coeff_Add()[0].is_Rational):
        return None
    from ..exact.magnitude import dominated

    return dominated(value)


def _dominated_note(dom: Any, text: str, holds_exactly: bool) -> str:
    n = dom.places
    masked = f"masked keys contribute e^{_paren(dom.exponent_text)}"
    if not holds_exactly:
        return f"{masked}, less than 10^−{n:,}"
    if dom.sign == 0:
        return f"holds to {n:,} digits; whether exactly {text} is not decided ({masked})"
    return f"holds to {n:,} digits; not exactly {text} ({masked})"


def _paren(t: str) -> str:
    return t if t.lstrip("−-").isdigit() and not t.startswith("≈") else f"({t})"


def _judge_dominated(dom: Any, p: PrintedAnswer, rtol: Fraction) -> Judgement | None:
    """A verdict from value = main + d, |d| ≤ bound (tiny), sign(d) known (see
    exact/magnitude.py); None when the split does not settle it."""
    from ..exact.certified import certify
    from .claims import _places

    cv = certify(dom.main)
    shown = p.text.strip().lstrip("≈~= ")
    if p.kind == "decimal":
        assert p.value is not None and p.unit is not None
        places = _places(p.unit)
        if dom.places <= max(places, 0) + 2:
            return None
        if cv.compare(p.value) == 0:
            return Judgement("correctly rounded", True, detail=_dominated_note(dom, shown, True))
        rounded = cv.round_places(places)
        if cv.is_tie(places):
            if dom.sign == 0:  # either neighbour of the tie
                ok = p.value in (dom_main_fraction(cv) - p.unit / 2, dom_main_fraction(cv) + p.unit / 2)
                return Judgement("correctly rounded" if ok else "wrong", ok,
                                 detail=_dominated_note(dom, shown, False))
            rounded = dom_main_fraction(cv) + dom.sign * p.unit / 2
        text = _fraction_text(rounded, p.unit)
        if rounded == p.value:
            return Judgement("correctly rounded", True, text, detail=_dominated_note(dom, shown, False))
        err = _error_units(p.value, dom.main, p.unit)
        return Judgement("wrong", False, text, _signed(err), detail=_dominated_note(dom, shown, False),
                         error_value=_float_of(err))
    diff = certify(dom.main - p.expr)
    if diff.sign() == 0:
        if p.approx:
            return Judgement("approximation", True, error_units="relative error below "
                             f"10^−{dom.places:,}", detail=_dominated_note(dom, shown, True))
        return Judgement("wrong", False, detail=_dominated_note(dom, shown, True))
    return None


def dom_main_fraction(cv: Any) -> Fraction:
    """The exact rational value of a certified main part that sits on a rounding tie."""
    x = cv.rational()
    assert x is not None  # a tie is a terminating decimal, hence rational
    return x


def nested_shape(value: Any) -> tuple[int, ...]:
    """The shape of a value: () for a number, (n,) for a row, (r, c) for a matrix, …"""
    shape: list[int] = []
    v = value
    while isinstance(v, tuple):
        shape.append(len(v))
        if not v:
            break
        v = v[0]
    return tuple(shape)


def flatten(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [x for v in value for x in flatten(v)]
    return [value]


def pairs(value: Any, p: PrintedAnswer, quantity: str = "the quantity") -> list[tuple[Any, PrintedAnswer]]:
    """(value, printed part) for every number a claim states, in row-major order; a
    ClaimError when the claim's shape does not match the value's."""
    vshape = nested_shape(value)
    if p.kind == "tuple":
        if vshape == ():
            raise ClaimError(f"{quantity} is one number but claimed={_brief(p.text)} is a tuple")
        if len(vshape) != 1:
            raise ClaimError(f"{quantity} is a {_dims(vshape)} matrix; claim it as a printed "
                             "tensor (tensor([[…]]) or [[…], […]]), not a tuple")
        if len(p.parts) != vshape[0]:
            raise ClaimError(f"{quantity} has {vshape[0]} entries but claimed={_brief(p.text)} "
                             f"has {len(p.parts)}")
        return list(zip(value, p.parts, strict=True))
    if p.kind == "array":
        if p.shape != vshape:
            what = "one number" if vshape == () else f"of shape {_dims(vshape)}"
            raise ClaimError(f"{quantity} is {what} but claimed={_brief(p.text)} is a printout of "
                             f"shape {_dims(p.shape)}")
        return list(zip(flatten(value), p.parts, strict=True))
    if vshape == (1,):  # a one-entry row claimed as its entry: "(17.311)"
        return [(value[0], p)]
    if vshape != ():
        raise ClaimError(f"{quantity} has {vshape[-1] if len(vshape) == 1 else _dims(vshape)} "
                         f"entries but claimed={_brief(p.text)} is one number")
    return [(value, p)]


def _dims(shape: tuple[int, ...]) -> str:
    return " × ".join(str(n) for n in shape)


def _brief(text: str) -> str:
    return echo(" ".join(text.split()), 60)


def holds(value: Any, p: PrintedAnswer, rtol: Fraction, *, exactly: bool = False) -> bool:
    """Whether the printed answer holds for ``value`` (``exactly``: with verdict exact)."""
    try:
        items = pairs(value, p)
    except ClaimError:
        return False
    for v, part in items:
        j = judge(v, part, rtol)
        if not (j.verdict == "exact" if exactly else j.ok):
            return False
    return True


def describe(value: Any, sig: int, *, form: bool = True) -> tuple[str, str]:
    """(certified digits, short exact form) of a value; ``form=False`` skips the form
    (returns ``""`` for it), for a caller that will not show it."""

    from ..exact.certified import certify

    special = special_value(value)
    if special is not None:
        return ("−∞" if special == "-inf" else "NaN"), ""
    from ..errors import PrecisionError

    dom = _dominated(value)
    if dom is not None:
        main = certify(dom.main).digits(sig) if dom.main != 0 else "0"
        side = {1: "+", -1: "−", 0: "±"}[dom.sign]
        return f"{main} {side} (less than 10^−{dom.places:,})", ""
    cv = certify(value)
    try:
        digits = cv.digits(sig)
    except PrecisionError:
        digits = "(digits undecided)"
    if not form:
        return digits, ""
    try:
        text = _cached_form(value)
    except TypeError:  # an unhashable value (none of the engine's): not cached
        text = short_form(value)
    return digits, ("" if text == digits else text)


def short_form(value: Any) -> str:
    """The exact form of a value when it prints in at most 60 characters, else ``""``.

    :func:`describe` goes through a cache of it: a file's claims name the same values
    again and again (a weight claimed as an entry, in its row and in the whole matrix),
    and simplifying is the dearest step of describing a value.  SymPy expressions are
    immutable and hash by structure."""
    if not _small(value):  # its printed form would exceed 60 characters: not worth printing
        return ""
    text = expr_text(simplified(value), 61)
    if len(text) > 60 or text.startswith("<"):
        return ""
    return text


_cached_form = functools.lru_cache(maxsize=4096)(short_form)


#: The most operations (``sympy.count_ops``) of an expression that is simplified before
#: it is printed; a larger one is printed as it is (simplification has no bounded cost).
SIMPLIFY_MAX_OPS = 40

#: The largest numerator and denominator of a power's exponent in an expression that
#: is simplified (larger ones are printed as they are).
_MAX_EXPONENT = 64


def simplified(value: Any) -> Any:
    """``value`` in its shortest form that cheap, bounded rewriting finds: a rational
    function of its exponentials and radicals cancelled (``(4 + 8x)/(1 + 2x)`` is 4), a
    sum over a common denominator; the value itself when it has more than
    :data:`SIMPLIFY_MAX_OPS` operations or nothing shorter is found.

    >>> import sympy as sp
    >>> x = sp.exp(sp.sqrt(2) / 2)
    >>> simplified((4 + 8 * x) / (1 + 2 * x))
    4
    >>> simplified(sp.exp(-3) / (sp.exp(-3) + sp.E))
    1/(1 + exp(4))
    """
    import sympy as sp

    if not isinstance(value, sp.Basic) or value.is_Atom:
        return value
    if not _small(value, nodes=2 * SIMPLIFY_MAX_OPS):  # a bounded walk, before anything
        return value
    # cancelling expands powers of sums: (a + b)^40 would be 41 terms, (a + b + c)^40 12,341
    if any(p.base.is_Add and not (p.exp.is_Integer and abs(int(p.exp)) <= 4)
           for p in value.atoms(sp.Pow)):
        return value
    if not _bounded_exponents(value):
        return value
    ops = sp.count_ops(value)
    if ops > SIMPLIFY_MAX_OPS:
        return value
    best, best_ops = value, ops
    try:
        candidates = [sp.cancel(sp.together(value))]
        candidates.append(sp.cancel(sp.powsimp(sp.expand(candidates[0]))))
    except (sp.PolynomialError, ValueError, TypeError, RecursionError):  # pragma: no cover
        return value
    for cand in candidates:
        n = sp.count_ops(cand)
        if n < best_ops or (n == best_ops and len(str(cand)) < len(str(best))):
            best, best_ops = cand, n
    return best


def _small_rational(x: Any) -> bool:
    return bool(x.is_Rational and abs(x.p) <= _MAX_EXPONENT and x.q <= _MAX_EXPONENT)


def _bounded_exponents(value: Any) -> bool:
    """Whether cancelling ``value`` has a bounded cost: SymPy's cancel reads x^(n + y)
    as x^n·x^y and e^(a/q + b·π) as (e^(1/q))^a·(e^π)^b, polynomials of degree n, a, b in
    new generators, and its GCD then evaluates them at large integers.  So every power's
    exponent, and every rational coefficient in an exponential's argument, must be a
    rational of at most :data:`_MAX_EXPONENT` over at most that (issue 30, seed 41:
    log(28)^(5364 − e) #150100 and e^(−1753π/32 − 12271/2000) #111708 each took minutes
    and gigabytes)."""
    import sympy as sp

    for p in value.atoms(sp.Pow):
        if not _small_rational(p.exp):
            return False
    for f in value.atoms(sp.exp):
        for coeff in f.args[0].as_coefficients_dict().values():
            if not _small_rational(coeff):
                return False
    return True


def _small(value: Any, nodes: int = 30) -> bool:
    """Whether an expression is small enough that its form may fit 60 characters (a
    bounded walk: at most ``nodes`` nodes, no rational with more than 12 digits)."""
    stack = [value]
    seen = 0
    while stack:
        e = stack.pop()
        seen += 1
        if seen > nodes:
            return False
        if getattr(e, "is_Rational", False) and (abs(e.p) > 10**12 or e.q > 10**12):
            return False
        stack.extend(getattr(e, "args", ()))
    return True
