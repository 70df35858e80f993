"""Theorem 2: softmax weights are positive and sum to 1; the output is a convex mix.

Seed page, Examples A and E: "weights positive and sum to 1", "each output row
is a convex mix of the values, so every coordinate lies inside [min, max]".
One output coordinate is treated; the others are the same statement with
another column of V.
"""

from __future__ import annotations

import random
from typing import Any

import sympy as sp
from flint import arb

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_dot, arb_precision, arb_softmax, i, j, l, n, random_scores, s

a = sp.IndexedBase("a", nonnegative=True)  # a_j = v_j - min_l v_l
b = sp.IndexedBase("b", nonnegative=True)  # b_j = max_l v_l - v_j
m = sp.Symbol("v_min", real=True)  # min_l v_l
M = sp.Symbol("v_max", real=True)  # max_l v_l
W = sp.Symbol("w_j")


def prove() -> Derivation:
    d = Derivation()
    denom = sp.Sum(sp.exp(s[l]), (l, 1, n))
    w_i = sp.exp(s[i]) / denom
    w_j = sp.exp(s[j]) / denom
    d.define("w_i", w_i, "softmax of real scores $s_1, \\dots, s_n$")
    d.sign(sp.exp(s[i]), ">", "exp of a real number")
    d.sign(denom, ">", "$n \\ge 1$ positive terms")
    d.sign(w_i, ">", "positive over positive")
    d.identity(sp.Sum(w_i, (i, 1, n)), 1, "the denominator does not depend on $i$")
    # convex hull, lower side: v_j = m + a_j with m = min_l v_l, a_j >= 0
    d.define("v_j", m + a[j], "$v_{\\min} = \\min_l v_l$, $a_j = v_j - v_{\\min} \\ge 0$")
    out_lo = sp.Sum(w_j * (m + a[j]), (j, 1, n))
    d.identity(out_lo, m + sp.Sum(w_j * a[j], (j, 1, n)), "linearity, and $\\sum_j w_j = 1$",
               show=(sp.Sum(W * sp.Symbol("v_j"), (j, 1, n)), m + sp.Sum(W * a[j], (j, 1, n))))
    d.sign(sp.Sum(w_j * a[j], (j, 1, n)), ">=", "a sum of products $w_j a_j \\ge 0$",
           show=sp.Sum(W * a[j], (j, 1, n)))
    # upper side: v_j = M - b_j with M = max_l v_l, b_j >= 0
    d.define("v_j", M - b[j], "$v_{\\max} = \\max_l v_l$, $b_j = v_{\\max} - v_j \\ge 0$")
    out_hi = sp.Sum(w_j * (M - b[j]), (j, 1, n))
    d.identity(out_hi, M - sp.Sum(w_j * b[j], (j, 1, n)), "linearity, and $\\sum_j w_j = 1$",
               show=(sp.Sum(W * sp.Symbol("v_j"), (j, 1, n)), M - sp.Sum(W * b[j], (j, 1, n))))
    d.sign(sp.Sum(w_j * b[j], (j, 1, n)), ">=", "a sum of products $w_j b_j \\ge 0$",
           show=sp.Sum(W * b[j], (j, 1, n)))
    d.conclude(r"$w_i > 0$, $\sum_i w_i = 1$ and $\min_j v_j \le \sum_j w_j v_j \le "
               r"\max_j v_j$ for every $n \ge 1$ and all real scores and values.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        # Example E: scores (-3, 1), values (100, 200) -> output 198.20 in (100, 200)
        cases: list[tuple[list[Any], list[list[Any]]]] = [
            ([arb(-3), arb(1)], [[arb(100)], [arb(200)]])]
        for _ in range(5):
            size, cols = rng.randint(1, 30), rng.randint(1, 4)
            scores = random_scores(rng, size, lo=-40, hi=40)
            values = [random_scores(rng, cols, lo=-100, hi=100) for _ in range(size)]
            cases.append((scores, values))
        for scores, values in cases:
            size = len(scores)
            w = arb_softmax(scores)
            chk.holds(r"every $w_i > 0$", all(x > 0 for x in w),
                      f"smallest {min(w, key=lambda x: float(x.mid())).str(6)}",
                      case={"n": size})
            chk.agree(r"$\sum_i w_i = 1$", sum(w, arb(0)), 1, case={"n": size})
            for col in range(len(values[0])):
                column = [row[col] for row in values]
                o = arb_dot(w, column)
                lo = min(arb(x).mid() for x in column)
                hi = max(arb(x).mid() for x in column)
                if lo == hi:  # one value (n = 1) or all equal: the output is that value
                    chk.agree(r"$o = v_1$ when all values are equal", o, lo,
                              case={"n": size})
                else:  # positive weights on unequal values: strictly inside
                    chk.holds(r"$\min_j v_j < o < \max_j v_j$ (unequal values)",
                              bool(o > lo) and bool(o < hi),
                              f"{lo.str(8, radius=False)} < {o.str(10)} < "
                              f"{hi.str(8, radius=False)}", case={"n": size})
    return chk


THEOREM = Theorem(
    name="convex",
    title="Positive weights that sum to one; outputs in the convex hull",
    statement_latex=r"For any real scores $s_1,\dots,s_n$ the weights $w_i = e^{s_i}/\sum_j "
    r"e^{s_j}$ are strictly positive and sum to $1$, so each coordinate of the output "
    r"$\sum_j w_j v_j$ lies between the minimum and the maximum of that coordinate over the "
    r"values.",
    prove=prove,
    cross_check=cross_check,
    number=2,
)
