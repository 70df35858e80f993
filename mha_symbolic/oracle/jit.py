"""Fused elementwise loops of the tiers, compiled with numba when it is installed.

Every kernel here has a numpy twin (the ``_np_`` functions, built from
:mod:`.dd` and :mod:`.expo`).  Both perform the same IEEE 754 operations in the
same order on every element — numba compiles without fast-math, so nothing is
reassociated or contracted into FMAs; ``np.rint`` and ``math.ldexp`` are the same
correctly rounded operations; the only reductions are row maxima, which do not
depend on the order — so the two give **bit-identical** arrays (checked in
tests/test_oracle_jit.py).  numba is an optional extra (``pip install
mha-symbolic[fast]``): without it, or with the environment variable
``MHA_SYMBOLIC_NUMBA=0``, the numpy twins run.  Why it pays: the numpy twins make
one pass over the (rows × keys) block per operation (~30 for tier 1, ~150 for
tier 2), each allocating a temporary; the compiled loops make two.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import numpy as np

from . import constants as C
from .dd import SPLIT, dd_add_d, dd_mul, dd_mul_d, two_sum
from .expo import _table1, _table2, exp_dd, exp_double

Array = np.ndarray[Any, Any]

_U, _ETA, _UP, _FLOOR = C.U, C.ETA, C.UP, C.FLOOR  # frozen into compiled code as constants
_POW2 = np.ldexp(1.0, np.arange(-1100, 1024))  # 2**k at index k + 1100 (exact; 0 below 2**-1074)


@lru_cache(maxsize=1)
def _kernels() -> Any:
    """The compiled kernels (a namespace), or None without numba / when disabled."""
    if os.environ.get("MHA_SYMBOLIC_NUMBA", "1") == "0":
        return None
    try:
        import numba
    except ImportError:
        return None
    return _build(numba)


def numba_active() -> bool:
    return _kernels() is not None


class Workspace:
    """Reusable buffers for the blocks of one call: freshly allocated large arrays
    are page-faulted in on every use (glibc returns them to the system), which
    costs more than the arithmetic; blocks of one shape reuse these instead.  A
    buffer is valid until the next request of the same name."""

    def __init__(self) -> None:
        self._bufs: dict[str, Array] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: Any = np.float64) -> Array:
        buf = self._bufs.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = np.empty(shape, dtype=dtype)
            self._bufs[name] = buf
        return buf


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


def _t1_elem(n: Any, a: Any, d: Any, dl: Any, tau0: Any, twt0: Any, taud: Any, vmax: Any,
             vr: Any, g: float, ascale: float, se: float, rf: float, rho_r: float,
             has_drop: bool, sc: Any) -> tuple[Any, Any]:
    """The tier-1 output and its error bound for one element (or, with numpy arrays,
    for all: only +, -, *, /, abs, so numpy and numba evaluate the same operations
    in the same order).  The derivation is in fast.py and docs/oracle.md §3.3."""
    y = n / d
    a_up = (a + se) * ascale / dl
    abs_y = abs(y)
    rnd = _U * abs_y * (1.0 + 2 * _U) + _ETA
    e_fl = (g * (a_up + 2.01 * (abs_y + _ETA)) + se / dl) * _UP
    yhat = (abs_y + e_fl + rnd) * _UP
    e_w = (tau0 * (a_up + yhat) + twt0 * (vmax + yhat) + (1.0 + taud) * vr) / (1.0 - taud)
    err = (e_w + e_fl + rnd) * _UP + _FLOOR
    if has_drop:
        y2 = y * rf
        err = (abs(rf) * err * (1 + _U) + rho_r * (yhat + err) + _U * abs(y2) + _ETA) * _UP
        y = y2
    return y * sc, err * sc + 2 * _ETA


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


def _np_w_slices(wh: Array, wl: Array) -> tuple[list[Array], list[bool], Array]:
    """Fixed-point slices of the weights' high words, aligned at 2**1 (22 bits each:
    W_s = 2**(1 - 22s)·rint(r·2**(22s - 1)), r -= W_s, exact), and the plain low part
    P = fl(wl + remainder) (P = wl when the remainder is 0)."""
    from .exact_scores import slice_rows

    ws = slice_rows(wh, 22, 3, np.ones(wh.shape[0], dtype=np.int64))
    rw = wh - sum(ws.parts) if not ws.zero_rem else None  # exact (the slices are wh's bits)
    p = wl.copy() if rw is None else wl + rw
    return ws.parts, ws.nonzero, p


# ---- dispatch ------------------------------------------------------------------------

def slice_kernel(x: Array, up1: Array, step: float, n: int) -> tuple[Array, Array] | None:
    """All ``n`` row-aligned slices of x at once (compiled) and the remainder, or None
    without numba.  Slice s of row i: q = rint(r·2**(sβ - a_i))·2**(a_i - sβ), r -= q;
    every step is exact, so any evaluation gives the same numbers as the numpy loop
    of :func:`.exact_scores.slice_rows` (which stops early once r is 0)."""
    k = _kernels()
    if k is None or x.size == 0 or x.ndim != 2:
        return None
    parts = np.empty((n, *x.shape))
    rem = np.empty_like(x, dtype=np.float64)
    k.slc(np.ascontiguousarray(x, dtype=np.float64), up1, step, parts, rem)
    return parts, rem


def w_slices(wh: Array, wl: Array) -> tuple[list[Array], list[bool], Array]:
    k = _kernels()
    if k is None or wh.size == 0:
        return _np_w_slices(wh, wl)
    w1 = np.empty_like(wh)
    w2 = np.empty_like(wh)
    w3 = np.empty_like(wh)
    rem = np.empty_like(wh)
    k.wsl(np.ascontiguousarray(wh), w1, w2, w3, rem)
    parts = [w1]
    nonzero = [bool(w1.any())]
    zero_rem = not rem.any()
    # the numpy twin stops slicing once the remainder is 0: drop the (zero) parts after
    if not zero_rem or w2.any() or w3.any():
        parts.append(w2)
        nonzero.append(bool(w2.any()))
        if not zero_rem or w3.any():
            parts.append(w3)
            nonzero.append(bool(w3.any()))
    p = wl.copy() if zero_rem else wl + rem
    return parts, nonzero, p


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


def accumulate(terms: list[Array]) -> tuple[Array, Array]:
    k = _kernels()
    if k is None or len(terms) < 2 or terms[0].ndim != 2 or terms[0].size == 0:
        return _np_accumulate(terms)
    hi = np.empty_like(terms[0])
    lo = np.empty_like(terms[0])
    k.acc(tuple(np.ascontiguousarray(t) for t in terms), hi, lo)
    return hi, lo


# ---- the compiled twins ----------------------------------------------------------------

def _build(numba: Any) -> Any:  # pragma: no cover - exercised only where numba is installed
    # constants bound here are frozen into the compiled code
    EXP1_C3, EXP1_C4, EXP1_CUT, EXP2_CUT = C.EXP1_C3, C.EXP1_C4, C.EXP1_CUT, C.EXP2_CUT
    INV_LN2_128, INV_LN2_1024 = C.INV_LN2_128, C.INV_LN2_1024
    LN2_128_HI, LN2_128_LO = C.LN2_128_HI, C.LN2_128_LO
    LN2_1024_A, LN2_1024_B, LN2_1024_C = C.LN2_1024_A, C.LN2_1024_B, C.LN2_1024_C
    # error_model="numpy": x/0 gives inf or nan as in numpy (not ZeroDivisionError)
    njit = numba.njit(cache=True, nogil=True, error_model="numpy")

    @njit
    def two_sum_s(a: float, b: float) -> tuple[float, float]:
        s = a + b
        bb = s - a
        e = (a - (s - bb)) + (b - bb)
        return s, e

    @njit
    def fast_two_sum_s(a: float, b: float) -> tuple[float, float]:
        s = a + b
        e = b - (s - a)
        return s, e

    @njit
    def split_s(a: float) -> tuple[float, float]:
        c = SPLIT * a
        hi = c - (c - a)
        return hi, a - hi

    @njit
    def two_prod_s(a: float, b: float) -> tuple[float, float]:
        p = a * b
        ah, al = split_s(a)
        bh, bl = split_s(b)
        e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
        return p, e

    @njit
    def dd_mul_s(ah: float, al: float, bh: float, bl: float) -> tuple[float, float]:
        p, e = two_prod_s(ah, bh)
        e = e + (ah * bl + al * bh)
        return fast_two_sum_s(p, e)

    @njit
    def dd_mul_d_s(ah: float, al: float, b: float) -> tuple[float, float]:
        p, e = two_prod_s(ah, b)
        e = e + al * b
        return fast_two_sum_s(p, e)

    @njit
    def dd_add_d_s(ah: float, al: float, b: float) -> tuple[float, float]:
        s, e = two_sum_s(ah, b)
        e = e + al
        return two_sum_s(s, e)

    RND = 6755399441055744.0  # 1.5·2**52: (x + RND) - RND = rint(x) for |x| < 2**51

    @njit
    def rint_s(x: float) -> float:
        return (x + RND) - RND  # round to nearest, ties to even, like np.rint

    @njit
    def exp_double_s(t: float, tab: Array, p2: Array) -> float:
        x = t if not t < EXP1_CUT else EXP1_CUT  # np.maximum (t is already clamped)
        n = rint_s(x * INV_LN2_128)
        r = n * LN2_128_HI
        r = x - r
        r = r - n * LN2_128_LO
        ni = int(n)
        p = r * EXP1_C4
        p = p + EXP1_C3
        p = p * r
        p = p + 0.5
        p = p * r
        p = p + 1.0
        p = p * r
        p = p + 1.0
        p = p * tab[ni & 127]
        # = ldexp(p, k): exact, the result is normal; the index is clamped only for the
        # garbage of rows that are discarded anyway (NaN/inf scores), never for valid ones
        return p * p2[min(max((ni >> 7) + 1100, 0), 2123)]

    c3, c4, c5, c6, c7 = C.EXP2_C

    @njit
    def exp_dd_s(th: float, tl: float, tab_hi: Array, tab_lo: Array, p2: Array
                 ) -> tuple[float, float]:
        cut = th < EXP2_CUT
        if cut:  # np.maximum / np.where (th is never NaN here: masked keys are skipped)
            th = EXP2_CUT
            tl = 0.0
        n = rint_s(th * INV_LN2_1024)
        r1 = th - n * LN2_1024_A
        rh, e = two_sum_s(r1, -(n * LN2_1024_B))
        e = e + tl
        e = e - n * LN2_1024_C
        rh, rl = two_sum_s(rh, e)
        p2h, p2l = two_prod_s(rh, rh)
        q = rh * c7
        q = q + c6
        q = q * rh
        q = q + c5
        q = q * rh
        q = q + c4
        q = q * rh
        q = q + c3
        t3 = p2h * rh
        t3 = t3 * q
        half = 0.5 * p2h
        a1, e1 = two_sum_s(rh, half)
        low = e1 + rl
        low = low + (rh * rl + 0.5 * p2l)
        low = low + t3
        eh, el = fast_two_sum_s(1.0, a1)
        el = el + low
        eh, el = fast_two_sum_s(eh, el)
        ni = int(n)
        j = ni & 1023
        wh, wl = dd_mul_s(tab_hi[j], tab_lo[j], eh, el)  # j in [0, 1023] for any int
        f = p2[min(max((ni >> 10) + 1100, 0), 2123)]  # 2**k (clamped: see exp_double_s)
        return wh * f, wl * f

    @njit
    def t1(s, c_f, madd, uniform, notallowed, has_key, w, m, tab, p2):
        r, S = s.shape
        for i in range(r):
            mx = -np.inf
            nan = False
            for j in range(S):
                x = s[i, j] * c_f
                if madd is not None:
                    x = x + madd[i, j]
                if uniform is not None and uniform[i]:
                    x = 0.0
                if notallowed is not None and notallowed[i, j]:
                    x = -np.inf
                s[i, j] = x
                if x > mx:
                    mx = x
                elif x != x:
                    nan = True
            if nan:  # np.max propagates NaN
                mx = np.nan
            mi = mx if has_key[i] else 0.0
            m[i] = mi
            for j in range(S):
                t = s[i, j] - mi
                if t < EXP1_CUT:  # np.maximum: NaN propagates
                    t = EXP1_CUT
                s[i, j] = t
                if notallowed is not None and notallowed[i, j]:
                    w[i, j] = 0.0
                else:
                    w[i, j] = exp_double_s(t, tab, p2)

    @njit
    def t2s(gh, gl, ps, tiny, mode, c_hi, c_lo, madd, uniform, notallowed,
            has_key, sh, sl, m):
        r, S = gh.shape
        for i in range(r):
            mx = -np.inf
            nan = False
            for j in range(S):
                a = gh[i, j] * ps[i]
                b = gl[i, j] * ps[i]
                if tiny[i]:
                    a = 0.0
                    b = 0.0
                if mode == 0:
                    if c_hi != 1.0:
                        a = -a
                        b = -b
                elif mode == 1:
                    a, b = dd_mul_d_s(a, b, c_hi)
                else:
                    a, b = dd_mul_s(a, b, c_hi, c_lo)
                if madd is not None:
                    a, b = dd_add_d_s(a, b, madd[i, j])
                if uniform is not None and uniform[i]:
                    a = 0.0
                    b = 0.0
                if notallowed is not None and notallowed[i, j]:
                    a = -np.inf
                sh[i, j] = a
                sl[i, j] = b
                if a > mx:
                    mx = a
                elif a != a:
                    nan = True
            ok = has_key[i] and mx > -np.inf and mx < np.inf and not nan
            m[i] = mx if ok else 0.0

    @njit
    def t2w(sh, sl, m, notallowed, wh, wl, tab_hi, tab_lo, p2):
        r, S = sh.shape
        for i in range(r):
            mi = -m[i]
            for j in range(S):
                if notallowed is not None and notallowed[i, j]:
                    wh[i, j] = 0.0
                    wl[i, j] = 0.0
                    continue
                th, tl = dd_add_d_s(sh[i, j], sl[i, j], mi)
                a, b = exp_dd_s(th, tl, tab_hi, tab_lo, p2)
                wh[i, j] = a
                wl[i, j] = b

    @njit
    def acc(terms, hi, lo):
        r, S = hi.shape
        K = len(terms)
        for i in range(r):
            for j in range(S):
                h = terms[0][i, j]
                low = 0.0
                for k in range(1, K):
                    h, e = two_sum_s(h, terms[k][i, j])
                    low = low + e
                h, low = two_sum_s(h, low)
                hi[i, j] = h
                lo[i, j] = low

    elem = njit(_t1_elem)

    @njit
    def slc(x, up1, step, parts, rem):
        n_s = parts.shape[0]
        r_, d = x.shape
        for i in range(r_):
            for j in range(d):
                rr = x[i, j]
                up = up1[i]
                for s in range(n_s):
                    q = np.rint(rr * up)  # exact scalings; np.rint: any magnitude
                    q = q / up
                    rr = rr - q
                    parts[s, i, j] = q
                    up = up * step
                rem[i, j] = rr

    @njit
    def wsl(wh, w1, w2, w3, rem):
        r, S = wh.shape
        for i in range(r):
            for j in range(S):
                x = wh[i, j]
                q = rint_s(x * 2097152.0)  # 2**21
                q = q / 2097152.0
                x = x - q
                w1[i, j] = q
                q = rint_s(x * 8796093022208.0)  # 2**43
                q = q / 8796093022208.0
                x = x - q
                w2[i, j] = q
                q = rint_s(x * 36893488147419103232.0)  # 2**65
                q = q / 36893488147419103232.0
                x = x - q
                w3[i, j] = q
                rem[i, j] = x

    @njit
    def t1f(n, a, d, dl, tau0, twt0, taud, vmax, vr, g, ascale, se, rf, rho_r,
            has_drop, sc, y, err, fin):
        r, Ev = n.shape
        for i in range(r):
            ok = True
            for col in range(Ev):
                yy, ee = elem(n[i, col], a[i, col], d[i], dl[i], tau0[i], twt0[i], taud[i],
                              vmax[col], vr[col], g, ascale, se, rf, rho_r, has_drop, sc[col])
                y[i, col] = yy
                err[i, col] = ee
                if not (np.isfinite(yy) and np.isfinite(ee)):
                    ok = False
            fin[i] = ok

    class K:
        pass

    ns = K()
    ns.t1, ns.t2s, ns.t2w, ns.acc, ns.t1f, ns.wsl, ns.slc = t1, t2s, t2w, acc, t1f, wsl, slc  # type: ignore[attr-defined]
    return ns
