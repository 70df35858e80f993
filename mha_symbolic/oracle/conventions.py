"""Conventions of scaled dot-product attention, as torch SDPA states them: the
scale (``None`` = exactly 1/sqrt(E), 0 means zero), masks (bool True = takes
part, float added, -inf excluded), causal alignment, fully masked rows."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InputValueError, ShapeError, SpecError
from .constants import ETA, UP, U
from .inputs import as_exact_array, to_float64, validate_finite

POLICIES = ("zero", "nan", "error")
ALIGNMENTS = ("top_left", "bottom_right")


def exact_scale(scale: Any, E: int) -> tuple[Fraction | None, float, float]:
    """(exact rational scale or None for 1/sqrt(E), c_f, rho_c) with |c - c_f| <= rho_c."""
    if scale is None:
        if E == 0:
            return None, 0.0, 0.0
        rt = math.isqrt(E)
        if rt * rt == E:
            c = Fraction(1, rt)
            c_f = float(c)  # correctly rounded
            return None, c_f, abs(float(c - Fraction(c_f))) * UP + (0.0 if c == c_f else ETA)
        c_f = 1.0 / math.sqrt(E)  # sqrt and division each round: |c - c_f| <= 2.01u c_f
        return None, c_f, 2.01 * U * c_f * UP + ETA
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise SpecError(f"scale={scale!r}: expected None or a real number")
    if isinstance(scale, (int, np.integer)) and abs(int(scale)) > 2**53:
        raise SpecError(f"scale={scale!r} is too large to be held exactly as a float")
    sf = float(scale)
    if not math.isfinite(sf):
        raise InputValueError(f"scale={scale!r}: expected a finite number")
    return Fraction(sf), sf, 0.0


def _broadcast(shapes: dict[str, tuple[int, ...]], what: str) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        desc = ", ".join(f"{k}={v}" for k, v in shapes.items())
        raise ShapeError(f"{what} do not broadcast: {desc}") from None


def prepare_mask(attn_mask: Any, is_causal: bool, causal_alignment: str,
                  batch: tuple[int, ...], L: int, S: int) -> tuple[Any, Any]:
    """(allowed bool array broadcastable to batch+(L,S), additive float64 or None)."""
    allowed: np.ndarray[Any, Any] = np.ones((1,) * len(batch) + (L, S), dtype=bool)
    madd = None
    if attn_mask is not None:
        m = as_exact_array(attn_mask, "attn_mask")
        target = (*batch, L, S)
        try:
            np.broadcast_shapes(m.shape, target)
            if np.broadcast_shapes(m.shape, target) != target:
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"attn_mask.shape={m.shape} does not broadcast to the scores' shape "
                f"{target} (batch..., L, S)"
            ) from None
        if m.dtype == bool:
            allowed = allowed & m
        else:
            validate_finite(m, "attn_mask", allow_neg_inf=True)
            m64 = to_float64(m)
            allowed = allowed & (m64 != -np.inf)
            madd = np.where(m64 == -np.inf, 0.0, m64)
    if is_causal:
        i = np.arange(L)[:, None]
        j = np.arange(S)[None, :]
        causal = j <= i if causal_alignment == "top_left" else j <= i + (S - L)
        allowed = allowed & causal
    return allowed, madd
