"""Theorem 13: stacked projections.  The h per-head matrices W^Q_i (d_model x d_k)
side by side form one d_model x h d_k matrix W^Q; X W^Q is [X W^Q_1 | ... | X W^Q_h],
so attention computed from the stacked product (what implementations do, with a
reshape to (n, h, d_k)) equals attention computed head by head.

Seed page, Example I: "8 x 64 = 512, so all heads' W^Q together equal one
512 x 512 matrix -- the stacked projection trick".
"""

from __future__ import annotations

import random

import sympy as sp

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, attention, columns, hstack, max_abs_diff, random_arb_mat

h, dk, dm, n = sp.symbols("h d_k d_model n", integer=True, positive=True)
r, m, c, hi = sp.symbols("r m c i", integer=True, positive=True)
X = sp.IndexedBase("X")
Wh = sp.IndexedBase("W")  # Wh[i, m, c] = (W^Q_i)_{m c}


def stacked(row: sp.Expr, head: sp.Expr, col: sp.Expr) -> sp.Expr:
    """Entry (row, (head - 1) d_k + col) of the stacked W^Q: by definition (W^Q_head)_{row col}."""
    return Wh[head, row, col]


def prove() -> Derivation:
    d = Derivation()
    d.define(r"W^Q_{m,\,(i-1)d_k + c}", Wh[hi, m, c],
             "stack: head $i$ fills columns $(i-1) d_k + 1, \\dots, i d_k$")
    d.fact(r"(i, c) \mapsto (i-1)d_k + c \text{ is a bijection } [1,h]\times[1,d_k] \to "
           r"[1, h d_k]", "division with remainder: every column is some head's column")
    d.identity(sp.Sum(X[r, m] * stacked(m, hi, c), (m, 1, dm)),
               sp.Sum(X[r, m] * Wh[hi, m, c], (m, 1, dm)),
               "column $(i-1) d_k + c$ of $X W^Q$ is column $c$ of $X W^Q_i$",
               show=(r"(X W^Q)_{r,\,(i-1)d_k + c} = \sum_{m=1}^{d_{\mathrm{model}}} X_{rm} "
                     r"W^Q_{m,\,(i-1)d_k + c}", r"(X W^Q_i)_{rc}"))
    d.identity(sp.Sum(dk, (hi, 1, h)), h * dk, "the stacked matrix is $d_{\\mathrm{model}} \\times h d_k$",
               show=(r"\mathrm{cols}(W^Q)", h * dk))
    d.fact(r"Q = X W^Q \in \mathbb{R}^{n \times h d_k} \xrightarrow{\text{reshape}} "
           r"(n, h, d_k):\ Q[r, i, c] = Q_{r,\,(i-1)d_k + c}",
           "row-major reshape (torch view) splits the columns head by head")
    d.fact(r"Q_i = X W^Q_i,\ K_i = X W^K_i,\ V_i = X W^V_i \Rightarrow "
           r"\mathrm{head}_i \text{ identical}", "the same for $W^K$ and $W^V$; each head "
           "only sees its own slices")
    d.conclude(r"for all $h$, $d_k$, $d_{\mathrm{model}}$, $n$: $X[W^Q_1 \mid \dots \mid "
               r"W^Q_h] = [XW^Q_1 \mid \dots \mid XW^Q_h]$, so one $d_{\mathrm{model}} \times "
               r"hd_k$ projection followed by a split gives exactly the per-head queries "
               r"(keys, values), and multi-head attention computed either way is identical.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb + exact")
    ns, ds, ks = sp.symbols("n d_model d_k", integer=True, positive=True)
    Xs = sp.MatrixSymbol("X", ns, ds)
    for heads in (2, 3, 4):
        Ws = [sp.MatrixSymbol(f"W_{t}", ds, ks) for t in range(1, heads + 1)]
        lhs = sp.block_collapse(Xs * sp.BlockMatrix([Ws]))
        rhs = sp.BlockMatrix([[Xs * W for W in Ws]])
        chk.holds(r"SymPy block algebra, symbolic $n, d_{\mathrm{model}}, d_k$: "
                  r"$X[W_1 \mid \dots \mid W_h] = [XW_1 \mid \dots \mid XW_h]$", lhs == rhs,
                  str(lhs), case={"h": heads})
    with arb_precision():
        for _ in range(4):
            heads, d_k, d_v = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 4)
            size, d_model = rng.randint(1, 7), rng.randint(1, 8)
            Xm = random_arb_mat(rng, size, d_model)
            Wq = [random_arb_mat(rng, d_model, d_k) for _ in range(heads)]
            Wk = [random_arb_mat(rng, d_model, d_k) for _ in range(heads)]
            Wv = [random_arb_mat(rng, d_model, d_v) for _ in range(heads)]
            Wo = random_arb_mat(rng, heads * d_v, d_model)
            scale = 1 / d_k
            per_head = hstack([attention(Xm * Wq[t], Xm * Wk[t], Xm * Wv[t], scale)
                               for t in range(heads)]) * Wo
            Q, K, V = Xm * hstack(Wq), Xm * hstack(Wk), Xm * hstack(Wv)
            stacked_out = hstack([attention(columns(Q, t * d_k, (t + 1) * d_k),
                                             columns(K, t * d_k, (t + 1) * d_k),
                                             columns(V, t * d_v, (t + 1) * d_v), scale)
                                  for t in range(heads)]) * Wo
            chk.agree(r"Arb: stacked-and-split MHA $=$ per-head MHA",
                      max_abs_diff(stacked_out, per_head), 0,
                      case={"h": heads, "d_k": d_k, "d_v": d_v, "n": size,
                            r"d_{\mathrm{model}}": d_model})
    return chk


THEOREM = Theorem(
    name="stacked",
    title="Stacked projections",
    statement_latex=r"Placing the $h$ matrices $W^Q_i \in \mathbb{R}^{d_{\mathrm{model}} "
    r"\times d_k}$ side by side gives $W^Q \in \mathbb{R}^{d_{\mathrm{model}} \times h d_k}$ "
    r"with $XW^Q = [XW^Q_1 \mid \dots \mid XW^Q_h]$; likewise for $W^K$, $W^V$, so attention "
    r"computed from the stacked projections and split into heads equals attention computed "
    r"head by head.",
    prove=prove,
    cross_check=cross_check,
    number=13,
)
