"""The Arb fallback of the backward pass: gradients of one attention problem in
ball arithmetic (python-flint), for the elements the fast path leaves undecided.

One problem is one (batch, head) slice with the query heads already matched to
their key/value heads: q (L×E), k (S×E), v (S×E_v), grad_output dO (L×E_v).  With
s_ij = c·q_i·k_j + M_ij over the allowed keys, P = softmax_rows(s), the dropout
weights W = f·keep∘P (f = 1/(1 − p); W = P without dropout) and output
o_i = Σ_j W_ij v_j, the gradients of Σ dO∘o are (FlashAttention-2, Algorithm 2;
proved for general sizes in proofs/t14_backward.py)::

    dV = Wᵀ dO                     dP_ij = f·keep_ij·(dO_i·v_j)
    D_i = Σ_j P_ij dP_ij           dS_ij = P_ij (dP_ij − D_i)
    dQ = c·dS K                    dK = c·dSᵀ Q          d(mask)_ij = dS_ij

Every step is exact real arithmetic enclosed by Arb balls; the softmax is shifted
by the exact midpoint of one score per row (any real shift gives the same P).
Rows with no allowed key: ``uniform`` rows have P_ij = 1/S and dS = 0 (the
output is the mean of the values whatever q and k are); other policies' rows have
P = 0 and are overwritten by the caller.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from .arb import to_arb_mat

__all__ = ["ArbGradients", "arb_backward"]


class ArbGradients:
    """Ball rows of one problem: ``dq`` (L×E, only the rows asked for), ``ds``
    (the same rows, L×S), and with ``full`` also ``dk`` (S×E), ``dv`` (S×E_v) and
    the forward output ``out`` (L×E_v, o = W V; only with ``want_out``)."""

    def __init__(self, dq: list[list[Any]], ds: list[list[Any]],
                 dk: list[list[Any]] | None, dv: list[list[Any]] | None,
                 out: list[list[Any]] | None = None) -> None:
        self.dq, self.ds, self.dk, self.dv, self.out = dq, ds, dk, dv, out


def _fmpq_arb(x: Fraction) -> Any:
    from flint import arb, fmpq

    return arb(fmpq(x.numerator, x.denominator))


def _shift_index(q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], c_f: float,
                 allowed: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None) -> list[int] | None:
    """Per row, an allowed key whose float score is largest (None when the float
    scores overflow; then the ball with the largest midpoint is used)."""
    with np.errstate(all="ignore"):
        sa = (q @ k.T) * c_f
        if madd is not None:
            sa = sa + madd
        sa = np.where(allowed, sa, -np.inf)
        if not np.all(np.isfinite(sa[allowed])):
            return None
    return [int(j) for j in np.argmax(sa, axis=-1)] if sa.shape[-1] else None


def arb_backward(
    q: Any, k: Any, v: Any, do: Any, allowed: np.ndarray[Any, Any],
    madd: np.ndarray[Any, Any] | None, keep: np.ndarray[Any, Any] | None,
    f: Fraction, c: Any, c_f: float, uniform: np.ndarray[Any, Any],
    rows: list[int] | None, prec: int,
    q_f: np.ndarray[Any, Any] | None = None, k_f: np.ndarray[Any, Any] | None = None,
    want_out: bool = False,
) -> ArbGradients:
    """Gradients of one problem at ``prec`` bits (sets and restores the precision).

    q, k, v, do: float64 arrays holding the exact inputs, or callables returning
    arb_mat enclosures of them at the current precision (with ``q_f``, ``k_f``
    float approximations of q and k, which only choose the softmax shift);
    allowed (L×S) bool;
    madd (L×S) finite additive mask or None; keep (L×S) bool dropout keep-mask or
    None; f the exact dropout factor 1/(1 − p); c the scale as an arb (computed at
    ``prec`` by the caller inside this call's precision: pass a callable's result);
    uniform (L,) rows with no allowed key under ``masked_rows="uniform"``.
    ``rows=None`` computes everything (dK, dV need every row); else only those
    rows of dQ and dS."""
    from flint import arb, arb_mat, ctx

    old = ctx.prec
    ctx.prec = prec
    try:
        cb = c() if callable(c) else c
        L, S = allowed.shape
        full = rows is None
        rr = list(range(L)) if rows is None else rows
        r = len(rr)
        zero = arb(0)
        fa = _fmpq_arb(f) if f != 1 else None
        al = np.asarray(allowed[rr])
        ma = None if madd is None else np.asarray(madd[rr])
        kp = None if keep is None else np.asarray(keep[rr])
        un = np.asarray(uniform[rr])
        if callable(q):
            qm_all, km, vm, dom_all = q(), k(), v(), do()
            assert q_f is not None and k_f is not None
            qm = arb_mat([[qm_all[i, l] for l in range(qm_all.ncols())] for i in rr]) \
                if r and qm_all.ncols() else arb_mat(r, qm_all.ncols())
            dom = arb_mat([[dom_all[i, l] for l in range(dom_all.ncols())] for i in rr]) \
                if r and dom_all.ncols() else arb_mat(r, dom_all.ncols())
            shift = _shift_index(q_f[rr], k_f, c_f, al, ma)
        else:
            qm_all, km, vm, dom_all = to_arb_mat(q), to_arb_mat(k), to_arb_mat(v), to_arb_mat(do)
            qm, dom = to_arb_mat(q[rr]), to_arb_mat(do[rr])
            shift = _shift_index(q[rr], k, c_f, al, ma)
        E, Ev = km.ncols(), vm.ncols()
        g_ents = (((qm * km.transpose()) * cb).entries() if E and r and S
                  else [zero] * (r * S))
        x_ents = (dom * vm.transpose()).entries() if Ev and r and S else [zero] * (r * S)
        inv_s = arb(1) / S if S else zero
        p_rows: list[list[Any]] = []
        ds_rows: list[list[Any]] = []
        for n in range(r):
            a_row = al[n]
            base = n * S
            if un[n]:
                p_rows.append([inv_s] * S)
                ds_rows.append([zero] * S)
                continue
            if ma is None and kp is None and fa is None and shift is not None and bool(a_row.all()):
                # the common dense row: list comprehensions, one division per row
                top = g_ents[base + shift[n]].mid()
                w_list = [(x - top).exp() for x in g_ents[base:base + S]]
                inv = 1 / sum(w_list, zero)
                p = [wj * inv for wj in w_list]
                dp = x_ents[base:base + S]
                d_i = sum((a * b for a, b in zip(p, dp, strict=True)), zero)
                p_rows.append(p)
                ds_rows.append([a * (b - d_i) for a, b in zip(p, dp, strict=True)])
                continue
            idx = np.flatnonzero(a_row).tolist()
            if not idx:
                p_rows.append([zero] * S)
                ds_rows.append([zero] * S)
                continue
            s_row = {}
            mrow = None if ma is None else ma[n].tolist()
            for j in idx:
                sj = g_ents[base + j]
                if mrow is not None:
                    sj = sj + arb(mrow[j])
                s_row[j] = sj
            top = (s_row[shift[n]] if shift is not None
                   else max(s_row.values(), key=lambda b: float(b.mid()))).mid()
            w = {j: (sj - top).exp() for j, sj in s_row.items()}
            total = sum(w.values(), zero)
            p = [zero] * S
            for j, wj in w.items():
                p[j] = wj / total
            # dP = f·keep∘X,  D = Σ P dP,  dS = P∘(dP − D)
            krow = None if kp is None else kp[n].tolist()
            dp = [zero] * S
            for j in idx:
                x = x_ents[base + j]
                if krow is not None and not krow[j]:
                    continue
                dp[j] = x * fa if fa is not None else x
            d_i = sum((p[j] * dp[j] for j in idx), zero)
            ds = [zero] * S
            for j in idx:
                ds[j] = p[j] * (dp[j] - d_i)
            p_rows.append(p)
            ds_rows.append(ds)
        if E and S and r:
            ents = ((arb_mat(ds_rows) * km) * cb).entries()
            dq = [ents[i * E:(i + 1) * E] for i in range(r)]
        else:
            dq = [[zero] * E for _ in range(r)]
        if not full:
            return ArbGradients(dq, ds_rows, None, None)
        # W = f·keep∘P;  dV = Wᵀ dO;  dK = c·dSᵀ Q
        w_rows = p_rows
        if kp is not None or fa is not None:
            w_rows = []
            for n in range(r):
                krow = None if kp is None else kp[n].tolist()
                w_rows.append([zero if (krow is not None and not krow[j]) else
                               (pj * fa if fa is not None else pj)
                               for j, pj in enumerate(p_rows[n])])
        if S and Ev and r:
            wm = arb_mat(w_rows)
            ents = (wm.transpose() * dom_all).entries()
            dv = [ents[j * Ev:(j + 1) * Ev] for j in range(S)]
            out = None
            if want_out:
                ents = (wm * vm).entries()
                out = [ents[i * Ev:(i + 1) * Ev] for i in range(r)]
        else:
            dv = [[zero] * Ev for _ in range(S)]
            out = [[zero] * Ev for _ in range(r)]
        if S and E and r:
            ents = ((arb_mat(ds_rows).transpose() * qm_all) * cb).entries()
            dk = [ents[j * E:(j + 1) * E] for j in range(S)]
        else:
            dk = [[zero] * E for _ in range(S)]
        return ArbGradients(dq, ds_rows, dk, dv, out)
    finally:
        ctx.prec = old
