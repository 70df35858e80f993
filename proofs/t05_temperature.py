"""Theorem 5: temperature: scale -> 0 gives uniform weights, scale -> oo the argmax.

The scores are multiplied by a scale beta >= 0 (beta = 1/temperature; the
attention scale 1/sqrt(d_k) is such a factor).  Both limits are derived from
exact rewritings plus bounds whose limits are plain exponentials; sympy.limit
never sees a softmax (it returns wrong answers there, REFERENCES.md section 5).
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb, fmpq

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, arb_softmax, i, l, n, s, show

beta = sp.Symbol("beta", positive=True)
R = sp.Symbol("R", nonnegative=True)  # max_j |s_j|
x = sp.Symbol("x", nonnegative=True)
M = sp.Symbol("s_max", real=True)  # the largest score, printed s_{max}
r = sp.Symbol("r", integer=True, positive=True)  # how many keys share it
K = sp.Symbol("K", integer=True, positive=True)  # how many keys score lower: n - r
n_shown = sp.Symbol("n", integer=True, positive=True)
g = sp.IndexedBase("g", positive=True)  # gaps of the lower keys
gap = sp.Symbol("gamma", positive=True)  # the smallest gap
F = sp.Symbol("F", nonnegative=True)  # sum of e^{-beta g_l} over the lower keys


def prove() -> Derivation:
    # the steps are decided with K = n - r >= 1 lower keys; they are printed with n - r
    d = Derivation(display={K: n_shown - r})
    denom = sp.Sum(sp.exp(beta * s[l]), (l, 1, n))
    w = sp.exp(beta * s[i]) / denom
    d.define(r"w_i(\beta)", w, "softmax of the scaled scores $\\beta s_j$, $\\beta \\ge 0$")
    # --- beta -> 0 ------------------------------------------------------
    d.identity(w.subs(beta, 0), 1 / n, "at $\\beta = 0$ every $e^{0 \\cdot s_j} = 1$",
               show=(r"w_i(0)", 1 / n))
    d.fact(r"e^{-\beta R} \le e^{\beta s_j} \le e^{\beta R},\quad R = \max_j |s_j|",
           "exp is increasing, $\\beta \\ge 0$")
    d.identity(sp.exp(-beta * R) / sp.Sum(sp.exp(beta * R), (l, 1, n)),
               sp.exp(-2 * beta * R) / n, "smallest numerator over largest denominator")
    d.identity(sp.exp(beta * R) / sp.Sum(sp.exp(-beta * R), (l, 1, n)),
               sp.exp(2 * beta * R) / n, "largest numerator over smallest denominator")
    d.identity(sp.exp(x) + sp.exp(-x) - 2, (sp.exp(x / 2) - sp.exp(-x / 2)) ** 2,
               "so $1 - e^{-x} \\le e^{x} - 1$ ($x = 2\\beta R$)")
    d.sign((sp.exp(x / 2) - sp.exp(-x / 2)) ** 2, ">=", "a real square")
    d.fact(r"\bigl|w_i(\beta) - \tfrac1n\bigr| \le \frac{e^{2\beta R} - 1}{n}",
           "$w_i(\\beta)$ lies between the two bounds above")
    d.limit((sp.exp(2 * beta * R) - 1) / n, beta, 0, 0, "the bound vanishes as $\\beta \\to 0$")
    # --- beta -> oo -------------------------------------------------------
    d.fact(r"\text{keys relabelled: } s_1 = \dots = s_r = s_{\max},\ s_j = s_{\max} - g_j\ "
           r"(g_j > 0) \text{ for } r < j \le n",
           "reorder the terms of the sum; $r = n$ is Theorem 1")
    Z = sp.Sum(sp.exp(beta * M), (l, 1, r)) + sp.Sum(sp.exp(beta * (M - g[l])), (l, r + 1, r + K))
    Fsum = sp.Sum(sp.exp(-beta * g[l]), (l, r + 1, r + K))
    d.identity(Z, sp.exp(beta * M) * (r + Fsum), "factor out $e^{\\beta s_{\\max}}$",
               show=(r"\sum_{l=1}^{n} e^{\beta s_l}", sp.exp(beta * M) * (r + Fsum)))
    d.identity(sp.exp(beta * M) / Z, 1 / (r + Fsum), "weight of a tied maximum, $i \\le r$",
               show=(r"w_i(\beta)", 1 / (r + Fsum)))
    d.identity(sp.exp(beta * (M - g[i])) / Z, sp.exp(-beta * g[i]) / (r + Fsum),
               "weight of a lower key, $i > r$", show=(r"w_i(\beta)",
                                                    sp.exp(-beta * g[i]) / (r + Fsum)))
    d.define("F", Fsum, "$F \\ge 0$")
    d.identity(1 / r - 1 / (r + F), F / (r * (r + F)), "distance of a tied weight from $1/r$",
               show=(r"\frac{1}{r} - \frac{1}{r + F}", F / (r * (r + F))))
    d.inequality(F / (r * (r + F)), "<=", F / r**2, "$r + F \\ge r$")
    d.fact(r"F \le (n - r)\, e^{-\beta\gamma},\quad \gamma = \min_{j > r} g_j",
           "exp is increasing")
    d.limit(K * sp.exp(-beta * gap) / r**2, beta, sp.oo, 0, "so a tied weight tends to $1/r$")
    d.inequality(sp.exp(-beta * g[i]) / (r + F), "<=", sp.exp(-beta * g[i]) / r, "$F \\ge 0$")
    d.limit(sp.exp(-beta * g[i]) / r, beta, sp.oo, 0, "so a lower key's weight tends to 0")
    d.conclude(r"as $\beta \to 0$ every weight tends to $1/n$ "
               r"($|w_i - \frac1n| \le (e^{2\beta R}-1)/n$), and as $\beta \to \infty$ the "
               r"$r$ keys tied at the maximum get $1/r$ each "
               r"($|w_i - \frac1r| \le (n - r)\, e^{-\beta\gamma}/r^2$) and every other key "
               r"$0$ ($w_i \le e^{-\beta g_i}/r$), for all $n$ and $1 \le r < n$.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision(320):
        for _ in range(3):
            ties, lower = rng.randint(1, 4), rng.randint(1, 8)
            top = fmpq(rng.randint(-20, 20), 4)
            gaps = [fmpq(rng.randint(1, 40), 8) for _ in range(lower)]
            scores = [top] * ties + [top - gg for gg in gaps]
            rng.shuffle(scores)
            size = len(scores)
            radius = max(abs(x) for x in scores)  # R = max |s_j|
            gamma = min(gaps)
            cs = {"n": size, "r": ties}
            for b in (fmpq(1, 1024), fmpq(1, 16)):
                w = arb_softmax([b * x for x in scores])
                bound = ((2 * arb(b * radius)).exp() - 1) / size
                worst = max((abs(x - fmpq(1, size)) for x in w), key=lambda y: float(y.mid()))
                chk.holds(r"$|w_i - \frac1n| \le (e^{2\beta R} - 1)/n$, $R = \max_j |s_j|$",
                          all(bool(abs(x - fmpq(1, size)) <= bound) for x in w),
                          f"max {show(worst, 4)} <= {show(bound, 4)}",
                          case={**cs, r"\beta": b})
            for bb in (4, 32, 256):
                # the bound is tight to a relative e^{-beta gamma}: resolve e^{-2 beta gamma}
                with arb_precision(128 + int(3 * bb * float(max(gaps)))):
                    w = arb_softmax([bb * x for x in scores])
                    tied_bound = lower * arb(-bb * gamma).exp() / ties**2
                    ok_tied = all(bool(abs(w[p] - fmpq(1, ties)) <= tied_bound)
                                  for p in range(size) if scores[p] == top)
                    ok_low = all(bool(w[p] <= arb(-bb * (top - scores[p])).exp() / ties)
                                 for p in range(size) if scores[p] != top)
                chk.holds(r"tied: $|w_i - \frac1r| \le (n - r) e^{-\beta\gamma}/r^2$; "
                          r"others: $w_i \le e^{-\beta g_i}/r$", ok_tied and ok_low,
                          f"bound {show(tied_bound, 4)}", case={**cs, r"\beta": bb})
    return chk


THEOREM = Theorem(
    name="temperature",
    title="Temperature: uniform at scale 0, argmax (ties shared) at infinite scale",
    statement_latex=r"Let $w(\beta) = \mathrm{softmax}(\beta s)$. As $\beta \to 0^+$, "
    r"$w_i(\beta) \to 1/n$ for every $i$. As $\beta \to \infty$, $w_i(\beta) \to 1/r$ for "
    r"each of the $r$ indices where $s$ attains its maximum, and $w_i(\beta) \to 0$ for the "
    r"others.",
    prove=prove,
    cross_check=cross_check,
    number=5,
)
