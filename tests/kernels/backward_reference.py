"""Independent references for the gradient tests (no oracle code, no backward formula).

``forward_mode_gradients`` differentiates Σ grad_output ∘ attention by *forward-mode*
automatic differentiation in Arb: every input element in turn carries a Taylor series
x + ε (python-flint ``arb_series`` truncated at ε²), the forward pass is written out
element by element (scores, exp, sums, division), and the ε-coefficient of the scalar
is the derivative.  Nothing here knows dS = P ∘ (dP − D): it is the chain rule done by
the series arithmetic, so it checks the backward formulas, not restates them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from flint import arb, arb_series, ctx, fmpq


def _arb_of(x: float | Fraction) -> Any:
    fr = Fraction(x)
    return arb(fmpq(fr.numerator, fr.denominator))


def _scalar(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, keep: np.ndarray,
            madd: np.ndarray | None, scale: Any, drop: np.ndarray | None, f: Fraction,
            which: tuple[str, tuple[int, ...]] | None, policy: str) -> Any:
    """Σ dO ∘ out for one problem (2-D arrays), with ``which`` input element perturbed."""

    def entry(name: str, arr: np.ndarray, idx: tuple[int, ...]) -> Any:
        val = _arb_of(float(arr[idx]))
        if which is not None and which[0] == name and which[1] == idx:
            return arb_series([val, 1], prec=2)
        return arb_series([val], prec=2)

    L, E = q.shape
    S, Ev = v.shape
    total = arb_series([0], prec=2)
    for i in range(L):
        idx = [j for j in range(S) if keep[i, j]]
        if not idx:
            if policy == "uniform" and S:
                w = {j: arb_series([1], prec=2) for j in range(S)}
            else:
                continue
        else:
            w = {}
            for j in idx:
                g = arb_series([0], prec=2)
                for l in range(E):
                    g = g + entry("q", q, (i, l)) * entry("k", k, (j, l))
                s = g * scale
                if madd is not None:
                    s = s + entry("m", madd, (i, j))
                w[j] = s.exp()
        z = arb_series([0], prec=2)
        for wj in w.values():
            z = z + wj
        for j, wj in w.items():
            p = wj / z
            if drop is not None:
                if not drop[i, j]:
                    continue
                p = p * _arb_of(f)
            for l in range(Ev):
                total = total + p * entry("v", v, (j, l)) * _arb_of(float(do[i, l]))
    return total


def forward_mode_gradients(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                           keep: np.ndarray, madd: np.ndarray | None, scale: Any,
                           drop: np.ndarray | None = None, f: Fraction = Fraction(1),
                           policy: str = "zero", prec: int = 300) -> dict[str, np.ndarray]:
    """Arb balls of d/dx Σ dO∘out for every element x of q, k, v (and madd) of one
    problem: q (L,E), k (S,E), v (S,Ev), do (L,Ev), keep (L,S) bool, madd (L,S) or None,
    ``scale``: a Fraction or the string "rsqrt" for 1/sqrt(E)."""
    old = ctx.prec
    ctx.prec = prec
    try:
        c = arb(q.shape[1]).rsqrt() if scale == "rsqrt" else _arb_of(scale)
        out: dict[str, np.ndarray] = {}
        names = [("q", q), ("k", k), ("v", v)] + ([("m", madd)] if madd is not None else [])
        for name, arr in names:
            res = np.empty(arr.shape, dtype=object)
            for idx in np.ndindex(*arr.shape):
                val = _scalar(q, k, v, do, keep, madd, c, drop, f, (name, idx), policy)
                res[idx] = val.coeffs()[1] if len(val.coeffs()) > 1 else arb(0)
            out[name] = res
        return out
    finally:
        ctx.prec = old


def forward_mode_mha_gradients(x: dict[str, np.ndarray], num_heads: int, dout: np.ndarray,
                               key_padding: np.ndarray | None = None,
                               prec: int = 300) -> dict[str, np.ndarray]:
    """Forward-mode Arb derivatives of Σ dout ∘ MHA(x) for a one-batch block, written out
    element by element: x holds "query" (L, E), "key" (S, kdim), "value" (S, vdim), "wq"
    (E, E), "wk" (E, kdim), "wv" (E, vdim), "bq", "bk", "bv" (E,), "wo" (E_out, E), "bo";
    key_padding (S,) bool True = masked out.  Returns the derivative of every element of
    every entry of x."""
    old = ctx.prec
    ctx.prec = prec
    try:
        out: dict[str, np.ndarray] = {}
        for name, arr in x.items():
            res = np.empty(arr.shape, dtype=object)
            for idx in np.ndindex(*arr.shape):
                val = _mha_scalar(x, num_heads, dout, key_padding, (name, idx))
                res[idx] = val.coeffs()[1] if len(val.coeffs()) > 1 else arb(0)
            out[name] = res
        return out
    finally:
        ctx.prec = old


def _mha_scalar(x: dict[str, np.ndarray], H: int, dout: np.ndarray,
                key_padding: np.ndarray | None, which: tuple[str, tuple[int, ...]]) -> Any:
    def e(name: str, *idx: int) -> Any:
        val = _arb_of(float(x[name][idx]))
        return arb_series([val, 1] if which == (name, idx) else [val], prec=2)

    def lin(inp: str, w: str, b: str, row: int) -> list[Any]:
        n_out, n_in = x[w].shape
        res = []
        for r in range(n_out):
            acc = e(b, r) if b in x else arb_series([0], prec=2)
            for c in range(n_in):
                acc = acc + e(inp, row, c) * e(w, r, c)
            res.append(acc)
        return res

    L, S = x["query"].shape[0], x["key"].shape[0]
    E = x["wq"].shape[0]
    hd = E // H
    c = arb(hd).rsqrt()
    Q = [lin("query", "wq", "bq", i) for i in range(L)]
    K = [lin("key", "wk", "bk", j) for j in range(S)]
    V = [lin("value", "wv", "bv", j) for j in range(S)]
    A = [[arb_series([0], prec=2)] * E for _ in range(L)]
    for h in range(H):
        cols = range(h * hd, (h + 1) * hd)
        for i in range(L):
            w = {}
            for j in range(S):
                if key_padding is not None and key_padding[j]:
                    continue
                g = arb_series([0], prec=2)
                for col in cols:
                    g = g + Q[i][col] * K[j][col]
                w[j] = (g * c).exp()
            z = arb_series([0], prec=2)
            for wj in w.values():
                z = z + wj
            for col in cols:
                acc = arb_series([0], prec=2)
                for j, wj in w.items():
                    acc = acc + wj * V[j][col]
                A[i][col] = acc / z
    total = arb_series([0], prec=2)
    E_out = x["wo"].shape[0]
    for i in range(L):
        for r in range(E_out):
            o = e("bo", r) if "bo" in x else arb_series([0], prec=2)
            for col in range(E):
                o = o + A[i][col] * e("wo", r, col)
            total = total + o * _arb_of(float(dout[i, r]))
    return total


def formula_gradients(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                      keep: np.ndarray, madd: np.ndarray | None, scale: Any,
                      drop: np.ndarray | None = None, f: Fraction = Fraction(1),
                      uniform: np.ndarray | None = None, prec: int = 200) -> dict[str, np.ndarray]:
    """Arb balls of dq, dk, dv, dmask of one problem from the backward formulas
    (FlashAttention-2; Theorem 14), written out here with python-flint alone — for
    sizes where the forward-mode reference is too slow.  keep (L, S) the allowed
    keys, madd the additive mask, drop the dropout keep-mask, uniform (L,) rows with
    weights 1/S and no dependence on the scores."""
    old = ctx.prec
    ctx.prec = prec
    try:
        L, E = q.shape
        S, Ev = v.shape
        c = arb(E).rsqrt() if scale == "rsqrt" else _arb_of(scale)
        fa = _arb_of(f)
        qa = [[_arb_of(float(x)) for x in row] for row in q]
        ka = [[_arb_of(float(x)) for x in row] for row in k]
        va = [[_arb_of(float(x)) for x in row] for row in v]
        da = [[_arb_of(float(x)) for x in row] for row in do]
        P = [[arb(0)] * S for _ in range(L)]
        dS = [[arb(0)] * S for _ in range(L)]
        W = [[arb(0)] * S for _ in range(L)]
        for i in range(L):
            uni = uniform is not None and bool(uniform[i])
            js = list(range(S)) if uni else [j for j in range(S) if keep[i, j]]
            if not js:
                continue
            s = {}
            for j in js:
                if uni:
                    s[j] = arb(0)
                    continue
                g = sum((qa[i][l] * ka[j][l] for l in range(E)), arb(0))
                s[j] = c * g + (_arb_of(float(madd[i, j])) if madd is not None else arb(0))
            top = max(s.values(), key=lambda b: float(b.mid()))
            w = {j: (s[j] - top).exp() for j in js}
            z = sum(w.values(), arb(0))
            for j in js:
                P[i][j] = w[j] / z
            dp = {}
            for j in js:
                kept = drop is None or bool(drop[i, j])
                x = sum((da[i][l] * va[j][l] for l in range(Ev)), arb(0))
                dp[j] = x * fa if kept else arb(0)
                W[i][j] = P[i][j] * fa if kept else arb(0)
            if uni:
                continue
            d_i = sum((P[i][j] * dp[j] for j in js), arb(0))
            for j in js:
                dS[i][j] = P[i][j] * (dp[j] - d_i)
        out = {"q": np.empty((L, E), dtype=object), "k": np.empty((S, E), dtype=object),
               "v": np.empty((S, Ev), dtype=object), "m": np.empty((L, S), dtype=object)}
        for i in range(L):
            for l in range(E):
                out["q"][i, l] = c * sum((dS[i][j] * ka[j][l] for j in range(S)), arb(0))
            for j in range(S):
                out["m"][i, j] = dS[i][j]
        for j in range(S):
            for l in range(E):
                out["k"][j, l] = c * sum((dS[i][j] * qa[i][l] for i in range(L)), arb(0))
            for l in range(Ev):
                out["v"][j, l] = sum((W[i][j] * da[i][l] for i in range(L)), arb(0))
        return out
    finally:
        ctx.prec = old
