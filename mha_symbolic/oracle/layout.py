"""The two tensor layouts of attention kernels, and the enclosure of one read in the other.

``"bhsd"`` is SDPA's (batch, heads, sequence, head dim): query (B, H_q, L, E), key
(B, H_kv, S, E), value (B, H_kv, S, E_v).  ``"bshd"`` is FlashAttention's, FlashInfer's
and xformers' (batch, sequence, heads, head dim): query (B, L, H_q, E), key
(B, S, H_kv, E).  The two differ by swapping the axes -3 and -2 of every input and of
the output, nothing else: the oracle computes in ``"bhsd"`` and :class:`Transposed`
shows its enclosure in ``"bshd"`` (the exact values are the same numbers, moved).

Masks (``attn_mask``, ``dropout_mask``) and the weights keep the shape (…, H_q, L, S)
in both layouts, as FlashAttention's ``return_attn_probs`` does.

>>> import numpy as np
>>> swap_layout(np.zeros((2, 5, 3, 4)), "bshd", "query").shape
(2, 3, 5, 4)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ShapeError, SpecError
from .mp import MpmathViews

__all__ = ["LAYOUTS", "Transposed", "check_layout", "swap_layout"]

#: layout -> its axes, as the error messages spell them
LAYOUTS: dict[str, str] = {"bhsd": "(B, H, S, D)", "bshd": "(B, S, H, D)"}


def check_layout(layout: Any) -> str:
    """``layout`` checked: "bhsd" or "bshd"."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise SpecError(f"layout={layout!r} is not a layout: expected 'bhsd' (SDPA's "
                        "(B, H, S, D)) or 'bshd' (FlashAttention's (B, S, H, D))")
    return layout


def swap_layout(x: Any, layout: str, name: str) -> Any:
    """``x`` with its axes -3 and -2 swapped when ``layout`` is "bshd" (a view for
    numpy, torch and jax; nested lists become numpy), else ``x`` itself."""
    if check_layout(layout) == "bhsd" or x is None:
        return x
    shape = tuple(getattr(x, "shape", np.shape(x)))
    if len(shape) < 3:
        raise ShapeError(f"{name}.shape={shape}: layout='bshd' needs (..., S, H, D), at "
                         "least 3 dimensions")
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        return x.transpose(-3, -2)
    if mod.startswith(("jax", "jaxlib")):
        import jax.numpy as jnp

        return jnp.swapaxes(x, -3, -2)
    return np.swapaxes(np.asarray(x) if not isinstance(x, np.ndarray) else x, -3, -2)


def _swap(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(np.swapaxes(np.asarray(a), -3, -2))


class Transposed(MpmathViews):
    """The enclosure ``base`` (…, H, L, E_v) shown as (…, L, H, E_v): the output of a
    "bshd" call.  ``weights`` (…, H, L, S) are ``base``'s, unmoved."""

    def __init__(self, base: Any) -> None:
        if len(base.shape) < 3:
            raise ShapeError(f"shape={tuple(base.shape)}: layout='bshd' needs at least 3 "
                             "dimensions")
        self._base = base
        s = list(base.shape)
        s[-3], s[-2] = s[-2], s[-3]
        self.shape = tuple(s)
        self.weights = getattr(base, "weights", None)

    @property
    def base(self) -> Any:
        """The enclosure in the "bhsd" layout."""
        return self._base

    @property
    def lower(self) -> np.ndarray[Any, Any]:
        return _swap(self._base.lower)

    @property
    def upper(self) -> np.ndarray[Any, Any]:
        return _swap(self._base.upper)

    @property
    def midpoint(self) -> np.ndarray[Any, Any]:
        return _swap(self._base.midpoint)

    def rounded(self, dtype: Any = "float64") -> np.ndarray[Any, Any]:
        return _swap(self._base.rounded(dtype))

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        idx = (int(index),) if isinstance(index, (int, np.integer)) else tuple(index)
        if len(idx) != len(self.shape) or not all(-n <= i < n for i, n in
                                                  zip(idx, self.shape, strict=True)):
            raise SpecError(f"index={idx} is out of range for shape={self.shape}")
        idx = tuple(i % n for i, n in zip(idx, self.shape, strict=True))
        j = list(idx)
        j[-3], j[-2] = j[-2], j[-3]
        return self._base.exact(tuple(j), prec=prec)

    def __getattr__(self, name: str) -> Any:
        # the rest of the base's API (lse, statistics) unmoved; only the output's axes move
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._base, name)

    def __repr__(self) -> str:
        return f"Enclosure(shape={self.shape}, layout='bshd')"
