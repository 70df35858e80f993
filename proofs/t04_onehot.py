"""Theorem 4: the one-hot limit, with the exact gap form and a bound.

Seed page, Example D: scores (0, 0, 20), ``w_3 = e^20 / (2 + e^20)``; "as the
top score -> infinity, softmax -> (0, 0, 1) ... giving exactly v_3".  The limit
is never handed to ``sympy.limit`` on the softmax (it answers wrongly on such
limits, REFERENCES.md section 5): the weight is rewritten exactly in terms of
the gaps, bounded, and only the bound's plain exponential goes to a limit.
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb, fmpq

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_dot, arb_precision, arb_softmax, j, l, random_scores, show, v

g = sp.IndexedBase("g", positive=True)  # g_j = s_1 - s_j > 0, the gap of key j
m = sp.Symbol("s_1", real=True)  # the winning score s_1
gap = sp.Symbol("gamma", positive=True)  # min_j g_j
u = sp.Symbol("v_1", real=True)  # the winner's value v_1
R = sp.Symbol("R", nonnegative=True)  # max_j |v_j - v_1|
t = sp.Symbol("t", real=True)  # the winner's score, growing
S2 = sp.Symbol("shat", real=True)  # \hat s = max_{j >= 2} s_j, fixed
N = sp.Symbol("N", integer=True, positive=True)
# The steps are decided with n = N + 1 (N >= 1), i.e. for every n >= 2 keys.  (With n
# merely positive, SymPy rightly refuses to sign sum_{j=2}^{n}: for n = 0 its Karr
# convention makes that sum negative.)  The rendering shows n: N is printed as n - 1.
n = N + 1
n_shown = sp.Symbol("n", integer=True, positive=True)


def prove() -> Derivation:
    d = Derivation(display={N: n_shown - 1})
    E = sp.Sum(sp.exp(-g[j]), (j, 2, n))
    Z = sp.exp(m) + sp.Sum(sp.exp(m - g[l]), (l, 2, n))
    w = sp.exp(m) / Z
    d.fact(r"\text{keys relabelled so that key 1 has the strictly largest score } s_1"
           r"\text{; } n \ge 2",
           "a sum does not depend on the order of its terms; $n = 1$ is Theorem 8")
    d.define("s_j", m - g[j], "$g_j = s_1 - s_j > 0$, the gap of key $j \\ge 2$")
    d.define("w_1", w, "softmax weight of the winner")
    d.identity(Z, sp.exp(m) * (1 + E), "$e^{m - g_l} = e^m e^{-g_l}$")
    d.identity(w, 1 / (1 + E), "exact gap form",
               show=("w_1", r"\frac{1}{1 + \sum_{j=2}^{n} e^{s_j - s_1}}"))
    d.identity(1 - 1 / (1 + E), E / (1 + E), "weight left for the other keys",
               show=("1 - w_1", E / (1 + E)))
    d.inequality(E / (1 + E), "<=", E, "$x/(1 + x) \\le x$ for $x \\ge 0$")
    d.fact(r"e^{-g_j} \le e^{-\gamma}\ \text{ for } \gamma = \min_{j \ge 2} g_j",
           "exp is increasing")
    d.identity(sp.Sum(sp.exp(-gap), (j, 2, n)), (n - 1) * sp.exp(-gap), "$n - 1$ equal terms")
    # the output: o - v_1 = sum_{j >= 2} w_j (v_j - v_1)
    w_j = sp.exp(m - g[j]) / Z
    out = w * u + sp.Sum(w_j * v[j], (j, 2, n))
    d.identity(out - u, sp.Sum(w_j * (v[j] - u), (j, 2, n)), "weights sum to 1",
               show=(r"o - v_1", r"\sum_{j=2}^{n} w_j (v_j - v_1)"))
    d.fact(r"\Bigl|\sum_{j=2}^{n} w_j (v_j - v_1)\Bigr| \le (1 - w_1)\, R,\quad "
           r"R = \max_j |v_j - v_1|", "triangle inequality, $w_j > 0$ (Theorem 2)")
    d.define(r"\hat{s}", r"\max_{j \ge 2} s_j", "the largest of the other scores, held fixed")
    d.define(r"\gamma", r"t - \hat{s}", "the smallest gap when the winner's score is $s_1 = t$")
    d.limit((n - 1) * sp.exp(-(t - S2)), t, sp.oo, 0,
            "bound on $1 - w_1$ as $s_1 = t$ grows, the other scores fixed")
    d.limit((n - 1) * R * sp.exp(-(t - S2)), t, sp.oo, 0, "bound on $|o - v_1|$")
    d.conclude(r"$w_1 = 1/(1 + \sum_{j\ge2} e^{s_j - s_1})$ exactly, "
               r"$0 < 1 - w_1 \le (n-1)\,e^{-\gamma}$ with $\gamma$ the smallest gap, and "
               r"$|o - v_1| \le (n-1)\,e^{-\gamma} \max_j |v_j - v_1|$; so as $s_1 \to \infty$ "
               r"with the other scores fixed, $w_1 \to 1$, every other weight $\to 0$ and "
               r"the output $\to v_1$, for every $n$.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision(256):
        # Example D: scores (0, 0, 20), values (10, 20, 30)
        w = arb_softmax([0, 0, 20])
        exact = 1 / (1 + 2 * arb(-20).exp())
        ex_d = {"Example": "D"}
        chk.agree(r"$w_3 = 1/(1 + 2e^{-20})$ for the scores $(0, 0, 20)$", w[2], exact,
                  case=ex_d)
        chk.holds(r"$1 - w_3 \le 2e^{-20}$", bool(1 - w[2] <= 2 * arb(-20).exp()),
                  f"1 - w_3 = {show(1 - w[2])}", case=ex_d)
        o = arb_dot(w, [10, 20, 30])
        chk.holds(r"$|o - 30| \le 2e^{-20} \cdot 20$ for the values $(10, 20, 30)$",
                  bool(abs(o - 30) <= 40 * arb(-20).exp()), f"o = {show(o, 15)}", case=ex_d)
        for _ in range(3):
            size = rng.randint(2, 20)
            others = random_scores(rng, size - 1, lo=-10, hi=10)
            values = random_scores(rng, size, lo=-10, hi=10)
            top_other = max(others)
            spread = max(abs(x - values[0]) for x in values)
            prev = arb(2)
            for lift in (1, 8, 64):
                winner = top_other + fmpq(lift)
                w = arb_softmax([winner, *others])
                gaps = [winner - x for x in others]
                gamma = min(gaps)
                exact = 1 / (1 + sum((arb(-x).exp() for x in gaps), arb(0)))
                cs = {"n": size, r"\gamma": gamma}
                chk.agree(r"$w_1 = 1/(1 + \sum_{j \ge 2} e^{-g_j})$", w[0], exact, case=cs)
                bound = (size - 1) * arb(-gamma).exp()
                rest = 1 - w[0]
                chk.holds(r"$0 < 1 - w_1 \le (n-1)e^{-\gamma}$",
                          bool(rest > 0) and bool(rest <= bound),
                          f"{show(rest, 6)} <= {show(bound, 6)}", case=cs)
                o = arb_dot(w, values)
                chk.holds(r"$|o - v_1| \le (n-1)e^{-\gamma} R$, $R = \max_j |v_j - v_1|$",
                          bool(abs(o - values[0]) <= bound * arb(spread)), f"o = {show(o, 10)}",
                          case=cs)
                chk.holds(r"$1 - w_1$ decreases as $s_1$ grows", bool(rest < prev),
                          case=cs)
                prev = rest
    return chk


THEOREM = Theorem(
    name="onehot",
    title="The one-hot limit and its gap bound",
    statement_latex=r"Let $s_1$ be the strictly largest score and $\gamma = \min_{j\ge2}"
    r"(s_1 - s_j)$. Then $w_1 = 1/(1 + \sum_{j\ge 2} e^{s_j - s_1})$, "
    r"$0 < 1 - w_1 \le (n-1)e^{-\gamma}$, and as $s_1 \to \infty$ with the other scores "
    r"fixed, $w_1 \to 1$ and the output tends to $v_1$.",
    prove=prove,
    cross_check=cross_check,
    number=4,
)
