"""The numba twins of the backward's tier-1 elementwise steps
(:func:`.fast.step_dp`, :func:`.fast.step_ds`), imported only when numba is
installed and the forward's kernels are active.  Each evaluates the formulas of
:mod:`.fast` (``_elem_*``, compiled as they are) element by element, so the
results are bit-identical to the numpy twins."""

from __future__ import annotations

import numba

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
