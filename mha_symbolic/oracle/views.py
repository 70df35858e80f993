"""Enclosures assembled from others: a view without the sink column, and the packed
(varlen) output of several sequences.  Both offer :class:`~.enclosure.Enclosure`'s
API (``lower``, ``upper``, ``midpoint``, ``shape``, ``rounded``, ``exact``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SpecError

__all__ = ["DropLastColumn", "PackedEnclosure"]


class DropLastColumn:
    """The enclosure ``base`` without its last column (the attention sink's weight:
    sinks are computed as one extra key, see :mod:`.variant_forward`)."""

    def __init__(self, base: Any) -> None:
        self._base = base
        self.shape = (*base.shape[:-1], base.shape[-1] - 1)
        self.weights = None

    @property
    def lower(self) -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(self._base.lower[..., :-1])

    @property
    def upper(self) -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(self._base.upper[..., :-1])

    @property
    def midpoint(self) -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(self._base.midpoint[..., :-1])

    def rounded(self, dtype: Any = "float64") -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(self._base.rounded(dtype)[..., :-1])

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        idx = (int(index),) if isinstance(index, (int, np.integer)) else tuple(index)
        if len(idx) != len(self.shape) or not all(-n <= i < n for i, n in
                                                  zip(idx, self.shape, strict=True)):
            raise SpecError(f"index={idx} is out of range for shape={self.shape}")
        idx = tuple(i % n for i, n in zip(idx, self.shape, strict=True))
        return self._base.exact(idx, prec=prec)

    def __repr__(self) -> str:
        return f"Enclosure(shape={self.shape}, sink column dropped)"


class PackedEnclosure:
    """The packed output (total, H, Ev) of variable-length sequences: sequence b owns
    rows ``cu[b]:cu[b+1]`` and its enclosure has shape (H, L_b, Ev)."""

    def __init__(self, parts: list[Any], cu: list[int], tail: tuple[int, ...]) -> None:
        self._parts = parts
        self._cu = cu
        self.shape = (cu[-1], *tail)
        self.weights = None

    def _cat(self, get: Any) -> np.ndarray[Any, Any]:
        blocks = [np.swapaxes(np.asarray(get(p)), 0, 1) for p in self._parts if p is not None]
        if not blocks:
            return np.zeros(self.shape)
        return np.ascontiguousarray(np.concatenate(blocks, axis=0))

    @property
    def lower(self) -> np.ndarray[Any, Any]:
        return self._cat(lambda p: p.lower)

    @property
    def upper(self) -> np.ndarray[Any, Any]:
        return self._cat(lambda p: p.upper)

    @property
    def midpoint(self) -> np.ndarray[Any, Any]:
        return self._cat(lambda p: p.midpoint)

    def rounded(self, dtype: Any = "float64") -> np.ndarray[Any, Any]:
        from .formats import get_format

        out = self._cat(lambda p: p.rounded(dtype))
        return out.astype(get_format(dtype).numpy_dtype())

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        idx = tuple(int(i) for i in index)
        if len(idx) != 3 or not all(-n <= i < n for i, n in zip(idx, self.shape, strict=True)):
            raise SpecError(f"index={idx} is out of range for shape={self.shape}")
        t, h, col = (i % n for i, n in zip(idx, self.shape, strict=True))
        b = int(np.searchsorted(self._cu, t, side="right")) - 1
        return self._parts[b].exact((h, t - self._cu[b], col), prec=prec)

    def __repr__(self) -> str:
        return f"Enclosure(shape={self.shape}, {len(self._parts)} packed sequences)"
