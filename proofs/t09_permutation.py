"""Theorem 9: unmasked self-attention is permutation-equivariant.

Permuting the input tokens permutes the output rows the same way:
Attn(P X) = P Attn(X) for every permutation matrix P, every n and every
choice of projections.  (A causal mask breaks this: the statement is for the
unmasked case.)
"""

from __future__ import annotations

import itertools
import random

import sympy as sp
from flint import arb_mat

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, attention, max_abs_diff, random_arb_mat

n = sp.Symbol("n", integer=True, positive=True)
dm, dk, dv = sp.symbols("d_model d_k d_v", integer=True, positive=True)
P = sp.MatrixSymbol("P", n, n)
X = sp.MatrixSymbol("X", n, dm)
WQ = sp.MatrixSymbol("W^Q", dm, dk)
WK = sp.MatrixSymbol("W^K", dm, dk)
WV = sp.MatrixSymbol("W^V", dm, dv)
A = sp.MatrixSymbol("A", n, n)  # softmax(S), S = Q K^T / sqrt(d_k)


def prove() -> Derivation:
    d = Derivation()
    Q, K, V = X * WQ, X * WK, X * WV
    d.define("P", r"(\delta_{\pi(i) j})_{ij}", "the permutation matrix of $\\pi$: $(P X)_i = "
             "X_{\\pi(i)}$")
    d.fact(r"P^{\top} P = I", "a permutation matrix is orthogonal (given to SymPy as "
           "Q.orthogonal(P))")
    d.identity((P * X * WQ) * (P * X * WK).T, P * (Q * K.T) * P.T,
               "scores of the permuted tokens, $(AB)^{\\top} = B^{\\top} A^{\\top}$",
               show=(r"(P X W^Q)(P X W^K)^{\top}", P * (Q * K.T) * P.T))
    d.fact(r"\bigl(P S P^{\top}\bigr)_{ij} = S_{\pi(i)\pi(j)}",
           "entries of a permuted matrix")
    d.fact(r"\sum_{l=1}^{n} e^{S_{\pi(i)\pi(l)}} = \sum_{l=1}^{n} e^{S_{\pi(i) l}}",
           "re-index a finite sum by the bijection $\\pi$")
    d.fact(r"\mathrm{softmax}\bigl(P S P^{\top}\bigr) = P\,\mathrm{softmax}(S)\,P^{\top}",
           "from the two lines above")
    d.identity(P * A * P.T * (P * V), P * (A * V), "output of the permuted tokens",
               assume=sp.Q.orthogonal(P),
               show=(r"\mathrm{Attn}(PX) = P A P^{\top}\,(P X W^V)", P * A * V))
    d.conclude(r"$\mathrm{Attn}(PX) = P\,\mathrm{Attn}(X)$ for every permutation matrix $P$, "
               r"every $n$ and all projections: unmasked self-attention is "
               r"permutation-equivariant.")
    return d


def _exact_instance(size: int, width: int) -> bool:
    """Exact SymPy check with symbolic entries, every permutation of ``size`` tokens."""
    S = sp.Matrix(size, size, lambda r, c: sp.Symbol(f"s_{r}{c}", real=True))
    Vm = sp.Matrix(size, width, lambda r, c: sp.Symbol(f"v_{r}{c}", real=True))

    def soft(M: sp.Matrix) -> sp.Matrix:
        rows = []
        for r in range(M.rows):
            den = sum(sp.exp(M[r, c]) for c in range(M.cols))
            rows.append([sp.exp(M[r, c]) / den for c in range(M.cols)])
        return sp.Matrix(rows)

    base = soft(S) * Vm
    for perm in itertools.permutations(range(size)):
        Pm = sp.Matrix(size, size, lambda r, c, p=perm: 1 if p[r] == c else 0)
        if (soft(Pm * S * Pm.T) * (Pm * Vm) - Pm * base).applyfunc(sp.simplify) != \
                sp.zeros(size, width):
            return False
    return True


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb + exact")
    for size in (2, 3):
        chk.holds(r"exact, symbolic entries: $\mathrm{Attn}(PX) = P\,\mathrm{Attn}(X)$ for "
                  r"all $n!$ permutations", _exact_instance(size, 2), case={"n": size})
    with arb_precision():
        for _ in range(4):
            size, d_model = rng.randint(2, 9), rng.randint(1, 6)
            d_k, d_v = rng.randint(1, 5), rng.randint(1, 5)
            Xm = random_arb_mat(rng, size, d_model)
            Wq, Wk = random_arb_mat(rng, d_model, d_k), random_arb_mat(rng, d_model, d_k)
            Wv = random_arb_mat(rng, d_model, d_v)
            perm = list(range(size))
            rng.shuffle(perm)
            Pm = arb_mat([[1 if perm[r] == c else 0 for c in range(size)] for r in range(size)])
            scale = 1 / d_k
            out = attention(Xm * Wq, Xm * Wk, Xm * Wv, scale)
            PX = Pm * Xm
            out_p = attention(PX * Wq, PX * Wk, PX * Wv, scale)
            chk.agree(r"Arb: $\mathrm{Attn}(PX) = P\,\mathrm{Attn}(X)$, a random permutation",
                      max_abs_diff(out_p, Pm * out), 0,
                      case={"n": size, r"d_{\mathrm{model}}": d_model})
    return chk


THEOREM = Theorem(
    name="permutation",
    title="Permutation equivariance of unmasked self-attention",
    statement_latex=r"For every permutation matrix $P$, unmasked self-attention satisfies "
    r"$\mathrm{Attn}(PX) = P\,\mathrm{Attn}(X)$, with $\mathrm{Attn}(X) = "
    r"\mathrm{softmax}\bigl(XW^Q (XW^K)^{\top}/\sqrt{d_k}\bigr) XW^V$.",
    prove=prove,
    cross_check=cross_check,
    number=9,
)
