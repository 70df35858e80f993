"""Magnitude analysis: values with dominated contributions e^(−huge), bounded analytically.

A key masked by a finite −10^6 (or −9·10^15: what tutorials write) contributes
e^(−10^6) ≈ 10^(−434294) to its row's softmax.  Deciding "is the output exactly 2?"
by evaluating to that many digits is hopeless (Arb would need 1.4 million bits); this
module decides it from the structure instead.

Let E be an exact value and t₁, t₂, … its *tiny* exponentials: subterms e^(a_i) whose
argument is certainly below :data:`TINY_ARGUMENT`.  Put a parameter s in front of each,
E(s) = E[e^(a_i) → s·e^(a_i)], so that E(1) = E and E(0) = M, the value with the tiny
terms removed (the masked keys dropped exactly).  By the mean value theorem

    E − M = E(1) − E(0) = E'(σ)   for some σ in [0, 1],

so an Arb enclosure of the single derivative E'(s) over the whole interval s ∈ [0, 1]
(interval evaluation: the ball s = [0, 1] is passed through every operation) bounds
|E − M| from above, and when that enclosure excludes 0 it gives the sign of E − M.  The
enclosure is of the size of the tiny terms themselves (Arb keeps exponents exactly, so
e^(−10^6) is a ball with a 20-bit exponent, not a zero), so the bound is sharp.

Example: with scores (0, 0), the second key masked by −10^6 and values (2, 0), the
output is E = 2/(1 + e^(−10^6)); M = 2, E'(s) = −2t/(1 + s t)² with t = e^(−10^6) < 0 on
[0, 1], so 2 − 2t ≤ E < 2: the claim "2" holds to 434,294 decimal places and is not
exact.

>>> import sympy as sp
>>> d = dominated(2 / (1 + sp.exp(-10**6)))
>>> d.main, d.sign, d.places, d.exponent_text
(2, -1, 434294, '−1000000')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["TINY_ARGUMENT", "Dominated", "dominated"]

#: e^(a) with a certainly below this is "tiny" (e^(−2000) < 10^(−868): far below any
#: printed digit, and below what plain Arb evaluation resolves cheaply).
TINY_ARGUMENT = -2000
#: Working precision of the enclosures (bits); the tiny terms' exponents are exact in Arb.
BITS = 128


@dataclass(frozen=True)
class Dominated:
    """E = main + d with |d| ≤ bound (a python-flint arb, > 0) and sign(d) = sign
    (0 when undecided)."""

    main: Any
    bound: Any
    sign: int
    exponent: Any  # the largest tiny argument a (SymPy), for "contribute e^(a)"

    @property
    def places(self) -> int:
        """N with |E − main| < 10^(−N): the decimal places to which E equals main."""
        from flint import arb, ctx

        old = ctx.prec
        ctx.prec = BITS
        try:
            lg = arb(self.bound.upper()).log() / arb(10).log()  # log10 of the bound, enclosed
            n = arb((-lg).lower()).floor().unique_fmpz()  # bound ≤ 10^(−n)
            return max(int(n), 0) if n is not None else 0
        finally:
            ctx.prec = old

    @property
    def exponent_text(self) -> str:
        """The largest tiny argument, as printed in 'contribute e^(…)'."""
        import sympy as sp

        a = self.exponent
        if a.is_Integer:
            return str(a).replace("-", "−")
        from .certified import to_arb

        ball = to_arb(a, 64)
        return "≈ " + sp.Float(float(ball.mid()), 7).__format__("").replace("-", "−")


def _tiny_exponentials(expr: Any) -> list[Any]:
    import sympy as sp

    from .certified import to_arb

    found = []
    for atom in expr.atoms(sp.exp):
        arg = atom.args[0]
        if arg.free_symbols:
            continue
        try:
            ball = to_arb(arg, 64)
        except Exception:  # anything not enclosable is simply not tiny
            continue
        if ball.is_finite() and ball.upper() < TINY_ARGUMENT:
            found.append(atom)
    return found


def dominated(expr: Any) -> Dominated | None:
    """The split E = main + d of a value with tiny exponentials, or None when it has
    none (or when the split does not apply: main not finite, the bound not finite).

    Closed values (no free symbols) are remembered by their structure: a document's
    diagnosis asks for the same value once per alternative it tries, and each split
    costs a symbolic derivative (the long fuzz run's slowest documents)."""
    import sympy as sp

    if not isinstance(expr, sp.Basic) or not expr.has(sp.exp):
        return None
    if expr.free_symbols:
        return _dominated(expr)
    return _dominated_closed(expr)


@functools.lru_cache(maxsize=256)
def _dominated_closed(expr: Any) -> Dominated | None:
    return _dominated(expr)


def _dominated(expr: Any) -> Dominated | None:
    import sympy as sp

    tiny = _tiny_exponentials(expr)
    if not tiny:
        return None
    from flint import arb

    from .certified import bound_symbols, to_arb

    # no assumptions on s: with nonnegative=True, diff asks SymPy for signs of sums in s,
    # which runs real_roots on polynomials in s (minutes; found by the long fuzz run)
    s = sp.Dummy("s")
    scaled = expr.xreplace({t: s * t for t in tiny})
    main = scaled.xreplace({s: sp.Integer(0)})
    if main.has(sp.nan, sp.zoo, sp.oo, -sp.oo):
        return None
    derivative = sp.diff(scaled, s)
    try:
        with bound_symbols({s: arb(0.5, 0.5)}):  # s ∈ [0, 1]
            ball = to_arb(derivative, BITS)
        to_arb(main, BITS)  # main must be enclosable (finite)
    except Exception:  # a split that cannot be enclosed does not apply
        return None
    if not ball.is_finite():
        return None
    sign = 1 if ball > 0 else -1 if ball < 0 else 0
    bound = max(abs(arb(ball.lower())), abs(arb(ball.upper())))
    if not bound > 0:
        return None
    largest = max((t.args[0] for t in tiny), key=lambda a: to_arb(a, 64).mid())
    return Dominated(main, bound, sign, largest)
