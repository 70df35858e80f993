"""Certified numbers: exact SymPy values evaluated with rigorous Arb enclosures.

A :class:`CertifiedValue` wraps an exact value (a SymPy expression built from
integers, rationals, ``e``, ``pi``, ``exp``, ``log`` and algebraic operations).
Every digit it prints is certified:

* exact rationals are handled with exact rational arithmetic;
* everything else is enclosed in an Arb ball (python-flint), whose radius is
  a proven bound, and the precision is raised until the question asked
  (a rounding, a comparison, a leading digit) has the same answer at both
  ends of the ball (Ziv's strategy).  If a cap is reached, the answer is
  :class:`~mha_symbolic.errors.PrecisionError`, never a guess.

Two notions of "digits" are offered, because books use both:

``digits(n)``
    the true decimal expansion cut after ``n`` significant digits, followed
    by ``…`` when more digits follow: every printed digit is a digit of the
    exact value (``1 − e^(−32)`` → ``0.99999999999998733583…``);
``round_places(k)`` / ``round_significant(n)``
    the correctly rounded decimal (round half to even on exact ties), as an
    exact :class:`fractions.Fraction`.

>>> from mha_symbolic.exact.certified import certify
>>> certify("1 - e^(-32)").digits(20)
'0.99999999999998733583…'
>>> str(certify("e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)").round_places(4))
'3349/5000'
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import PrecisionError, SpecError

if TYPE_CHECKING:
    import flint

__all__ = ["CertifiedValue", "certify", "to_arb"]

#: Largest expression (SymPy operation count) on which an exact identity is attempted.
MAX_IDENTITY_OPS = 400

#: Working precisions (bits) tried in turn before giving up.
PRECISIONS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@contextmanager
def _precision(bits: int) -> Iterator[None]:
    from flint import ctx

    old = ctx.prec
    ctx.prec = bits
    try:
        yield
    finally:
        ctx.prec = old


#: Symbols bound to Arb balls while an interval evaluation runs (see :func:`bound_symbols`).
_BOUND: dict[Any, Any] = {}


@contextmanager
def bound_symbols(env: dict[Any, Any]) -> Iterator[None]:
    """Evaluate with these SymPy symbols standing for these Arb balls: the enclosure then
    holds for every value of each symbol in its ball (interval evaluation)."""
    _BOUND.update(env)
    try:
        yield
    finally:
        for key in env:
            _BOUND.pop(key, None)


def to_arb(expr: Any, bits: int) -> flint.arb:
    """Enclose an exact SymPy expression in an Arb ball at ``bits`` of precision.

    The ball provably contains the value: each operation is Arb's, whose
    output ball contains the image of the input balls.
    """
    with _precision(bits):
        return _arb(expr)


def _arb(e: Any) -> flint.arb:
    import sympy as sp
    from flint import arb, fmpq

    if _BOUND and e in _BOUND:
        return _BOUND[e]
    if e.is_Integer or e.is_Rational:
        return arb(fmpq(int(e.p), int(e.q)))
    if e.is_Float:
        sign, man, exp, _ = e._mpf_  # exact binary value of the Float
        value = arb(int(man)) * arb(2) ** int(exp)
        return -value if sign else value
    if e is sp.pi:
        return arb.pi()
    if e is sp.E:
        return arb.const_e()
    if e.is_Add:
        total = arb(0)
        for term in e.args:
            total += _arb(term)
        return total
    if e.is_Mul:
        prod = arb(1)
        for factor in e.args:
            prod *= _arb(factor)
        return prod
    if e.is_Pow:
        base, exponent = e.args
        if exponent.is_Integer:
            b = _arb(base)
            n = int(exponent)
            return b**n if n >= 0 else 1 / b ** (-n)
        if exponent == sp.Rational(1, 2):
            return _arb(base).sqrt()
        if exponent == sp.Rational(-1, 2):
            return _arb(base).rsqrt()
        if base is sp.E:
            return _arb(exponent).exp()
        return (_arb(exponent) * _arb(base).log()).exp()
    if isinstance(e, sp.exp):
        return _arb(e.args[0]).exp()
    if isinstance(e, sp.log):
        if len(e.args) != 1:
            return _arb(e.args[0]).log() / _arb(e.args[1]).log()
        return _arb(e.args[0]).log()
    if isinstance(e, sp.Abs):
        return abs(_arb(e.args[0]))
    if isinstance(e, (sp.Max, sp.Min)):
        balls = [_arb(a) for a in e.args]
        out = balls[0]
        for b in balls[1:]:
            out = out.max(b) if isinstance(e, sp.Max) else out.min(b)
        return out
    if e.free_symbols:
        names = ", ".join(sorted(str(s) for s in e.free_symbols))
        raise SpecError(f"cannot evaluate an expression with free symbols ({names}): give them values")
    if e.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
        raise SpecError(f"cannot evaluate {e}: it is not a finite real number")
    raise SpecError(f"cannot evaluate {sp.srepr(e)[:80]} with certified arithmetic")


#: Values beyond 2^±MAX_BINARY_EXPONENT (about 10^±30000) are refused: their exact
#: endpoints would be integers of that many bits, and no worked example needs them.
MAX_BINARY_EXPONENT = 100_000


def _fraction(ball_end: flint.arb) -> Fraction:
    """An exact dyadic arb (an endpoint) as a Fraction."""
    m, e = ball_end.man_exp()
    man, exp = int(m), int(e)
    if man and abs(exp + man.bit_length()) > MAX_BINARY_EXPONENT:
        e2 = exp + man.bit_length()
        size = f"2^{e2}" if abs(e2) < 10**15 else f"2^(±10^{len(str(e2.bit_length()))}…)"
        raise PrecisionError(
            f"a value of magnitude about {size} is outside the range "
            f"2^±{MAX_BINARY_EXPONENT} handled by certified evaluation"
        )
    return Fraction(man * 2**exp) if exp >= 0 else Fraction(man, 2 ** (-exp))


def arb_2_pow(k: int) -> flint.arb:
    from flint import arb

    return arb(2) ** k


def _bounds(ball: flint.arb) -> tuple[Fraction, Fraction] | None:
    """Exact endpoints of a ball; call at the ball's precision (Arb rounds
    ``lower()`` down and ``upper()`` up to the context precision)."""
    if not ball.is_finite():
        return None
    return _fraction(ball.lower()), _fraction(ball.upper())


def _round_half_even(x: Fraction) -> tuple[int, bool]:
    """Nearest integer to x, ties to even; also whether x was an exact tie."""
    floor = math.floor(x)
    rest = x - floor
    if rest > Fraction(1, 2):
        return floor + 1, False
    if rest < Fraction(1, 2):
        return floor, False
    return (floor if floor % 2 == 0 else floor + 1), True


def _exponent10(x: Fraction) -> int:
    """floor(log10(|x|)) for x != 0, exactly."""
    ax = abs(x)
    # an estimate from the bit lengths (str() stops at 4300 digits); the loops make it exact
    k = int((ax.numerator.bit_length() - ax.denominator.bit_length()) * 0.30103)
    # adjust: 10^k <= ax < 10^(k+1)
    while Fraction(10) ** k > ax:
        k -= 1
    while Fraction(10) ** (k + 1) <= ax:
        k += 1
    return k


def _pow10(k: int) -> Fraction:
    return Fraction(10**k) if k >= 0 else Fraction(1, 10 ** (-k))


@dataclass(frozen=True)
class CertifiedValue:
    """An exact real number with certified decimal and binary views."""

    expr: Any
    exact: Fraction | None = None  # set when the value is a rational number
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- core: decide a question with rising precision --------------------------
    def _decide(self, question: Any, what: str) -> Any:
        """Evaluate ``question`` (a function of an exact Fraction) at both ends
        of ever tighter balls until the answers agree."""
        if self.exact is not None:
            return question(self.exact)
        for bits in PRECISIONS:
            with _precision(bits):  # lower()/upper() round to the context precision
                bounds = _bounds(_arb(self.expr))
            if bounds is None:
                continue
            lo, hi = bounds
            a, b = question(lo), question(hi)
            if a == b:
                return a
            if bits == PRECISIONS[1]:
                # Still undecided: the value may be a rational number in disguise
                # (a row of weights summing to 1), sitting exactly on the boundary.
                hidden = self._hidden_rational()
                if hidden is not None:
                    return question(hidden)
        from .grammar import short_text

        raise PrecisionError(
            f"could not decide {what} for {short_text(self.expr)} at {PRECISIONS[-1]} bits "
            "(the value may sit exactly on a boundary)"
        )

    def _hidden_rational(self) -> Fraction | None:
        """The value as an exact rational, if cheap exact algebra shows it is one.

        A candidate q with a small denominator is read off a 512-bit enclosure, then
        value − q = 0 is *proved*: over a common denominator, the numerator must expand
        to exactly 0 (exponentials multiply out, logarithms split). Only expansion is
        used, never polynomial gcds: SymPy's ``cancel`` can hang, or crash the process
        with SIGFPE under python-flint ground types, on exponentials of irrational
        arguments (seen on a 3 × 3 example with sqrt(2) scales).
        """
        if "rational" not in self._cache:
            self._cache["rational"] = self._prove_rational()
        found_rational: Fraction | None = self._cache["rational"]
        return found_rational

    def _prove_rational(self) -> Fraction | None:
        import sympy as sp

        if sp.count_ops(self.expr) > MAX_IDENTITY_OPS:
            return None
        with _precision(512):
            ball = _arb(self.expr)
            if not ball.is_finite() or ball.rad() > arb_2_pow(-400):
                return None
            mid = _fraction(ball.mid())
        q = mid.limit_denominator(10**12)
        if abs(mid - q) > Fraction(1, 2**300):
            return None  # not a rational with a small denominator
        try:
            num, _ = sp.together(self.expr - sp.Rational(q.numerator, q.denominator)).as_numer_denom()
            expanded = sp.expand(num, log=True, force=True)
            zero = expanded == 0 or sp.logcombine(expanded, force=True).doit() == 0
        except (TypeError, ValueError, RecursionError):  # pragma: no cover - defensive
            return None
        return q if zero else None
        found_rational: Fraction | None = self._cache["rational"]
        return found_rational

    def enclosure(self, bits: int = 128) -> flint.arb:
        """A rigorous Arb ball containing the value."""
        return to_arb(self.expr, bits)

    def sign(self) -> int:
        """-1, 0 or 1, certified."""
        if self.exact is not None:
            return (self.exact > 0) - (self.exact < 0)
        try:  # an enclosure that excludes 0 settles it without asking SymPy (is_zero is slow)
            ball = to_arb(self.expr, 64)
            if ball > 0 or ball < 0:
                return 1 if ball > 0 else -1
        except (PrecisionError, SpecError):
            pass
        if self.expr.is_zero:
            return 0
        return int(self._decide(lambda x: (x > 0) - (x < 0), "the sign"))

    def compare(self, other: Fraction) -> int:
        """Sign of (value - other), certified."""
        if self.exact is not None:
            d = self.exact - other
            return (d > 0) - (d < 0)
        return int(self._decide(lambda x: (x > other) - (x < other),
                                f"the comparison with {_brief(other)}"))

    def round_places(self, places: int) -> Fraction:
        """Correctly rounded to ``places`` digits after the decimal point (ties to even)."""
        scale = _pow10(places)
        n = self._decide(lambda x: _round_half_even(x * scale)[0], f"rounding to {places} places")
        return Fraction(n) / scale

    def rational(self) -> Fraction | None:
        """The value as an exact Fraction when it is rational (also in disguise), else None."""
        return self.exact if self.exact is not None else self._hidden_rational()

    def is_tie(self, places: int) -> bool:
        """Whether the value lies exactly half-way between two ``places``-digit decimals."""
        scale = _pow10(places)
        if self.exact is not None:
            return _round_half_even(self.exact * scale)[1]
        # a value half-way between two decimals is not on a decimal, so its floor is decided
        floor = self._decide(lambda x: math.floor(x * scale), f"the floor at {places} places")
        return self.compare((Fraction(floor) + Fraction(1, 2)) / scale) == 0

    def exponent10(self) -> int:
        """floor(log10(|value|)), certified (value must be non-zero)."""
        if self.sign() == 0:
            raise PrecisionError("zero has no decimal exponent")
        return int(self._decide(_exponent10, "the decimal exponent"))

    def round_significant(self, digits: int) -> Fraction:
        """Correctly rounded to ``digits`` significant digits (ties to even)."""
        _check_digits(digits)
        if self.sign() == 0:
            return Fraction(0)

        def q(x: Fraction) -> Fraction:
            k = _exponent10(x) - digits + 1
            n, _ = _round_half_even(x / _pow10(k))
            return n * _pow10(k)

        return Fraction(self._decide(q, f"rounding to {digits} significant digits"))

    def truncate_places(self, places: int) -> Fraction:
        """The value cut (toward zero) after ``places`` decimals, certified."""
        scale = _pow10(places)
        n = self._decide(lambda x: math.trunc(x * scale), f"truncation to {places} places")
        return Fraction(n) / scale

    def digits(self, significant: int = 20) -> str:
        """The leading ``significant`` digits of the exact decimal expansion,
        followed by ``…`` if the expansion goes on. Every printed digit is certified."""
        _check_digits(significant)
        if self.sign() == 0:
            return "0"
        if self.exact is not None and _terminates(self.exact):
            return _format_fraction(self.exact, _decimal_places(self.exact))
        k = self.exponent10()
        places = max(significant - 1 - k, 0)
        cut = self.truncate_places(places)
        if self.compare(cut) == 0:  # the expansion ends here (a rational in disguise)
            return _format_fraction(cut, _decimal_places(cut))
        text = _format_fraction(cut, places)
        return text + "…"

    def to_float(self) -> float:
        """The correctly rounded float64 (round to nearest even)."""
        if self.exact is not None:
            return _float(self.exact)
        return float(self._decide(_float, "rounding to float64"))

    def __float__(self) -> float:
        return self.to_float()


def _decimal(n: int) -> str:
    """str(n) without Python's 4300-digit limit (python-flint's fmpz has none)."""
    from flint import fmpz

    return str(fmpz(n))


def _float(x: Fraction) -> float:
    """The correctly rounded float64 of x; beyond the largest double, ±inf (IEEE
    round-to-nearest overflows to infinity)."""
    try:
        return float(x)  # int/int true division is correctly rounded in CPython
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _brief(x: Fraction) -> str:
    """A Fraction for a message: never thousands of digits long."""
    size = max(x.numerator.bit_length(), x.denominator.bit_length())
    return str(x) if size < 200 else f"<a number of about {int(size * 0.30103)} digits>"


def _check_digits(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SpecError(f"significant digits={n!r} must be a positive integer")


def _terminates(x: Fraction) -> bool:
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def _decimal_places(x: Fraction) -> int:
    places = 0
    while (x * _pow10(places)).denominator != 1:
        places += 1
    return places


def _format_fraction(x: Fraction, places: int) -> str:
    """Exact decimal text of x, which must be a multiple of 10^-places."""
    scaled = x * _pow10(places)
    assert scaled.denominator == 1, (x, places)
    n = int(scaled)
    sign = "-" if n < 0 else ""
    digits = _decimal(abs(n)).rjust(places + 1, "0")
    if places == 0:
        return sign + digits
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def certify(value: Any) -> CertifiedValue:
    """Wrap an exact value for certified evaluation.

    ``value`` may be a SymPy expression, an int, a Fraction, or a string in the
    restricted grammar of :func:`mha_symbolic.exact.grammar.parse_number`. Python
    floats are refused (they are not exact statements of a book's number).

    >>> certify("1/3").digits(5)
    '0.33333…'
    >>> certify(20).digits()
    '20'
    """
    import sympy as sp

    if isinstance(value, float):
        raise SpecError(f"value={value!r} is a float; pass a string such as {str(value)!r} "
                        "or a Fraction so that the exact number is explicit")
    if isinstance(value, str):
        from .grammar import parse_number

        expr = parse_number(value)
    elif isinstance(value, Fraction):
        expr = sp.Rational(value.numerator, value.denominator)
    else:
        try:
            expr = sp.sympify(value, strict=True) if not isinstance(value, sp.Basic) else value
        except (sp.SympifyError, TypeError, ValueError):
            raise SpecError(f"value={value!r} ({type(value).__name__}) is not an exact number; "
                            "pass an int, a Fraction, a SymPy number or a string") from None
        if not isinstance(expr, sp.Expr):
            raise SpecError(f"value={value!r} ({type(value).__name__}) is not a number")
    if expr.free_symbols:
        names = ", ".join(sorted(str(s) for s in expr.free_symbols))
        raise SpecError(f"cannot certify an expression with free symbols ({names})")
    if expr.has(sp.Float):
        raise SpecError(f"value={expr} holds a floating-point Float: pass a string such as "
                        "'0.1' or a Rational so that the exact number is explicit")
    if expr.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
        raise SpecError(f"value={expr} is not a finite real number")
    exact = Fraction(int(expr.p), int(expr.q)) if expr.is_Rational else None
    return CertifiedValue(expr, exact)
