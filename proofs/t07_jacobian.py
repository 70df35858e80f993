"""Theorem 7: the softmax Jacobian diag(w) - w w^T, and why gradients die.

Seed page, Example F: unscaled scores (40, 8) have gap 32 and
``w_1 ~ 1 - e^{-32}``; "gradients die".  The derivative of the winning weight
with respect to its own score is w(1 - w) = e^{-g}/(1 + e^{-g})^2 for two
keys, at most (n - 1) e^{-gap} in general: about 1.3e-14 at gap 32 against
0.018 at gap 4 (the scaled scores (5, 1)).
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb, arb_series

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, arb_softmax, i, k, l, n, random_scores, s, show

gam = sp.Symbol("gamma", positive=True)
wsym = sp.Symbol("w", real=True)


def prove() -> Derivation:
    d = Derivation()
    denom = sp.Sum(sp.exp(s[l]), (l, 1, n))
    w_i = sp.exp(s[i]) / denom
    w_k = sp.exp(s[k]) / denom
    d.define("w_i", w_i, "softmax weights")
    d.identity(sp.Derivative(denom, s[k]), sp.exp(s[k]), "only the term $l = k$ depends on $s_k$",
               assume=sp.Q.le(k, n))
    d.identity(sp.Derivative(w_i, s[k]), w_i * sp.KroneckerDelta(i, k) - w_i * w_k,
               "quotient rule", assume=sp.Q.le(k, n),
               show=(r"\frac{\partial w_i}{\partial s_k}", r"w_i \delta_{ik} - w_i w_k"))
    d.define(r"J", r"\operatorname{diag}(w) - w w^{\top}",
             "the matrix of the entries $w_i \\delta_{ik} - w_i w_k$")
    d.identity((w_i * sp.KroneckerDelta(i, k) - w_i * w_k).subs(k, i), w_i * (1 - w_i),
               "the winning score's own gradient", show=(r"\frac{\partial w_i}{\partial s_i}",
                                                         r"w_i (1 - w_i)"))
    d.identity(sp.Sum(w_i * sp.KroneckerDelta(i, k) - w_i * w_k, (k, 1, n)), 0,
               "each row of $J$ sums to 0 (weights sum to 1; $1 \\le i \\le n$)", assume=sp.Q.le(i, n),
               show=(r"\sum_{k=1}^{n} J_{ik}", 0))
    d.inequality(wsym * (1 - wsym), "<=", 1 - wsym, "the difference is $(1 - w)^2$")
    d.fact(r"1 - w_1 \le (n-1)\, e^{-\gamma}", "Theorem 4, $\\gamma$ the smallest gap")
    w2 = 1 / (1 + sp.exp(-gam))
    d.identity(w2 * (1 - w2), sp.exp(-gam) / (1 + sp.exp(-gam)) ** 2,
               "two keys with gap $\\gamma$", show=(r"w_1 (1 - w_1)",
                                               sp.exp(-gam) / (1 + sp.exp(-gam)) ** 2))
    x = sp.Symbol("x", positive=True)
    d.inequality(x / (1 + x) ** 2, "<=", x, "$x = e^{-\\gamma} > 0$, denominator $\\ge 1$")
    d.conclude(r"$\partial w_i/\partial s_k = w_i(\delta_{ik} - w_k)$, i.e. "
               r"$J = \operatorname{diag}(w) - ww^{\top}$, for every $n$; the winner's own "
               r"gradient is $w_1(1 - w_1) \le (n-1)e^{-\gamma}$, which for Example F's gap "
               r"$32$ is below $e^{-32} \approx 1.27\times10^{-14}$.")
    return d


def _jacobian_column(scores: list[arb], col: int) -> list[arb]:
    """d w_i / d s_col for every i, exactly enclosed: Taylor arithmetic in x = s_col shift."""
    exps = [arb_series([x, 1] if p == col else [x], prec=2).exp()
            for p, x in enumerate(scores)]
    total = exps[0]
    for e in exps[1:]:
        total = total + e
    return [(e / total)[1] for e in exps]


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        for _ in range(4):
            size = rng.randint(2, 12)
            scores = [arb(x) for x in random_scores(rng, size, lo=-10, hi=10)]
            w = arb_softmax(scores)
            col = rng.randrange(size)
            deriv = _jacobian_column(scores, col)
            err = sum((abs(deriv[p] - (w[p] * ((1 if p == col else 0) - w[col])))
                       for p in range(size)), arb(0))
            chk.agree(r"Taylor-mode $\partial w/\partial s_k$ = column $k$ of "
                      r"$\operatorname{diag}(w) - ww^{\top}$", err, 0, case={"n": size, "k": col + 1})
            chk.agree(r"column $k$ of $J$ sums to $0$", sum(deriv, arb(0)), 0,
                      case={"n": size, "k": col + 1})
        # Example F: unscaled (40, 8), scaled by 1/sqrt(64) = 1/8: (5, 1)
        for pair, gap in (([arb(40), arb(8)], 32), ([arb(5), arb(1)], 4)):
            g = pair[0] - pair[1]
            cs = {"Example": "F", r"\gamma": gap}  # scores (40, 8), and scaled by 1/8: (5, 1)
            grad = _jacobian_column(pair, 0)[0]
            closed = (-g).exp() / (1 + (-g).exp()) ** 2
            chk.agree(r"$\partial w_1/\partial s_1 = e^{-\gamma}/(1 + e^{-\gamma})^2$ for the "
                      r"scores $(40, 8)$ and $(5, 1)$",
                      grad, closed, case=cs)
            chk.holds(r"$\partial w_1/\partial s_1 \le e^{-\gamma}$", bool(grad <= (-g).exp()),
                      f"dw_1/ds_1 = {show(grad, 10)}", case=cs)
        g32 = _jacobian_column([arb(40), arb(8)], 0)[0]
        g4 = _jacobian_column([arb(5), arb(1)], 0)[0]
        chk.note(r"$\partial w_1/\partial s_1$ at scores $(40, 8)$", g32, case={"Example": "F"})
        chk.note(r"$\partial w_1/\partial s_1$ at scores $(5, 1)$", g4, case={"Example": "F"})
        chk.note(r"their ratio, unscaled over scaled", g32 / g4, case={"Example": "F"})
    return chk


THEOREM = Theorem(
    name="jacobian",
    title="The softmax Jacobian and the vanishing gradient of a saturated softmax",
    statement_latex=r"$\partial w_i/\partial s_k = w_i(\delta_{ik} - w_k)$, i.e. the Jacobian "
    r"of softmax is $\operatorname{diag}(w) - ww^{\top}$; its rows sum to $0$; the gradient "
    r"of the winning weight with respect to its own score is $w(1-w) \le (n-1)e^{-\gamma}$ "
    r"($\gamma$ the gap to the runner-up).",
    prove=prove,
    cross_check=cross_check,
    number=7,
)
