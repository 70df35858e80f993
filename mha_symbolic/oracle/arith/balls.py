"""Arb balls (python-flint) for the oracle's tiers: the working precision
(:class:`Prec`), exact matrices of doubles, exact score products at a precision that
holds every bit (:func:`exact_prec`), the exact scale, and outward float64 bounds of
a ball (:func:`ball_bounds`).  Exponents below ``EXP_FLOOR`` are replaced by the ball
[0, e**EXP_FLOOR] (Arb's own exp of such arguments can be the whole real line)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


EXP_FLOOR = -1_000_000  # exp(t) for t < EXP_FLOOR is enclosed in [0, exp(EXP_FLOOR)]


class Prec:
    """Context manager setting python-flint's working precision (restored on exit).
    Arb endpoints (``x.lower()``) and differences are rounded to the *current*
    precision, so every inspection of a ball happens inside one of these."""

    def __init__(self, prec: int) -> None:
        self.prec = prec
        self.old = 0

    def __enter__(self) -> None:
        from flint import ctx

        self.old = ctx.prec
        ctx.prec = self.prec

    def __exit__(self, *exc: object) -> None:
        from flint import ctx

        ctx.prec = self.old


def to_arb_mat(rows: Array) -> Any:
    """An exact arb_mat of a 2-D float64 array (doubles are exact in Arb)."""
    from flint import arb_mat

    r, c = rows.shape
    if r == 0 or c == 0:
        return arb_mat(r, c)
    return arb_mat(rows.tolist())


def _exp_range(x: Array) -> tuple[int, int]:
    """(top, bottom): every nonzero |x| < 2**top and is a multiple of 2**bottom."""
    ax = np.abs(x[x != 0])
    if ax.size == 0:
        return 0, 0
    _, e_max = np.frexp(ax.max())
    _, e_all = np.frexp(ax)
    return int(e_max), int(np.min(e_all)) - 53


def exact_prec(a: Array, b: Array, d: int) -> int:
    """A precision at which every dot product of a row of ``a`` with a row of ``b``
    (length d) is exactly representable: the products are multiples of
    2**(bottom_a + bottom_b) below 2**(top_a + top_b), their sum below d times that."""
    ta, ba = _exp_range(a)
    tb, bb = _exp_range(b)
    return max(64, (ta + tb) - (ba + bb) + max(d, 1).bit_length() + 8)


def scale_arb(scale: Fraction | None, E: int) -> Any:
    """The exact scale as a ball: a float (dyadic) scale is exact; 1/sqrt(E) at the
    current precision."""
    from flint import arb, fmpq

    if scale is not None:
        return arb(fmpq(scale.numerator, scale.denominator))
    if E == 0:
        return arb(0)
    return arb(E).rsqrt()


def exact_score_rows(q: Array, kmT: Any, k_prec: int) -> list[list[Any]]:
    """The dot products q_i·k_j as exact balls (radius 0): ``kmT`` the exact arb_mat of
    Kᵀ, ``k_prec`` from :func:`exact_prec`."""
    from flint import arb

    r = q.shape[0]
    S = kmT.ncols()
    with Prec(k_prec):
        if q.shape[1] and S and r:
            ents = (to_arb_mat(q) * kmT).entries()
            return [ents[i * S:(i + 1) * S] for i in range(r)]
        return [[arb(0)] * S for _ in range(r)]


def ball_bounds(x: Any) -> tuple[float, float]:
    """Outward float64 bounds of an arb ball (call inside Prec)."""
    from flint import arb

    if not x.is_finite():
        return -math.inf, math.inf
    lo_x, hi_x = x.lower(), x.upper()
    lo, hi = float(lo_x), float(hi_x)
    if math.isfinite(lo) and arb(lo) > lo_x:
        lo = math.nextafter(lo, -math.inf)
    if math.isfinite(hi) and arb(hi) < hi_x:
        hi = math.nextafter(hi, math.inf)
    return lo, hi
