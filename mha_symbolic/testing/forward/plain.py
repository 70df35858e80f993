"""Float64 attention, evaluated in chunks of (batch·head, query rows): what the
tolerance model, the bug catalogue and the ``"flash"`` rule share.

Nothing here is a reference (the reference is the oracle's certified enclosure):
the float64 evaluation gives the weights and outputs that the error model and the
buggy variants need.  Memory is bounded by the chunk: the (rows × keys) arrays of
one chunk hold at most :data:`CHUNK_SCORES` elements, and only output-shaped arrays
are kept whole.

Broadcasting follows ``torch.nn.functional.scaled_dot_product_attention``: query
(..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, E_v), the leading
dimensions broadcast (a query may have fewer of them than key and value); with
``enable_gqa`` query head g uses key/value head g // (H_q / H_kv).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..call import AttentionCall
from ..tolerance import ErrorModel
from .model import HeadCache, attention_error_bound

__all__ = [
    "CHUNK_SCORES",
    "BugSwitches",
    "Chunk",
    "Plain",
    "fit_ratio",
    "plain_attention",
    "plain_in_dtype",
]

#: Scores per chunk (rows × keys): about 4 MB per float64 array of the chunk.
CHUNK_SCORES = 1 << 19
#: Scores per chunk of the tolerance model (:meth:`Plain.bound`): its ~100 elementwise
#: passes over (rows × keys) arrays run in the cache at 512 KB per array (issue 29:
#: 2× faster than at 4 MB; the values are those of any other chunking, up to the
#: float64 summation order of BLAS on matrices of another shape).
BOUND_CHUNK_SCORES = 1 << 16
#: ... and without any mask (no attn_mask, not causal, no dropout), twice as many rows
#: per chunk (2^17 scores: fewer, BLAS-friendlier blocks; issue 29) where the rows of a
#: chunk of :data:`BOUND_CHUNK_SCORES` are a multiple of :data:`BOUND_ROW_UNIT`: every
#: chunk then starts at a multiple of the unit in both chunkings and ends at the same
#: rows, so BLAS runs each row in the same microkernel (its tails at M mod unroll rows
#: sum in another order) and the tolerances are bit-identical (bench/tolerance_identity.py;
#: with S = 999 keys, 65 → 130 rows changed 62 of 44800 by one ulp).
BOUND_CHUNK_SCORES_FULL = 1 << 17
BOUND_ROW_UNIT = 32


@dataclass(frozen=True)
class BugSwitches:
    """Switches that turn the plain algorithm into the buggy variants of the catalogue."""

    softmax_axis: int = -1
    tile_gqa: bool = False
    causal_offset: int = 0
    invert_bool_mask: bool = False


@dataclass
class Chunk:
    """Rows ``rows`` of flat batch element ``b``: the operands of one evaluation."""

    b: int
    rows: slice
    q: np.ndarray                    # (R, E)
    k: np.ndarray                    # (S, E)
    v: np.ndarray                    # (S, Ev)
    allowed: np.ndarray              # (R, S) bool
    mask_add: np.ndarray | None      # (R, S) finite float mask
    kappa: np.ndarray | None         # (R, S) dropout multipliers keep/(1 - p)
    dead: np.ndarray                 # (R,) rows with no allowed key
    uniform: np.ndarray | None       # (R,) dead rows given uniform weights
    scale: float
    dq: np.ndarray | None = None
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None
    keys: slice | None = None        # allowed, mask_add, kappa hold only these keys
    nan_rows: np.ndarray | None = None  # (R,) dead rows whose output is NaN (the policy)

    def restricted(self) -> Chunk:
        """This chunk with ``allowed``, ``mask_add`` and ``kappa`` cut to the smallest
        range of keys that some row may see (issue 29: causal, window and block-sparse
        masks; uniform rows see every key; at least one key when S > 0, so that a chunk
        of rows without any key keeps its meaning).  ``k``, ``v``, ``dk``, ``dv`` stay
        the head's: :func:`.model.attention_error_bound` slices them (``keys=``)."""
        if self.uniform is not None and np.any(self.uniform):
            return self
        S = self.allowed.shape[1]
        cols = np.flatnonzero(np.any(self.allowed, axis=0))
        j0, j1 = (int(cols[0]), int(cols[-1]) + 1) if cols.size else (0, min(S, 1))
        if (j0, j1) == (0, S):
            return self

        def cut(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.ascontiguousarray(a[:, j0:j1])

        return replace(self, allowed=np.ascontiguousarray(self.allowed[:, j0:j1]),
                       mask_add=cut(self.mask_add),
                       kappa=cut(self.kappa), keys=slice(j0, j1))


class _Layout:
    """Shapes, broadcasting and the GQA head map of an :class:`AttentionCall`."""

    def __init__(self, x: AttentionCall, tile_gqa: bool) -> None:
        q, k, v = x.q, x.k, x.v
        self.L, self.E = q.shape[-2], q.shape[-1]
        self.S, self.Ev = v.shape[-2], v.shape[-1]
        self.rep = 1
        kl, vl = list(k.shape[:-2]), list(v.shape[:-2])
        if x.enable_gqa and q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
            hk = k.shape[-3]
            self.rep = q.shape[-3] // hk if hk else 1
            kl[-1] = vl[-1] = q.shape[-3]
        self.hk = k.shape[-3] if k.ndim >= 3 else 1
        self.tile = tile_gqa
        self.batch = tuple(np.broadcast_shapes(q.shape[:-2], tuple(kl), tuple(vl)))
        self.B = math.prod(self.batch)

    def index(self, lead: tuple[int, ...], idx: tuple[int, ...], gqa: bool) -> tuple[int, ...]:
        """The index into an array with leading shape ``lead`` for batch index ``idx``
        (right-aligned broadcasting; the head dimension mapped for GQA)."""
        off = len(idx) - len(lead)
        out = []
        for d, n in enumerate(lead):
            i = idx[off + d]
            if gqa and self.rep > 1 and d == len(lead) - 1:
                i = i % self.hk if self.tile else i // self.rep
            out.append(0 if n == 1 else i)
        return tuple(out)


def _mask_view(m: np.ndarray | None, lay: _Layout, idx: tuple[int, ...]) -> np.ndarray | None:
    if m is None:
        return None
    full = np.broadcast_to(m, (*lay.batch, lay.L, lay.S))
    return full[idx] if idx else full


class Plain:
    """The float64 plain evaluation of ``x`` (optionally a buggy ``variant``), chunked.

    ``out`` is the output (float64, the oracle's shape); :meth:`bound` the model's
    tolerance and vacuity, output-shaped; :meth:`fits` whether an actual output lies
    within a bound of this evaluation (stopping at the first misfit).

    >>> import numpy as np
    >>> x = AttentionCall(np.eye(2), np.eye(2), np.arange(4.0).reshape(2, 2), scale=0.0)
    >>> Plain(x).out.tolist()
    [[1.0, 2.0], [1.0, 2.0]]
    """

    def __init__(self, x: AttentionCall, variant: BugSwitches = BugSwitches()) -> None:
        self.x = x
        self.variant = variant
        self.layout = _Layout(x, variant.tile_gqa)
        self.shape = (*self.layout.batch, self.layout.L, self.layout.Ev)
        self._out: np.ndarray | None = None

    # ---- chunks
    def chunks(self, max_scores: int = CHUNK_SCORES) -> Iterator[Chunk]:
        x, lay, var = self.x, self.layout, self.variant
        L, S = lay.L, lay.S
        c = x.effective_scale
        step = L if var.softmax_axis != -1 else max(1, max_scores // max(S, 1))
        kappa_scale = 1.0 / (1.0 - x.dropout_p) if x.dropout_p < 1.0 else 0.0
        m = x.attn_mask
        views: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}   # one view per kv head
        for b in range(lay.B):
            idx = tuple(int(i) for i in np.unravel_index(b, lay.batch)) if lay.batch else ()
            qi = lay.index(x.q.shape[:-2], idx, False)
            ki = lay.index(x.k.shape[:-2], idx, True)
            vi = lay.index(x.v.shape[:-2], idx, True)
            q = x.q[qi]
            k = views.setdefault(("k", ki), x.k[ki])
            v = views.setdefault(("v", vi), x.v[vi])
            mb = _mask_view(m, lay, idx)
            db = _mask_view(x.dropout_mask, lay, idx)
            for i0 in range(0, L, step):
                i1 = min(L, i0 + step)
                allowed = np.ones((i1 - i0, S), dtype=bool)
                madd = None
                if x.is_causal:
                    off = var.causal_offset + (S - L if x.causal_alignment == "bottom_right"
                                               else 0)
                    allowed &= np.arange(S)[None, :] <= np.arange(i0, i1)[:, None] + off
                if mb is not None:
                    mr = mb[i0:i1]
                    if mr.dtype == np.bool_:
                        allowed &= ~mr if var.invert_bool_mask else mr
                    else:
                        mf = np.asarray(mr, dtype=np.float64)
                        allowed &= mf != -np.inf
                        madd = np.where(np.isfinite(mf), mf, 0.0)
                dead = ~np.any(allowed, axis=-1) if S else np.ones(i1 - i0, dtype=bool)
                policy = x.masked(dead, S)
                uniform = policy.uniform if policy.uniform.any() else None
                kappa = None
                if db is not None:
                    kappa = np.asarray(db[i0:i1], dtype=np.float64) * kappa_scale
                yield Chunk(
                    b, slice(i0, i1), q[i0:i1], k, v, allowed, madd, kappa, dead, uniform, c,
                    None if x.dq is None else x.dq[qi][i0:i1],
                    None if x.dk is None else x.dk[ki],
                    None if x.dv is None else x.dv[vi],
                    nan_rows=policy.nan if policy.nan.any() else None,
                )

    # ---- evaluation
    def _eval(self, ch: Chunk) -> np.ndarray:
        """The output rows of one chunk (float64)."""
        ax = self.variant.softmax_axis
        allowed, madd = ch.allowed, ch.mask_add
        S = ch.k.shape[0]
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            s = ch.scale * (ch.q @ ch.k.T)       # may overflow: a variant, not a bound
            if madd is not None:
                s = s + madd
        if ch.uniform is not None and np.any(ch.uniform):
            z = ch.uniform[:, None]
            allowed = allowed | z
            s = np.where(z, 0.0, s)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
            s = np.where(allowed, s, -np.inf)
            if s.shape[ax] == 0 or S == 0:
                p = np.zeros(s.shape)
            else:
                smax = np.max(s, axis=ax, keepdims=True)
                e = np.where(allowed, np.exp(s - np.where(np.isfinite(smax), smax, 0.0)), 0.0)
                tot = np.sum(e, axis=ax, keepdims=True)
                p = np.where(tot == 0, 0.0, e / np.where(tot == 0, 1.0, tot))
        if ch.kappa is not None:
            p = p * ch.kappa
        out = p @ ch.v
        if ch.nan_rows is not None and ax == -1:
            out = np.where(ch.nan_rows[:, None], np.nan, out)
        return np.asarray(out)

    @property
    def out(self) -> np.ndarray:
        if self._out is None:
            flat = np.zeros((self.layout.B, self.layout.L, self.layout.Ev))
            for ch in self.chunks():
                flat[ch.b, ch.rows] = self._eval(ch)
            self._out = flat.reshape(self.shape)
        return self._out

    def _bound_chunk(self, ch: Chunk, model: ErrorModel, head: HeadCache | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        b = attention_error_bound(
            ch.q, ch.k, ch.v, scale=ch.scale, allowed=ch.allowed, model=model,
            mask_add=ch.mask_add, kappa=ch.kappa, uniform_rows=ch.uniform,
            dq=ch.dq, dk=ch.dk, dv=ch.dv, softmax_axis=self.variant.softmax_axis,
            head=head, keys=ch.keys)
        return b.tol, b.vacuous

    def _bound_chunks(self, model: ErrorModel, progress: Any = None
                      ) -> Iterator[tuple[Chunk, np.ndarray, np.ndarray]]:
        """(chunk, tolerance, vacuous) in chunks of :data:`BOUND_CHUNK_SCORES`, the
        scaled keys and values computed once per key/value head (the query heads of a
        GQA group and the batch elements broadcast over one key head come one after
        another and share its arrays); ``progress``: a bar to advance by each chunk's
        rows.  Only the keys some row of a chunk may see are computed
        (:meth:`Chunk.restricted`; softmax over the keys)."""
        head = HeadCache()
        skip = self.variant.softmax_axis == -1
        for ch in self.chunks(self._bound_chunk_scores()):
            tol, vac = self._bound_chunk(ch.restricted() if skip else ch, model, head)
            if progress is not None:
                progress.update(ch.rows.stop - ch.rows.start)
            yield ch, tol, vac

    def _bound_chunk_scores(self) -> int:
        """The scores per chunk of :meth:`_bound_chunks` (:data:`BOUND_CHUNK_SCORES_FULL`)."""
        x, S = self.x, max(self.layout.S, 1)
        step = BOUND_CHUNK_SCORES // S
        if (x.attn_mask is None and not x.is_causal and x.dropout_mask is None
                and self.variant.softmax_axis == -1 and step and step % BOUND_ROW_UNIT == 0
                and 2 * step * S <= BOUND_CHUNK_SCORES_FULL):
            return 2 * step * S
        return BOUND_CHUNK_SCORES

    def events(self) -> tuple[float, float]:
        """Probabilistic events of one check (for the λs): the bound elements, and the
        terms of the sums bounded by Higham & Mary (the 2S terms of each weighted sum
        and of each row's softmax sum)."""
        lay = self.layout
        n_out = lay.B * lay.L * lay.Ev
        return float(n_out), float(2 * lay.S * (n_out + lay.B * lay.L) + 1)

    def bound(self, model: ErrorModel, progress: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(tolerance, vacuous) of every output element, output-shaped (``progress``: a
        bar advanced by the rows done, or None)."""
        lay = self.layout
        tol = np.zeros((lay.B, lay.L, lay.Ev))
        vac = np.zeros((lay.B, lay.L, lay.Ev), dtype=bool)
        for ch, t, v in self._bound_chunks(model, progress):
            tol[ch.b, ch.rows], vac[ch.b, ch.rows] = t, v
        return tol.reshape(self.shape), vac.reshape(self.shape)

    def fits(self, actual: np.ndarray, model: ErrorModel, safety: float) -> tuple[bool, float]:
        """Is ``actual`` (output-shaped) within ``safety`` × this evaluation's bound of
        its output everywhere (NaN matching NaN)?  Returns (fits, worst ratio),
        stopping at the first chunk that does not fit."""
        a = np.asarray(actual, dtype=np.float64).reshape(self.layout.B, self.layout.L, -1)
        worst = 0.0
        for ch in self.chunks():
            out = self._eval(ch)
            tol, _ = self._bound_chunk(ch, model)
            w = fit_ratio(a[ch.b, ch.rows], out, tol, safety)
            worst = max(worst, w)
            if w > 1.0:
                return False, worst
        return True, worst


def fit_ratio(actual: np.ndarray, out: np.ndarray, tol: np.ndarray, safety: float) -> float:
    """max |actual − out| / (safety × tol) (NaN matching NaN; a slack of 1e-12 of the
    terms for the float64 evaluation of ``out`` itself); ≤ 1 means ``actual`` fits.

    >>> import numpy as np
    >>> round(fit_ratio(np.array([1.0, np.nan]), np.array([1.5, np.nan]), np.ones(2), 1.0), 9)
    0.5
    """
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        both_nan = np.isnan(actual) & np.isnan(out)
        slack = safety * tol + 1e-12 * (np.abs(out) + tol)
        err = np.where(both_nan, 0.0, np.abs(actual - out))
        err = np.where(np.isnan(err), np.inf, err)
        ratio = np.where(err == 0, 0.0, err / np.where(slack > 0, slack, np.inf))
    return float(np.max(ratio, initial=0.0))


def plain_attention(x: AttentionCall, **switches: Any) -> Plain:
    """:class:`Plain` of ``x``; keyword switches (``softmax_axis``, ``tile_gqa``,
    ``causal_offset``, ``invert_bool_mask``) select a buggy variant."""
    return Plain(x, BugSwitches(**switches))


# --------------------------------------------------------------------------------------
# A plain implementation in a given dtype, simulated (for the FlashAttention-style rule)

# work dtype of a plain implementation whose tensors are stored in `dtype`: fp16 and
# bf16 kernels multiply-accumulate and take softmax in float32 (cuBLAS, the PyTorch MATH
# path and FlashAttention all do); fp32 and fp64 work in their own dtype.
_WORK = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}


@dataclass
class SimulatedRun:
    """The output of the simulated plain same-dtype kernel (float64 values) and the
    number of elements where it overflowed (non-finite output for a finite answer)."""

    out: np.ndarray
    n_overflow: int = 0
    overflow_index: tuple[int, ...] | None = field(default=None)


def plain_in_dtype(x: AttentionCall, dtype: object, work: object | None = None) -> SimulatedRun:
    """What a plain same-dtype implementation outputs (float64 array of its values).

    Every tensor it stores is rounded to ``dtype``: the inputs, the scaled query, the
    scores (after the mask), the weights P, the output; the products and the softmax
    run in ``work`` (float32 for fp16/bf16 by default).  This is the "out_pt" of
    FlashAttention's tests, computed here instead of by a second implementation.  A
    score beyond the dtype's range (float16: 65504) overflows as it would in the
    kernel; such elements are counted, not hidden.

    >>> import numpy as np
    >>> x = AttentionCall(*(np.ones((1, 2, 2)) for _ in range(3)))
    >>> plain_in_dtype(x, np.float16).out.tolist()
    [[[1.0, 1.0], [1.0, 1.0]]]
    """
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    wk = np.dtype(work if work is not None else _WORK[dt.name])  # type: ignore[call-overload]
    pl = Plain(x)
    lay = pl.layout
    flat = np.zeros((lay.B, lay.L, lay.Ev))

    def st(a: np.ndarray) -> np.ndarray:          # store: round to dtype, back to work
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(a).astype(dt).astype(wk)

    for ch in pl.chunks():
        q, k, v = st(ch.q), st(ch.k), st(ch.v)
        allowed = ch.allowed
        with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
            qs = st(q * wk.type(ch.scale))
            s = st(qs @ k.T)
            if ch.mask_add is not None:
                s = st(s + st(ch.mask_add))
            if ch.uniform is not None and np.any(ch.uniform):
                allowed = allowed | ch.uniform[:, None]
                s = np.where(ch.uniform[:, None], 0.0, s).astype(wk)
            s = np.where(allowed, s, -np.inf)
            if s.shape[-1] == 0:
                p = np.zeros(s.shape, dtype=wk)
            else:
                smax = np.max(s, axis=-1, keepdims=True)
                e = np.where(allowed, np.exp(s - np.where(np.isfinite(smax), smax, 0)), 0)
                tot = np.sum(e, axis=-1, keepdims=True)
                p = np.where(tot == 0, 0, e / np.where(tot == 0, 1, tot)).astype(wk)
            p = st(p)
            if ch.kappa is not None:
                p = st(p * ch.kappa.astype(wk))
            out = st(p @ v).astype(np.float64)
        if ch.nan_rows is not None:
            out = np.where(ch.nan_rows[:, None], np.nan, out)
        flat[ch.b, ch.rows] = out
    out = flat.reshape(pl.shape)
    bad = ~np.isfinite(out)
    if x.masked_rows == "nan":
        bad &= ~np.isnan(Plain(replace(x)).out)
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if np.any(bad) else None
    return SimulatedRun(out, int(np.sum(bad)), first)
