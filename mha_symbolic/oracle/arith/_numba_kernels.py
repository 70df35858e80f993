"""The numba kernels of :mod:`.jit` (imported only when numba is installed).

Module-level functions with module-level constants, so numba can cache the
compiled code on disk (``cache=True``): a fresh process loads it instead of
compiling.  Each kernel mirrors its numpy twin in :mod:`.jit` operation by
operation (see that module's docstring)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from . import constants as C
from .dd import SPLIT
from .elements import _t1_elem

Array = np.ndarray[Any, Any]

# constants: module globals are frozen into the compiled code
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
def slc(x, up1, step, parts, rem, nz):
    # nz[s]: slice s has a nonzero entry; nz[n_s]: the remainder has one.  q * inv
    # equals q / up bit for bit: inv = 1/up is an exact power of two (up is one
    # between 2**-1002 and 2**532, so both are normal).  Slice by slice over a row
    # (the inner loop over the entries vectorises; entry by entry the slices form one
    # chain of dependent roundings): an entry that is already 0 keeps its slices +0
    # and its remainder as it is, as when the chain stops at it.  Every plane of
    # ``parts`` is written (np.empty will do).
    n_s = parts.shape[0]
    r_, d = x.shape
    istep = 1.0 / step
    for s in range(n_s + 1):
        nz[s] = False
    buf = np.empty(d)
    for i in range(r_):
        for j in range(d):
            buf[j] = x[i, j]
        up = up1[i]
        inv = 1.0 / up
        for s in range(n_s):
            cnt = 0
            out = parts[s, i]
            for j in range(d):
                rr = buf[j]
                q = np.rint(rr * up)  # exact scalings; np.rint: any magnitude
                q = q * inv
                q = q if rr != 0.0 else 0.0
                buf[j] = rr - q
                out[j] = q
                cnt += q != 0.0
            if cnt:
                nz[s] = True
            up = up * step
            inv = inv * istep
        cnt = 0
        for j in range(d):
            rem[i, j] = buf[j]
            cnt += buf[j] != 0.0
        if cnt:
            nz[n_s] = True

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


TANH_SMALL_K = 0.17325  # transformed.TANH_SMALL


@njit
def softcap(s, cap, coeffs, tab, p2, out):
    """cap·tanh(s/cap) elementwise, operation by operation as the numpy twin
    (transformed.tanh_proved then the product by cap): the odd Taylor series by Horner
    in x² below TANH_SMALL, (1 - e)/(1 + e) with e = exp_double(-2|x|) above."""
    fs = s.ravel()
    fo = out.ravel()
    n = coeffs.shape[0]
    for idx in range(fs.shape[0]):
        x = fs[idx] / cap
        a = abs(x)
        if a <= TANH_SMALL_K:
            y = a * a
            p = coeffs[n - 1]
            for t in range(n - 2, -1, -1):
                p = p * y
                p = p + coeffs[t]
            th = a * p
        else:
            e = exp_double_s(-2.0 * a, tab, p2)
            th = (1.0 - e) / (1.0 + e)
        fo[idx] = cap * np.copysign(th, x)


@njit
def softcap_rows(g, c_f, cap, allowed, coeffs, tab, p2, out, gmax, smax):
    """out = cap·tanh(fl(c_f·g)/cap) row by row, as :func:`softcap` on fl(c_f·g), with
    the row maxima of |g| and |out| over the allowed keys (allowed has shape (0, 0)
    when every key is): transformed._np_softcap_rows is the numpy twin.  The series
    (10 coefficients, unrolled) runs on every key in a branch-free loop the compiler
    can vectorise; a second loop redoes the keys beyond TANH_SMALL with the exp."""
    r, S = g.shape
    c0, c1, c2, c3, c4 = coeffs[0], coeffs[1], coeffs[2], coeffs[3], coeffs[4]
    c5, c6, c7, c8, c9 = coeffs[5], coeffs[6], coeffs[7], coeffs[8], coeffs[9]
    every = allowed.shape[0] == 0
    for i in range(r):
        for j in range(S):
            x = (g[i, j] * c_f) / cap
            a = abs(x)
            y = a * a
            p = c9 * y
            p = p + c8
            p = p * y
            p = p + c7
            p = p * y
            p = p + c6
            p = p * y
            p = p + c5
            p = p * y
            p = p + c4
            p = p * y
            p = p + c3
            p = p * y
            p = p + c2
            p = p * y
            p = p + c1
            p = p * y
            p = p + c0
            out[i, j] = cap * np.copysign(a * p, x)
        for j in range(S):
            x = (g[i, j] * c_f) / cap
            a = abs(x)
            if not a <= TANH_SMALL_K:
                e = exp_double_s(-2.0 * a, tab, p2)
                out[i, j] = cap * np.copysign((1.0 - e) / (1.0 + e), x)
        gm = 0.0
        sm = 0.0
        for j in range(S):
            if every or allowed[i, j]:
                ag = abs(g[i, j])
                if ag > gm:
                    gm = ag
                ao = abs(out[i, j])
                if ao > sm:
                    sm = ao
        gmax[i] = gm
        smax[i] = sm


@njit
def dd_div_s(nh: float, nl: float, dh: float, dl: float) -> tuple[float, float]:
    q1 = nh / dh
    p, e = two_prod_s(q1, dh)
    r = (nh - p) - e
    r = r + nl
    r = r - q1 * dl
    q2 = r / dh
    return fast_two_sum_s(q1, q2)


TANH_FAR = 300.0  # transformed._tanh_dd: tanh is 1 to 2*e^-600 beyond


@njit
def tanh_dd(xh, xl, chi, clo, tab_hi, tab_lo, p2, th, tl, want_f, fh, fl):
    """tanh(xh + xl) in double-double elementwise, operation by operation as
    transformed._np_tanh_dd (the odd Taylor series by Horner in dd below TANH_SMALL,
    (1 - e)/(1 + e) with e = exp_dd(-2|x|) above), and with ``want_f`` sech² (1 - t² on
    the series branch, 4e/(1 + e)² above).  Step by step over all elements (each Horner
    step a simple loop of independent elements, which the CPU overlaps; element by
    element the chain of ~700 dependent operations would stall), then a loop finishes
    each element on its branch."""
    fxh = xh.ravel()
    fxl = xl.ravel()
    fth = th.ravel()
    ftl = tl.ravel()
    ffh = fh.ravel()
    ffl = fl.ravel()
    m = fxh.shape[0]
    n = chi.shape[0]
    ah = np.empty(m)
    al = np.empty(m)
    yh = np.empty(m)
    yl = np.empty(m)
    ph = np.empty(m)
    pl = np.empty(m)
    for idx in range(m):
        sg = -1.0 if fxh[idx] < 0 else 1.0
        h = fxh[idx] * sg
        lo = fxl[idx] * sg
        ah[idx] = h
        al[idx] = lo
        yh[idx], yl[idx] = dd_mul_s(h, lo, h, lo)
        ph[idx] = chi[n - 1]
        pl[idx] = clo[n - 1]
    for t in range(n - 2, -1, -1):
        c_hi = chi[t]
        c_lo = clo[t]
        for idx in range(m):
            a, b = dd_mul_s(ph[idx], pl[idx], yh[idx], yl[idx])
            a, b = dd_add_d_s(a, b, c_hi)
            ph[idx], pl[idx] = dd_add_d_s(a, b, c_lo)
    for idx in range(m):
        sg = -1.0 if fxh[idx] < 0 else 1.0
        h = ah[idx]
        lo = al[idx]
        if h <= TANH_SMALL_K:
            rh, rl = dd_mul_s(h, lo, ph[idx], pl[idx])
            if want_f:
                qh, ql = dd_mul_s(rh, rl, rh, rl)
                ffh[idx], ffl[idx] = dd_add_d_s(-qh, -ql, 1.0)
        else:
            if h > TANH_FAR:  # the twin discards exp_dd(-600) here
                eh = 0.0
                el = 0.0
            else:
                eh, el = exp_dd_s(-2.0 * h, -2.0 * lo, tab_hi, tab_lo, p2)
            nh, nl = dd_add_d_s(-eh, -el, 1.0)
            dh, dl = dd_add_d_s(eh, el, 1.0)
            rh, rl = dd_div_s(nh, nl, dh, dl)
            if want_f:
                if h > TANH_FAR:
                    ffh[idx] = 0.0
                    ffl[idx] = 0.0
                else:
                    qh, ql = dd_mul_s(dh, dl, dh, dl)
                    ffh[idx], ffl[idx] = dd_div_s(4.0 * eh, 4.0 * el, qh, ql)
        fth[idx] = rh * sg
        ftl[idx] = rl * sg


@njit
def sech2_dd(xh, xl, tab_hi, tab_lo, p2, fh, fl):
    """sech²(xh + xl) = 4e/(1 + e)², e = exp_dd(-2|x|), in double-double elementwise,
    operation by operation as transformed._np_sech2_dd (0 beyond |x| > TANH_FAR)."""
    fxh = xh.ravel()
    fxl = xl.ravel()
    ffh = fh.ravel()
    ffl = fl.ravel()
    for idx in range(fxh.shape[0]):
        h = fxh[idx]
        lo = fxl[idx]
        if h < 0:
            h = -h
            lo = -lo
        if h > TANH_FAR:
            ffh[idx] = 0.0
            ffl[idx] = 0.0
            continue
        eh, el = exp_dd_s(-2.0 * h, -2.0 * lo, tab_hi, tab_lo, p2)
        dh, dl = dd_add_d_s(eh, el, 1.0)
        sh, sl = dd_mul_s(dh, dl, dh, dl)
        ffh[idx], ffl[idx] = dd_div_s(4.0 * eh, 4.0 * el, sh, sl)


@njit
def rdot(q, kTs, hidx, gh, gl):
    r, E = q.shape
    S = gh.shape[1]
    s = np.empty(S)
    c = np.empty(S)
    for i in range(r):
        kT = kTs[hidx[i]]
        for j in range(S):
            s[j] = 0.0
            c[j] = 0.0
        for l in range(E):
            ql = q[i, l]
            for j in range(S):
                p = ql * kT[l, j]
                a = s[j]
                t = a + p
                bb = t - a
                e = (a - (t - bb)) + (p - bb)
                s[j] = t
                c[j] = c[j] + e
        for j in range(S):
            gh[i, j], gl[i, j] = two_sum_s(s[j], c[j])

@njit
def rsum(wh, wl, keep, vs, hidx, want_n, out_d, nh, nl):
    r, S = wh.shape
    Ev = nh.shape[1]
    sn = np.empty(Ev)
    cn = np.empty(Ev)
    for i in range(r):
        v = vs[hidx[i]]
        sd = 0.0
        cd = 0.0
        aw = 0.0
        al = 0.0
        for c in range(Ev):
            sn[c] = 0.0
            cn[c] = 0.0
        for j in range(S):
            h = wh[i, j]
            lw = wl[i, j]
            sd, e = two_sum_s(sd, h)
            cd = (cd + e) + lw
            aw = aw + abs(h)
            al = al + abs(lw)
            if not want_n:
                continue
            w1, w2 = split_s(h)
            if keep is not None and not keep[i, j]:
                w1 = 0.0
                w2 = 0.0
                lw = 0.0
            for c in range(Ev):
                vv = v[j, c]
                p1 = w1 * vv
                a = sn[c]
                t = a + p1
                bb = t - a
                e1 = (a - (t - bb)) + (p1 - bb)
                p2 = w2 * vv
                t2 = t + p2
                bb = t2 - t
                e2 = (t - (t2 - bb)) + (p2 - bb)
                sn[c] = t2
                cn[c] = ((cn[c] + e1) + e2) + lw * vv
        out_d[0, i], out_d[1, i] = two_sum_s(sd, cd)
        out_d[2, i] = aw
        out_d[3, i] = al
        if want_n:
            for c in range(Ev):
                nh[i, c], nl[i, c] = two_sum_s(sn[c], cn[c])

#: keys per block of rdotk: (E, RDOT_JB) doubles transposed per block stay in L1/L2
RDOT_JB = 16

@njit
def rdotk(q, ks, hidx, gh, gl):
    # rdot with each head's keys in their (S, E) layout: the keys are transposed a
    # block of RDOT_JB at a time into a small buffer (once per block and run of rows
    # on one head), and every score runs the same Sum2 chain over l as in rdot
    r, E = q.shape
    S = gh.shape[1]
    buf = np.empty((E, RDOT_JB))
    s = np.empty(RDOT_JB)
    c = np.empty(RDOT_JB)
    for j0 in range(0, S, RDOT_JB):
        nb = min(RDOT_JB, S - j0)
        last = -1
        for i in range(r):
            h = hidx[i]
            if h != last:
                k = ks[h]
                for jj in range(nb):
                    for l in range(E):
                        buf[l, jj] = k[j0 + jj, l]
                last = h
            for jj in range(nb):
                s[jj] = 0.0
                c[jj] = 0.0
            for l in range(E):
                ql = q[i, l]
                for jj in range(nb):
                    p = ql * buf[l, jj]
                    a = s[jj]
                    t = a + p
                    bb = t - a
                    e = (a - (t - bb)) + (p - bb)
                    s[jj] = t
                    c[jj] = c[jj] + e
            for jj in range(nb):
                gh[i, j0 + jj], gl[i, j0 + jj] = two_sum_s(s[jj], c[jj])

@njit
def vscale(v, sc, vcat):
    # tier 1's [v', |v'|] (v' = v·sc per column, sc powers of two) in one pass; whether
    # a nonzero value's |v'| is below 2**-1022 (the scaling may then be inexact)
    S, Ev = v.shape
    tiny = False
    for j in range(S):
        for c in range(Ev):
            x = v[j, c] * sc[c]
            a = abs(x)
            vcat[j, c] = x
            vcat[j, Ev + c] = a
            tiny |= (a < 2.0**-1022) & (v[j, c] != 0.0)
    return tiny

@njit
def wdiv(wh, wl, dh, dl, rel, add, eta4, up, floor, notallowed, ph, pl, err, fin):
    """:func:`..forward.dd.weights_dd` without keep or dropout factor: p = w/D by
    dd_div_s, err = ((|p|·rel)·1.01 + add) + 4η, then err·UP + FLOOR; masked keys 0;
    fin[i]: every p and bound of row i is finite (the numpy twin's order: bit-identical)."""
    r, S = wh.shape
    for i in range(r):
        ok = True
        di = dh[i]
        dli = dl[i]
        ri = rel[i]
        ai = add[i]
        for j in range(S):
            if notallowed is not None and notallowed[i, j]:
                ph[i, j] = 0.0
                pl[i, j] = 0.0
                err[i, j] = 0.0
                continue
            a, b = dd_div_s(wh[i, j], wl[i, j], di, dli)
            e = ((abs(a) * ri) * 1.01 + ai) + eta4
            e = e * up + floor
            ph[i, j] = a
            pl[i, j] = b
            err[i, j] = e
            if not (np.isfinite(a) and np.isfinite(e)):
                ok = False
        fin[i] = ok

@njit
def dec64(mf, rf, rad, ok, val):
    """:func:`.formats.decide_rounding` for float64 (z = mf), element by element with
    the numpy twin's operations (half gaps by nextafter, the same tests): bit-identical."""
    n = mf.shape[0]
    for i in range(n):
        m = mf[i]
        r = rf[i]
        rd = rad[i]
        good = np.isfinite(m) and np.isfinite(r) and np.isfinite(rd)
        good = good and (abs(m) >= 2.0**-960 or m == 0.0)
        zz = m if good else 1.0
        lo_n = np.nextafter(zz, -np.inf)
        hi_n = np.nextafter(zz, np.inf)
        below = (zz - lo_n) / 2
        above = (hi_n - zz) / 2
        if not np.isfinite(hi_n):
            above = (zz - lo_n) / 2
        if not np.isfinite(lo_n):
            below = (hi_n - zz) / 2
        d = m - m
        base = d + r
        good = good and (base - rd > -below * (1 - 2.0**-20)) and (
            base + rd < above * (1 - 2.0**-20))
        good = good and (abs(d) + abs(r) + rd) <= min(below, above) * 2.0**20
        z = m
        if m == 0.0:
            sure = (abs(r) + rd) < abs(m) * (1 - 2.0**-50)
            sure = sure or (m == 0.0 and r == 0.0 and rd == 0.0)
            good = good and sure
            z = -0.0 if m < 0 else 0.0
        ok[i] = good
        val[i] = z if good else np.nan

@njit
def ddenc(hi, lo, err, u, out_lo, out_hi):
    """:func:`..enclosure.dd_enclosure` element by element (the numpy twin's operations
    in its order: bit-identical)."""
    n = hi.shape[0]
    for i in range(n):
        h = hi[i]
        for k in range(2):
            sign = -1.0 if k == 0 else 1.0
            toward = -np.inf if k == 0 else np.inf
            a = lo[i] + sign * err[i]
            s = h + a
            bb = s - h
            e = (h - (s - bb)) + (a - bb)
            slack = u * abs(a) * (1 + 2.0**-50) + 2.0**-1074
            step = np.nextafter(s, toward)
            safe = slack <= abs(step - s) / 4
            inside = (e >= slack) if k == 0 else (-e >= slack)
            if safe:
                res = s if inside else step
            else:
                res = np.nextafter(s + sign * 2 * u * (abs(a) + abs(s)) + sign * 2.0**-1074,
                                   toward)
            if k == 0:
                out_lo[i] = res
            else:
                out_hi[i] = res

@njit
def slc_t(y, up1, step, parts, rem, nz):
    """:func:`slc` for the rows of x = yᵀ (y C-contiguous (d, m): row c of x is column c
    of y, aligned by up1[c]): the same operations on every entry (bit-identical), in
    y's memory order; parts[s] and rem are (d, m), the caller reads their transposes."""
    n_s = parts.shape[0]
    d, m = y.shape
    istep = 1.0 / step
    ups = np.empty((n_s, m))
    invs = np.empty((n_s, m))
    for c in range(m):
        up = up1[c]
        inv = 1.0 / up
        for s in range(n_s):
            ups[s, c] = up
            invs[s, c] = inv
            up = up * step
            inv = inv * istep
    cnt = np.zeros(n_s + 1, dtype=np.int64)
    buf = np.empty(m)
    for i in range(d):
        for c in range(m):
            buf[c] = y[i, c]
        for s in range(n_s):
            out = parts[s, i]
            u_ = ups[s]
            v_ = invs[s]
            k = 0
            for c in range(m):
                rr = buf[c]
                q = np.rint(rr * u_[c])
                q = q * v_[c]
                q = q if rr != 0.0 else 0.0
                buf[c] = rr - q
                out[c] = q
                k += q != 0.0
            cnt[s] += k
        k = 0
        for c in range(m):
            rem[i, c] = buf[c]
            k += buf[c] != 0.0
        cnt[n_s] += k
    for s in range(n_s + 1):
        nz[s] = cnt[s] > 0
