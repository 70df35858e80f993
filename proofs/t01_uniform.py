"""Theorem 1: equal scores give uniform weights 1/n, and the output is the mean.

Seed page, Example C: ``w_j = e^2 / (3 e^2) = 1/3`` and the output 20 is the
mean of (10, 20, 30).  Here for every n and every common score c.
"""

from __future__ import annotations

import random

import sympy as sp
from flint import fmpq

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_dot, arb_precision, arb_softmax, i, j, l, n, random_rational, v

c = sp.Symbol("c", real=True)


def prove() -> Derivation:
    d = Derivation()
    denom = sp.Sum(sp.exp(c), (l, 1, n))
    w = sp.exp(c) / denom  # the weight of any key j: its score is c like all others
    d.define("w_j", w, "softmax with every score $s_l = c$")
    d.identity(denom, n * sp.exp(c), "$n$ equal terms")
    d.identity(w, 1 / n, "$e^c > 0$ cancels")
    d.identity(sp.Sum(1 / n, (i, 1, n)), 1, "the $n$ weights sum to 1")
    out = sp.Sum(w * v[j], (j, 1, n))
    d.define("o", sp.Sum(sp.Symbol("w_j") * v[j], (j, 1, n)), "output: weighted sum of the values")
    d.identity(out, sp.Sum(v[j], (j, 1, n)) / n, "substitute $w_j$",
               show=(sp.Sum(sp.Symbol("w_j") * v[j], (j, 1, n)), sp.Sum(v[j], (j, 1, n)) / n))
    d.conclude(r"for every $n \ge 1$ and every real $c$, equal scores give $w_j = 1/n$ "
               r"and $o = \frac{1}{n}\sum_{j=1}^{n} v_j$, the mean of the values.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        cases = [(3, fmpq(2), [fmpq(10), fmpq(20), fmpq(30)])]  # Example C
        for _ in range(4):
            size = rng.randint(1, 40)
            cases.append((size, random_rational(rng, -50, 50),
                          [random_rational(rng, -100, 100) for _ in range(size)]))
        for size, score, values in cases:
            w = arb_softmax([score] * size)
            for idx in (0, size - 1):
                chk.agree(r"$w_j = 1/n$ ($j = 1$ and $j = n$)", w[idx], fmpq(1, size),
                          case={"n": size, "c": score})
            mean = sum(values, fmpq(0)) / size
            chk.agree(r"$o = \frac1n \sum_j v_j$ (exact mean)", arb_dot(w, values), mean,
                      case={"n": size})
    return chk


THEOREM = Theorem(
    name="uniform",
    title="Equal scores give uniform weights",
    statement_latex=r"If all $n$ scores of a row equal $c$, every softmax weight is $1/n$ and "
    r"the output is the mean $\frac1n\sum_j v_j$ of the values, for every $n \ge 1$.",
    prove=prove,
    cross_check=cross_check,
    number=1,
)
