"""Theorem 6: why attention divides the scores by sqrt(d_k).

With the entries of q and k independent, mean 0 and variance 1,
E[q . k] = 0 and Var[q . k] = d_k, so q . k / sqrt(d_k) has variance 1
(seed page, Example F, and "Scale by sqrt(d_k)" in Example A).  The
derivation is done for general means mu and variances sigma^2 first:
E[q . k] = d mu_q mu_k and Var[q . k] = d (sigma_q^2 sigma_k^2 +
sigma_q^2 mu_k^2 + mu_q^2 sigma_k^2); the classical case is mu = 0, sigma = 1.
The cross-check is exact: all outcomes of finite distributions enumerated
with rational arithmetic.
"""

from __future__ import annotations

import itertools
import random

import sympy as sp
from flint import fmpq

from mha_symbolic.exact.proof_render import book_latex
from mha_symbolic.exact.prove import CrossCheck, Derivation, Theorem

from ._common import i, j

d = sp.Symbol("d_k", integer=True, positive=True)
mq, mk = sp.symbols("mu_q mu_k", real=True)
sq, sk = sp.symbols("sigma_q sigma_k", positive=True)
q = sp.IndexedBase("q")
k = sp.IndexedBase("k")


def _E(x: str) -> str:
    return rf"\mathbb{{E}}\left[{x}\right]"


def prove() -> Derivation:
    dv = Derivation()
    dot = sp.Sum(q[i] * k[i], (i, 1, d))
    dv.define("X", dot, "the unscaled score $q \\cdot k$")
    dv.fact(r"\mathbb{E}[q_i] = \mu_q,\ \mathbb{E}[q_i q_j] = \sigma_q^2 \delta_{ij} + \mu_q^2"
            r"\text{ (same for } k\text{)}",
            "mean and variance; $q_i, q_j$ independent for $i \\ne j$")
    dv.fact(r"\mathbb{E}[q_i k_i] = \mathbb{E}[q_i]\,\mathbb{E}[k_i],\ "
            r"\mathbb{E}[q_i k_i q_j k_j] = \mathbb{E}[q_i q_j]\,\mathbb{E}[k_i k_j]",
            "$q$ is independent of $k$")
    mean = sp.Sum(mq * mk, (i, 1, d))
    dv.identity(mean, d * mq * mk, "linearity of expectation",
                show=(_E("X"), d * mq * mk))
    second = sp.Sum(sp.Sum((sq**2 * sp.KroneckerDelta(i, j) + mq**2)
                           * (sk**2 * sp.KroneckerDelta(i, j) + mk**2), (j, 1, d)), (i, 1, d))
    ex2 = d**2 * mq**2 * mk**2 + d * (sq**2 * sk**2 + sq**2 * mk**2 + mq**2 * sk**2)
    # shown with its left side, E[X^2] = (the double sum) = (closed form): the double sum
    # alone read as a bare expression, not as the second moment it is
    dv.identity(second, ex2, "$\\mathbb{E}[X^2] = \\sum_{i,j} \\mathbb{E}[q_i q_j]\\,\\mathbb{E}[k_i k_j]$; "
                "the $\\delta$ sums give $d_k$ ($1 \\le i \\le d_k$)", assume=sp.Q.le(i, d),
                show=(_E("X^2"), f"{book_latex(second)} = {book_latex(ex2)}"))
    var = ex2 - (d * mq * mk) ** 2
    var_closed = d * (sq**2 * sk**2 + sq**2 * mk**2 + mq**2 * sk**2)
    dv.identity(var, var_closed, "$\\operatorname{Var} X = \\mathbb{E}[X^2] - \\mathbb{E}[X]^2$",
                show=(r"\operatorname{Var}[X]", var_closed))
    dv.identity((d * mq * mk).subs(mq, 0), 0, "mean 0", show=(_E("X"), 0))
    dv.identity(var_closed.subs({mq: 0, mk: 0, sq: 1, sk: 1}), d, "mean 0, variance 1",
                show=(r"\operatorname{Var}[X]", d))
    dv.fact(r"\operatorname{Var}[cX] = c^2 \operatorname{Var}[X]", "definition of variance")
    dv.identity((1 / sp.sqrt(d)) ** 2 * d, 1, "the scaled score",
                show=(r"\operatorname{Var}\bigl[X/\sqrt{d_k}\bigr]", 1))
    dv.conclude(r"for every $d_k \ge 1$, with independent entries of mean $0$ and variance "
                r"$1$, $\mathbb{E}[q\cdot k] = 0$, $\operatorname{Var}[q\cdot k] = d_k$ and "
                r"$\operatorname{Var}[q\cdot k/\sqrt{d_k}] = 1$.")
    return dv


Dist = list[tuple[fmpq, fmpq]]  # (value, probability)


def _moments(qd: Dist, kd: Dist, size: int) -> tuple[fmpq, fmpq]:
    """E[X] and E[X^2] of X = sum_i q_i k_i by enumerating every outcome exactly."""
    e1, e2 = fmpq(0), fmpq(0)
    for qs in itertools.product(qd, repeat=size):
        pq = fmpq(1)
        for _, p in qs:
            pq *= p
        for ks in itertools.product(kd, repeat=size):
            p = pq
            x = fmpq(0)
            for (qv, _), (kv, kp) in zip(qs, ks, strict=True):
                p *= kp
                x += qv * kv
            e1 += p * x
            e2 += p * x * x
    return e1, e2


def _mean_var(dist: Dist) -> tuple[fmpq, fmpq]:
    mu = sum((x * p for x, p in dist), fmpq(0))
    return mu, sum(((x - mu) ** 2 * p for x, p in dist), fmpq(0))


def _random_dist(rng: random.Random) -> Dist:
    size = rng.randint(2, 3)
    weights = [rng.randint(1, 6) for _ in range(size)]
    total = sum(weights)
    return [(fmpq(rng.randint(-12, 12), 4), fmpq(wt, total)) for wt in weights]


def cross_check(rng: random.Random) -> CrossCheck:
    chk = CrossCheck("exact")
    rademacher: Dist = [(fmpq(-1), fmpq(1, 2)), (fmpq(1), fmpq(1, 2))]
    three_point: Dist = [(fmpq(-2), fmpq(1, 8)), (fmpq(0), fmpq(3, 4)), (fmpq(2), fmpq(1, 8))]
    for name, dist, sizes in (("Rademacher", rademacher, (1, 2, 3, 4, 5)),
                              ("three-point", three_point, (1, 2, 3))):
        for size in sizes:
            e1, e2 = _moments(dist, dist, size)
            cs = {"Law": name, "d_k": size}
            chk.agree(r"$\mathbb{E}[q\cdot k] = 0$ (mean $0$, variance $1$)", e1, 0, case=cs)
            chk.agree(r"$\operatorname{Var}[q\cdot k] = d_k$", e2 - e1 * e1, size, case=cs)
            chk.agree(r"$\operatorname{Var}[q\cdot k/\sqrt{d_k}] = 1$", (e2 - e1 * e1) / size, 1,
                      case=cs)
    for _ in range(3):
        qd, kd = _random_dist(rng), _random_dist(rng)
        size = rng.randint(1, 3)
        (muq, vq), (muk, vk) = _mean_var(qd), _mean_var(kd)
        e1, e2 = _moments(qd, kd, size)
        cs = {"Law": "random", "d_k": size}
        chk.agree(r"$\mathbb{E}[q\cdot k] = d_k \mu_q \mu_k$ (general laws)", e1,
                  size * muq * muk, case=cs)
        chk.agree(r"$\operatorname{Var}[q\cdot k] = d_k(\sigma_q^2\sigma_k^2 + \sigma_q^2\mu_k^2 "
                  r"+ \mu_q^2\sigma_k^2)$", e2 - e1 * e1,
                  size * (vq * vk + vq * muk * muk + muq * muq * vk), case=cs)
    return chk


THEOREM = Theorem(
    name="scale",
    title=r"Why scale by $1/\sqrt{d_k}$",
    statement_latex=r"If the entries $q_1,\dots,q_{d_k}, k_1,\dots,k_{d_k}$ are independent "
    r"with mean $0$ and variance $1$, then $\mathbb{E}[q\cdot k] = 0$ and "
    r"$\operatorname{Var}[q \cdot k] = d_k$, so $q\cdot k/\sqrt{d_k}$ has variance $1$. "
    r"(In general $\operatorname{Var}[q\cdot k] = d_k(\sigma_q^2\sigma_k^2 + \sigma_q^2\mu_k^2 "
    r"+ \mu_q^2\sigma_k^2)$.)",
    prove=prove,
    cross_check=cross_check,
    number=6,
)
