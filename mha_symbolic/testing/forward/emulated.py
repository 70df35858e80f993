"""The dtype level of a verdict: how far do *correct* kernels of the stated precision
err on these very inputs?

The rounding-error model (:mod:`.attention_bound`) bounds every summation order a
kernel might use, every rounding at the worst place its analysis allows; it is a
sound ceiling, and a test built on it alone passes precision bugs whose error is
hundreds of times a real kernel's (P rounded to float16 in a float32 kernel, a float16
KV cache, TF32 matmuls: issue 22).  This module measures instead: it runs the
summation orders that real kernels use, in the kernel's own formats, on the caller's
inputs, and takes their error against the exact answer as the yardstick:

``gemm``
    scores by one matrix product in the accumulation dtype, a max-subtracted softmax,
    P·V by one matrix product (torch's MATH backend, XLA, an op-by-op kernel); the
    scale rounded to the accumulation dtype; an eager kernel (``kernel="eager"``)
    also stores the scores and P in the output dtype, ``"eager_scaled_query"`` the
    scaled query;
``online``
    FlashAttention-2's forward: key blocks of :data:`BLOCK` visited from the last to
    the first, scores scaled by the rounded constant c·log2(e) and exponentiated in
    base 2, the running maximum and sum rescaled at every block, the unnormalised
    weights stored in the output dtype before P·V (when it is narrower than the
    accumulation), one division at the end.

For each group of rows (one batch × head element, a block of query rows: the chunks
of :class:`~.plain.Plain`) the worst error of the emulations relative to the
element's natural scale ``a = Σ_j p_j |v_j|`` is ``r``; the dtype tolerance of an
element is ::

    DTYPE_FACTOR · r · a  +  FLOOR_UA · u_a · a  +  FLOOR_P · u_P · sqrt(Σ_j p_j² v_j²)
                          +  ulp(exact)      (output dtype)

the middle two a floor for small rows whose emulations happen to be exact (u_P the
unit roundoff of the stored weights: the output's when narrower than the
accumulation), the last the kernel's own final store.  A kernel beyond it is "wrong
for its dtype": its error is more than DTYPE_FACTOR times what correct kernels of that
precision make here.  The
factor and the false-alarm rate are measured on correct kernels that this module was
not written around (bench/bench_verdicts.py, bench/verdict_kernels.py; docs/testing.md
§ "The dtype level").  Rows where every emulation overflows (float16 scores beyond
65504) have no dtype level: they are left to the model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...oracle.arith.formats import FloatFormat
from ..call import AttentionCall
from ..tolerance import ErrorModel, ulp, unit_roundoff
from .model_jit import kernels
from .plain import Chunk, Plain

__all__ = ["BLOCK", "DTYPE_FACTOR", "FLOOR_P", "FLOOR_UA", "DtypeLevel", "dtype_level"]

#: The dtype tolerance is this many times the worst error of the emulated correct
#: kernels (measured: bench/RESULTS.md, issue 22).
DTYPE_FACTOR = 4.0
#: A floor of this many accumulation roundings of the natural scale Σ p|v|.
FLOOR_UA = 2.0
#: and of this many roundings of each weight, independent: FLOOR_P u_P sqrt(Σ p²v²)
FLOOR_P = 4.0
#: Accumulators of the vector-dot-product order (a GEMV, a SIMD loop over the keys:
#: each sums every LANES-th key one term at a time); kernel="sequential" uses 1.
LANES = 4
#: rows whose scores' rounding bound exceeds this are left to the model (DtypeLevel.unstable)
UNSTABLE_SCORE = 2.0**-4
#: The orders that cost L·S·E_v elementwise operations run on this many rows of
#: each row group (evenly spaced; their relative error stands for the group's).
SAMPLE_ROWS = 8
#: FlashAttention-2's key block (64 for head dims up to 128 on most GPUs).
BLOCK = 64
_LOG2E = math.log2(math.e)


@dataclass
class DtypeLevel:
    """The emulated correct kernels of one check: their outputs (float64, the output's
    shape; NaN where one overflowed), the natural scale ``a`` and the row groups."""

    outputs: tuple[np.ndarray, ...]
    a: np.ndarray
    groups: list[tuple[int, slice]]
    shape: tuple[int, ...]
    model: ErrorModel
    names: tuple[str, ...]
    #: sqrt(Σ_j p_j² v_j²): the scale of independent errors of the weights
    a2: np.ndarray | None = None
    #: the unit roundoff of the stored weights (the output's when narrower)
    u_p: float = 0.0
    #: max |v| (times the dropout multiplier) per flat batch element, and S
    vmax: np.ndarray | None = None
    n_keys: int = 0
    #: (B, L) rows whose scores a correct kernel may round by more than UNSTABLE_SCORE
    #: (huge queries): there a different summation order can move the weights by O(1)
    #: (even flip the top key) where every emulation agrees, so the level is no yardstick
    #: and the rows are left to the model (review of 2026-12-03: q ~ 1e150, near-equal
    #: keys, a correct float64 kernel failed at 6.7e14x)
    unstable: np.ndarray | None = None

    #: the last call of :meth:`tolerance`: (mid, factor, result); a check asks twice,
    #: before and after refining the enclosure, mostly with the same midpoint
    _memo: Any = field(default=None, init=False, repr=False, compare=False)

    def tolerance(self, mid: np.ndarray, factor: float = DTYPE_FACTOR
                  ) -> tuple[np.ndarray, np.ndarray, float]:
        """(tolerance, undecided, worst): the dtype tolerance of every element against
        the exact midpoint ``mid``; ``undecided`` marks rows no emulation could run
        (overflow); ``worst`` the largest emulated error (for the report).  The arrays
        are read-only (a second call with an equal midpoint returns them again)."""
        mid = np.asarray(mid, np.float64)
        if self._memo is not None:
            m0, f0, res = self._memo
            if f0 == factor and m0.shape == mid.shape and np.array_equal(
                    m0, mid, equal_nan=True):
                return res
        res = self._tolerance(mid, factor)
        if self.unstable is not None and np.any(self.unstable):
            B = math.prod(self.shape[:-2])
            und = res[1].reshape(B, *self.shape[-2:]) | self.unstable[:, :, None]
            res = (res[0], und.reshape(self.shape), res[2])
        for arr in res[:2]:
            arr.flags.writeable = False
        self._memo = (mid.copy(), factor, res)
        return res

    def _tolerance(self, mid: np.ndarray, factor: float
                   ) -> tuple[np.ndarray, np.ndarray, float]:
        L, Ev = self.shape[-2], self.shape[-1]
        B = math.prod(self.shape[:-2])
        m = np.asarray(mid, np.float64).reshape(B, L, Ev)
        a = self.a.reshape(B, L, Ev)
        outs = [o.reshape(B, L, Ev) for o in self.outputs]
        ua = unit_roundoff(self.model.acc)
        worst = 0.0
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            # r: the worst relative error of every emulation over the whole check
            # (pooled: one row's features share its weights' errors, so a group of few
            # rows is few samples)
            fused = self._fused(m, a, outs, factor, ua)
            if fused is not None:   # the same values in compiled passes (model_jit)
                return fused
            r = 0.0
            ok_any = np.zeros((B, L), bool)
            m_fin, m_nan = np.isfinite(m), np.isnan(m)       # the same for every emulation
            a_pos = a > 0
            all_pos = bool(np.all(a_pos))
            a_safe = a if all_pos else np.where(a_pos, a, 1.0)
            for o in outs:
                fin = np.isfinite(o) & m_fin
                ok_any |= np.all(fin | m_nan, axis=-1) & ~np.all(np.isnan(o), axis=-1)
                err = np.abs(o - m)
                if not np.all(fin):
                    err = np.where(fin, err, 0.0)
                if err.size:
                    worst = max(worst, float(np.max(err)))
                # where every a > 0: the masked err is 0 where not finite, so is err / a
                rel = err / a_safe if all_pos else np.where(fin & a_pos, err / a_safe, 0.0)
                if rel.size:
                    r = max(r, float(np.max(rel)))
            # every element at once (the row groups share r; the same operations per
            # element as group by group), rows outside every group left at 0 / decided
            t = (factor * r + FLOOR_UA * ua) * a
            if self.a2 is not None:
                t = t + FLOOR_P * self.u_p * self.a2.reshape(B, L, Ev)
            flush_t = self._flush_term()
            if flush_t is not None:
                t = t + flush_t[:, None, None]
            # undecided: no emulation ran the row; a level that allows the whole
            # natural scale is no test; a scale the emulation could not give (NaN
            # from an overflow, 0 from weights that underflowed where the exact
            # value is not 0)
            bad_scale = ~np.isfinite(t) | (a == 0) & (m != 0) & ~m_nan
            und = ~ok_any[:, :, None] | (t >= a) & (a > 0) | bad_scale
            tol = np.where(bad_scale, 0.0, t)
            covered = self._covered(B, L)
            if not np.all(covered):
                tol = np.where(covered[:, :, None], tol, 0.0)
                und = und & covered[:, :, None]
            tol += ulp(m, self.model.fmt)
        return tol.reshape(self.shape), und.reshape(self.shape), worst

    def _flush_term(self) -> np.ndarray | None:
        """Per flat batch element, what a kernel flushing subnormals may lose on top
        (the model's term: 4 η_a (n (max|v| + 1) + 1), η_a the smallest normal, plus the
        output's smallest normal); None when it does not flush."""
        if not (self.model.flush and self.vmax is not None):
            return None
        return np.asarray(4 * math.ldexp(1.0, self.model.acc.emin) * (
            self.n_keys * (np.asarray(self.vmax, np.float64) + 1) + 1) + math.ldexp(
            1.0, self.model.fmt.emin))

    def _covered(self, B: int, L: int) -> np.ndarray:
        covered = np.zeros((B, L), bool)
        for b, rows in self.groups:
            covered[b, rows] = True
        return covered

    def _fused(self, m: np.ndarray, a: np.ndarray, outs: list[np.ndarray], factor: float,
               ua: float) -> tuple[np.ndarray, np.ndarray, float] | None:
        """:meth:`_tolerance` in compiled passes (forward/model_jit: one per emulation,
        one for the tolerance; the same operations), or None without numba."""
        B, L, Ev = a.shape
        kern = kernels() if a.size else None
        if kern is None:
            return None
        N = B * L
        m2, a2 = (np.ascontiguousarray(x_).reshape(N, Ev) for x_ in (m, a))
        all_pos = bool(np.all(a2 > 0))
        ok_any, res = np.zeros(N, bool), np.empty(2)
        worst, r = 0.0, 0.0
        for o in outs:
            kern.level_errors(np.ascontiguousarray(o).reshape(N, Ev), m2, a2, all_pos,
                              ok_any, res)
            worst = max(worst, float(res[0]))
            r = max(r, float(res[1]))
        fmt = self.model.fmt
        flush_t = self._flush_term()
        tol, und = np.empty((N, Ev)), np.empty((N, Ev), bool)
        kern.level_tolerance(
            a2, a2 if self.a2 is None else np.ascontiguousarray(self.a2).reshape(N, Ev),
            self.a2 is not None, m2, ok_any, self._covered(B, L).reshape(N),
            np.zeros(B) if flush_t is None else np.ascontiguousarray(flush_t, np.float64),
            flush_t is not None, L, factor * r + FLOOR_UA * ua, FLOOR_P * self.u_p, math.ldexp(1.0, fmt.emin),
            math.ldexp(1.0, max(-1, fmt.emin)), math.ldexp(1.0, 1 - fmt.p), tol, und)
        return tol.reshape(self.shape), und.reshape(self.shape), worst


def _np_dtype(f: FloatFormat) -> np.dtype:
    return f.numpy_dtype()


def dtype_level(x: AttentionCall, model: ErrorModel, progress: Any = None
                ) -> DtypeLevel | None:
    """The emulated correct kernels of ``x`` in the formats of ``model``; None for
    formats the emulation does not cover (fp8 outputs or weights, accumulation in a
    16-bit format): the model alone judges those.  ``progress``: a bar advanced by the
    rows done, or None."""
    if model.fmt.p < 8 or model.weights is not None or model.acc.p < 24:
        return None   # fp8, and sums in 16 bits (numpy's own 16-bit products are not those)
    if x.q.shape[-2] == 0 or x.v.shape[-1] == 0 or x.v.shape[-2] == 0:
        return None   # nothing to emulate: an empty output, or rows with no key
    dt, wk = _np_dtype(model.fmt), _np_dtype(model.acc)
    if wk.itemsize < dt.itemsize:   # accumulation narrower than the output: as stated
        wk = dt
    pl = Plain(x)
    lay = pl.layout
    kname = model.kernel.name
    # each run: the chunk and whether its float64 weights are wanted (the last run that
    # has weights gives the natural scales) -> (output, weights or None)
    runs: list[tuple[str, Callable[[Chunk, _Cast, bool],
                                   tuple[np.ndarray, np.ndarray | None]]]]
    shared = _SharedGemm()
    # (the operands in ``wk`` are cast once per chunk and shared by every run: _Cast)
    if kname in ("fused", "sequential"):
        lanes = 1 if kname == "sequential" else LANES
        runs = [("gemm", lambda ch, cw, want: shared.plain(ch, dt, wk, want, cw)),
                ("online", lambda ch, cw, want: _online(ch, dt, wk, cw)),
                (f"{lanes} accumulator{'s' if lanes > 1 else ''}",
                 lambda ch, cw, want: _lanes(ch, dt, wk, lanes, cw)),
                ("gemm, q and k scaled by √c", lambda ch, cw, want: _gemm(
                    ch, dt, wk, stores=0, scaled_query=False, store_p=False, split_scale=True,
                    want_p=want, cw=cw))]
        if dt != wk:     # the plain gemm's weights, stored: its scores and softmax reused
            runs.append(("gemm with P stored",
                         lambda ch, cw, want: shared.stored(ch, dt, wk, want, cw)))
    else:
        sq = model.kernel.scaled_query
        runs = [("gemm", lambda ch, cw, want: _gemm(
            ch, dt, wk, stores=model.kernel.score_stores, scaled_query=sq, store_p=True,
            want_p=want, cw=cw))]
    last_with_p = max(i for i, (name, _) in enumerate(runs) if name.startswith("gemm"))
    flats = [np.zeros((lay.B, lay.L, lay.Ev)) for _ in runs]
    a = np.zeros((lay.B, lay.L, lay.Ev))
    a2 = np.zeros((lay.B, lay.L, lay.Ev))
    vmax = np.zeros(lay.B)
    kap = 1.0 / (1.0 - x.dropout_p) if 0 < x.dropout_p < 1 else 1.0
    groups: list[tuple[int, slice]] = []
    unstable = np.zeros((lay.B, lay.L), bool)
    ua_acc = unit_roundoff(model.acc)
    g_acc = (lay.E + 2) * ua_acc / (1.0 - (lay.E + 2) * ua_acc)
    for ch in pl.chunks():
        groups.append((ch.b, ch.rows))
        vmax[ch.b] = kap * float(np.max(np.abs(ch.v), initial=0.0))
        with np.errstate(over="ignore", invalid="ignore"):
            kmax = float(np.max(_norms(ch.k), initial=0.0))
            sig = g_acc * abs(ch.scale) * _norms(ch.q) * kmax
        unstable[ch.b, ch.rows] = _unstable_rows(ch, sig)
        last_p = None
        cw = _Cast(ch, wk)
        for i, (flat, (_, run)) in enumerate(zip(flats, runs, strict=True)):
            out, p64 = run(ch, cw, i == last_with_p)
            if ch.nan_rows is not None:
                out = np.where(ch.nan_rows[:, None], np.nan, out)
            flat[ch.b, ch.rows] = out
            if p64 is not None:
                last_p = p64
        if last_p is not None:      # the natural scales from the last run's weights
            a[ch.b, ch.rows] = last_p @ np.abs(ch.v)
            # (last_p is this function's own float64 copy: squared in place)
            a2[ch.b, ch.rows] = _root_sq(np.multiply(last_p, last_p, out=last_p), ch.v)
        if progress is not None:
            progress.update(ch.rows.stop - ch.rows.start)
    shape = pl.shape
    return DtypeLevel(tuple(f.reshape(shape) for f in flats), a.reshape(shape), groups,
                      shape, model, tuple(n for n, _ in runs), a2.reshape(shape),
                      unit_roundoff(model.fmt) if dt != wk else unit_roundoff(model.acc),
                      vmax, lay.S, unstable)


def _norms(x: np.ndarray) -> np.ndarray:
    """Row 2-norms without overflow (rows scaled by their largest magnitude first)."""
    m = np.max(np.abs(x), axis=-1, initial=0.0)
    safe = np.where(m > 0, m, 1.0)
    return m * np.sqrt(np.sum((x / safe[:, None]) ** 2, axis=-1))


def _unstable_rows(ch: Chunk, sig: np.ndarray) -> np.ndarray:
    """Rows whose scores' rounding bound ``sig`` exceeds UNSTABLE_SCORE and whose top
    score has another allowed key within 4·sig + 50 of it: there a correct kernel's
    summation order may move the weights by O(1) (the emulations cannot sample that).
    Rows whose other keys are all far below the top (one-hot at huge scores) stay: every
    correct kernel gives them the top key's value."""
    out = ~(sig <= UNSTABLE_SCORE)
    if not np.any(out):
        return out
    rows = np.flatnonzero(out)
    with np.errstate(over="ignore", invalid="ignore"):
        sc = (ch.q[rows] @ ch.k.T) * ch.scale
    allowed = ch.allowed[rows]
    if ch.keys is not None:
        sc = sc[:, ch.keys]
    sc = np.where(allowed, sc, -np.inf)
    if sc.shape[-1] < 2:
        out[rows] = False
        return out
    top2 = -np.sort(-sc, axis=-1)[:, :2]
    with np.errstate(invalid="ignore"):
        near = ~((top2[:, 0] - top2[:, 1]) > 4.0 * sig[rows] + 50.0)
    out[rows] = near & np.isfinite(top2[:, 0])
    return out


def _root_sq(pp: np.ndarray, v: np.ndarray) -> np.ndarray:
    """sqrt(Σ_j p_j² v_j²) per row and feature from the squared weights ``pp = p·p``;
    where v_j² overflows (|v| above 2^511, issue 30: 0 · inf would be NaN and leave the
    level undecided) the same in the units 2^e > max|v|: sqrt(Σ p² (v 2^-e)²) 2^e (exact
    scalings)."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.sqrt(pp @ (v * v))
    if np.all(np.isfinite(r)):
        return r
    m = float(np.max(np.abs(v), initial=0.0))
    e = math.frexp(m)[1] if m > 0 and math.isfinite(m) else 0
    vs = np.ldexp(v, -e)
    return np.where(np.isfinite(r), r, np.ldexp(np.sqrt(pp @ (vs * vs)), e))


def store(a: np.ndarray, dt: np.dtype, wk: np.dtype) -> np.ndarray:
    """``a`` rounded to ``dt`` (a store), back in the work dtype ``wk``."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(a).astype(dt).astype(wk)


def exp_shifted(s: np.ndarray, allowed: np.ndarray, wk: np.dtype) -> np.ndarray:
    """exp(s − rowmax s) in ``wk`` where allowed, 0 elsewhere (a row with no finite
    score is shifted by 0)."""
    m = np.max(s, axis=-1, keepdims=True)
    return _kept(allowed, np.exp(s - np.where(np.isfinite(m), m, wk.type(0))),
                 wk.type(0)).astype(wk, copy=False)


def _kept(mask: np.ndarray, a: np.ndarray, fill: Any) -> np.ndarray:
    """``np.where(mask, a, fill)``: ``a`` itself where the mask keeps everything (the
    same values without the pass; ``a`` is then not copied)."""
    return a if mask.all() else np.where(mask, a, fill)


def normalised(e: np.ndarray, tot: np.ndarray, wk: np.dtype) -> np.ndarray:
    """e / tot in ``wk``, 0 for a row whose sum is 0."""
    zero = tot == 0
    if not zero.any():                  # the same values without the two selections
        return (e / tot).astype(wk, copy=False)
    return np.where(zero, wk.type(0), e / np.where(zero, wk.type(1), tot)).astype(wk)


class _Cast:
    """The operands of one chunk in the work dtype ``wk``, cast once and shared by every
    emulated run on the chunk (the same ``astype`` values each run made on its own);
    the mask's additive terms scaled for base 2 (the online order) are made on first
    use."""

    def __init__(self, ch: Chunk, wk: np.dtype) -> None:
        self.q, self.k, self.v = ch.q.astype(wk), ch.k.astype(wk), ch.v.astype(wk)
        self.mask_add = None if ch.mask_add is None else ch.mask_add.astype(wk)
        self.kappa = None if ch.kappa is None else ch.kappa.astype(wk)
        self._ch, self._wk = ch, wk
        self._madd2: np.ndarray | None = None

    def mask_add_log2e(self) -> np.ndarray | None:
        if self._ch.mask_add is None:
            return None
        if self._madd2 is None:
            self._madd2 = (self._ch.mask_add * _LOG2E).astype(self._wk)
        return self._madd2


def _store_inplace(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    """:func:`store` into ``a`` itself (its dtype the work dtype): the same values
    (bit for bit, NaN payloads included).  A contiguous float32 array stored to
    bfloat16 / float16 goes through the integer kernels of :mod:`._store_kernels`
    (with numba: ~5× faster than the two ``astype``; their NaNs redone by ``astype``)."""
    kern = _store_kernel(a, dt)
    if kern is not None:
        if kern(a.reshape(-1).view(np.uint32)):
            nan = np.isnan(a)
            with np.errstate(invalid="ignore"):
                a[nan] = a[nan].astype(dt)
        return a
    with np.errstate(over="ignore", invalid="ignore"):
        a[...] = a.astype(dt)
    return a


_STORE_KERNELS: list[Any] = []


def _store_kernel(a: np.ndarray, dt: np.dtype) -> Any:
    """The compiled in-place store of float32 ``a`` to ``dt``, or None (numba missing
    or disabled by ``MHA_SYMBOLIC_NUMBA=0``, another dtype, a non-contiguous array)."""
    if a.dtype != np.float32 or not a.flags.c_contiguous or a.size == 0 or (
            dt.name not in ("float16", "bfloat16")):
        return None
    if os.environ.get("MHA_SYMBOLIC_NUMBA", "1") == "0":
        return None
    if not _STORE_KERNELS:
        try:
            from . import _store_kernels
        except ImportError:
            _STORE_KERNELS.append(None)
        else:
            _STORE_KERNELS.append(_store_kernels)
    sk = _STORE_KERNELS[0]
    if sk is None:
        return None
    return sk.f16_inplace if dt.name == "float16" else sk.bf16_inplace


def _where_inplace(a: np.ndarray, keep: np.ndarray, fill: Any) -> np.ndarray:
    """``_kept(keep, a, fill)`` written into ``a`` (``a`` owned by the caller)."""
    if not keep.all():
        np.copyto(a, fill, where=~keep)
    return a


def _scores(ch: Chunk, dt: np.dtype, wk: np.dtype, stores: int,
            scaled_query: bool, split_scale: bool = False, cw: _Cast | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """(scores in wk with -inf where masked, allowed); ``split_scale``: q and k each
    multiplied by √c first (torch's MATH backend).  The result is a fresh array (the
    caller may overwrite it)."""
    cw = _Cast(ch, wk) if cw is None else cw
    q, k = cw.q, cw.k
    c = wk.type(ch.scale)
    allowed = ch.allowed
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if split_scale:
            r = wk.type(math.sqrt(abs(ch.scale)))
            s = ((q * (r if ch.scale >= 0 else -r)).astype(wk) @ (k * r).astype(wk).T)
        elif scaled_query:
            s = _store_inplace(_store_inplace(q * c, dt) @ k.T, dt)
        else:
            s = q @ k.T
            if stores:
                _store_inplace(s, dt)
            s *= c
            if stores:
                _store_inplace(s, dt)
        if s.dtype != wk:
            s = s.astype(wk)
        if cw.mask_add is not None:
            s += cw.mask_add
            if stores:
                _store_inplace(s, dt)
        if ch.uniform is not None and np.any(ch.uniform):
            allowed = allowed | ch.uniform[:, None]
            s[ch.uniform] = wk.type(0)
        _where_inplace(s, allowed, wk.type(-np.inf))
    return s, allowed


def _gemm_weights(ch: Chunk, dt: np.dtype, wk: np.dtype, *, stores: int, scaled_query: bool,
                  split_scale: bool = False, cw: _Cast | None = None) -> np.ndarray:
    """The weights of the one-matrix-product order in ``wk`` (the dropout multipliers
    applied), before any store of P; (R, 0) for a chunk with no key.  The passes run in
    place on the scores' array (the values of :func:`exp_shifted`, :func:`normalised`)."""
    cw = _Cast(ch, wk) if cw is None else cw
    s, allowed = _scores(ch, dt, wk, stores, scaled_query, split_scale, cw)
    if s.shape[1] == 0:
        return s
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        s -= np.where(np.isfinite(m), m, wk.type(0))
        e = _where_inplace(np.exp(s, out=s), allowed, wk.type(0))
        tot = np.sum(e, axis=-1, keepdims=True)
        zero = tot == 0
        if not zero.any():
            e /= tot
        else:
            e = np.where(zero, wk.type(0), e / np.where(zero, wk.type(1), tot)).astype(wk)
        if cw.kappa is not None:
            e *= cw.kappa
    return e


def _gemm_out(ch: Chunk, p: np.ndarray, dt: np.dtype, wk: np.dtype, store_p: bool,
              want_p: bool, cw: _Cast | None = None, inplace: bool = False
              ) -> tuple[np.ndarray, np.ndarray | None]:
    """P·V by one matrix product (P stored in ``dt`` first when ``store_p``; into ``p``
    itself when ``inplace``), and the float64 weights when ``want_p``."""
    R, S = p.shape
    if S == 0:
        return np.zeros((R, ch.v.shape[1])), np.zeros((R, 0))
    v = ch.v.astype(wk) if cw is None else cw.v
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        if store_p and dt != wk:
            p = _store_inplace(p if inplace else p.copy(), dt)
        out = (p @ v).astype(np.float64)
    return out, p.astype(np.float64) if want_p else None


def _gemm(ch: Chunk, dt: np.dtype, wk: np.dtype, *, stores: int, scaled_query: bool,
          store_p: bool, split_scale: bool = False, want_p: bool = True,
          cw: _Cast | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    p = _gemm_weights(ch, dt, wk, stores=stores, scaled_query=scaled_query,
                      split_scale=split_scale, cw=cw)
    return _gemm_out(ch, p, dt, wk, store_p, want_p, cw, inplace=True)


class _SharedGemm:
    """The fused kernels' plain gemm and its P-stored twin on one chunk: the same
    scores and softmax (the same operations on the same arrays), computed once."""

    def __init__(self) -> None:
        self._ch: Chunk | None = None
        self._p: np.ndarray | None = None

    def _weights(self, ch: Chunk, dt: np.dtype, wk: np.dtype, cw: _Cast | None
                 ) -> np.ndarray:
        if self._ch is not ch or self._p is None:
            self._ch, self._p = ch, _gemm_weights(ch, dt, wk, stores=0, scaled_query=False,
                                                  cw=cw)
        return self._p

    def plain(self, ch: Chunk, dt: np.dtype, wk: np.dtype, want_p: bool,
              cw: _Cast | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        return _gemm_out(ch, self._weights(ch, dt, wk, cw), dt, wk, False, want_p, cw)

    def stored(self, ch: Chunk, dt: np.dtype, wk: np.dtype, want_p: bool,
               cw: _Cast | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        # the last use of the weights: stored in place
        out = _gemm_out(ch, self._weights(ch, dt, wk, cw), dt, wk, True, want_p, cw,
                        inplace=True)
        self._ch = self._p = None           # the chunk is done
        return out


def _online(ch: Chunk, dt: np.dtype, wk: np.dtype, cw: _Cast | None = None
            ) -> tuple[np.ndarray, None]:
    """FlashAttention-2's forward over key blocks, last block first, in base 2 (the
    full blocks' passes in place in buffers allocated once per chunk)."""
    cw = _Cast(ch, wk) if cw is None else cw
    q, k, v = cw.q, cw.k, cw.v
    R, S = q.shape[0], k.shape[0]
    Ev = v.shape[1]
    c2 = wk.type(ch.scale * _LOG2E)
    allowed = ch.allowed
    madd = cw.mask_add_log2e()
    uni = ch.uniform[:, None] if ch.uniform is not None and np.any(ch.uniform) else None
    m = np.full((R, 1), -np.inf, wk)
    lsum = np.zeros((R, 1), wk)
    acc = np.zeros((R, Ev), wk)
    store_p = dt != wk
    s_full, p_full, pv = np.empty((R, BLOCK), wk), np.empty((R, BLOCK), wk), np.empty((R, Ev), wk)
    kern = _online_kernels(wk, uni)
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        for j1 in range(S, 0, -BLOCK):
            j0 = max(0, j1 - BLOCK)
            if j1 - j0 == BLOCK:
                s, p = np.matmul(q, k[j0:j1].T, out=s_full), p_full
            else:                        # the one short block: fresh arrays
                s = q @ k[j0:j1].T
                p = np.empty_like(s)
            if kern is not None:         # the same passes compiled (model_jit)
                m, lsum, alpha = _online_block(kern, s, p, allowed[:, j0:j1], madd,
                                               cw.kappa, j0, j1, c2, m, lsum, wk)
                if store_p:
                    _store_inplace(p, dt)
                acc *= alpha
                acc += np.matmul(p, v[j0:j1], out=pv)
                continue
            s *= c2
            al = allowed[:, j0:j1]
            if madd is not None:
                s += madd[:, j0:j1]
            if uni is not None:
                al = al | uni
                s[uni[:, 0]] = wk.type(0)
            _where_inplace(s, al, wk.type(-np.inf))
            m_new = np.maximum(m, np.max(s, axis=-1, keepdims=True))
            safe = np.where(np.isfinite(m_new), m_new, wk.type(0))
            alpha = np.where(np.isfinite(m), np.exp2(m - safe), wk.type(0)).astype(wk)
            np.subtract(s, safe, out=p)
            _where_inplace(np.exp2(p, out=p), al, wk.type(0))
            lsum = (lsum * alpha + np.sum(p, axis=-1, keepdims=True)).astype(wk, copy=False)
            if cw.kappa is not None:
                p *= cw.kappa[:, j0:j1]
            if store_p:
                _store_inplace(p, dt)
            acc *= alpha
            acc += np.matmul(p, v[j0:j1], out=pv)
            m = m_new
        out = np.where(lsum == 0, wk.type(0), acc / np.where(lsum == 0, wk.type(1), lsum))
    return out.astype(np.float64), None


def _online_kernels(wk: np.dtype, uni: np.ndarray | None) -> Any:
    """The compiled kernels for :func:`_online`'s block passes (float32 work, no uniform
    rows), or None (numba missing or disabled, another work dtype: the numpy passes)."""
    if wk != np.float32 or uni is not None:
        return None
    return kernels()


def _online_block(kern: Any, s: np.ndarray, p: np.ndarray, al: np.ndarray,
                  madd: np.ndarray | None, kappa: np.ndarray | None, j0: int, j1: int,
                  c2: Any, m: np.ndarray, lsum: np.ndarray, wk: np.dtype
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key block of :func:`_online` up to its store, by the kernels (the numpy passes'
    float32 operations in their order; the exp2s stay numpy's): the scaled, masked
    scores and their shift into ``p``, exp2, the masked weights, the running sum (and
    κ): returns (m_new, lsum_new, alpha), each (R, 1)."""
    R = s.shape[0]
    m_new, safe = np.empty((R, 1), wk), np.empty((R, 1), wk)
    none = np.zeros((1, 1), wk)
    kern.online_scores(s, al, none if madd is None else madd[:, j0:j1], madd is not None,
                       c2, m[:, 0], m_new[:, 0], safe[:, 0], p)
    alpha = np.where(np.isfinite(m), np.exp2(m - safe), wk.type(0)).astype(wk)
    np.exp2(p, out=p)
    lsum = lsum.copy()
    kern.online_weights(p, al, lsum[:, 0], alpha[:, 0],
                        none if kappa is None else kappa[:, j0:j1], kappa is not None)
    return m_new, lsum, alpha


# ------------------------------------------------------------------------------------
# Verdicts that need no error model: the value hull


def hull_violations(actual: np.ndarray, x: AttentionCall, model: ErrorModel) -> np.ndarray:
    """Elements of ``actual`` outside the hull every attention output lies in, whatever
    the kernel's rounding: an output is a convex combination of its row's values
    (times the dropout multiplier 1/(1 − p); a dropped key, a sink or a fully masked
    row contributes 0), so it lies in [min(0, min v), max(0, max v)] over the row's
    keys, widened by the rounding of a sum of S terms in the accumulation dtype (the
    worst case, capped at the hull's own size), four roundings of the stored weights
    and one ulp of the output.  NaN
    elements are not counted here (the NaN pattern is judged on its own)."""
    pl = Plain(x)
    lay = pl.layout
    a = np.asarray(actual, np.float64).reshape(lay.B, lay.L, lay.Ev)
    bad = np.zeros(a.shape, bool)
    ua = unit_roundoff(model.acc)
    kap = 1.0 / (1.0 - x.dropout_p) if 0 < x.dropout_p < 1 else 1.0
    for ch in pl.chunks():
        v = ch.v
        lo = np.min(v, axis=0, initial=0.0) * kap
        hi = np.max(v, axis=0, initial=0.0) * kap
        # the sums' rounding, and the stored weights' (a kernel that rounds the
        # unnormalised weights and divides by a sum it did not round: FlashAttention)
        slack = ((hi - lo) * min(1.0, 4.0 * (v.shape[0] + 2) * ua)
                 + np.maximum(np.abs(lo), np.abs(hi)) * 4 * (ua + model.uw))
        lo, hi = lo - slack, hi + slack
        ar = a[ch.b, ch.rows]
        with np.errstate(invalid="ignore"):
            u1 = ulp(ar, model.fmt)
            bad[ch.b, ch.rows] = np.isfinite(ar) & ((ar < lo - u1) | (ar > hi + u1))
    return bad.reshape(pl.shape)


def _lanes(ch: Chunk, dt: np.dtype, wk: np.dtype, lanes: int, cw: _Cast | None = None
           ) -> tuple[np.ndarray, None]:
    """Sums over the keys in ``lanes`` interleaved accumulators, each one term at a
    time (products rounded, then added: no FMA), then added together; the softmax sum
    likewise.  On :data:`SAMPLE_ROWS` evenly spaced rows of the group (NaN elsewhere):
    the work is rows × S × E_v elementwise."""
    R = ch.q.shape[0]
    S = ch.k.shape[0]
    Ev = ch.v.shape[1]
    out = np.full((R, Ev), np.nan)
    if S == 0 or R == 0:
        return np.zeros((R, Ev)), None
    idx = np.unique(np.linspace(0, R - 1, min(R, SAMPLE_ROWS)).round().astype(int))
    sub = Chunk(ch.b, ch.rows, ch.q[idx], ch.k, ch.v, ch.allowed[idx],
                None if ch.mask_add is None else ch.mask_add[idx],
                None if ch.kappa is None else ch.kappa[idx], ch.dead[idx],
                None if ch.uniform is None else ch.uniform[idx], ch.scale,
                nan_rows=None if ch.nan_rows is None else ch.nan_rows[idx])
    s, allowed = _scores(sub, dt, wk, 0, False)
    v = ch.v.astype(wk) if cw is None else cw.v
    pad = (-S) % lanes
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        e = exp_shifted(s, allowed, wk)
        ep = np.concatenate([e, np.zeros((len(idx), pad), wk)], axis=1)
        # (S/lanes, lanes, r): np.add.reduce over axis 0 of a C-ordered array adds its
        # rows one after another: a sequential sum in every lane
        tot = np.add.reduce(np.ascontiguousarray(ep.T.reshape(-1, lanes, len(idx))), axis=0)
        tot = np.add.reduce(tot, axis=0)[:, None].astype(wk)
        p = normalised(e, tot, wk)
        if sub.kappa is not None:
            p = (p * sub.kappa.astype(wk)).astype(wk)
        if dt != wk:
            p = store(p, dt, wk)
        pp = np.concatenate([p, np.zeros((len(idx), pad), wk)], axis=1)
        vp = np.concatenate([v, np.zeros((pad, Ev), wk)], axis=0)
        acc = np.zeros((lanes, len(idx), Ev), wk)
        step = max(lanes, (1 << 20) // max(1, len(idx) * Ev) // lanes * lanes)
        for j0 in range(0, S + pad, step):
            j1 = min(S + pad, j0 + step)
            prod = (pp[:, j0:j1].T[:, :, None] * vp[j0:j1, None, :]).astype(wk)
            prod = prod.reshape(-1, lanes, len(idx), Ev)
            acc = np.add.reduce(np.concatenate([acc[None], prod], axis=0), axis=0)
        res = np.add.reduce(acc, axis=0).astype(np.float64)
    out[idx] = res
    return out, None
