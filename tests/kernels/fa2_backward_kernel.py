"""An independent FlashAttention-2-style backward kernel in numpy, for tests and benches.

Blocked as Algorithm 2 of Dao (2023): the forward keeps O (stored in the dtype) and the
row log-sum-exp (float32); the backward recomputes P = exp(S − lse) block by block,
accumulates dV += Pᵀ dO, dK += scale·dSᵀ Q, dQ += scale·dS K in float32 (dQ across key
blocks, as FA's atomic adds), with D = rowsum(dO ∘ O); P and dS are rounded to the dtype
before their products, as FA does.  ``bug=`` injects one mistake of the backward bug
catalogue.  Written from the paper, not from mha_symbolic's formulas.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def fa2_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *, dtype: Any,
                 scale: float | None = None, causal: bool = False, mask: np.ndarray | None = None,
                 keep: np.ndarray | None = None, p_drop: float = 0.0, block: int = 16,
                 bug: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of one call: q (H_q, L, E), k, v (H_kv, S, E), do (H_q, L, E); mask
    (L, S) bool True = takes part; keep (H_q, L, S) dropout keep-mask.  Returns dq, dk,
    dv as float64 arrays holding values of ``dtype``."""
    dt = np.dtype(dtype)
    acc = np.float64 if dt == np.float64 else np.float32

    def st(a: np.ndarray) -> np.ndarray:          # store in the dtype, work in acc
        return np.asarray(a).astype(dt).astype(acc)

    q, k, v, do = (st(x) for x in (q, k, v, do))
    hq, L, E = q.shape
    hk, S, _ = k.shape
    rep = hq // hk
    c = acc(1.0 / math.sqrt(E) if scale is None else scale)
    f = acc(1.0 / (1.0 - p_drop))
    allowed = np.ones((L, S), dtype=bool) if mask is None else mask.copy()
    fwd_allowed = allowed.copy()
    if causal:
        fwd_allowed &= np.tri(L, S, dtype=bool)
    bwd_allowed = fwd_allowed
    if bug == "causal_mask_missing_in_backward":
        bwd_allowed = allowed
    elif bug == "mask_missing_in_backward":
        bwd_allowed = np.ones((L, S), dtype=bool)
    dq = np.zeros((hq, L, E), dtype=acc)
    dk_h = np.zeros((hq, S, E), dtype=acc)
    dv_h = np.zeros((hq, S, E), dtype=acc)
    for h in range(hq):
        K, V = k[h // rep], v[h // rep]
        kp = None if keep is None else keep[h]
        # forward: online softmax over key blocks, O stored in dtype, lse in float32
        m = np.full(L, -np.inf, dtype=acc)
        ell = np.zeros(L, dtype=acc)
        o = np.zeros((L, E), dtype=acc)
        for j0 in range(0, S, block):
            sl = slice(j0, j0 + block)
            s = (q[h] @ K[sl].T) * c
            s = np.where(fwd_allowed[:, sl], s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isfinite(m_new), m_new, 0)
            p = np.exp(s - safe[:, None])
            corr = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))
            pd = p if kp is None else np.where(kp[:, sl], p * f, 0)
            ell = ell * corr + p.sum(axis=1)
            o = o * corr[:, None] + st(pd) @ V[sl]
            m = m_new
        has = ell > 0
        o = st(np.where(has[:, None], o / np.where(has, ell, 1)[:, None], 0))
        lse = np.where(has, m + np.log(np.where(has, ell, 1)), np.inf)
        # backward
        if bug == "d_term_missing":
            D = np.zeros(L, dtype=acc)
        elif bug == "d_term_from_grad_output":
            D = (do[h] * do[h]).sum(axis=1)
        else:
            D = (do[h] * o).sum(axis=1)
        rowsum_dp = _rowsum_dp(do[h], V, bwd_allowed, kp, f)   # for the unweighted-D bug
        for j0 in range(0, S, block):
            sl = slice(j0, j0 + block)
            s = (q[h] @ K[sl].T) * c
            p = np.where(bwd_allowed[:, sl], np.exp(s - lse[:, None]), 0)
            pw = p if kp is None or bug == "dropout_missing_in_backward" else np.where(kp[:, sl], p * f, 0)
            if bug != "dv_p_not_transposed":
                dv_h[h, sl] += st(pw).T @ do[h]
            dp = do[h] @ V[sl].T
            if kp is not None and bug != "dropout_missing_in_backward":
                dp = np.where(kp[:, sl], dp * f, 0)
            if bug == "d_term_unweighted":
                ds = p * (dp - rowsum_dp[:, None])
            elif bug == "softmax_jacobian_diagonal_only":
                ds = p * (1 - p) * dp
            else:
                ds = p * (dp - D[:, None])
            ds = st(ds)
            cq = acc(1) if bug in ("scale_missing_in_dq", "scale_missing_in_dq_and_dk") else (
                c * c if bug == "scale_applied_twice_in_dq_and_dk" else c)
            ck = acc(1) if bug in ("scale_missing_in_dk", "scale_missing_in_dq_and_dk") else (
                c * c if bug == "scale_applied_twice_in_dq_and_dk" else c)
            dq[h] += cq * (ds @ K[sl])
            dk_h[h, sl] += ck * (ds.T @ q[h])
        if bug == "dv_p_not_transposed":   # dV = P dO (L = S): the whole P at once
            P = np.where(bwd_allowed, np.exp((q[h] @ K.T) * c - lse[:, None]), 0)
            Pw = P if kp is None else np.where(kp, P * f, 0)
            dv_h[h] = st(Pw) @ do[h]
        if bug == "ds_transposed":          # dQ = c dSᵀ K, dK = c dS Q (L = S)
            P = np.where(bwd_allowed, np.exp((q[h] @ K.T) * c - lse[:, None]), 0)
            dP = do[h] @ V.T
            if kp is not None:
                dP = np.where(kp, dP * f, 0)
            dS = st(P * (dP - D[:, None]))
            dq[h] = c * (dS.T @ K)
            dk_h[h] = c * (dS @ q[h])
    dk = np.zeros((hk, S, E), dtype=acc)
    dv = np.zeros((hk, S, E), dtype=acc)
    for h in range(hq):
        if bug == "gqa_not_reduced" and h % rep:
            continue
        g = h % hk if bug == "gqa_reduced_with_tile_mapping" else h // rep
        dk[g] += dk_h[h]
        dv[g] += dv_h[h]
    return (st(dq).astype(np.float64), st(dk).astype(np.float64), st(dv).astype(np.float64))


def _rowsum_dp(do: np.ndarray, V: np.ndarray, allowed: np.ndarray, kp: Any, f: Any) -> np.ndarray:
    dp = do @ V.T
    if kp is not None:
        dp = np.where(kp, dp * f, 0)
    return np.where(allowed, dp, 0).sum(axis=1)
