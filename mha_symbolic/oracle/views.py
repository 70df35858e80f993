"""Enclosures assembled from others: a view without the sink column, and the packed
(varlen) output of several sequences.  Both offer :class:`~.enclosure.Enclosure`'s
API (``lower``, ``upper``, ``midpoint``, ``shape``, ``rounded``, ``exact``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SpecError
from .mp import MpmathViews

__all__ = ["DropLast", "DropLastColumn", "PackedEnclosure"]


class DropLast(MpmathViews):
    """The enclosure ``base`` without its last index along ``axis`` (the attention
    sink: it is computed as one extra key, see :mod:`.variant_forward`; its weight is
    the last column, its key the last row of dk and dv)."""

    def __init__(self, base: Any, axis: int = -1) -> None:
        self._base = base
        self._axis = axis % len(base.shape)
        shape = list(base.shape)
        shape[self._axis] -= 1
        self.shape = tuple(shape)
        self.weights = None

    def _cut(self, a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(np.take(a, range(self.shape[self._axis]), axis=self._axis))

    @property
    def lower(self) -> np.ndarray[Any, Any]:
        return self._cut(self._base.lower)

    @property
    def upper(self) -> np.ndarray[Any, Any]:
        return self._cut(self._base.upper)

    @property
    def midpoint(self) -> np.ndarray[Any, Any]:
        return self._cut(self._base.midpoint)

    def rounded(self, dtype: Any = "float64") -> np.ndarray[Any, Any]:
        return self._cut(self._base.rounded(dtype))

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        idx = (int(index),) if isinstance(index, (int, np.integer)) else tuple(index)
        if len(idx) != len(self.shape) or not all(-n <= i < n for i, n in
                                                  zip(idx, self.shape, strict=True)):
            raise SpecError(f"index={idx} is out of range for shape={self.shape}")
        idx = tuple(i % n for i, n in zip(idx, self.shape, strict=True))
        return self._base.exact(idx, prec=prec)

    def __repr__(self) -> str:
        return f"Enclosure(shape={self.shape}, sink dropped)"


DropLastColumn = DropLast  # the weights' view (axis -1)


class PackedEnclosure(MpmathViews):
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
