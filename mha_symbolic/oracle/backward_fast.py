"""The fast path of the backward pass: gradients in numpy float64 with a *proved*
elementwise error bound (the proof: docs/gradients.md §3; the steps are numbered
the same way here).

Notation: u = 2**-53, η = 2**-1074, γ_n = nu/(1 − nu); every float64 operation
rounds to nearest, fl(a op b) = (a op b)(1 + δ) + ε with |δ| <= u, |ε| <= η/2
(ε = 0 for + and −).  Facts used (Higham, *Accuracy and Stability*, 2nd ed.):

(H1) |fl(xᵀy) − xᵀy| <= γ_n |x|ᵀ|y| + nη, any summation order, FMA or not;
(H2) for nonnegative a_i, fl(Σ a_i) >= (1 − γ_{n−1}) Σ a_i, so a true sum of
     nonnegative terms is at most (fl(Σ) + nη)/(1 − γ_n).

Every bound is itself evaluated in floats from nonnegative terms: an elementwise
formula of fewer than 2**12 operations loses at most a factor (1 − u)**4096 > 1/UP,
so it is multiplied by UP; matrix products of nonnegative matrices go through
:func:`mm_up`, which applies (H2).  Underflow inside the bound formulas loses at
most η per operation, covered by FLOOR added to every bound that is not zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .constants import ETA, FLOOR, UP, U, gamma
from .fast import fast_attention, row_norm_up

__all__ = ["FastGradients", "fast_attention_backward", "mm_up"]

Arr = np.ndarray[Any, Any]


def mm_up(a: Arr, b: Arr) -> Arr:
    """An upper bound on the exact product a @ b of nonnegative float arrays (H2):
    the n-term sums lie below (fl(a @ b) + nη)/(1 − γ_n), times UP for the few
    roundings of this formula."""
    n = a.shape[-1]
    return (np.matmul(a, b) + n * ETA) / (1.0 - gamma(max(n, 1))) * UP


class FastGradients:
    """Fast-path gradients of C stacked problems, each value with an error bound.

    dq, e_dq (C, L, E); dk, e_dk (C, S, E); dv, e_dv (C, S, Ev); ds, e_ds (C, L, S);
    row_ok (C, L): the forward row was usable (dq and ds of that row are valid);
    all_ok (C,): every row was usable (dk and dv are valid); o, e_o (C, L, Ev) the
    forward output without dropout and its bound (from the forward fast path)."""

    def __init__(self, **kw: Arr) -> None:
        self.dq, self.e_dq = kw["dq"], kw["e_dq"]
        self.dk, self.e_dk = kw["dk"], kw["e_dk"]
        self.dv, self.e_dv = kw["dv"], kw["e_dv"]
        self.ds, self.e_ds = kw["ds"], kw["e_ds"]
        self.row_ok, self.all_ok = kw["row_ok"], kw["all_ok"]
        self.o, self.e_o = kw["o"], kw["e_o"]


def fast_attention_backward(
    q: Arr, qr: Arr | None, k: Arr, kr: Arr | None, v: Arr, vr: Arr | None,
    do: Arr, dor: Arr | None, allowed: Arr, madd: Arr | None,
    c_f: float, rho_c: float, keep: Arr | None, f_f: float, rho_f: float,
    uniform: Arr,
) -> FastGradients:
    """Gradients of (q ± qr, k ± kr, v ± vr) against grad_output (do ± dor).

    Shapes: q (C,L,E), k (C,S,E), v (C,S,Ev), do (C,L,Ev); allowed (C,L,S); madd
    (C,L,S) or None; keep (C,L,S) dropout keep-mask or None with the true factor
    f, |f − f_f| <= rho_f (f = 1 exactly, rho_f = 0 without dropout); the true
    scale c, |c − c_f| <= rho_c; uniform (C,L) rows without an allowed key whose
    weights are 1/S (masked_rows="uniform").  Other rows without an allowed key
    give zero gradients (the caller applies the NaN and zero policies)."""
    C, L = q.shape[:2]
    S, Ev = k.shape[1], v.shape[2]
    has_key = allowed.any(axis=-1) if S else np.zeros((C, L), dtype=bool)

    # (0) the weights from the forward fast path: |P − P~| <= eP elementwise,
    # exactly 0 on masked keys (P~ = eP = 0 there)
    fr = fast_attention(q, qr, k, kr, v, vr, allowed, madd, c_f, rho_c, True)
    assert fr.p is not None and fr.err_p is not None
    row_ok = fr.ok | ~has_key
    dead = ~row_ok  # rows whose forward bound failed: their results are not used
    p = np.where(dead[..., None], 0.0, fr.p)
    e_p = np.where(dead[..., None], 0.0, fr.err_p)
    if np.any(uniform):
        # 1/S rounds once: |1/S − fl(1/S)| <= u/S
        inv_s = 1.0 / S
        p = np.where(uniform[..., None], inv_s, p)
        e_p = np.where(uniform[..., None], U * inv_s * UP, e_p)
    live = allowed & ~uniform[..., None]  # keys whose dS can be nonzero

    # (1) dropout weights W = f·keep∘P: |W − W~| <= rho_f P + f_f eP + u W~ + η
    if keep is not None:
        w = np.where(keep, f_f * p, 0.0)
        e_w = np.where(keep, (rho_f * (p + e_p) + f_f * e_p + U * w + ETA) * UP, 0.0)
    else:
        w, e_w = p, e_p

    # (2) X = dO vᵀ: (H1) and Cauchy–Schwarz, |dO_i||v_j| <= ||dO_i|| ||v_j||; input
    # uncertainties add ||dor_i||(||v_j|| + ||vr_j||) + ||dO_i|| ||vr_j||
    x = np.matmul(do, np.swapaxes(v, -1, -2))
    n_do, n_v = row_norm_up(do), row_norm_up(v)
    e_x = gamma(max(Ev, 1)) * n_do[..., :, None] * n_v[..., None, :] + Ev * ETA
    if dor is not None or vr is not None:
        r_do = row_norm_up(dor) if dor is not None else np.zeros_like(n_do)
        r_v = row_norm_up(vr) if vr is not None else np.zeros_like(n_v)
        e_x = e_x + r_do[..., :, None] * (n_v + r_v)[..., None, :] \
            + n_do[..., :, None] * r_v[..., None, :]
    e_x = e_x * UP

    # (3) dP = f·keep∘X: |dP − dP~| <= rho_f(|X~| + eX) + f_f eX + u|dP~| + η
    if keep is not None:
        dp = np.where(keep, f_f * x, 0.0)
        e_dp = np.where(keep, (rho_f * (np.abs(x) + e_x) + f_f * e_x + U * np.abs(dp)
                               + ETA) * UP, 0.0)
    else:
        dp, e_dp = x, e_x
    del x, e_x

    # (4) D_i = Σ_j P_ij dP_ij: |D − D~| <= Σ_j [eP(|dP~| + e_dP) + P~ e_dP + γ_S P~|dP~|]
    # + Sη, the sum of nonnegative terms bounded by (H2)
    pd = np.where(live, p * dp, 0.0)
    d = np.sum(pd, axis=-1)
    gS = gamma(max(S, 1))
    t = np.where(live, e_p * (np.abs(dp) + e_dp) + p * e_dp + gS * np.abs(pd), 0.0)
    e_d = (np.sum(t, axis=-1) + 2 * S * ETA) / (1.0 - gamma(max(S, 1) + 1)) * UP
    del pd, t

    # (5) Y = dP − D: |Y − Y~| <= e_dP + e_D + u|Y~|(1 + 2u)
    y = dp - d[..., None]
    e_y = (e_dp + e_d[..., None] + U * np.abs(y) * (1 + 2 * U)) * UP
    del dp, e_dp

    # (6) dS = P∘Y: |dS − dS~| <= eP(|Y~| + eY) + P~ eY + u|dS~| + η; exactly 0 off
    # the live keys (P = 0 there, or dS = 0 on uniform rows)
    ds = np.where(live, p * y, 0.0)
    e_ds = np.where(live, (e_p * (np.abs(y) + e_y) + p * e_y + U * np.abs(ds) + ETA) * UP,
                    0.0)
    del y, e_y
    abs_ds = np.abs(ds)

    # (7) dV = Wᵀ dO: |dV − dV~| <= (eW + γ_L W~)ᵀ(|dO| + dor) + W~ᵀ dor + Lη
    wt = np.swapaxes(w, -1, -2)
    dv = np.matmul(wt, do)
    gL = gamma(max(L, 1))
    abs_do = np.abs(do)
    e_dv = mm_up(np.swapaxes(e_w + gL * w, -1, -2), abs_do) + L * ETA
    if dor is not None:
        e_dv = e_dv + mm_up(np.swapaxes(e_w + w, -1, -2), dor)
    e_dv = e_dv * UP

    # (8) dQ = c·dS K: G = fl(dS~ K~) with |dS K − G| <= (eS + γ_S|dS~|)|K~| + Sη
    # (+ (eS + |dS~|) kr); then |c·dS K − fl(c_f G)| <= rho_c(|G| + eG) + |c_f| eG
    # + u|dQ~|(1 + 2u) + η
    gq = np.matmul(ds, k)
    e_gq = mm_up(e_ds + gS * abs_ds, np.abs(k)) + S * ETA
    if kr is not None:
        e_gq = e_gq + mm_up(e_ds + abs_ds, kr)
    dq = c_f * gq
    e_dq = (rho_c * (np.abs(gq) + e_gq) + abs(c_f) * e_gq + U * np.abs(dq) * (1 + 2 * U)
            + ETA) * UP
    del gq, e_gq

    # (9) dK = c·dSᵀ Q, the same with transposes and γ_L
    dst = np.swapaxes(ds, -1, -2)
    gk = np.matmul(dst, q)
    e_gk = mm_up(np.swapaxes(e_ds + gL * abs_ds, -1, -2), np.abs(q)) + L * ETA
    if qr is not None:
        e_gk = e_gk + mm_up(np.swapaxes(e_ds + abs_ds, -1, -2), qr)
    dk = c_f * gk
    e_dk = (rho_c * (np.abs(gk) + e_gk) + abs(c_f) * e_gk + U * np.abs(dk) * (1 + 2 * U)
            + ETA) * UP

    all_ok = np.all(row_ok, axis=-1)
    with np.errstate(invalid="ignore"):
        row_ok = row_ok & np.all(np.isfinite(dq) & np.isfinite(e_dq), axis=-1) \
            & np.all(np.isfinite(ds) & np.isfinite(e_ds), axis=-1)
        all_ok = all_ok & np.all(row_ok, axis=-1) \
            & np.all(np.isfinite(dk) & np.isfinite(e_dk), axis=(-2, -1)) \
            & np.all(np.isfinite(dv) & np.isfinite(e_dv), axis=(-2, -1))
    # FLOOR covers underflow inside the bound formulas (see the module docstring)
    return FastGradients(dq=dq, e_dq=e_dq + FLOOR, dk=dk, e_dk=e_dk + FLOOR, dv=dv,
                         e_dv=e_dv + FLOOR, ds=ds, e_ds=np.where(live, e_ds + FLOOR, 0.0),
                         row_ok=row_ok, all_ok=all_ok, o=fr.y, e_o=fr.err_y)
