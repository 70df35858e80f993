"""Theorem 8: one token: attention is the identity on the value; with W^O = I,
multi-head attention returns the concatenation of the heads' values.

Seed page, Example B: one token, two heads, values (1, 2) and (3, 4),
``W^O = I``: output (1, 2, 3, 4).  Here for every number of heads h and every
head width d_v.
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb_mat

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import (
    arb_precision,
    attention,
    hstack,
    j,
    max_abs_diff,
    random_arb_mat,
    s,
)

h = sp.Symbol("h", integer=True, positive=True)
dv = sp.Symbol("d_v", integer=True, positive=True)
c = sp.Symbol("c", integer=True, positive=True)  # column inside a head, 1..d_v
hi = sp.Symbol("i", integer=True, positive=True)  # head index, 1..h
m, mp = sp.symbols("m m'", integer=True, positive=True)  # column of the concatenation
V = sp.IndexedBase("V")  # V[j, c]: value row j of one head
Vh = sp.IndexedBase("v")  # v[i, c]: the single token's value in head i
C = sp.IndexedBase("C")  # the concatenation


def prove() -> Derivation:
    d = Derivation()
    w1 = sp.exp(s[1]) / sp.Sum(sp.exp(s[j]), (j, 1, 1))
    d.define("w_1", w1, "softmax over the single key ($n = 1$)")
    d.identity(w1, 1, "the only weight is 1, whatever the score")
    d.identity(sp.Sum(w1 * V[j, c], (j, 1, 1)), V[1, c], "each head outputs its value row",
               show=(r"\mathrm{head}[c] = \sum_{j=1}^{1} w_j V_{jc}", V[1, c]))
    d.define(r"C_{(i-1)d_v + c}", Vh[hi, c],
             "concatenate: head $i$ fills columns $(i-1) d_v + 1, \\dots, i d_v$")
    d.fact(r"(i, c) \mapsto (i-1)d_v + c \text{ is a bijection } [1,h]\times[1,d_v] \to "
           r"[1, h d_v]", "division with remainder")
    d.identity(sp.Sum(sp.KroneckerDelta(m, mp) * C[mp], (mp, 1, h * dv)), C[m],
               "$W^O = I$, $1 \\le m \\le h d_v$", assume=sp.Q.le(m, h * dv),
               show=(r"(C\, I)_m = \sum_{m'=1}^{h d_v} C_{m'} \delta_{m' m}", C[m]))
    d.conclude(r"for a single token every softmax weight is $1$, each head returns its value "
               r"vector, and with $W^O = I$ the output is their concatenation "
               r"$(v^{(1)} \mid \dots \mid v^{(h)})$, for every $h$ and $d_v$.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        # Example B: one token, two heads of width 2, values (1, 2) and (3, 4)
        vals = [arb_mat([[1, 2]]), arb_mat([[3, 4]])]
        out = hstack([attention(arb_mat([[0.5, -1]]), arb_mat([[2, 7]]), v, 0.5) for v in vals])
        chk.agree(r"output $= (1, 2, 3, 4)$ for the values $(1, 2)$, $(3, 4)$",
                  max_abs_diff(out * arb_mat([[1 if r == q else 0 for q in range(4)]
                                              for r in range(4)]), arb_mat([[1, 2, 3, 4]])), 0,
                  case={"Example": "B"})
        for _ in range(4):
            heads, width = rng.randint(1, 6), rng.randint(1, 5)
            dk = rng.randint(1, 5)
            d_model = rng.randint(1, 12)
            x = random_arb_mat(rng, 1, d_model)
            Wq = [random_arb_mat(rng, d_model, dk) for _ in range(heads)]
            Wk = [random_arb_mat(rng, d_model, dk) for _ in range(heads)]
            Wv = [random_arb_mat(rng, d_model, width) for _ in range(heads)]
            got = hstack([attention(x * Wq[t], x * Wk[t], x * Wv[t], 1) for t in range(heads)])
            ident = arb_mat([[1 if r == q else 0 for q in range(heads * width)]
                             for r in range(heads * width)])
            want = x * hstack(Wv)  # the heads' values side by side
            chk.agree(r"$\mathrm{MHA}(x)$ with $W^O = I$ equals $(xW^V_1 \mid \dots \mid xW^V_h)$",
                      max_abs_diff(got * ident, want), 0,
                      case={"h": heads, "d_v": width, r"d_{\mathrm{model}}": d_model})
    return chk


THEOREM = Theorem(
    name="single_token",
    title="A single token: attention is the identity on the value",
    statement_latex=r"With one key ($n = 1$) every softmax weight is $1$, so attention "
    r"returns the value row whatever the query and key; with $W^O = I$, multi-head attention "
    r"of one token returns the concatenation of its $h$ value vectors.",
    prove=prove,
    cross_check=cross_check,
    number=8,
)
