"""Enclosures assembled from others: a view without the sink column, the packed
(varlen) output of several sequences, and the Enclosures of a scaled one (FP8
descale factors in the gradients) and of a sum (a parameter shared by varlen
sequences).  All offer :class:`~.enclosure.Enclosure`'s API (``lower``, ``upper``,
``midpoint``, ``shape``, ``rounded``, ``exact``)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import SpecError
from ..arith.constants import ETA, UP, U, gamma
from ..arith.dd import dd_mul_d
from ..arith.formats import get_format
from ..backward.dd import DDSum
from ..enclosure import Enclosure, Problem
from ..mp import MpmathViews

__all__ = ["DropLast", "DropLastColumn", "PackedEnclosure", "scaled", "summed"]


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


# --------------------------------------------------------------------------------------
# Enclosures of exact functions of others: a scaling (FP8 descale factors), a sum
# (varlen: a parameter shared by the sequences).  Each is a true Enclosure whose
# Problem delegates to the bases' problems, so every tier and the exact decisions
# carry over.


class _ScaledProblem(Problem):
    """f_b·y for the elements of stack element b of ``base`` (f a double per b):
    tier 2 multiplies the double-double by f (dd_mul_d, 4.02u² relative, + 4η), Arb
    exactly, exact rationals exactly; sign(f y − T) = sign(f)·sign(y − T/f)."""

    def __init__(self, base: Any, factor: np.ndarray[Any, Any]) -> None:
        self.base, self.kind, self.f = base._problem, base._kind, factor

    def refine(self, b: int, rows: Any, kind: str) -> Any:

        got = self.base.refine(b, rows, self.kind)
        if got is None:
            return None
        h, lo, err, ok = got
        f = float(self.f[b])
        if f == 0.0:
            z = np.zeros_like(h)
            return z, z.copy(), z.copy(), ok
        ph, pl = dd_mul_d(h, lo, np.full_like(h, f))
        e2 = (abs(f) * err + 4.02 * U * U * np.abs(ph) * 1.01 + 4 * ETA) * UP
        return ph, pl, e2, ok & np.all(np.isfinite(ph) & np.isfinite(e2), axis=-1)

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        from flint import arb

        got = self.base.arb_rows(b, rows, prec, self.kind, cols)
        f = arb(float(self.f[b]))
        return [[x * f for x in row] for row in got]

    def rational_row(self, b: int, i: int, kind: str) -> Any:
        row = self.base.rational_row(b, i, self.kind)
        if row is None:
            return None
        f = Fraction(float(self.f[b]))
        return _MappedRow(row, lambda x: None if x is None else x * f)

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction
                      ) -> int | None:
        f = Fraction(float(self.f[b]))
        if f == 0:
            return (boundary < 0) - (boundary > 0)
        got = self.base.boundary_sign(b, i, col, self.kind, boundary / f)
        return None if got is None else (got if f > 0 else -got)


class _SumProblem(Problem):
    """Σ_k y_k of elements of bases with the same layout: tier 2 by DDSum, Arb by
    addition, exact when every part is rational; a boundary is left to Arb."""

    def __init__(self, bases: list[Any]) -> None:
        self.parts = [(b._problem, b._kind) for b in bases]

    def refine(self, b: int, rows: Any, kind: str) -> Any:

        acc = DDSum()
        ok = np.ones(len(rows), dtype=bool)
        shape = None
        for prob, k in self.parts:
            got = prob.refine(b, rows, k)
            if got is None:
                return None
            acc.add(got[0], got[1], got[2])
            ok &= got[3]
            shape = got[0].shape
        assert shape is not None
        h, lo, err = acc.result(shape)
        return h, lo, err, ok & np.all(np.isfinite(h) & np.isfinite(err), axis=-1)

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        out: list[list[Any]] | None = None
        for prob, k in self.parts:
            got = prob.arb_rows(b, rows, prec, k, cols)
            out = got if out is None else [[x + y for x, y in zip(r1, r2, strict=True)]
                                           for r1, r2 in zip(out, got, strict=True)]
        assert out is not None
        return out

    def rational_row(self, b: int, i: int, kind: str) -> Any:
        rows = [prob.rational_row(b, i, k) for prob, k in self.parts]
        if any(r is None for r in rows):
            return None
        n = len(rows[0])

        def value(col: int) -> Fraction | None:
            vals = [r[col] for r in rows]
            return None if any(v is None for v in vals) else sum(vals, Fraction(0))

        return _MappedRow(list(range(n)), value)

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction
                      ) -> int | None:
        return None


class _MappedRow(list[Any]):
    """row[col] = fn(base[col]) computed when asked for (the bases' rows are lazy)."""

    def __init__(self, base: Any, fn: Any) -> None:
        super().__init__()
        self._base, self._fn = base, fn

    def __len__(self) -> int:
        return len(self._base)

    def __getitem__(self, col: Any) -> Any:
        if not isinstance(col, int):
            return [self[c] for c in range(len(self))[col]]
        return self._fn(self._base[col])

    def __iter__(self) -> Any:
        return (self[c] for c in range(len(self)))


def _half_width(enc: Any) -> np.ndarray[Any, Any]:
    """>= max(hi - mid, mid - lo) of an Enclosure's flat bounds (rounded up)."""

    with np.errstate(invalid="ignore", over="ignore"):
        return np.maximum(enc._hi - enc._mid, enc._mid - enc._lo) * UP


def scaled(base: Any, factor: np.ndarray[Any, Any]) -> Any:
    """The Enclosure of f_b·y for y enclosed by ``base`` (an Enclosure), f_b =
    ``factor[b]`` (doubles, one per stack element of its flat layout):
    |f y − fl(f m)| <= |f| w + u|fl(f m)|(1 + 2u) + η, w the base's half-width."""

    f = np.asarray(factor, dtype=np.float64).reshape(-1)[:, None, None]
    with np.errstate(invalid="ignore", over="ignore"):
        mid = np.where(f == 0.0, 0.0, base._mid * f)
        err = np.where(f == 0.0, 0.0, (np.abs(f) * _half_width(base)
                                       + U * np.abs(mid) * (1 + 2 * U) + ETA) * UP)
    ok = np.all(np.isfinite(mid) & np.isfinite(err), axis=-1)
    zero = base._zero_rows | (f[:, :, 0] == 0.0) & ~base._nan_rows
    return Enclosure(_ScaledProblem(base, f[:, 0, 0]), base._kind, base.shape, mid, err,
                     ok, zero, base._nan_rows.copy(), perm=base._perm)


def summed(bases: list[Any]) -> Any:
    """The Enclosure of Σ_k y_k for Enclosures of the same shape and layout:
    |Σ y − fl(Σ m)| <= Σ w_k + γ_n Σ|m_k| (H1), the bounds summed upward (H2)."""

    first = bases[0]
    if len(bases) == 1:
        return first
    n = len(bases)
    g = gamma(n)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = np.sum([b._mid for b in bases], axis=0)
        mag = np.sum([np.abs(b._mid) for b in bases], axis=0)
        w = np.sum([_half_width(b) for b in bases], axis=0)
        err = (w + g * mag) / (1 - g) * UP
    zero = np.logical_and.reduce([b._zero_rows for b in bases])
    nan = np.logical_or.reduce([b._nan_rows for b in bases])
    ok = np.all(np.isfinite(mid) & np.isfinite(err), axis=-1)
    return Enclosure(_SumProblem(bases), first._kind, first.shape, mid, err, ok,
                     zero & ~nan, nan, perm=first._perm)
