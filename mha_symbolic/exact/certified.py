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

import functools
import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .._text import expr_text
from .._validate import MAX_DIGITS, check_int, shown
from ..errors import PrecisionError, SpecError

if TYPE_CHECKING:
    import flint

__all__ = ["CertifiedValue", "certify", "to_arb"]

#: Largest expression (SymPy operation count) on which an exact identity is attempted.
MAX_IDENTITY_OPS = 400

#: A walk of at most this many nodes precedes SymPy's (slow) operation count.
IDENTITY_NODES = 8 * MAX_IDENTITY_OPS

#: Working precisions (bits) tried in turn before giving up.
PRECISIONS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

#: Largest number of terms an exact expansion may produce (counted before expanding).
MAX_EXPANSION_TERMS = 2000


def expansion_terms(expr: Any, cap: int = 10**9) -> int:
    """An upper bound on the number of terms ``sympy.expand`` produces from ``expr``
    (capped at ``cap``): sums add, products multiply, a power (t terms)^n gives at most
    C(n + t − 1, t − 1) terms, and a function's arguments are expanded inside it.

    >>> import sympy as sp
    >>> expansion_terms(sp.Mul(*[1 + sp.sqrt(p) for p in (2, 3, 5, 7, 11)], evaluate=False))
    32
    """
    import sympy as sp

    def count(e: Any) -> int:
        if e.is_Atom:
            return 1
        if e.is_Add:
            return min(sum(count(a) for a in e.args), cap)
        if e.is_Mul:
            total = 1
            for a in e.args:
                total = min(total * count(a), cap)
            return total
        if e.is_Pow:
            t = count(e.base)
            n = e.exp
            inner = count(n) if not n.is_Atom else 1
            if t == 1 or not n.is_Integer:
                return min(max(t, inner), cap)
            k = abs(int(n))
            if k * math.log2(t) > 40:  # t^k >= C(k + t - 1, t - 1): beyond any cap used
                return cap
            return min(max(math.comb(k + t - 1, t - 1), inner), cap)
        # a function (exp, log, ...): its arguments are expanded; exp of a sum splits
        return min(max((count(a) for a in e.args), default=1), cap)

    if not isinstance(expr, sp.Basic):
        return 1
    return count(expr)


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


def _arb(e: Any, memo: dict[Any, Any] | None = None) -> flint.arb:
    """The Arb ball of ``e`` at the current precision.  A subexpression that occurs
    several times (the softmax denominator shared by every weight of a row) is
    evaluated once: ``memo`` maps each evaluated node to its ball (an equal SymPy
    expression has an equal value, so the same ball encloses it)."""
    return _Evaluator(memo if memo is not None else {}).ball(e)


class _Evaluator:
    __slots__ = ("arb", "fmpq", "memo", "sp")

    def __init__(self, memo: dict[Any, Any]) -> None:
        import sympy
        from flint import arb, fmpq

        self.sp, self.arb, self.fmpq, self.memo = sympy, arb, fmpq, memo

    def ball(self, e: Any) -> flint.arb:
        if e.is_Rational:
            return self.arb(self.fmpq(int(e.p), int(e.q)))
        if _BOUND and e in _BOUND:
            return _BOUND[e]
        hit = self.memo.get(e)
        if hit is None:
            hit = self.memo[e] = self._ball(e)
        return hit

    def _ball(self, e: Any) -> flint.arb:
        sp, arb = self.sp, self.arb
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
                total += self.ball(term)
            return total
        if e.is_Mul:
            prod = arb(1)
            for factor in e.args:
                prod *= self.ball(factor)
            return prod
        if e.is_Pow:
            base, exponent = e.args
            if exponent.is_Integer:
                b = self.ball(base)
                n = int(exponent)
                return b**n if n >= 0 else 1 / b ** (-n)
            if exponent == sp.S.Half:
                return self.ball(base).sqrt()
            if exponent == -sp.S.Half:
                return self.ball(base).rsqrt()
            if base is sp.E:
                return self.ball(exponent).exp()
            return (self.ball(exponent) * self.ball(base).log()).exp()
        if isinstance(e, sp.exp):
            return self.ball(e.args[0]).exp()
        if isinstance(e, sp.log):
            if len(e.args) != 1:
                return self.ball(e.args[0]).log() / self.ball(e.args[1]).log()
            return self.ball(e.args[0]).log()
        if isinstance(e, sp.tanh):  # softcapped scores (attention variants)
            return self.ball(e.args[0]).tanh()
        if isinstance(e, sp.Abs):
            return abs(self.ball(e.args[0]))
        if isinstance(e, (sp.Max, sp.Min)):
            balls = [self.ball(a) for a in e.args]
            out = balls[0]
            for b in balls[1:]:
                out = out.max(b) if isinstance(e, sp.Max) else out.min(b)
            return out

        if e.free_symbols:
            names = ", ".join(sorted(expr_text(s, 32) for s in e.free_symbols))
            raise SpecError(f"cannot evaluate an expression with free symbols ({names}): "
                            "give them values")
        if e.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
            raise SpecError(f"cannot evaluate {expr_text(e)}: it is not a finite real number")
        raise SpecError(f"cannot evaluate {expr_text(sp.srepr(e), 80)} with certified arithmetic")


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
    _cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- core: decide a question with rising precision --------------------------
    def _decide(self, question: Any, what: str, max_bits: int | None = None) -> Any:
        """Evaluate ``question`` (a function of an exact Fraction) at both ends
        of ever tighter balls until the answers agree.

        The precision rises through :data:`PRECISIONS` (at most ``max_bits``); at 128
        bits the value is also tried as a rational number in disguise (a row of
        weights summing to 1 sits exactly on a boundary and no ball can settle it).
        Undecided at the cap: :class:`~mha_symbolic.errors.PrecisionError`.
        """
        if self.exact is not None:
            return question(self.exact)
        cap = PRECISIONS[-1] if max_bits is None else max_bits
        tried_rational = False
        for bits in PRECISIONS:
            if bits > cap:
                break
            bounds = self._bounds_at(bits)
            if bounds is not None:
                lo, hi = bounds
                a, b = question(lo), question(hi)
                if a == b:
                    return a
            if bits >= PRECISIONS[1] and not tried_rational:
                # Still undecided: the value may be a rational number in disguise
                # (a row of weights summing to 1), sitting exactly on the boundary.
                tried_rational = True
                hidden = self._hidden_rational()
                if hidden is not None:
                    return question(hidden)

        raise PrecisionError(
            f"could not decide {what} for {expr_text(self.expr)} at {min(cap, PRECISIONS[-1])} "
            "bits: the value may be exactly on the boundary (an exact identity that cheap "
            "algebra cannot prove), or closer to it than that precision resolves"
        )

    def _bounds_at(self, bits: int) -> tuple[Fraction, Fraction] | None:
        """Exact endpoints of the value's ball at ``bits`` (cached: every question about
        the value reuses them)."""
        key = ("bounds", bits)
        if key not in self._cache:
            with _precision(bits):  # lower()/upper() round to the context precision
                self._cache[key] = _bounds(_arb(self.expr))
        bounds: tuple[Fraction, Fraction] | None = self._cache[key]
        return bounds

    def _hidden_rational(self) -> Fraction | None:
        """The value as an exact rational, if cheap exact algebra shows it is one.

        A candidate q with a small denominator is read off a 512-bit enclosure, then
        value − q = 0 is *proved*: over a common denominator, the numerator must expand
        to exactly 0 (exponentials multiply out, logarithms split). Only expansion is
        used, never polynomial gcds: SymPy's ``cancel`` can hang, or crash the process
        with SIGFPE under python-flint ground types, on exponentials of irrational
        arguments (seen on a 3 × 3 example with sqrt(2) scales).  The expansion is
        attempted only when its number of terms, counted beforehand, is at most
        :data:`MAX_EXPANSION_TERMS` (a product of k binomials has 2^k terms).
        """
        if "rational" not in self._cache:
            self._cache["rational"] = self._prove_rational()
        found_rational: Fraction | None = self._cache["rational"]
        return found_rational

    def _prove_rational(self) -> Fraction | None:
        import sympy as sp

        # count_ops walks the whole tree, slowly (0.1 s for a row of 21 weights sharing
        # one denominator): first a walk that stops past IDENTITY_NODES nodes.  SymPy
        # counts at least one operation per 5 nodes (x/y: 1 operation, 5 nodes; only a
        # function of thousands of arguments has fewer), so an expression of at most
        # MAX_IDENTITY_OPS operations is not stopped by it.
        walk = itertools.islice(sp.preorder_traversal(self.expr), IDENTITY_NODES + 1)
        if sum(1 for _ in walk) > IDENTITY_NODES:
            return None
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
            if expansion_terms(num) > MAX_EXPANSION_TERMS:
                return None
            # logarithms of integers are split into logarithms of primes (factor=True), so
            # that log 6 − log 2 − log 3 expands to 0; factoring is bounded by refusing
            # integers above 10^18 under a logarithm.  No logcombine: it rewrites c·log(b)
            # as log(b^c) and builds b^c, of unbounded size (found by the long fuzz run).
            for lg in num.atoms(sp.log):
                for r in lg.args[0].atoms(sp.Rational):
                    if max(abs(int(r.p)), int(r.q)) > 10**18:
                        return None
            expanded = sp.expand(num, log=True, force=True, factor=True)
            zero = expanded == 0
        except (TypeError, ValueError, ArithmeticError, RecursionError):  # pragma: no cover
            return None
        return q if zero else None

    def enclosure(self, bits: int = 128) -> flint.arb:
        """A rigorous Arb ball containing the value."""
        return to_arb(self.expr, bits)

    def sign(self, *, max_bits: int | None = None) -> int:
        """-1, 0 or 1, certified (Arb at rising precision, at most ``max_bits``; a zero
        is recognised exactly when cheap expansion proves it).  Never asks SymPy's
        assumptions, which may run ``minimal_polynomial`` on a zero in disguise.
        Undecided: :class:`~mha_symbolic.errors.PrecisionError`."""
        if self.exact is not None:
            return (self.exact > 0) - (self.exact < 0)
        if self.expr == 0:
            return 0
        quick = self._ball_side(Fraction(0), max_bits)
        if quick is not None:
            return quick
        return int(self._decide(lambda x: (x > 0) - (x < 0), "the sign", max_bits))

    def compare(self, other: Fraction) -> int:
        """Sign of (value - other), certified (``other`` an int or a Fraction)."""
        if isinstance(other, bool) or not isinstance(other, (int, Fraction)):
            raise SpecError(f"compare(other={shown(other)}): expected an int or a Fraction "
                            "(a float is not an exact statement; Fraction(x) takes its value)")
        other = Fraction(other)
        if self.exact is not None:
            d = self.exact - other
            return (d > 0) - (d < 0)
        quick = self._ball_side(other)
        if quick is not None:
            return quick
        return int(self._decide(lambda x: (x > other) - (x < other),
                                f"the comparison with {_brief(other)}"))

    def _ball_side(self, other: Fraction, max_bits: int | None = None) -> int | None:
        """1 or −1 when an Arb ball of the value (64, then 128 bits) lies wholly above or
        below ``other``, compared in Arb: decided also for magnitudes beyond the range
        whose endpoints :func:`_fraction` refuses to build (a gradient of size e^−10^9
        against a claim of 0.88).  None: not separated at that precision."""
        from flint import arb, fmpq

        for bits in (64, 128):
            if max_bits is not None and bits > max_bits:
                break
            with _precision(bits):
                try:
                    ball = _arb(self.expr)
                except SpecError:
                    return None
                if not ball.is_finite():
                    continue
                x = arb(fmpq(other.numerator, other.denominator))
                if ball > x:
                    return 1
                if ball < x:
                    return -1
        return None

    def round_places(self, places: int) -> Fraction:
        """Correctly rounded to ``places`` digits after the decimal point (ties to even)."""
        places = _check_places(places)
        scale = _pow10(places)
        n = self._decide(lambda x: _round_half_even(x * scale)[0], f"rounding to {places} places")
        return Fraction(n) / scale

    def rational(self) -> Fraction | None:
        """The value as an exact Fraction when it is rational (also in disguise), else None."""
        return self.exact if self.exact is not None else self._hidden_rational()

    def is_tie(self, places: int) -> bool:
        """Whether the value lies exactly half-way between two ``places``-digit decimals."""
        places = _check_places(places)
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
        places = _check_places(places)
        scale = _pow10(places)
        n = self._decide(lambda x: math.trunc(x * scale), f"truncation to {places} places")
        return Fraction(n) / scale

    def digits(self, significant: int = 20, *, max_bits: int | None = None) -> str:
        """The leading ``significant`` digits of the exact decimal expansion,
        followed by ``…`` if the expansion goes on. Every printed digit is certified
        (undecided within ``max_bits`` of Arb precision: PrecisionError)."""
        _check_digits(significant)
        if self.exact is not None:
            if self.exact == 0:
                return "0"
            if _terminates(self.exact):
                return _format_fraction(self.exact, _decimal_places(self.exact))
        if self.expr == 0:
            return "0"

        def view(x: Fraction) -> tuple[int, int, int, bool]:
            """(sign, places, the value cut after them, whether digits follow), of x."""
            if x == 0:
                return (0, 0, 0, False)
            places = max(significant - 1 - _exponent10(x), 0)
            scaled = x * _pow10(places)
            cut = math.trunc(scaled)
            return ((x > 0) - (x < 0), places, cut, scaled != cut)

        # One question decided on both ends of a ball: the sign, the decimal exponent,
        # the digits and whether more follow (four separate decisions cost four times more)
        sign, places, cut, more = self._decide(view, f"the first {significant} digits",
                                               max_bits)
        if sign == 0:
            return "0"
        text = _format_fraction(Fraction(cut) / _pow10(places), places)
        if not more:  # the expansion ends here (a rational in disguise)
            value = Fraction(cut) / _pow10(places)
            return _format_fraction(value, _decimal_places(value))
        return text + "…"

    def to_float(self) -> float:
        """The correctly rounded float64 (round to nearest even)."""
        if self.exact is not None:
            return _float(self.exact)
        return float(self._decide(_float, "rounding to float64"))

    def __float__(self) -> float:
        return self.to_float()

    # -- mpmath --------------------------------------------------------------------
    def mpf(self, dps: int | None = None) -> Any:
        """The value as an ``mpmath.mpf`` correctly rounded (to nearest, ties to even) to
        the binary precision mpmath uses for ``dps`` decimal digits (mpmath's
        ``dps_to_prec``: 53 bits for 15, 169 for 50; ``dps=None``: the current
        ``mpmath.mp.dps``).  Certified: the rounding is decided on both ends of an Arb
        ball, refined until they agree (an exact tie is settled exactly).

        >>> import mpmath
        >>> mpmath.nstr(certify("1 - e^(-32)").mpf(30), 30)
        '0.999999999999987335834450905824'
        """
        import mpmath
        from mpmath.libmp import dps_to_prec, from_rational

        if dps is None:
            dps = int(mpmath.mp.dps)
        if isinstance(dps, bool) or not isinstance(dps, int) or not 1 <= dps <= 10**5:
            raise SpecError(f"dps={dps!r} must be an integer from 1 to 100000")
        prec = int(dps_to_prec(dps))

        def rounded(x: Fraction) -> Any:
            return from_rational(x.numerator, x.denominator, prec, "n")

        raw = self._decide(rounded, f"the rounding to {prec} bits")
        return mpmath.mp.make_mpf(raw)

    def mpi(self, *, bits: int = 128) -> Any:
        """An ``mpmath.mpi`` interval containing the value: the endpoints of its Arb
        ball at ``bits`` of precision (at least ``mpmath.iv.prec + 10``), rounded
        outward to ``mpmath.iv.prec`` bits (an exact value: its own outward rounding).

        >>> import mpmath
        >>> mpmath.mpf(1) / 3 in certify("1/3").mpi()
        True
        """
        import mpmath
        from mpmath.libmp import from_rational

        prec = int(mpmath.iv.prec)
        if self.exact is not None:
            lo = hi = self.exact
        else:
            bounds = None
            for b in (max(bits, prec + 10), *(p for p in PRECISIONS if p > max(bits, prec))):
                bounds = self._bounds_at(b)
                if bounds is not None:
                    break
            if bounds is None:
                raise PrecisionError(f"no finite enclosure of {self._short()} was found")
            lo, hi = bounds
        a = mpmath.mp.make_mpf(from_rational(lo.numerator, lo.denominator, prec, "f"))
        z = mpmath.mp.make_mpf(from_rational(hi.numerator, hi.denominator, prec, "c"))
        return mpmath.mpi(a, z)

    # -- displays -----------------------------------------------------------------
    def _short(self) -> str:

        return expr_text(self.expr)

    def _shown(self) -> tuple[str, bool]:
        """(the digits shown, whether they are the certified 20 digits): decided within
        1024 bits, else the Arb ball's text (a display never waits long)."""
        try:
            return self.digits(20, max_bits=1024), True
        except (PrecisionError, SpecError):
            return str(self.enclosure(128).str(25, radius=True)), False

    def _parts(self) -> tuple[str, int | None, bool]:
        """(digits, decimal exponent or None, certified): the certified digits in
        scientific notation when the value is below 10^-4 or from 10^21 in magnitude
        (as Python prints floats), else positional."""
        from .certified_display import scientific

        text, certified = self._shown()
        if certified:
            sci = scientific(text)
            if sci is not None:
                return sci[0], sci[1], True
        return text, None, certified

    def __repr__(self) -> str:
        text, exp, certified = self._parts()
        if exp is not None:
            text = f"{text}e{exp:+03d}"
        if self.exact is not None and self.exact.denominator == 1:
            from .._text import int_text

            return f"CertifiedValue({int_text(self.exact.numerator)})"
        sign = "=" if certified else "∈"
        return f"CertifiedValue({self._short()} {sign} {text})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_latex_(self) -> str:
        import sympy as sp

        from .certified_display import latex_digits, latex_escape

        text, exp, certified = self._parts()
        value = latex_digits(text) if certified else r"\text{" + latex_escape(text) + "}"
        if exp is not None:
            value += rf" \times 10^{{{exp}}}"
        relation = "=" if certified else r"\in"
        try:
            lhs = sp.latex(self.expr) if sp.count_ops(self.expr) <= 200 else None
        except ValueError:        # an integer beyond Python's str() digit limit
            lhs = None
        if lhs is None or len(lhs) > 400:
            lhs = r"\text{" + latex_escape(self._short()) + "}"
        return f"${lhs} {relation} {value}$"

    def _repr_markdown_(self) -> str:
        _, _, certified = self._parts()
        note = "every digit shown is certified" if certified else "an Arb ball"
        return f"{self._repr_latex_()} ({note})"

    def _repr_html_(self) -> str:
        import html

        from .certified_display import grouped

        text, exp, certified = self._parts()
        note = ("every digit shown is certified" if certified
                else "Arb ball: the digits are not yet decided")
        relation = "=" if certified else "∈"
        value = html.escape(grouped(text, "\u202f"))   # a narrow no-break space
        if exp is not None:
            value += f" × 10<sup>{str(exp).replace('-', '−')}</sup>"
        return (f"<span><code>{html.escape(self._short())}</code> {relation} {value} "
                f"<small>({note})</small></span>")


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
    check_int(n, "significant digits", 1, MAX_DIGITS)


def _check_places(places: int) -> int:
    return check_int(places, "places", -MAX_DIGITS, MAX_DIGITS)


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
    return _certified(expr)


@functools.lru_cache(maxsize=8192)
def _certified(expr: Any) -> CertifiedValue:
    """One CertifiedValue per exact value (cached): the enclosures, exact-identity proofs
    and decisions it caches serve every claim, variant and check that asks about it."""
    import sympy as sp

    if expr.free_symbols:
        names = ", ".join(sorted(expr_text(s, 32) for s in expr.free_symbols))
        raise SpecError(f"cannot certify an expression with free symbols ({names})")
    if expr.has(sp.Float):
        raise SpecError(f"value={expr_text(expr)} holds a floating-point Float: pass a string "
                        "such as '0.1' or a Rational so that the exact number is explicit")
    if expr.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
        raise SpecError(f"value={expr_text(expr)} is not a finite real number")
    exact = Fraction(int(expr.p), int(expr.q)) if expr.is_Rational else None
    return CertifiedValue(expr, exact)
