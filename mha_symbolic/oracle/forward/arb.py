"""Tier 3, the Arb fallback: attention rows in ball arithmetic (python-flint) for the
few elements the double-double tier leaves undecided, and for rows it cannot take
(scores beyond 2**40, exponents outside the double range of its scalings).

Scores are computed **exactly** (``arb_mat`` products of doubles at a precision
that holds every bit, :func:`exact_prec`), the softmax is shifted by the exact
score of one near-maximal key, and only then is anything rounded: the shifted
scores ``c·(g_j - g_*) + (M_j - M_*)`` and the exponentials are computed at the
working precision.  So however large the scores (1e600 from fp64 inputs near
1e300), the balls stay finite and tight: the shift key has weight exactly 1 and
every other weight is a ball inside [0, 1 + tiny].  Exponents below -10**6 are
replaced by the ball [0, e**-10**6] (Arb's own exp of such arguments can be the
whole real line)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ..arith.balls import EXP_FLOOR, scale_arb
from ..conventions import Block

Array = np.ndarray[Any, Any]

def attention_rows(g_rows: list[list[Any]], vm: Any, g_prec: int, scale: Fraction | None,
                   E: int, blk: Block, factor: Fraction | None, kind: str,
                   prec: int) -> list[list[Any]]:
    """Rows of attention as Arb balls at ``prec`` bits from exact dot products.

    ``g_rows[i][j]`` the exact q_i·k_j (balls of radius 0 with at most ``g_prec``
    bits, so their differences are exact at ``g_prec``); ``vm`` the arb_mat (S × Ev')
    of the values wanted; ``blk`` masks/keep/uniform rows; ``factor`` the dropout
    factor 1/(1-p).  kind "output" -> r lists of Ev' balls; "weights" -> r lists
    of S balls.  Every row must have an allowed key."""
    from flint import arb, arb_mat, ctx, fmpq

    r = len(g_rows)
    S = vm.nrows()
    Ev = vm.ncols()
    old = ctx.prec
    try:
        ctx.prec = prec
        c = scale_arb(scale, E)
        zero = arb(0)
        w_tiny = (arb(EXP_FLOOR).exp() * arb(0.5, 0.5)).nonnegative_part()  # [0, e**EXP_FLOOR]
        fac = None if factor is None else arb(fmpq(factor.numerator, factor.denominator))
        w_rows: list[list[Any]] = []
        for i in range(r):
            grow = g_rows[i]
            allowed = (np.ones(S, dtype=bool) if blk.allowed is None
                       else np.asarray(blk.allowed[i], dtype=bool))
            uniform = blk.uniform is not None and bool(blk.uniform[i])
            if uniform:
                w_rows.append([arb(1)] * S)
                continue
            madd = None if blk.madd is None else blk.madd[i]
            idx = np.flatnonzero(allowed).tolist()
            # shift key: largest score at a low precision (any allowed key would do)
            ctx.prec = 64
            est = {j: (c * grow[j] + (arb(float(madd[j])) if madd is not None else zero)).mid()
                   for j in idx}
            jstar = max(idx, key=lambda j: est[j])
            ctx.prec = max(g_prec, prec, 2200 if madd is not None else 0)
            dg = [grow[j] - grow[jstar] if allowed[j] else zero for j in range(S)]  # exact
            dm = ([arb(float(madd[j])) - arb(float(madd[jstar])) if allowed[j] else zero
                   for j in range(S)] if madd is not None else None)  # exact
            ctx.prec = prec
            c = scale_arb(scale, E)
            row = []
            for j in range(S):
                if not allowed[j]:
                    row.append(zero)
                    continue
                if j == jstar:
                    row.append(arb(1))
                    continue
                t = c * dg[j] if dm is None else c * dg[j] + dm[j]
                row.append(w_tiny if t.upper() < EXP_FLOOR else t.exp())
            w_rows.append(row)
        ctx.prec = prec
        keep = blk.keep
        wm = arb_mat(w_rows) if r and S else arb_mat(r, S)
        ones = arb_mat(S, 1)
        for j in range(S):
            ones[j, 0] = 1
        d = (wm * ones).entries() if S else [arb(0)] * r
        invs = [1 / d[i] if fac is None else fac / d[i] for i in range(r)]
        if kind == "weights":
            return [[w_rows[i][j] * invs[i] if keep is None or keep[i][j] else zero
                     for j in range(S)] for i in range(r)]
        if Ev == 0:
            return [[] for _ in range(r)]
        if keep is not None:
            for i in range(r):
                for j in range(S):
                    if not keep[i][j]:
                        wm[i, j] = 0
        nm = (wm * vm).entries()
        return [[nm[i * Ev + col] * invs[i] for col in range(Ev)] for i in range(r)]
    finally:
        ctx.prec = old


