"""Theorem 14: the backward pass of attention (FlashAttention-2's formulas).

For one head with scores s_ij = β q_i·k_j (+ a constant mask), weights
P = softmax_rows(s), output O = P V and a scalar loss L = Σ_i Σ_f dO_if O_if (so that
dO = ∂L/∂O), the gradients are::

    dV = Pᵀ dO,   dP = dO Vᵀ,   D_i = Σ_j P_ij dP_ij = Σ_f dO_if O_if,
    dS = P ∘ (dP − D),   dQ = β·dS K,   dK = β·dSᵀ Q,

for every number of keys n, of queries and of features; and each row of dS sums
to 0 (so dQ does not change when every key is shifted by the same vector).  The
proof differentiates one row's loss L_i = Σ_j w_j dP_ij (w_j = e^{s_j}/Σ_l e^{s_l})
with indexed sums of symbolic length n; the cross-check differentiates the
forward pass itself by Taylor arithmetic in Arb (no backward formula) on random
instances and compares.
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb, arb_series

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, j, k, l, n, random_rational, s

dP = sp.IndexedBase(r"dP", real=True)
g = sp.IndexedBase(r"dO", real=True)     # one row of dO
vv = sp.IndexedBase(r"v", real=True)
q = sp.IndexedBase("q", real=True)
K = sp.IndexedBase("k", real=True)
f, m, e = sp.symbols("f m e", integer=True, positive=True)
d_v = sp.Symbol("d_v", integer=True, positive=True)
d_k = sp.Symbol("d_k", integer=True, positive=True)
beta = sp.Symbol("beta", positive=True)  # the scale, 1/sqrt(d_k) in attention


def prove() -> Derivation:
    d = Derivation()
    Z = sp.Sum(sp.exp(s[l]), (l, 1, n))
    w_j = sp.exp(s[j]) / Z
    w_k = sp.exp(s[k]) / Z
    d.define("w_j", w_j, "softmax weights of one query row")
    d.define(r"dP_{j}", sp.Sum(g[f] * vv[j, f], (f, 1, d_v)),
             "$dP = dO\\, V^{\\top}$, row $i$: the gradient of the output row against value $j$")
    d.fact(r"L_i = \sum_{f} dO_{if} O_{if} = \sum_{f} dO_{if} \sum_j w_j v_{jf} "
           r"= \sum_j w_j\, dP_{ij}",
           "finite sums commute ($O_i = \\sum_j w_j v_j$)")
    L_i = sp.Sum(sp.exp(s[j]) * dP[j], (j, 1, n)) / Z
    D = L_i
    d.define("D_i", D, "$D_i = \\sum_j w_j dP_{ij}$, which equals $L_i = dO_i \\cdot O_i$")
    # dV: L_i is linear in v with coefficient w_j g_f
    L_v = sp.Sum(w_j * sp.Sum(g[f] * vv[j, f], (f, 1, d_v)), (j, 1, n))
    d.identity(sp.Derivative(L_v, vv[k, m]), w_k * g[m],
               "$L_i$ is linear in the values; summed over $i$: $dV = P^{\\top} dO$",
               assume=sp.Q.le(k, n) & sp.Q.le(m, d_v),
               show=(r"\frac{\partial L_i}{\partial v_{km}}", r"w_k\, dO_{im}"))
    # dS: the quotient rule
    dS_k = w_k * (dP[k] - D)
    d.identity(sp.Derivative(L_i, s[k]), dS_k, "quotient rule: $dS = P \\circ (dP - D)$",
               assume=sp.Q.le(k, n),
               show=(r"dS_{ik} = \frac{\partial L_i}{\partial s_{ik}}", r"w_k (dP_{ik} - D_i)"))
    d.identity(sp.Sum(dS_k, (k, 1, n)), 0, "each row of dS sums to 0 (the weights sum to 1)",
               show=(r"\sum_{k=1}^{n} dS_{ik}", 0))
    # chain rule through the scores
    s_k = beta * sp.Sum(q[e] * K[k, e], (e, 1, d_k))
    d.identity(sp.Derivative(s_k, q[m]), beta * K[k, m],
               "$s_{ik} = \\beta\\, q_i \\cdot k_k$ is linear in $q_i$",
               assume=sp.Q.le(m, d_k),
               show=(r"\frac{\partial s_{ik}}{\partial q_{im}}", r"\beta\, k_{km}"))
    d.identity(sp.Derivative(s_k, K[k, m]), beta * q[m], "and in $k_k$",
               assume=sp.Q.le(m, d_k),
               show=(r"\frac{\partial s_{ik}}{\partial k_{km}}", r"\beta\, q_{im}"))
    d.fact(r"\frac{\partial L}{\partial q_{im}} = \sum_k dS_{ik} \frac{\partial s_{ik}}"
           r"{\partial q_{im}},\ \frac{\partial L}{\partial k_{km}} = \sum_i dS_{ik} "
           r"\frac{\partial s_{ik}}{\partial k_{km}}",
           "chain rule: $L$ depends on $q_i$ only through row $i$ of the scores, on $k_k$ through column $k$")
    d.conclude(r"$dV = P^{\top} dO$, $dS = P \circ (dP - D)$ with $D_i = \sum_j P_{ij} dP_{ij} "
               r"= dO_i \cdot O_i$, $dQ = \beta\, dS\, K$, $dK = \beta\, dS^{\top} Q$, and "
               r"$\sum_j dS_{ij} = 0$, for all sizes.")
    return d


def _taylor_gradients(Q: list[list[arb]], Kmat: list[list[arb]], V: list[list[arb]],
                      dO: list[list[arb]], scale: arb) -> dict[str, list[list[arb]]]:
    """∂L/∂x for every input element x, by Taylor arithmetic through the forward
    pass (degree 1 in a perturbation of x); no backward formula is used."""

    def loss(which: tuple[str, int, int]) -> arb:
        def ent(name: str, mat: list[list[arb]], a: int, b: int) -> arb_series:
            return arb_series([mat[a][b], 1] if which == (name, a, b) else [mat[a][b]], prec=2)

        total = arb_series([0], prec=2)
        for a in range(len(Q)):
            ws = []
            for b in range(len(Kmat)):
                acc = arb_series([0], prec=2)
                for x in range(len(Q[0])):
                    acc = acc + ent("q", Q, a, x) * ent("k", Kmat, b, x)
                ws.append((acc * scale).exp())
            z = sum(ws[1:], ws[0])
            for b, wb in enumerate(ws):
                p = wb / z
                for y in range(len(V[0])):
                    total = total + p * ent("v", V, b, y) * dO[a][y]
        coeffs = total.coeffs()
        return coeffs[1] if len(coeffs) > 1 else arb(0)

    return {name: [[loss((name, a, b)) for b in range(len(mat[0]))] for a in range(len(mat))]
            for name, mat in (("q", Q), ("k", Kmat), ("v", V))}


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        for _ in range(3):
            Lq, S, E, Ev = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 2)

            def mat(r: int, cols: int) -> list[list[arb]]:
                return [[arb(random_rational(rng, -2, 2, 8)) for _ in range(cols)] for _ in range(r)]

            Q, Km, V, dO = mat(Lq, E), mat(S, E), mat(S, Ev), mat(Lq, Ev)
            scale = arb(E).rsqrt()
            ref = _taylor_gradients(Q, Km, V, dO, scale)
            # the formulas
            P = []
            for a in range(Lq):
                ws = [(scale * sum((Q[a][x] * Km[b][x] for x in range(E)), arb(0))).exp()
                      for b in range(S)]
                z = sum(ws, arb(0))
                P.append([wb / z for wb in ws])
            dP = [[sum((dO[a][y] * V[b][y] for y in range(Ev)), arb(0)) for b in range(S)]
                  for a in range(Lq)]
            O = [[sum((P[a][b] * V[b][y] for b in range(S)), arb(0)) for y in range(Ev)]
                 for a in range(Lq)]
            D = [sum((P[a][b] * dP[a][b] for b in range(S)), arb(0)) for a in range(Lq)]
            dS = [[P[a][b] * (dP[a][b] - D[a]) for b in range(S)] for a in range(Lq)]
            cs = {"n_q": Lq, "n": S, "d_k": E, "d_v": Ev}
            for a in range(Lq):
                chk.agree(r"$D_i = dO_i \cdot O_i$ (every row)",
                          D[a], sum((dO[a][y] * O[a][y] for y in range(Ev)), arb(0)), case=cs)
                chk.agree(r"$\sum_j dS_{ij} = 0$ (every row)", sum(dS[a], arb(0)), 0, case=cs)
                for x in range(E):
                    dq = scale * sum((dS[a][b] * Km[b][x] for b in range(S)), arb(0))
                    chk.agree(r"$dQ = \beta\,dS\,K$ = Taylor-mode $\partial L/\partial Q$ "
                              r"(every entry)", dq, ref["q"][a][x], case=cs)
            for b in range(S):
                for x in range(E):
                    dk = scale * sum((dS[a][b] * Q[a][x] for a in range(Lq)), arb(0))
                    chk.agree(r"$dK = \beta\,dS^{\top} Q$ = Taylor-mode $\partial L/\partial K$ "
                              r"(every entry)", dk, ref["k"][b][x], case=cs)
                for y in range(Ev):
                    dv = sum((P[a][b] * dO[a][y] for a in range(Lq)), arb(0))
                    chk.agree(r"$dV = P^{\top} dO$ = Taylor-mode $\partial L/\partial V$ "
                              r"(every entry)", dv, ref["v"][b][y], case=cs)
    return chk


THEOREM = Theorem(
    name="backward",
    title=r"The backward pass of attention: $dS = P \circ (dP - D)$",
    statement_latex=r"For $O = \operatorname{softmax}(\beta\,QK^{\top})V$ and a loss with "
    r"$\partial L/\partial O = dO$: $dV = P^{\top} dO$, $dS = P \circ (dP - D)$ with "
    r"$dP = dO\,V^{\top}$ and $D_i = \sum_j P_{ij} dP_{ij} = dO_i \cdot O_i$, "
    r"$dQ = \beta\,dS\,K$, $dK = \beta\,dS^{\top} Q$; every row of $dS$ sums to $0$.",
    prove=prove,
    cross_check=cross_check,
    number=14,
)
