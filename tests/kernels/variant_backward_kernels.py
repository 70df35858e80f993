"""An independent FlashAttention-2-style backward with the attention variants, in numpy,
for tests and benches: correct, and one mutant per variant backward bug.

Written from FlashAttention's conventions (window as ``construct_local_mask``, softcap
``tanh(s/C)·C`` after the scale, ALiBi ``-slope·|i + off - j|`` after the softcap,
gpt-oss sinks in the denominator only, FA3 descale factors on q, k, v) and Algorithm 2
of Dao (2023): the forward keeps O (stored in the dtype) and the row log-sum-exp over
the keys and the sink (float32); the backward recomputes P = exp(S − lse), dV = Pᵀ dO,
dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP − D) (stored in the dtype, as FA does),
dS⁰ = dS ∘ (1 − tanh²(s⁰/C)) for a softcap, dQ = c·dS⁰K, dK = c·dS⁰ᵀQ in float32, the
sink logit's gradient −Σ_i P_{i,sink} D_i and the slopes' Σ −|i + off − j| dS.  It
imports nothing from mha_symbolic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

BUGS = ("softcap_derivative_missing", "sink_gradient_sign_flipped", "sink_gradient_missing",
        "window_missing_in_backward", "alibi_slopes_reversed_in_backward",
        "descale_missing_in_backward")


def variant_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *,
                     dtype: Any, scale: float | None = None, causal: bool = False,
                     align: str = "top_left", window: tuple[int, int] | None = None,
                     softcap: float | None = None, alibi: np.ndarray | None = None,
                     sinks: np.ndarray | None = None,
                     descale: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                     bug: str | None = None) -> dict[str, np.ndarray]:
    """Gradients of one call: q (B, H, L, E), k, v (B, H, S, E), do (B, H, L, E) (values
    of ``dtype``, or fp8 values with ``descale`` factors (B, H) each); alibi, sinks (H,).
    Returns "dq", "dk", "dv" and, with sinks / alibi, "d_sinks" (H,) and "d_slopes" (H,)
    as float64 arrays holding values of ``dtype`` (float32 for the parameters of a
    low-precision kernel).  The log-sum-exp is kept in float32 (float64 for a float64
    kernel), as FlashAttention's."""
    dt = np.dtype(dtype)
    acc = np.float64 if dt == np.float64 else np.float32

    def st(a: np.ndarray) -> np.ndarray:          # store in the dtype, work in acc
        return np.asarray(a).astype(dt).astype(acc)

    B, H, L, E = q.shape
    S = k.shape[2]
    qa, ka, va = (np.asarray(x, dtype=acc) for x in (q, k, v))
    doa = st(do)
    if descale is not None:
        dqs, dks, dvs = (np.asarray(d, dtype=acc) for d in descale)
        qa = qa * dqs[:, :, None, None]
        ka = ka * dks[:, :, None, None]
        va = va * dvs[:, :, None, None]
    c = acc(1.0 / math.sqrt(E) if scale is None else scale)
    off = 0 if align == "top_left" else S - L
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    d = j - (i + off)
    allowed = np.ones((L, S), dtype=bool)
    if causal:
        allowed &= d <= 0
    fwd_allowed = allowed.copy()
    if window is not None:
        if window[0] >= 0:
            fwd_allowed &= d >= -window[0]
        if window[1] >= 0:
            fwd_allowed &= d <= window[1]
    bwd_allowed = allowed if bug == "window_missing_in_backward" else fwd_allowed
    out = {"dq": np.zeros((B, H, L, E)), "dk": np.zeros((B, H, S, E)),
           "dv": np.zeros((B, H, S, E))}
    d_sinks = np.zeros(H)
    d_slopes = np.zeros(H)
    for b in range(B):
        for h in range(H):
            Q, K, V, dO = qa[b, h], ka[b, h], va[b, h], doa[b, h]
            s0 = (Q @ K.T) * c

            def scores(slope: Any, s0: np.ndarray = s0) -> np.ndarray:
                s = s0
                if softcap is not None:
                    s = np.tanh(s / acc(softcap)) * acc(softcap)
                if slope is not None:
                    s = s - acc(slope) * np.abs(d).astype(acc)
                return s

            slope = None if alibi is None else alibi[h]
            s = np.where(fwd_allowed, scores(slope), -np.inf)
            sk = None if sinks is None else acc(sinks[h])
            m = s.max(axis=1)
            if sk is not None:
                m = np.maximum(m, sk)
            m = np.where(np.isfinite(m), m, 0)
            e = np.exp(s - m[:, None])
            den = e.sum(axis=1) + (np.exp(sk - m) if sk is not None else 0)
            has = den > 0
            lse = np.where(has, m + np.log(np.where(has, den, 1)), np.inf).astype(acc)
            o = st(np.where(has[:, None], (st(e) @ V) / np.where(has, den, 1)[:, None], 0))
            # backward: recompute P from the scores and the forward's lse
            slope_b = slope
            if bug == "alibi_slopes_reversed_in_backward" and alibi is not None:
                slope_b = alibi[H - 1 - h]
            sb = np.where(bwd_allowed, scores(slope_b), -np.inf)
            P = np.exp(sb - lse.astype(acc)[:, None])
            P = np.where(np.isfinite(P), P, 0)
            dV = st(P).T @ dO
            dP = dO @ V.T
            D = (dO * o).sum(axis=1)
            dS = st(P * (dP - D[:, None]))
            if softcap is not None and bug != "softcap_derivative_missing":
                t = np.tanh(s0 / acc(softcap))
                dS0 = st(dS * (1 - t * t))
            else:
                dS0 = dS
            dQ = (dS0 @ K) * c
            dK = (dS0.T @ Q) * c
            if descale is not None and bug != "descale_missing_in_backward":
                dQ, dK, dV = dQ * dqs[b, h], dK * dks[b, h], dV * dvs[b, h]
            out["dq"][b, h], out["dk"][b, h], out["dv"][b, h] = st(dQ), st(dK), st(dV)
            if sk is not None:
                p_sink = np.exp(sk - lse.astype(acc))
                g = -(p_sink * D).sum()
                if bug == "sink_gradient_sign_flipped":
                    g = -g
                elif bug == "sink_gradient_missing":
                    g = acc(0)
                d_sinks[h] += g
            if alibi is not None:
                d_slopes[h] += (-(np.abs(d).astype(acc)) * dS).sum()
    pdt = np.float64 if acc is np.float64 else np.float32
    if sinks is not None:
        out["d_sinks"] = d_sinks.astype(pdt).astype(np.float64)
    if alibi is not None:
        out["d_slopes"] = d_slopes.astype(pdt).astype(np.float64)
    return out
