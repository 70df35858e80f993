"""Tier 3 of the backward pass: gradients of one attention problem in Arb ball
arithmetic (python-flint), for the elements the double-double tier leaves
undecided — the query rows and key columns asked for, not the whole problem.

One problem is one (batch, head) slice with the query heads already matched to
their key/value heads: q (L×E), k (S×E), v (S×E_v), grad_output dO (L×E_v).  With
s_ij = c·q_i·k_j + M_ij over the allowed keys, P = softmax_rows(s), the dropout
weights W = f·keep∘P (f = 1/(1 − p); W = P without dropout) and output
o_i = Σ_j W_ij v_j, the gradients of Σ dO∘o are (FlashAttention-2, Algorithm 2;
proved for general sizes in proofs/t14_backward.py)::

    dV = Wᵀ dO                     dP_ij = f·keep_ij·(dO_i·v_j)
    D_i = Σ_j P_ij dP_ij           dS_ij = P_ij (dP_ij − D_i)
    dQ = c·dS K                    dK = c·dSᵀ Q          d(mask)_ij = dS_ij

The weights are the forward's Arb rows (:func:`..arb.attention_rows`, kind
"weights"): from exact scores (or, for the projections of a multi-head block,
score balls), shifted by one near-maximal key, exponents below -10**6 as
[0, e**-10**6] — finite, tight balls for any finite input.  A dQ or mask element
needs its own row; a dK or dV element needs the weights of every row (each row's
normaliser and D_i), so its key columns are computed from all rows' weights, but
the products only for the keys asked for.  Rows with no allowed key: ``uniform``
rows have P_ij = 1/S and dS = 0 (the output is the mean of the values whatever q
and k are); other rows have P = 0 (the caller applies the policy).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ..arith.balls import exact_prec, exact_score_rows, scale_arb, to_arb_mat
from ..conventions import Block
from ..forward.arb import attention_rows

__all__ = ["ArbGradients", "arb_backward", "exact_scores"]

Arr = np.ndarray[Any, Any]


class ArbGradients:
    """Balls of one problem: ``dq`` and ``ds`` for the query rows computed, ``dk``,
    ``dv`` for the keys asked for (None otherwise), ``out`` (the forward output
    o = W V of the rows, with ``want_out``)."""

    def __init__(self, dq: list[list[Any]], ds: list[list[Any]],
                 dk: list[list[Any]] | None, dv: list[list[Any]] | None,
                 out: list[list[Any]] | None = None) -> None:
        self.dq, self.ds, self.dk, self.dv, self.out = dq, ds, dk, dv, out


def _fmpq_arb(x: Fraction) -> Any:
    from flint import arb, fmpq

    return arb(fmpq(x.numerator, x.denominator))


def exact_scores(q: Arr, k: Arr, E: int, km: Any = None) -> tuple[list[list[Any]], int]:
    """The dot products q_i·k_j of exact doubles as exact balls and the precision that
    holds them (:func:`..arb.exact_prec`); ``km`` the exact arb_mat of k when the caller
    has it."""
    kmT = (to_arb_mat(k) if km is None else km).transpose()
    k_prec = exact_prec(q, k, E)
    return exact_score_rows(q, kmT, k_prec), k_prec


def _arb_weights(g_rows: list[list[Any]], g_prec: int, blk: Block, allowed: Arr, uni: Arr,
                 has_key: Arr, r: int, S: int, scale: Fraction | None, E: int, prec: int,
                 transformed: Any) -> tuple[list[list[Any]], list[list[Any]] | None]:
    """P: the forward's Arb weights for rows with a key (uniform rows: 1/S), and the
    transformed score's factor rows Φ (None for plain scores)."""
    from flint import arb, arb_mat

    zero = arb(0)
    pos = [n for n in range(r) if has_key[n]]
    p_rows: list[list[Any]] = [[zero] * S for _ in range(r)]
    phi_rows: list[list[Any]] | None = None
    if transformed is not None:
        got_p, phi_rows = transformed(prec)
        for n in pos:
            p_rows[n] = got_p[n]
    elif pos and S:
        sub = Block(None if blk.allowed is None else allowed[pos],
                    None if blk.madd is None else np.asarray(blk.madd)[pos], None,
                    None if blk.uniform is None else uni[pos])
        got = attention_rows([g_rows[n] for n in pos], arb_mat(S, 0), g_prec, scale, E, sub,
                             None, "weights", prec)
        for n, row in zip(pos, got, strict=True):
            p_rows[n] = row
    return p_rows, phi_rows


def _arb_ds(p_rows: list[list[Any]], x_ents: list[Any], allowed: Arr, keep: Arr | None,
            uni: Arr, has_key: Arr, fa: Any, S: int) -> tuple[list[list[Any]], list[list[Any]]]:
    """dP = f·keep∘X, D = Σ P dP, dS = P∘(dP − D) on the live keys (0 on uniform rows and
    rows without a key), and the weights W = f·keep∘P, row by row."""
    from flint import arb

    zero = arb(0)
    ds_rows: list[list[Any]] = []
    w_rows: list[list[Any]] = []
    for n, p in enumerate(p_rows):
        base = n * S
        krow = None if keep is None else keep[n]
        dp = [zero] * S
        for j in range(S):
            if not allowed[n, j] or (krow is not None and not krow[j]):
                continue
            x = x_ents[base + j]
            dp[j] = x * fa if fa is not None else x
        w_rows.append([zero if (krow is not None and not krow[j]) else
                       (p[j] * fa if fa is not None else p[j]) for j in range(S)])
        if uni[n] or not has_key[n]:
            ds_rows.append([zero] * S)
            continue
        d_i = sum((p[j] * dp[j] for j in range(S) if allowed[n, j]), zero)
        ds_rows.append([p[j] * (dp[j] - d_i) if allowed[n, j] else zero for j in range(S)])
    return ds_rows, w_rows


def _arb_product(rows_: list[list[Any]], m: Any, c: Any, n: int, inner: int) -> list[list[Any]]:
    """The n rows (each of ``inner`` balls) times the arb_mat m, times c when given;
    zeros when a dimension is empty."""
    from flint import arb, arb_mat

    cols = m.ncols()
    if not (n and inner and cols):
        return [[arb(0)] * cols for _ in range(n)]
    prod = arb_mat(rows_) * m
    ents = (prod * c if c is not None else prod).entries()
    return [ents[k * cols:(k + 1) * cols] for k in range(n)]


def arb_backward(g_rows: list[list[Any]], g_prec: int, qm: Any, km: Any, vm: Any, dom: Any,
                 blk: Block, rows: list[int], scale: Fraction | None, E: int, f: Fraction,
                 prec: int, keys: list[int] | None = None, want_out: bool = False,
                 transformed: Any = None, dom_rows: bool = False) -> ArbGradients:
    """Gradients of one problem at ``prec`` bits (sets and restores the precision).

    ``g_rows[n]`` the scores q_i·k_j (i = rows[n]) as balls with at most ``g_prec``
    bits; qm (L×E), km (S×E), vm (S×Ev), dom (L×Ev) arb_mat enclosures of the
    inputs (all rows; ``dom_rows``: dom holds only the rows ``rows``, in order, and qm
    may be None — without ``keys``); ``blk`` the score model of ``rows`` (masks, keep, uniform);
    ``scale`` exact or None for 1/sqrt(E); f the exact dropout factor.  Returns dq
    and ds for ``rows``; with ``keys``, dk and dv of those keys (then ``rows`` must
    be every row: every row contributes).  ``transformed`` (a transformed score):
    a function of the precision giving (weights rows, factor rows) as balls — the
    weights replace the forward's rows from q·k, dQ and dK use Φ∘dS, ``ds`` stays
    the gradient of the transformed scores."""
    from flint import arb, arb_mat, ctx

    old = ctx.prec
    ctx.prec = prec
    try:
        r = len(rows)
        S = km.nrows()
        Ev = vm.ncols()
        allowed = np.ones((r, S), dtype=bool) if blk.allowed is None else np.asarray(blk.allowed)
        uni: Arr = np.zeros(r, dtype=bool) if blk.uniform is None else np.asarray(blk.uniform)
        has_key: Arr = np.asarray(allowed.any(axis=-1)) if S else np.zeros(r, dtype=bool)
        p_rows, phi_rows = _arb_weights(g_rows, g_prec, blk, allowed, uni, has_key, r, S,
                                        scale, E, prec, transformed)
        ctx.prec = prec
        c = scale_arb(scale, E)
        fa = _fmpq_arb(f) if f != 1 else None
        zero = arb(0)
        # X = dO Vᵀ for the rows; dP = f·keep∘X; D = Σ P dP; dS = P∘(dP − D) on live keys
        if Ev and r and S:
            dsub = dom if dom_rows else arb_mat([[dom[i, col] for col in range(Ev)]
                                                 for i in rows])
            x_ents = (dsub * vm.transpose()).entries()
        else:
            x_ents = [zero] * (r * S)
        ds_rows, w_rows = _arb_ds(p_rows, x_ents, allowed, None if blk.keep is None else
                                  np.asarray(blk.keep), uni, has_key, fa, S)
        ds0_rows = ds_rows
        if phi_rows is not None:
            ds0_rows = [[x * y for x, y in zip(dr, fr, strict=True)]
                        for dr, fr in zip(ds_rows, phi_rows, strict=True)]
        dq = _arb_product(ds0_rows, km, c, r, S)
        out = _arb_product(w_rows, vm, None, r, S) if want_out else None
        if keys is None:
            return ArbGradients(dq, ds_rows, None, None, out)
        assert not dom_rows and qm is not None
        # dK = c·dS[:, keys]ᵀ Q, dV = W[:, keys]ᵀ dO (rows = every row)
        dk = _arb_product([[ds0_rows[n][j] for n in range(r)] for j in keys], qm, c, len(keys), r)
        dv = _arb_product([[w_rows[n][j] for n in range(r)] for j in keys], dom, None, len(keys), r)
        return ArbGradients(dq, ds_rows, dk, dv, out)
    finally:
        ctx.prec = old
