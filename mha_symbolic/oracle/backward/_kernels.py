"""The numba twins of the backward's tier-1 elementwise steps
(:func:`.fast.step_dp`, :func:`.fast.step_ds`), imported only when numba is
installed and the forward's kernels are active.  Each evaluates the formulas of
:mod:`.fast` (``_elem_*``, compiled as they are) element by element, so the
results are bit-identical to the numpy twins."""

from __future__ import annotations

import numba
import numpy as np

from .elements import _elem_dp, _elem_ds, _elem_t, _elem_w

njit = numba.njit(cache=True, nogil=True, error_model="numpy")

e_dp = njit(_elem_dp)
e_t = njit(_elem_t)
e_ds = njit(_elem_ds)
e_w = njit(_elem_w)


@njit
def step_dp(p, ep, x, ex, keep, live, f_f, rho_f, g_d, dp, edp, t, pl):
    r, S = p.shape
    for i in range(r):
        for j in range(S):
            if keep is None:
                a, b = x[i, j], ex[i, j]
            elif keep[i, j]:
                a, b = e_dp(x[i, j], ex[i, j], f_f, rho_f)
            else:
                a, b = 0.0, 0.0
            c = e_t(p[i, j], ep[i, j], a, b, g_d)
            dp[i, j] = a
            edp[i, j] = b
            if live[i, j]:
                t[i, j] = c
                pl[i, j] = p[i, j]
            else:
                t[i, j] = 0.0
                pl[i, j] = 0.0


@njit
def step_ds(p, ep, dp, edp, d, ed, keep, live, f_f, rho_f, g_q, g_r,
            ds, eds, aq, ak, w, ew, aw):
    r, S = p.shape
    for i in range(r):
        for j in range(S):
            if live[i, j]:
                a, b, c, e = e_ds(p[i, j], ep[i, j], dp[i, j], edp[i, j], d[i], ed[i], g_q, g_r)
            else:
                a, b, c, e = 0.0, 0.0, 0.0, 0.0
            ds[i, j] = a
            eds[i, j] = b
            aq[i, j] = c
            ak[i, j] = e
            if keep is None:
                w[i, j] = p[i, j]
                ew[i, j] = ep[i, j]
                aw[i, j] = ep[i, j] + g_r * p[i, j]
            elif keep[i, j]:
                a, b, c = e_w(p[i, j], ep[i, j], f_f, rho_f, g_r)
                w[i, j] = a
                ew[i, j] = b
                aw[i, j] = c
            else:
                w[i, j] = 0.0
                ew[i, j] = 0.0
                aw[i, j] = 0.0


@njit
def chain_plain(ph, pl, pe, xh, xl, xe, dh, dl, de, live, c_u, c_a, c_ab, c_s, c_e, floor,
                up, sh, sl, se):
    """:func:`.dd._chain` without a dropout factor, element by element with the numpy
    formulas' operations in their order (dd_add, dd_mul by TwoSum/TwoProduct/Veltkamp):
    bit-identical.  Constants: c_u = u, c_a = 1.01u, c_ab = 1 + 2u, c_s = 8.02u², c_e =
    4η; returns whether every dS and its bound are finite."""
    r, S = ph.shape
    fin = True
    for i in range(r):
        bh = -dh[i]
        bl = -dl[i]
        adh = abs(dh[i])
        adl = abs(dl[i])
        for j in range(S):
            if not live[i, j]:
                sh[i, j] = 0.0
                sl[i, j] = 0.0
                se[i, j] = 0.0
                continue
            ah = xh[i, j]
            al = xl[i, j]
            # dd_add(x, -D)
            s = ah + bh
            bb = s - ah
            e = (ah - (s - bb)) + (bh - bb)
            e = e + (al + bl)
            yh = s + e
            bb = yh - s
            yl = (s - (yh - bb)) + (e - bb)
            ye = (xe[i, j] + de[i] + c_u * (c_a * (abs(ah) + adh) + 2.01 * (abs(al) + adl))) * up
            # dd_mul(p, y)
            a = ph[i, j]
            p = a * yh
            c = 134217729.0 * a
            a1 = c - (c - a)
            a2 = a - a1
            c = 134217729.0 * yh
            b1 = c - (c - yh)
            b2 = yh - b1
            e = ((a1 * b1 - p) + a1 * b2 + a2 * b1) + a2 * b2
            e = e + (a * yl + pl[i, j] * yh)
            h = p + e
            lo = e - (h - p)
            abs_y = abs(yh) * c_ab
            abs_p = abs(a) * c_ab
            err = (pe[i, j] * (abs_y + ye) + abs_p * ye + c_s * abs_p * abs_y * 1.01 + c_e) * up
            sh[i, j] = h
            sl[i, j] = lo
            se[i, j] = err + floor
            if not (np.isfinite(h) and np.isfinite(err + floor)):
                fin = False
    return fin


@njit
def row_ddsum(h, lo, e, hi_out, lo_out, err_out, mag_out):
    """Per row i, :class:`.dd.DDSum` over the columns j of (h, lo, e)[i, j] (the parts in
    column order, each part's high word then its low word into one TwoSum chain): the
    same operations in the same order, so bit-identical; err_out and mag_out are the
    sums Σ e and Σ |words| (the caller applies DDSum's final formula)."""
    r, S = h.shape
    for i in range(r):
        err = 0.0
        mag = 0.0
        c = 0.0
        s = h[i, 0]
        err += e[i, 0]
        mag += abs(h[i, 0])
        for j in range(S):
            if j > 0:
                err += e[i, j]
                t = h[i, j]
                mag += abs(t)
                a = s
                s = a + t
                bb = s - a
                c += (a - (s - bb)) + (t - bb)
            t = lo[i, j]
            mag += abs(t)
            a = s
            s = a + t
            bb = s - a
            c += (a - (s - bb)) + (t - bb)
        a = s
        s = a + c
        bb = s - a
        hi_out[i] = s
        lo_out[i] = (a - (s - bb)) + (c - bb)
        err_out[i] = err
        mag_out[i] = mag
