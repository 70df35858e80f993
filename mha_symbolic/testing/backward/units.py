"""Exact power-of-two units for the backward check at the float64 limits (issue 30).

Values or output gradients beyond 2^400 make the products of the check's float64
model (dP = dO·Vᵀ, D = rowsum(dO ∘ O), the bounds' sums of |dO||V|ᵀ) leave the float64
range although every gradient is finite.  :func:`power_of_two_form` then states the
same check in units 2^-a (V) and 2^-b (dO), as the oracle does
(:mod:`mha_symbolic.oracle.shifted`); docs/testing.md ("Values and output gradients
near the float64 maximum") says when this is exact and when it is not used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...oracle.shifted import SHIFT_ABOVE, shift_of
from ..verdict import _as_array

__all__ = ["power_of_two_form", "shifts_of_gradients", "unit_shift"]



#: Entries of V and dO all below 2^-SHIFT_BELOW are scaled up to units near 1: the
#: probabilistic model squares products of them (σ_p² ∝ (u |dO||V|)²), which for
#: |dO||V| below ~2^-460 underflow to 0 and would leave a tolerance of 0 where a
#: kernel's rounding errors are not (a false alarm at dO of 2^-900, V of 2^1000).
SHIFT_BELOW = 200


def unit_shift(x: np.ndarray) -> int:
    """n with max|x|·2^-n in units the float64 model handles: ``shift_of`` (n > 0)
    above 2^SHIFT_ABOVE, n < 0 (max|x|·2^-n in [1/2, 1)) below 2^-SHIFT_BELOW, else 0.

    >>> unit_shift(np.array([2.0 ** -900])), unit_shift(np.array([1.0, 2.0 ** 1000]))
    (-899, 601)
    """
    n = shift_of(x)
    if n:
        return n
    top = float(np.max(np.abs(x), initial=0.0)) if x.size else 0.0
    if 0.0 < top < 2.0 ** -SHIFT_BELOW:
        return math.frexp(top)[1]
    return 0


def shifts_of_gradients(a: int, b: int) -> tuple[int, int, int, int]:
    """(dq, dk, dv, d_attn_mask) exponents n of the scaling 2^-n for V·2^-a, dO·2^-b.

    >>> shifts_of_gradients(600, 0)
    (600, 600, 0, 600)
    """
    return (a + b, a + b, b, a + b)


def _exactly_scaled(x: np.ndarray, n: int) -> np.ndarray | None:
    """x · 2^-n in x's own float dtype if every element is exact (no bit lost to the
    subnormal range), else None.  NaN and inf stay what they are (a failing actual)."""
    y = np.ldexp(x, -n).astype(x.dtype)
    fin = np.isfinite(x)
    with np.errstate(over="ignore", invalid="ignore"):
        back = np.ldexp(y, n)
    return y if np.array_equal(back[fin], x[fin]) else None


def power_of_two_form(value: Any, grad_output: Any, *actual: Any) -> tuple[Any, ...] | None:
    """The backward check in units 2^-a (values) and 2^-b (grad_output), for values
    or dO beyond 2^400 whose products would leave the float64 range (issue 30;
    the oracle does the same, :mod:`mha_symbolic.oracle.shifted`).

    Why it is the same check: attention's backward is linear in dO and, given the
    scores, bilinear in (V, dO) for dQ, dK and the mask gradient: O = P V and
    dP = dO Vᵀ scale with V, so D = rowsum(dO ∘ O) and dS = P ∘ (dP − D) scale by
    2^-(a+b), hence dQ = c dS K and dK = c dSᵀ Q by 2^-(a+b), and dV = Pᵀ dO by 2^-b;
    P (and the dropout keep-mask) do not change.  The exact gradients of the scaled
    inputs are therefore the exact gradients times those powers of two, and so are the
    kernel's rounding errors, since floating point is invariant under exact power-of-two
    scaling unless it overflows or underflows: a kernel run that overflowed ends in inf
    or NaN (inf absorbs sums and products by nonzero numbers, and attention divides only
    by the softmax normaliser >= 1), which stays a failure here; an underflow in the
    original run errs by at most the format's absolute unit, which the scaled model's
    floor (the same unit, in units 2^-s) exceeds, so the tolerance stays a bound.  Used
    only when every scaled array is exact (``_exactly_scaled``: no bit of an input or
    a kernel's gradient is lost), else the check runs unscaled.  Scaled up (V or dO all
    below 2^-200, whose squared products the probabilistic model would underflow to a
    tolerance of 0), an underflow of the original run, at most η in its units, is
    η·2^-n in the scaled one: the returned ``floor`` 2^-min(0, a, b, a+b) multiplies the
    model's η (``ErrorModel.floor_scale``), so the tolerance stays a bound.  Returns
    (value, grad_output, dq, dk, dv, d_attn_mask, (note,), floor) or None (nothing to
    scale)."""
    if value is None or grad_output is None:
        return None
    v, do = _as_array(value, "value"), _as_array(grad_output, "grad_output")
    if v.dtype != np.float64 or do.dtype != np.float64:
        return None  # narrower formats end far below 2^400
    a, b = unit_shift(v), unit_shift(do)
    if a == 0 and b == 0:
        return None
    shifts = shifts_of_gradients(a, b)
    scaled: list[Any] = []
    for x, n in ((v, a), (do, b)):
        y = _exactly_scaled(x, n)
        if y is None:
            return None
        scaled.append(y)
    for g, n in zip(actual, shifts, strict=True):
        if g is None:
            scaled.append(None)
            continue
        arr = _as_array(g, "gradient")
        if arr.dtype not in (np.float64, np.float32):
            return None
        y = _exactly_scaled(arr, n)
        if y is None:
            return None
        scaled.append(y)
    units = ", ".join(f"{name} × 2^{-n}" for name, n in (("value", a), ("grad_output", b)) if n)
    shown = f"dq, dk (and d_attn_mask) are shown × 2^{-(a + b)}" + (
        f" and dv × 2^{-b}" if b else "")
    note = (f"checked in exact power-of-two units (entries above 2^{SHIFT_ABOVE} or all below "
            f"2^-{SHIFT_BELOW}): {units}, so {shown}")
    # scaled up (n < 0), the original run's underflows (η in its units) are η·2^-n here
    floor = math.ldexp(1.0, -min(0, a, b, a + b))
    return (*scaled, (note,), floor)
