"""The fast path: attention in numpy float64 with a *proved* elementwise error bound.

Higham's dot-product bounds, Cauchy–Schwarz norm bounds, an exp with range
reduction and a Taylor polynomial whose error is bounded analytically
(:func:`exp_nonpos`), and an error propagation through the normalised weighted
sum.  The proofs are in the comments and in docs/oracle.md §3."""

from __future__ import annotations

from typing import Any

import numpy as np

from .constants import (
    ETA,
    EXP_COEFFS,
    EXP_CUT,
    EXP_DEGREE,
    FLOOR,
    INV_LN2,
    LN2_HI,
    LN2_LO,
    MAX_SCORE_ERR,
    RHO_EXP,
    TINY_W,
    UP,
    U,
    gamma,
)


def exp_nonpos(t: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """exp(t) for t <= 0 (float64 array; -inf allowed), with
    |result - exp(t)| <= RHO_EXP · exp(t) for t >= EXP_CUT; 0 below EXP_CUT.

    Proof (u = 2**-53, all operations round to nearest):
    * k = rint(fl(t/ln2)): |t| <= 700 so |k| <= 1010 and |t/ln2 - k| <= 1/2 + 1011·3u,
      hence r* = t - k ln2 satisfies |r*| <= 0.3466 + 2**-40 < 0.3467.
    * r = fl(fl(t - k·LN2_HI) - fl(k·LN2_LO)), k·LN2_HI exact (<= 43 bits).  Each of
      the three roundings errs by <= u times a quantity <= 0.3467 + 2**-22, and
      |k|·|ln2 - LN2_HI - LN2_LO| <= 1010·2**-86, so |r - r*| <= 1.05u.  Thus
      exp(r)/exp(r*) is within a factor exp(±1.05u).
    * P(r) = sum_{i<=14} c_i r^i by Horner, c_i = RN(1/i!).  Horner's bound
      (Higham Eq. 5.3): |fl(P(r)) - P(r)| <= gamma_28 sum c_i|r|^i <= 28.01u·1.4144;
      coefficient rounding adds <= u·1.4144; the Taylor remainder is
      <= |r|^15/15!·e^|r| <= 1.4e-19 < 0.0013u.  Total <= 41.06u absolute, and
      exp(r) >= e^-0.3467 = 0.707, so <= 58.1u relative.
    * ldexp(P, k) is exact: P in [0.70, 1.42] and k >= -1010 keep it normal.
    Total relative error <= 58.1u + 1.05u·(1 + tiny) < 60u < 2**-46 = RHO_EXP.
    exp(0) is exactly 1 (k = 0, r = 0, Horner returns c_0 = 1).
    """
    ok = t >= EXP_CUT  # False for -inf and NaN
    tt = np.where(ok, t, 0.0)
    k = np.rint(tt * INV_LN2)
    r = tt - k * LN2_HI
    r -= k * LN2_LO
    p = np.full_like(r, EXP_COEFFS[EXP_DEGREE])
    for c in reversed(EXP_COEFFS[:EXP_DEGREE]):
        p *= r
        p += c
    out = np.ldexp(p, k.astype(np.int32))
    out[~ok] = 0.0
    return out


def row_norm_up(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Upper bound on the 2-norms of the last axis: true sum x² <= fl(sum x²)·(1+gamma_{n+1})
    + n·ETA (each square errs by <= u relatively or ETA/2 absolutely; the sum of n
    nonnegative terms by gamma_{n-1}); sqrt rounds by <= u."""
    n = x.shape[-1]
    s = np.einsum("...i,...i->...", x, x)
    return np.sqrt(s * (1.0 + 2.0 * gamma(n + 1)) + n * ETA) * UP * (1.0 + 2 * U)


class FastResult:
    """Fast-path output for a stack of C problems (arrays indexed [c, i, ...])."""

    def __init__(self, y: Any, err_y: Any, ok: Any, p: Any, err_p: Any) -> None:
        self.y = y
        self.err_y = err_y
        self.ok = ok
        self.p = p
        self.err_p = err_p


def fast_attention(
    q: np.ndarray[Any, Any], qr: np.ndarray[Any, Any] | None,
    k: np.ndarray[Any, Any], kr: np.ndarray[Any, Any] | None,
    v: np.ndarray[Any, Any], vr: np.ndarray[Any, Any] | None,
    allowed: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None,
    c_f: float, rho_c: float, want_weights: bool,
) -> FastResult:
    """Attention of (q ± qr, k ± kr, v ± vr) for C stacked problems, in float64,
    with a rigorous elementwise error bound on the output (and weights).

    q (C,L,E), k (C,S,E), v (C,S,Ev); allowed (C,L,S) bool; madd (C,L,S) float64
    (finite where allowed) or None; the true scale c satisfies |c - c_f| <= rho_c.
    Rows with no allowed key are not handled here (ok=False is not set for them;
    callers overwrite them by policy).  The bound's derivation is in docs/oracle.md
    §3; the numbered steps below follow it.
    """
    C, L, E = q.shape
    S = k.shape[1]
    Ev = v.shape[2]
    gE, gS = gamma(max(E, 1)), gamma(max(S, 1))
    inf = np.inf

    # Only the per-row maximum of the score errors is needed (tau below is monotone
    # in it), so every bound is reduced over keys first: max of a sum <= sum of maxima.
    # (1) G = fl(q kᵀ): |G - q kᵀ| <= gamma_E |q||k|ᵀ + E·ETA  (any summation
    # order, with or without FMA), and |q||k|ᵀ_ij <= ||q_i|| ||k_j|| (Cauchy–Schwarz).
    # Uncertain inputs add ||qr_i||(||k_j|| + ||kr_j||) + ||q_i|| ||kr_j||.
    G = np.matmul(q, np.swapaxes(k, -1, -2))
    nq, nk = row_norm_up(q), row_norm_up(k)
    eg = gE * nq * np.max(nk, axis=-1)[:, None] + E * ETA  # (C, L): >= max_j err_g
    if qr is not None or kr is not None:
        rq = row_norm_up(qr) if qr is not None else np.zeros_like(nq)
        rk = row_norm_up(kr) if kr is not None else np.zeros_like(nk)
        eg = eg + rq * np.max(nk + rk, axis=-1)[:, None] + nq * np.max(rk, axis=-1)[:, None]
    gmax = np.maximum(np.max(G, axis=-1), -np.min(G, axis=-1))  # max_j |G_ij|

    # (2) s = c·g + M, computed as fl(fl(c_f·G) + M):
    # |s - s~| <= rho_c|G| + (|c_f| + rho_c) err_g + u|a| + ETA + u|s~|,  a = fl(c_f G),
    # with |a| <= |c_f||G|(1 + u) + ETA.
    s = G
    s *= c_f
    if madd is not None:
        s += madd
    all_allowed = bool(allowed.all())
    if not all_allowed:
        s[~allowed] = -inf
    has_key: np.ndarray[Any, Any] = np.asarray(allowed.any(axis=-1)) if S else \
        np.zeros((C, L), dtype=bool)
    m = np.max(s, axis=-1) if S else np.zeros((C, L))
    m = np.where(has_key, m, 0.0)
    smin = np.min(s, axis=-1, where=allowed, initial=inf) if S else np.zeros((C, L))
    smin = np.where(has_key, smin, 0.0)
    smax_abs = np.maximum(np.abs(m), np.abs(smin))
    e_s = (rho_c * gmax + (abs(c_f) + rho_c) * eg + U * (abs(c_f) * gmax * (1 + U) + ETA)
           + ETA + U * smax_abs)

    # (3) shift by the row maximum m (a double, so the shift itself is exact in the
    # mathematics: softmax(s) = softmax(s - m) for every real m); t~ = fl(s~ - m) <= 0,
    # |t~ - (s~ - m)| <= u|t~| <= u(m - min s~)(1 + u): the error of t~ against
    # t = s - m is at most e_t below, for every key of the row.
    with np.errstate(invalid="ignore"):
        t = s
        t -= m[..., None]
    e_t = (e_s + U * (m - smin)) * UP

    # (4) w~ = exp~(t~), relative error <= RHO_EXP for t~ >= EXP_CUT (proof in
    # exp_nonpos).  The true weight w = exp(t) = w~(1 + theta) with
    # |theta| <= (e^err - 1 + rho)/(1 - rho) <= (err(1 + err) + rho)(1 + 2 rho)
    # for err <= 1.  Keys with t~ < EXP_CUT get w~ = 0 and true w <= e^(-700 + err)
    # <= TINY_W (err <= 1); they are counted in T0.
    w = exp_nonpos(t)
    n_cut = np.count_nonzero(t < EXP_CUT, axis=-1)  # masked keys have t = -inf
    n_masked = S - np.count_nonzero(allowed, axis=-1) if not all_allowed else 0
    t0 = (n_cut - n_masked) * TINY_W
    tiny = (allowed & (t < EXP_CUT)) if want_weights else None
    del t, s, G
    with np.errstate(over="ignore"):  # an infinite tau only sends the row to Arb
        tau = (e_t * (1.0 + e_t) + RHO_EXP) * (1.0 + 2.0 * RHO_EXP) * UP
    max_err_t = e_t
    tau_d = tau + t0  # |D/D~ - 1| <= tau + T0/D~ and D~ >= w~(argmax) = exp~(0) = 1

    # (5)+(6) D~ = sum w~, N~ = w~ v, A = w~|v|, y^ = N~/D~, a = A/D~, computed by BLAS:
    # |fl(N~) - N~| <= gamma_S A + S·ETA, fl(D~) = D~(1 ± gamma_S), fl(A) >= A(1 - gamma_S) - S·ETA.
    # Since Σ_j w~_j (v_j - y^) = 0 exactly, y - y^ = [Σ w~θ(v - y^) + Σ w~(1+θ)δv
    # + N_tiny - y^ D_tiny] / D and D >= D~(1 - tau) with D~ >= 1, so
    #   |y - y^| <= [tau (a + |y^|) + (1 + tau) Vr + T0 (Vmax + |y^|)] / (1 - tau)
    # and the float evaluation adds
    #   |y~ - y^| <= (gamma_S (a + |y^|) + S·ETA)/(1 - gamma_S) + u|y~|(1 + 2u) + ETA,
    # where |y^| <= |y~| + (2 gamma_S a + S·ETA)/(1 - gamma_S) + u|y~|(1 + 2u) + ETA.
    d_f = np.sum(w, axis=-1)
    abs_v = np.abs(v)
    n_f = np.matmul(w, v)
    a_f = np.matmul(w, abs_v)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = n_f / d_f[..., None]
        a_up = (a_f + S * ETA) * (1.0 + gS) / ((1.0 - gS) * d_f[..., None])
    vmax = np.max(abs_v, axis=1) if S else np.zeros((C, Ev))
    if vr is not None:
        vr_col = np.max(vr, axis=1) if S else np.zeros((C, Ev))
        vmax = (vmax + vr_col) * UP
    else:
        vr_col = np.zeros_like(vmax)
    tau3, t03 = tau[..., None], t0[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        abs_y = np.abs(y)
        rnd = U * abs_y * (1.0 + 2 * U) + ETA
        yhat = (abs_y + (2.0 * gS * a_up + S * ETA) / (1.0 - gS) + rnd) * UP
        err1 = (tau3 * (a_up + yhat) + (1.0 + tau3) * vr_col[:, None, :]
                + t03 * (vmax[:, None, :] + yhat)) / (1.0 - tau3)
        err2 = (gS * (a_up + yhat) + S * ETA) / (1.0 - gS)
        err_y = (err1 + err2 + rnd) * UP + FLOOR
    tau_d3 = tau_d[..., None]
    ok = has_key & (max_err_t <= MAX_SCORE_ERR) & (tau_d < 2.0**-10)
    ok &= np.all(np.isfinite(y) & np.isfinite(err_y), axis=-1)
    p = err_p = None
    if want_weights:
        # p_j = w_j/D.  |p_j - w~_j/D~| <= (w~_j/D~)(tau + tau_d)/(1 - tau_d) (big keys),
        # p_j <= TINY_W/(1 - tau_d) (tiny keys), exactly 0 (masked keys);
        # |fl(w~/fl(D~)) - w~/D~| <= u p~(1+2u) + ETA + (w~/D~) gamma_S/(1 - gamma_S),
        # and w~/D~ <= (p~(1 + u) + ETA)(1 + gamma_S).
        with np.errstate(divide="ignore", invalid="ignore"):
            p = w / d_f[..., None]
            pb = (p * (1.0 + U) + ETA) * (1.0 + gS)
            rel = (tau3 + tau_d3) / (1.0 - tau_d3) + gS / (1.0 - gS)
            err_p = (pb * rel + U * p * (1.0 + 2 * U) + ETA) * UP + FLOOR
            err_p = err_p + np.where(tiny, 2.0 * TINY_W, 0.0)  # type: ignore[arg-type]
        err_p = np.where(allowed, err_p, 0.0)
        p = np.where(allowed, p, 0.0)
        ok &= np.all(np.isfinite(p) & np.isfinite(err_p), axis=-1)
    return FastResult(y, err_y, ok, p, err_p)




def proj_fast(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any],
               b: np.ndarray[Any, Any] | None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """y = x wᵀ + b in float64 with |y - y~| <= err (x, w, b exact doubles):
    gamma_n ||x_i|| ||w_r|| + n·ETA (dot product, Cauchy–Schwarz) + u|y~| + ETA (bias)."""
    n = x.shape[-1]
    y = x @ w.T
    if b is not None:
        y = y + b
    err = gamma(max(n, 1)) * row_norm_up(x)[..., None] * row_norm_up(w)[None, :] + n * ETA
    if b is not None:
        err = err + U * np.abs(y) + ETA
    return y, err * UP
