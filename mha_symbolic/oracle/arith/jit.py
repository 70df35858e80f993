"""Fused elementwise loops of the tiers, compiled with numba when it is installed.

Every kernel here has a numpy twin (the ``_np_`` functions, built from
:mod:`.dd` and :mod:`.expo`).  Both perform the same IEEE 754 operations in the
same order on every element — numba compiles without fast-math, so nothing is
reassociated or contracted into FMAs; ``np.rint`` and ``math.ldexp`` are the same
correctly rounded operations; the only reductions are row maxima, which do not
depend on the order — so the two give **bit-identical** arrays (checked in
tests/oracle/arith/test_oracle_jit.py).  numba is an optional extra (``pip install
mha-symbolic[fast]``): without it, or with the environment variable
``MHA_SYMBOLIC_NUMBA=0``, the numpy twins run.  Why it pays: the numpy twins make
one pass over the (rows × keys) block per operation (~30 for tier 1, ~150 for
tier 2), each allocating a temporary; the compiled loops make two.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Any

import numpy as np

from . import constants as C
from .dd import dd_add_d, dd_mul, dd_mul_d, split, two_sum
from .elements import _t1_elem
from .expo import _table1, _table2, exp_dd, exp_double

Array = np.ndarray[Any, Any]

_U, _ETA, _UP, _FLOOR = C.U, C.ETA, C.UP, C.FLOOR  # frozen into compiled code as constants
_TN = C.TINY_N  # >= η, and normal: no slow subnormal operands in the per-element bounds
_POW2 = np.ldexp(1.0, np.arange(-1100, 1024))  # 2**k at index k + 1100 (exact; 0 below 2**-1074)


@lru_cache(maxsize=1)
def _kernels() -> Any:
    """The compiled kernels (a namespace), or None without numba / when disabled."""
    if os.environ.get("MHA_SYMBOLIC_NUMBA", "1") == "0":
        return None
    try:
        from . import _numba_kernels
    except ImportError:
        return None
    return _numba_kernels


def numba_active() -> bool:
    return _kernels() is not None


class Workspace:
    """Reusable buffers for the blocks of one call: freshly allocated large arrays
    are page-faulted in on every use (glibc returns them to the system), which
    costs more than the arithmetic; blocks of one shape reuse these instead.  A
    buffer is valid until the next request of the same name.  Blocks of varying
    shape (the key ranges of a causal mask) share one flat buffer per name, grown to
    the largest request: a request is a C-contiguous view of its first elements."""

    def __init__(self) -> None:
        self._bufs: dict[str, Array] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: Any = np.float64) -> Array:
        n = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = np.empty(max(n, 1), dtype=dtype)
            self._bufs[name] = buf
        return buf[:n].reshape(shape)


# ---- numpy twins --------------------------------------------------------------------

def _np_t1_weights(s: Array, c_f: float, madd: Array | None, uniform: Array | None,
                   notallowed: Array | None, has_key: Array) -> tuple[Array, Array, Array]:
    """Tier 1 from G = fl(q kᵀ) (overwritten): s = fl(fl(c_f G) + M), masked keys -inf,
    m = row max (0 for rows without a key), t = max(fl(s - m), EXP1_CUT),
    w = exp~(t) with masked keys 0.  Returns (w, t, m)."""
    s *= c_f
    if madd is not None:
        s += madd
    if uniform is not None:
        s[uniform] = 0.0
    if notallowed is not None:
        np.putmask(s, notallowed, -np.inf)
    with np.errstate(invalid="ignore"):
        m = np.max(s, axis=-1) if s.shape[1] else np.zeros(s.shape[0])
    m = np.where(has_key, m, 0.0)
    with np.errstate(invalid="ignore"):
        s -= m[:, None]
    np.maximum(s, C.EXP1_CUT, out=s)
    w = exp_double(s)
    if notallowed is not None:
        np.putmask(w, notallowed, 0.0)
    return w, s, m


def _np_t2_scores(gh: Array, gl: Array, ps: Array, tiny: Array, mode: int, c_hi: float,
                  c_lo: float, madd: Array | None, uniform: Array | None,
                  notallowed: Array | None, has_key: Array) -> tuple[Array, Array, Array]:
    """Tier 2: (sh, sl) = c·(2**P G') + M in double-double (mode 0: c = ±1 exactly,
    1: c a double, 2: c a double-double), uniform rows 0, masked keys sh = -inf;
    m = row max of sh (0 for rows without a key or with a non-finite max)."""
    gh = gh * ps[:, None]
    gl = gl * ps[:, None]
    if tiny.any():
        gh[tiny] = 0.0
        gl[tiny] = 0.0
    if mode == 0:
        sh, sl = (gh, gl) if c_hi == 1.0 else (-gh, -gl)
    elif mode == 1:
        sh, sl = dd_mul_d(gh, gl, np.float64(c_hi))
    else:
        sh, sl = dd_mul(gh, gl, np.full_like(gh, c_hi), np.full_like(gh, c_lo))
    if madd is not None:
        sh, sl = dd_add_d(sh, sl, madd)
    if uniform is not None:
        sh[uniform] = 0.0
        sl[uniform] = 0.0
    if notallowed is not None:
        np.putmask(sh, notallowed, -np.inf)
    with np.errstate(invalid="ignore"):
        m = np.max(sh, axis=-1) if sh.shape[1] else np.zeros(sh.shape[0])
    m = np.where(has_key & np.isfinite(m), m, 0.0)
    return sh, sl, m


def _np_t2_weights(sh: Array, sl: Array, m: Array, notallowed: Array | None
                   ) -> tuple[Array, Array]:
    """(wh, wl) = exp~(s - m) in double-double, masked keys 0."""
    with np.errstate(invalid="ignore"):
        th, tl = dd_add_d(sh, sl, -m[:, None])
        wh, wl = exp_dd(th, tl)
    if notallowed is not None:
        np.putmask(wh, notallowed, 0.0)
        np.putmask(wl, notallowed, 0.0)
    return wh, wl


def _np_accumulate(terms: list[Array]) -> tuple[Array, Array]:
    """TwoSum accumulation (hi, lo) of the terms, renormalised by TwoSum."""
    hi = terms[0].copy()
    lo = np.zeros_like(hi)
    for x in terms[1:]:
        hi, e = two_sum(hi, x)
        lo += e
    return two_sum(hi, lo)


def _np_t1_finish(n_f: Array, a_f: Array, d_f: Array, d_low: Array, tau0: Array, twt0: Array,
                  tau_d: Array, vmax: Array, vr: Array, g: float, ascale: float, se: float,
                  rf: float, rho_r: float, has_drop: bool, sc: Array
                  ) -> tuple[Array, Array, Array]:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y, err = _t1_elem(n_f, a_f, d_f[:, None], d_low[:, None], tau0[:, None],
                          twt0[:, None], tau_d[:, None], vmax[None, :], vr[None, :], g, ascale,
                          se, rf, rho_r, has_drop, sc[None, :])
    fin = np.all(np.isfinite(y) & np.isfinite(err), axis=-1)
    return y, err, fin


def _np_row_dots(q: Array, kTs: list[Array], hidx: Array) -> tuple[Array, Array]:
    """Sum2 of the products ``q_il·kT_lj`` over l, row i against ``kT = kTs[hidx[i]]``
    (exact products for float32 values): s, e = TwoSum(s, q_il kT_lj); c = fl(c + e) for
    l = 0 … E-1 from s = c = 0, then (gh, gl) = TwoSum(s, c).  The row path of tier 2
    (:mod:`.dd_rows`)."""
    r, E = q.shape
    S = kTs[0].shape[1]
    gh = np.zeros((r, S))
    gl = np.zeros((r, S))
    for h in np.unique(hidx).tolist():  # the rows of one head at a time
        sel = hidx == h
        qh, kT = q[sel], kTs[h]
        s = np.zeros((qh.shape[0], S))
        c = np.zeros((qh.shape[0], S))
        for l in range(E):
            s, e = two_sum(s, qh[:, l, None] * kT[l][None, :])
            c = c + e
        gh[sel], gl[sel] = two_sum(s, c)
    return gh, gl


def _np_row_sums(wh: Array, wl: Array, keep: Array | None, vs: list[Array], hidx: Array,
                 want_n: bool
                 ) -> tuple[Array, Array, Array | None, Array | None, Array, Array]:
    """Sum2 over the keys (:meth:`.dd_rows.RowsBatch.weighted_sums`), row i against the
    values ``vs[hidx[i]]``: D = Σ (wh + wl) and N = Σ keep (w1 + w2 + wl) v with
    wh = w1 + w2 split by Veltkamp; also Σ|wh|, Σ|wl|.  Returns (Dh, Dl, Nh, Nl, aw, al)
    (N None without ``want_n``)."""
    r, S = wh.shape
    if len(vs) > 1:  # the rows of one head at a time
        out: list[Any] = [np.zeros(r), np.zeros(r), np.zeros((r, vs[0].shape[1])),
                          np.zeros((r, vs[0].shape[1])), np.zeros(r), np.zeros(r)]
        for h in np.unique(hidx).tolist():
            sel = hidx == h
            got = _np_row_sums(wh[sel], wl[sel], None if keep is None else keep[sel], [vs[h]],
                               np.zeros(int(sel.sum()), dtype=np.int64), want_n)
            for o, g in zip(out, got, strict=True):
                if g is not None:
                    o[sel] = g
        return (out[0], out[1], out[2] if want_n else None, out[3] if want_n else None,
                out[4], out[5])
    v = vs[0]
    Ev = v.shape[1]
    sd = np.zeros(r)
    cd = np.zeros(r)
    aw = np.zeros(r)
    al = np.zeros(r)
    sn = np.zeros((r, Ev))
    cn = np.zeros((r, Ev))
    for j in range(S):
        h = wh[:, j]
        lw = wl[:, j]
        sd, e = two_sum(sd, h)
        cd = (cd + e) + lw
        aw = aw + np.abs(h)
        al = al + np.abs(lw)
        if not want_n:
            continue
        w1, w2 = split(h)
        if keep is not None:
            k = keep[:, j]
            w1 = np.where(k, w1, 0.0)
            w2 = np.where(k, w2, 0.0)
            lw = np.where(k, lw, 0.0)
        vj = v[j][None, :]
        sn, e1 = two_sum(sn, w1[:, None] * vj)
        sn, e2 = two_sum(sn, w2[:, None] * vj)
        cn = ((cn + e1) + e2) + lw[:, None] * vj
    Dh, Dl = two_sum(sd, cd)
    if not want_n:
        return Dh, Dl, None, None, aw, al
    Nh, Nl = two_sum(sn, cn)
    return Dh, Dl, Nh, Nl, aw, al


# ---- dispatch ------------------------------------------------------------------------

def slice_kernel(x: Array, up1: Array, step: float, n: int
                 ) -> tuple[Array, Array, Array] | None:
    """All ``n`` row-aligned slices of x at once (compiled), the remainder and which of
    them (n slices, then the remainder) hold a nonzero entry, or None without numba.
    Slice s of row i: q = rint(r·2**(sβ - a_i))·2**(a_i - sβ), r -= q; every step is
    exact, so any evaluation gives the same numbers as the numpy loop of
    :func:`.exact_scores.slice_rows` (which stops early once r is 0)."""
    k = _kernels()
    if k is None or x.size == 0 or x.ndim != 2:
        return None
    nz = np.zeros(n + 1, dtype=np.bool_)
    if x.dtype == np.float64 and x.T.flags.c_contiguous and not x.flags.c_contiguous:
        # a transposed array (rows of x are columns in memory): sliced in place, the
        # slices handed back as transposed views (BLAS reads them without copies)
        parts_t = np.empty((n, x.shape[1], x.shape[0]))
        rem_t = np.empty((x.shape[1], x.shape[0]))
        k.slc_t(x.T, np.ascontiguousarray(up1, dtype=np.float64), step, parts_t, rem_t, nz)
        return parts_t.transpose(0, 2, 1), rem_t.T, nz
    parts = np.empty((n, *x.shape))  # the kernel writes every plane (0 after an entry ends)
    rem = np.empty_like(x, dtype=np.float64)
    k.slc(np.ascontiguousarray(x, dtype=np.float64), up1, step, parts, rem, nz)
    return parts, rem, nz


def t1_finish(n_f: Array, a_f: Array, d_f: Array, d_low: Array, tau0: Array, twt0: Array,
              tau_d: Array, vmax: Array, vr: Array, g: float, ascale: float, se: float,
              rf: float, rho_r: float, has_drop: bool, sc: Array) -> tuple[Array, Array, Array]:
    """(y, err, finite rows) of tier 1 from the block sums (see :func:`_t1_elem`)."""
    k = _kernels()
    if k is None or n_f.size == 0:
        return _np_t1_finish(n_f, a_f, d_f, d_low, tau0, twt0, tau_d, vmax, vr, g, ascale, se,
                             rf, rho_r, has_drop, sc)
    y = np.empty_like(n_f)
    err = np.empty_like(n_f)
    fin = np.empty(n_f.shape[0], dtype=bool)
    k.t1f(np.ascontiguousarray(n_f), np.ascontiguousarray(a_f), d_f, d_low, tau0, twt0, tau_d,
          vmax, vr, g, ascale, se, rf, rho_r, has_drop, sc, y, err, fin)
    return y, err, fin


def t1_weights(s: Array, c_f: float, madd: Array | None, uniform: Array | None,
               notallowed: Array | None, has_key: Array, ws: Workspace | None = None
               ) -> tuple[Array, Array, Array]:
    k = _kernels()
    if k is None or s.size == 0:
        return _np_t1_weights(s, c_f, madd, uniform, notallowed, has_key)
    w = np.empty_like(s) if ws is None else ws.get("t1_w", s.shape)
    m = np.empty(s.shape[0])
    k.t1(s, c_f, madd, uniform, notallowed, has_key, w, m, _table1(), _POW2)
    return w, s, m


def t2_scores(gh: Array, gl: Array, ps: Array, tiny: Array, mode: int, c_hi: float,
              c_lo: float, madd: Array | None, uniform: Array | None,
              notallowed: Array | None, has_key: Array) -> tuple[Array, Array, Array]:
    k = _kernels()
    if k is None or gh.size == 0:
        return _np_t2_scores(gh, gl, ps, tiny, mode, c_hi, c_lo, madd, uniform, notallowed,
                             has_key)
    sh = np.empty_like(gh)
    sl = np.empty_like(gh)
    m = np.empty(gh.shape[0])
    k.t2s(gh, gl, ps, tiny, mode, c_hi, c_lo, madd, uniform, notallowed, has_key, sh, sl, m)
    return sh, sl, m


def t2_weights(sh: Array, sl: Array, m: Array, notallowed: Array | None) -> tuple[Array, Array]:
    k = _kernels()
    if k is None or sh.size == 0:
        return _np_t2_weights(sh, sl, m, notallowed)
    wh = np.empty_like(sh)
    wl = np.empty_like(sh)
    th, tl = _table2()
    k.t2w(sh, sl, m, notallowed, wh, wl, th, tl, _POW2)
    return wh, wl


def weights_plain(wh: Array, wl: Array, Dh: Array, Dl: Array, eD: Array, d_low: Array,
                  tau: Array, tau_d: Array, notallowed: Array | None
                  ) -> tuple[Array, Array, Array, Array] | None:
    """:func:`..forward.dd.weights_dd` without keep and dropout factor, compiled (p, its
    low word, its bound, per row whether all are finite), or None without numba.  The
    per-row factors are formed here as the numpy twin forms them; the kernel then does
    the twin's elementwise operations in its order (bit-identical)."""
    k = _kernels()
    if k is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.ascontiguousarray((tau + tau_d) / (1.0 - tau_d) + eD / d_low + 2.0**-99,
                                   dtype=np.float64)
        add = np.ascontiguousarray(2 * C.TINY2 / d_low, dtype=np.float64)
    ph, pl, err = (np.empty(wh.shape) for _ in range(3))
    fin = np.empty(wh.shape[0], dtype=np.bool_)
    k.wdiv(np.ascontiguousarray(wh, dtype=np.float64), np.ascontiguousarray(wl, dtype=np.float64),
           np.ascontiguousarray(Dh, dtype=np.float64), np.ascontiguousarray(Dl, dtype=np.float64),
           rel, add, 4 * _ETA, _UP, _FLOOR,
           None if notallowed is None else np.ascontiguousarray(notallowed, dtype=np.bool_),
           ph, pl, err, fin)
    return ph, pl, err, fin


def decide_float64(mf: Array, rf: Array, rad: Array) -> tuple[Array, Array] | None:
    """:func:`.formats.decide_rounding` to float64, compiled ((decided, value), the
    arrays' shape), or None without numba."""
    k = _kernels()
    if k is None:
        return None
    shape = np.shape(mf)
    flat = [np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype=np.float64), shape)).ravel()
            for a in (mf, rf, rad)]
    ok = np.empty(flat[0].size, dtype=np.bool_)
    val = np.empty(flat[0].size)
    k.dec64(*flat, ok, val)
    return ok.reshape(shape), val.reshape(shape)


def dd_bounds(hi: Array, lo: Array, err: Array) -> tuple[Array, Array] | None:
    """:func:`..enclosure.dd_enclosure` compiled (lower, upper), or None without numba."""
    k = _kernels()
    if k is None:
        return None
    shape = np.shape(hi)
    flat = [np.ascontiguousarray(a, dtype=np.float64).ravel() for a in (hi, lo, err)]
    out_lo = np.empty(flat[0].size)
    out_hi = np.empty(flat[0].size)
    k.ddenc(*flat, _U, out_lo, out_hi)
    return out_lo.reshape(shape), out_hi.reshape(shape)


def accumulate(terms: list[Array]) -> tuple[Array, Array]:
    k = _kernels()
    if k is None or len(terms) < 2 or terms[0].ndim != 2 or terms[0].size == 0:
        return _np_accumulate(terms)
    hi = np.empty_like(terms[0])
    lo = np.empty_like(terms[0])
    k.acc(tuple(np.ascontiguousarray(t) for t in terms), hi, lo)
    return hi, lo


# ---- the compiled twins ----------------------------------------------------------------


def _typed(arrays: list[Array]) -> Any:
    """A numba typed List of C-contiguous float64 arrays (the kernels index it by head),
    or of float32 arrays when every one is float32 (the kernels widen each element as
    they read it: exact, so the same results as from float64 copies)."""
    from numba.typed import List

    dt = np.float32 if all(a.dtype == np.float32 for a in arrays) else np.float64
    out = List()
    for a in arrays:
        out.append(np.ascontiguousarray(a, dtype=dt))
    return out


def _wide(arrays: list[Array]) -> list[Array]:
    """The arrays in float64 (the numpy twins' operands: exact widening)."""
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def row_dots(q: Array, kTs: list[Array], hidx: Array) -> tuple[Array, Array]:
    k = _kernels()
    if k is None or q.size == 0 or kTs[0].size == 0:
        return _np_row_dots(q, kTs, hidx)
    gh = np.empty((q.shape[0], kTs[0].shape[1]))
    gl = np.empty_like(gh)
    k.rdot(np.ascontiguousarray(q), _typed(kTs), np.ascontiguousarray(hidx, dtype=np.int64),
           gh, gl)
    return gh, gl


def _np_vscale(v: Array, sc: Array, vcat: Array, check: bool) -> bool:
    """Fill ``vcat`` (S, 2·Ev) with [v·sc, |v·sc|] (``sc`` per column); with ``check``,
    whether some nonzero ``v`` has ``|v·sc| < 2**-1022`` (else False)."""
    Ev = v.shape[1]
    v2, absv = vcat[:, :Ev], vcat[:, Ev:]
    np.multiply(v, sc, out=v2)
    np.abs(v2, out=absv)
    return bool(check and v.size and float(np.min(absv)) < 2.0**-1022
                and np.count_nonzero(absv < 2.0**-1022) != np.count_nonzero(v == 0))


def vscale(v: Array, sc: Array, vcat: Array, check: bool) -> bool:
    """Tier 1's values scaled by powers of two, and their magnitudes, in one pass
    (:class:`.fast.KV`): :func:`_np_vscale` (multiplications by powers of two and
    absolute values: the same numbers in any order; the flag is a plain predicate)."""
    k = _kernels()
    if (k is None or not v.size or v.dtype not in (np.float64, np.float32)
            or not v.flags.c_contiguous
            or not vcat.flags.c_contiguous):
        return _np_vscale(v, sc, vcat, check)
    return bool(k.vscale(v, np.ascontiguousarray(sc, dtype=np.float64), vcat)) and check


def row_dots_k(q: Array, ks: list[Array], hidx: Array) -> tuple[Array, Array]:
    """:func:`row_dots` with each head's keys ``ks[h]`` in their (S, E) layout (no
    transposed copy of a head: the kernel transposes blocks of a few keys in cache);
    the same Sum2 chain per score, so the same (gh, gl) bit for bit."""
    k = _kernels()
    if k is None or q.size == 0 or ks[0].size == 0:
        return _np_row_dots(q, [x.T for x in _wide(ks)], hidx)
    gh = np.empty((q.shape[0], ks[0].shape[0]))
    gl = np.empty_like(gh)
    k.rdotk(np.ascontiguousarray(q), _typed(ks), np.ascontiguousarray(hidx, dtype=np.int64),
            gh, gl)
    return gh, gl


def row_sums(wh: Array, wl: Array, keep: Array | None, vs: list[Array], hidx: Array,
             want_n: bool
             ) -> tuple[Array, Array, Array | None, Array | None, Array, Array]:
    k = _kernels()
    if k is None or wh.size == 0:
        return _np_row_sums(wh, wl, keep, _wide(vs), hidx, want_n)
    r = wh.shape[0]
    Ev = vs[0].shape[1] if want_n else 0
    out_d = np.empty((4, r))
    nh = np.empty((r, Ev))
    nl = np.empty((r, Ev))
    k.rsum(np.ascontiguousarray(wh), np.ascontiguousarray(wl),
           None if keep is None else np.ascontiguousarray(keep, dtype=np.bool_),
           _typed(vs), np.ascontiguousarray(hidx, dtype=np.int64), want_n, out_d, nh, nl)
    if not want_n:
        return out_d[0], out_d[1], None, None, out_d[2], out_d[3]
    return out_d[0], out_d[1], nh, nl, out_d[2], out_d[3]
