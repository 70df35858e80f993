"""Theorem 3: adding a constant to a row of scores changes nothing.

This is why implementations may subtract the row maximum before ``exp``
(the "safe softmax"): the weights, hence the output, are unchanged.
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_dot, arb_precision, arb_softmax, i, j, l, n, random_scores, s, v

c = sp.Symbol("c", real=True)


def prove() -> Derivation:
    d = Derivation()
    shifted = sp.Sum(sp.exp(s[l] + c), (l, 1, n))
    plain = sp.Sum(sp.exp(s[l]), (l, 1, n))
    w_shift = sp.exp(s[i] + c) / shifted
    w_plain = sp.exp(s[i]) / plain
    d.define(r"w_i(s + c)", w_shift, "softmax of the row $s_1 + c, \\dots, s_n + c$")
    d.identity(shifted, sp.exp(c) * plain, "$e^{s_l + c} = e^c e^{s_l}$; $e^c$ does not depend on $l$")
    d.identity(w_shift, w_plain, "$e^c > 0$ cancels")
    d.identity(sp.Sum(sp.exp(s[j] + c) / shifted * v[j], (j, 1, n)),
               sp.Sum(sp.exp(s[j]) / plain * v[j], (j, 1, n)),
               "so the output $\\sum_j w_j v_j$ is unchanged",
               show=(r"\sum_{j=1}^{n} w_j(s + c)\, v_j", r"\sum_{j=1}^{n} w_j(s)\, v_j"))
    d.conclude(r"$\mathrm{softmax}(s + c\mathbf{1}) = \mathrm{softmax}(s)$ for every $n$, "
               r"every real row $s$ and every real $c$; in particular subtracting "
               r"$\max_j s_j$ changes neither the weights nor the output.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        for _ in range(6):
            size = rng.randint(1, 25)
            scores = random_scores(rng, size, lo=-30, hi=30)
            values = random_scores(rng, size, lo=-10, hi=10)
            shift = random_scores(rng, 1, lo=-1000, hi=1000)[0]
            w = arb_softmax(scores)
            ws = arb_softmax([x + shift for x in scores])
            top = max(scores)
            wm = arb_softmax([x - top for x in scores])
            chk.agree(r"$\sum_i |w_i(s + c) - w_i(s)| = 0$",
                      sum((abs(a - b) for a, b in zip(ws, w, strict=True)), arb(0)), 0,
                      case={"n": size, "c": shift})
            chk.agree(r"$\sum_i |w_i(s - s_{\max}) - w_i(s)| = 0$, "
                      r"$s_{\max} = \max_j s_j$",
                      sum((abs(a - b) for a, b in zip(wm, w, strict=True)), arb(0)), 0,
                      case={"n": size})
            chk.agree(r"$o(s + c) = o(s)$", arb_dot(ws, values), arb_dot(w, values),
                      case={"n": size, "c": shift})
    return chk


THEOREM = Theorem(
    name="shift",
    title="Shift invariance",
    statement_latex=r"Adding the same real constant $c$ to every score of a row leaves the "
    r"softmax weights of that row, and hence its output, unchanged: "
    r"$\mathrm{softmax}(s + c\mathbf{1}) = \mathrm{softmax}(s)$.",
    prove=prove,
    cross_check=cross_check,
    number=3,
)
