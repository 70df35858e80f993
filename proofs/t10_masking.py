"""Theorem 10: masked keys get weight exactly 0; the rest is the softmax over the
unmasked keys.

A mask adds b_j = 0 (key visible) or b_j = -oo (key masked) to the scores;
e^{-oo} = 0 exactly.  A finite sentinel -L (the -1e4, -1e9 of real code, a bug
class in REFERENCES.md section 3) leaves the masked key a positive weight,
below e^{s_j - L - s_i} for any visible key i: tiny, but not 0.  A row with every
key masked is 0/0: undefined (PyTorch SDPA, FlashAttention and JAX return 0 by
convention).
"""

from __future__ import annotations

import random

import sympy as sp
from flint import arb, fmpq

from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import arb_precision, arb_softmax, i, l, random_scores, s, show

u = sp.Symbol("u", integer=True, positive=True)  # visible keys 1..u
K = sp.Symbol("K", integer=True, positive=True)  # masked keys u+1..u+K: n - u of them
L = sp.Symbol("Lambda", positive=True)  # a finite sentinel -Lambda
n_shown = sp.Symbol("n", integer=True, positive=True)


def prove() -> Derivation:
    # decided with K = n - u >= 1 masked keys, printed with n
    d = Derivation(display={K: n_shown - u})
    d.fact(r"\text{keys relabelled: } b_1 = \dots = b_u = 0,\ b_{u+1} = \dots = b_n = "
           r"-\infty,\ 1 \le u < n", "reorder the terms of the sum")
    d.identity(sp.exp(s[i] + (-sp.oo)), 0, "a masked key's numerator: $e^{-\\infty} = 0$",
               show=(r"e^{s_i + b_i}\ (i > u)", 0))
    masked = sp.Sum(sp.exp(s[l]) , (l, 1, u)) + sp.Sum(sp.exp(s[l] + (-sp.oo)), (l, u + 1, u + K))
    visible = sp.Sum(sp.exp(s[l]), (l, 1, u))
    d.identity(masked, visible, "the masked terms vanish from the denominator",
               show=(r"\sum_{l=1}^{n} e^{s_l + b_l}", visible))
    d.sign(visible, ">", "$u \\ge 1$ visible keys")
    d.identity(sp.exp(s[i] + (-sp.oo)) / visible, 0, "so a masked key's weight is exactly 0",
               show=(r"w_i\ (i > u)", 0))
    d.identity(sp.exp(s[i]) / masked, sp.exp(s[i]) / visible,
               "a visible key's weight is the softmax over the visible keys",
               show=(r"w_i\ (i \le u)", sp.exp(s[i]) / visible))
    # finite sentinel -L
    sj, si = sp.Symbol("s_j", real=True), sp.Symbol(r"s_{i^*}", real=True)  # i* visible
    d.fact(r"w_j = \frac{e^{s_j - \Lambda}}{\sum_{l} e^{s_l + b_l}} \le e^{s_j - \Lambda - s_{i^*}}"
           r"\ \ (i^* \text{ visible})",
           "with $b_j = -\\Lambda$ the denominator exceeds $e^{s_{i^*}}$")
    d.sign(sp.exp(sj - L - si), ">", "but a finite sentinel leaves a positive weight")
    d.limit(sp.exp(sj - L - si), L, sp.oo, 0, "that vanishes only as $\\Lambda \\to \\infty$")
    d.conclude(r"with $b_j = -\infty$ a masked key's weight is exactly $0$ and the visible "
               r"weights are $\mathrm{softmax}$ of the visible scores alone, for all "
               r"$1 \le u < n$; a finite sentinel $-\Lambda$ leaves the masked key a weight in "
               r"$(0, e^{s_j - \Lambda - s_{i^*}}]$.")
    return d


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("Arb")
    with arb_precision():
        for _ in range(5):
            size = rng.randint(2, 16)
            scores = random_scores(rng, size, lo=-20, hi=20)
            mask = [rng.random() < 0.4 for _ in range(size)]  # True = masked out
            mask[rng.randrange(size)] = False  # at least one visible key
            # definition: w_j = m_j e^{s_j} / sum_l m_l e^{s_l}, m = 0 for masked keys
            exps = [arb(0) if mk else arb(x).exp() for x, mk in zip(scores, mask, strict=True)]
            total = sum(exps, arb(0))
            w = [e / total for e in exps]
            visible = [x for x, mk in zip(scores, mask, strict=True) if not mk]
            w_vis = iter(arb_softmax(visible))
            cs = {"n": size, "u": size - sum(mask)}
            chk.holds(r"masked weights are exactly $0$",
                      all(w[p].is_exact() and w[p] == 0 for p in range(size) if mask[p]), case=cs)
            err = sum((abs(w[p] - next(w_vis)) for p in range(size) if not mask[p]), arb(0))
            chk.agree(r"visible weights $=$ softmax over the visible keys", err, 0, case=cs)
            if sum(mask):
                # the -1e4 sentinel: masked weight positive, below e^{s_j - L - s_max(visible)}
                sentinel = fmpq(-10000)
                ws = arb_softmax([x + sentinel if mk else x
                                  for x, mk in zip(scores, mask, strict=True)])
                p = mask.index(True)
                bound = arb(scores[p] + sentinel - max(visible)).exp()
                chk.holds(r"sentinel $-\Lambda = -10^4$: $0 < w_j \le "
                          r"e^{s_j - \Lambda - s_{i^*}}$", bool(ws[p] > 0) and bool(ws[p] <= bound),
                          f"w = {show(ws[p], 5)}", case=cs)
    return chk


THEOREM = Theorem(
    name="masking",
    title="Masked keys get weight exactly zero",
    statement_latex=r"With an additive mask $b_j \in \{0, -\infty\}$ and at least one visible "
    r"key, every masked key gets weight exactly $0$ and the visible keys get "
    r"$\mathrm{softmax}$ of their own scores; a finite sentinel $-\Lambda$ instead leaves a "
    r"positive weight that vanishes only as $\Lambda \to \infty$.",
    prove=prove,
    cross_check=cross_check,
    number=10,
)
