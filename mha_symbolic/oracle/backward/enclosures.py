"""The gradients' Enclosures laid out as their inputs (:class:`_Flat`: tier 1 summed
over the problems that share an input), and tier 1 deferred for a plain call
(:class:`_Deferred`, issue 29 item 4): rounded to float64 it decides nothing but the
structural zeros, so that rounding starts at tier 2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..arith.constants import UP, U, gamma
from ..arith.formats import FloatFormat, get_format
from ..enclosure import Enclosure, Problem
from ..progress import Progress

__all__: list[str] = []

Arr = np.ndarray[Any, Any]


class _Flat:
    """A gradient laid out as its input (n, rows, cols), summed over the problems that
    share an input: the float sum of n terms errs by <= γ_{n−1} Σ|terms| (H1), the
    bounds are a float sum of nonnegative terms (H2)."""

    def __init__(self, n: int, rows: int, cols: int, single: bool = False) -> None:
        self.single = single  # every input is one problem's: no sums
        self.val = np.zeros((n, rows, cols))
        self.err = np.zeros((n, rows, cols))
        self.mag = np.zeros((n, rows, cols)) if not single else np.zeros((0, rows, cols))
        self.count = np.zeros(n, dtype=np.int64)
        self.ok = np.ones((n, rows), dtype=bool)
        self.live = np.zeros((n, rows), dtype=bool)
        self.nan = np.zeros((n, rows), dtype=bool)

    def add(self, t: int, val: Arr, err: Arr, ok: Arr, live: Arr, nan: Arr) -> None:
        if self.single:
            self.val[t] = val
            self.err[t] = err
            if not live.all():  # structural zeros: exactly 0
                self.val[t][~live] = 0.0
                self.err[t][~live] = 0.0
        else:
            val = np.where(live[:, None], val, 0.0)
            err = np.where(live[:, None], err, 0.0)
            self.val[t] += val
            self.err[t] += err
            self.mag[t] += np.abs(val)
        self.count[t] += 1
        self.ok[t] &= ok
        self.live[t] |= live
        self.nan[t] |= nan

    def parts(self) -> tuple[Arr, Arr, Arr, Arr, Arr]:
        """(value, bound, ok rows, zero rows, NaN rows) of the Enclosure."""
        err = self.err
        if (self.count > 1).any():
            n = np.maximum(self.count, 1)
            g = (n * U / (1 - n * U) * UP)[:, None, None]
            many = (self.count > 1)[:, None, None]
            err = np.where(many, (self.err + g * self.mag) / (1 - g) * UP, self.err)
        ok = self.ok & np.all(np.isfinite(self.val) & np.isfinite(err), axis=-1)
        zero = ~self.live & ~self.nan
        return self.val, err, ok, zero, self.nan

    def enclosure(self, problem: Problem, kind: str, shape: tuple[int, ...]) -> Enclosure:
        return _GradEnclosure(problem, kind, shape, *self.parts())

    def placeholder(self, problem: Problem, kind: str, shape: tuple[int, ...]) -> Enclosure:
        """The Enclosure before tier 1 (:class:`_Deferred`): the zero and NaN rows of the
        score model's structure, every other bound infinite (no row decided)."""
        inf = np.full(self.val.shape, np.inf)
        return _GradEnclosure(problem, kind, shape, np.zeros(self.val.shape), inf,
                              np.ones(self.ok.shape, dtype=bool), ~self.live & ~self.nan,
                              self.nan, owned=True)


class _Deferred:
    """Tier 1 of a plain call, run when first needed (issue 29 item 4).

    Rounded to float64, tier 1 decides nothing but the structural zeros (its float64
    bounds are wider than half an ulp of float64), so ``rounded("float64")`` runs on
    placeholders (:meth:`_Flat.placeholder`: the same zero and NaN rows, every other
    row undecided) and goes to tier 2 at once: the flow of :meth:`Enclosure._round`
    after tier 1's first test, the same roundings.  Anything else that reads the
    bounds (``lower``, ``upper``, ``midpoint``, the other formats, the views of the
    variants) first runs tier 1 for every gradient of the call (:meth:`real`), and the
    rows tier 2 refined meanwhile keep their double-double bounds."""

    def __init__(self, st: Any, progress: bool | None, encs: dict[str, Enclosure],
                 tier1: Callable[[Any, bool | None], tuple[dict[str, _Flat], Progress]]
                 ) -> None:
        # st: the call's setup (attention._Setup); tier1(st, progress): its tier 1
        self.st, self.progress, self.encs, self.tier1 = st, progress, encs, tier1
        self.quiet = False   # inside a float64 rounding on the placeholders

    def real(self, also: Enclosure | None = None) -> None:
        """Run tier 1 and re-initialise the call's Enclosures from it (and ``also``: a
        copy of one of them, which this object does not list)."""
        encs, self.encs = list(self.encs.items()), {}
        if also is not None and all(also is not e for _, e in encs):
            encs.append((also._kind, also))
        if not encs:
            return
        problem = encs[0][1]._problem
        flats, prog = self.tier1(self.st, self.progress)
        for kind, enc in encs:
            assert isinstance(enc, _GradEnclosure)
            enc._deferred = None
            saved = (enc._tier, enc._ok2, getattr(enc, "_dd_blocks", []), enc._rounded_cache,
                     enc._exact_rows, enc.__dict__["_lo_"], enc.__dict__["_hi_"],
                     enc.__dict__["_mid_"])
            Enclosure.__init__(enc, problem, kind, self.st.shapes[kind], *flats[kind].parts())
            enc._progress = prog if prog.enabled else None
            tier, ok2, blocks, cache, exact_rows, lo0, hi0, mid0 = saved
            take = ok2 & (enc._tier == 1)   # tier 2's bounds of the rows it refined
            if take.any():
                lo, hi, mid = enc._writable()
                lo[take], hi[take], mid[take] = lo0[take], hi0[take], mid0[take]
                enc._lo, enc._hi, enc._mid = lo, hi, mid
                enc._ok2 |= take
                enc._dd_blocks = [*getattr(enc, "_dd_blocks", []), *blocks]
            enc._tier = np.maximum(enc._tier, np.where(enc._zero_rows | enc._nan_rows,
                                                       enc._tier, tier)).astype(np.int8)
            enc._rounded_cache.update(cache)
            enc._exact_rows.update(exact_rows)


def _deferred_bounds(name: str) -> Any:
    """A bound array of :class:`_GradEnclosure` (``_lo``, ``_hi``, ``_mid``): reading it
    runs a deferred tier 1 first (outside a float64 rounding on the placeholders)."""
    key = name + "_"

    def get(self: Any) -> Arr:
        d = self.__dict__.get("_deferred")
        if d is not None and not d.quiet:
            d.real(self)
        return self.__dict__[key]

    def put(self: Any, value: Arr) -> None:
        self.__dict__[key] = value

    return property(get, put)


class _GradEnclosure(Enclosure):
    """A gradient's Enclosure: before rounding it tells its problem the format
    (:meth:`_BackwardProblem.hint`); its tier 1 may be deferred (:class:`_Deferred`)."""

    _deferred: _Deferred | None = None
    _lo = _deferred_bounds("_lo")
    _hi = _deferred_bounds("_hi")
    _mid = _deferred_bounds("_mid")

    def rounded(self, dtype: Any = "float64") -> Arr:
        d = self._deferred
        if d is not None:
            if get_format(dtype).name != "float64":
                d.real(self)
            else:
                d.quiet = True
                try:
                    return super().rounded(dtype)
                finally:
                    d.quiet = False
        return super().rounded(dtype)

    def _round(self, fmt: FloatFormat) -> Arr:
        hint = getattr(self._problem, "hint", None)
        if hint is not None:
            hint(fmt)
        return super()._round(fmt)


def _mask_part(ds: Arr, e_ds: Arr, bl: bool, bs: bool) -> tuple[Arr, Arr]:
    """ds summed over the axes the mask broadcasts along: nested float sums of n
    terms, γ_n Σ|terms| plus the terms' bounds (H2)."""
    n_terms = 1
    mag = np.abs(ds)
    for axis, flag in ((0, bl), (1, bs)):
        if flag:
            n_terms *= ds.shape[axis]
            ds = ds.sum(axis=axis, keepdims=True)
            e_ds = e_ds.sum(axis=axis, keepdims=True)
            mag = mag.sum(axis=axis, keepdims=True)
    if n_terms > 1:
        g = gamma(n_terms)
        e_ds = (e_ds + g * mag) / (1.0 - g) * UP
    return ds, e_ds
