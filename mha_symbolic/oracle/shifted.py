"""Exact power-of-two units for the backward at the float64 limits (issue 30).

The oracle's float64 and double-double tiers form dP = dO·Vᵀ, D = rowsum(dO ∘ O) and
dS with sums of products of values and output gradients; with entries of V or dO
beyond about 2^500 those products leave the float64 range (bounds of ±inf, or NaN)
although every gradient is finite.  Attention's backward is linear in dO and, given
the scores, bilinear in (V, dO) for dQ, dK and the mask gradient:

* O = P V and dP = dO Vᵀ scale with V; D = rowsum(dO ∘ O) and dS = P ∘ (dP − D) scale
  with both, so V·2^-a and dO·2^-b give dS·2^-(a+b), dQ = c·dS·K and dK = c·dSᵀ·Q
  times 2^-(a+b), the mask gradient (dS summed over broadcast axes) likewise, and
  dV = Pᵀ·dO times 2^-b; P (and a dropout keep-mask and factor) are unchanged.

So :func:`shifted_backward` runs the tiers on V·2^-a and dO·2^-b (exact: used only when
no bit is lost, :func:`exact_shift`) and :class:`ShiftedProblem` multiplies everything
the tiers return by 2^n, n = a + b or b: float64 values by ``ldexp`` (exact unless the
product overflows, which is then a non-finite bound and goes to the next tier), Arb
balls and rationals exactly, and a rounding boundary t of the result becomes the
boundary t·2^-n of the scaled problem.  The Enclosure built on it (bounds, tiers,
correct rounding) is then that of the exact gradient itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np

from .arith.balls import Prec
from .enclosure import Enclosure, Problem

__all__ = ["ShiftedProblem", "exact_shift", "shift_of", "shifted"]

Array = np.ndarray[Any, Any]

#: Entries of V and dO up to 2^SHIFT_ABOVE are used as they are: their products, and
#: sums of them over E_v, S and L, stay far inside float64 (2^800 times the sizes).
SHIFT_ABOVE = 400


def shift_of(x: Array) -> int:
    """The n >= 0 with max|x|·2^-n below 2^SHIFT_ABOVE (0 for arrays within it)."""
    top = float(np.max(np.abs(x), initial=0.0)) if x.size else 0.0
    if not (math.isfinite(top) and top):
        return 0
    return max(0, math.frexp(top)[1] - SHIFT_ABOVE)


def exact_shift(x: Array, n: int) -> Array | None:
    """x·2^-n (float64) if every element is exact (no bit lost to the subnormal range),
    else None."""
    y = np.ldexp(np.asarray(x, dtype=np.float64), -n)
    return y if np.array_equal(np.ldexp(y, n), x) else None


class ShiftedProblem(Problem):
    """``inner`` (a problem computing the value·2^-n) seen in units of the value."""

    def __init__(self, inner: Problem, n: int) -> None:
        self.inner, self.n = inner, n
        self._factor = Fraction(2) ** n

    def __getattr__(self, name: str) -> Any:  # hint(), the backward problem's extras
        return getattr(self.inner, name)

    def _up(self, got: tuple[Array, Array, Array, Array] | None
            ) -> tuple[Array, Array, Array, Array] | None:
        if got is None:
            return None
        hi, lo, err, ok = got
        with np.errstate(over="ignore", invalid="ignore"):
            hi2, lo2, err2 = (np.ldexp(x, self.n) for x in (hi, lo, err))
        fin = np.all(np.isfinite(hi2) & np.isfinite(lo2) & np.isfinite(err2), axis=-1)
        return hi2, lo2, err2, ok & fin

    def refine(self, b: int, rows: Array, kind: str) -> tuple[Array, Array, Array, Array] | None:
        return self._up(self.inner.refine(b, rows, kind))

    def refine_many(self, items: list[tuple[int, Array]], kind: str
                    ) -> Iterator[tuple[int, tuple[Array, Array, Array, Array] | None]]:
        for n, got in self.inner.refine_many(items, kind):
            yield n, self._up(got)

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb

        got = self.inner.arb_rows(b, rows, prec, kind, cols)
        # at ``prec`` (the inner rows return at the caller's precision, python-flint's
        # 53 bits by default): a ball of prec bits times 2^n is then exact, where at 53
        # bits it was rounded to one ulp of a double, a radius no precision shrank, so
        # Ziv's loop could not decide a rounding whose boundary sat within it (issue 30,
        # the limits kind: 42 huge-query inputs of seed 73)
        with Prec(prec):
            two_n = arb(2) ** self.n  # exact: a power of two
            return [[x * two_n for x in row] for row in got]

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        row = self.inner.rational_row(b, i, kind)
        if row is None:
            return None
        return [None if f is None else f * self._factor for f in row]

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        return self.inner.boundary_sign(b, i, col, kind, boundary / self._factor)


def shifted(enc: Enclosure, n: int) -> Enclosure:
    """The Enclosure of 2^n times the value ``enc`` encloses (n >= 0), with its own
    tiers: bounds from ``enc``'s (exact scaling; err rounded up), rows whose bounds
    overflow refined again through :class:`ShiftedProblem`."""
    if n == 0:
        return enc
    lo, hi, mid = enc._lo, enc._hi, enc._mid
    with np.errstate(over="ignore", invalid="ignore"):
        # |x - mid| <= max(hi - mid, mid - lo); the float subtraction rounds within
        # 2^-53 relative, so (1 + 2^-50) and the smallest subnormal make it an upper bound
        err = np.maximum(hi - mid, mid - lo) * (1 + 2.0**-50) + 2.0**-1074
        err = np.where(lo == hi, 0.0, err)  # equal rigorous bounds: the value itself
        mid2, err2 = np.ldexp(mid, n), np.ldexp(err, n)
    policy = enc._zero_rows | enc._nan_rows
    ok = np.all(np.isfinite(mid2) & np.isfinite(err2), axis=-1) | policy
    mid2 = np.where(np.isfinite(mid2), mid2, 0.0)
    err2 = np.where(np.isfinite(err2), err2, np.inf)
    out = type(enc)(ShiftedProblem(enc._problem, n), enc._kind, enc.shape, mid2, err2,
                    ok & ~policy, enc._zero_rows, enc._nan_rows, perm=enc._perm,
                    progress=enc._progress, owned=True)
    return out
