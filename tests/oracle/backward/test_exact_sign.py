"""The exact sign of gradient elements that round to ±0 (oracle/backward/exact.py):
the dominant-term rule decides them without expanding the exponential polynomial
(issue 30, fuzz seed 51: gradients of e^(−1e100…−1e300) took 6.5 CPU s per element).

Expected values come from an independent method: the gradients evaluated in mpmath at
4000 bits straight from the softmax formulas (no group expansion, no Arb), and the
closed form of one query over two keys, derived by hand.
"""

from __future__ import annotations

import math
import time
from typing import Any

import mpmath
import numpy as np
import pytest

from mha_symbolic import reference_attention_backward
from mha_symbolic.oracle.backward import exact


def _mp_gradients(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray,
                  scale: Any) -> dict[str, list[list[Any]]]:
    """dq, dk, dv of softmax(scale q kᵀ) v in mpmath (one problem, no mask), in forms
    without cancellation (D_i = Σ_l P_il dP_il is within e^(−1e100) of dP_ij*, beyond
    any fixed precision): dS_ij = P_ij Σ_l P_il (dP_ij − dP_il),
    dq_i = c Σ_{j<l} P_ij P_il (dP_ij − dP_il)(k_j − k_l), dk_j = c Σ_i dS_ij q_i,
    dv_j = Σ_i P_ij dO_i."""
    L, S, E, Ev = q.shape[0], k.shape[0], q.shape[1], v.shape[1]
    Q = [[mpmath.mpf(float(x)) for x in row] for row in q]
    K = [[mpmath.mpf(float(x)) for x in row] for row in k]
    V = [[mpmath.mpf(float(x)) for x in row] for row in v]
    DO = [[mpmath.mpf(float(x)) for x in row] for row in do]
    P, dS, dq = [], [], []
    for i in range(L):
        s = [scale * mpmath.fsum(Q[i][e] * K[j][e] for e in range(E)) for j in range(S)]
        m = max(s)
        w = [mpmath.exp(x - m) for x in s]
        tot = mpmath.fsum(w)
        p = [x / tot for x in w]
        dp = [mpmath.fsum(DO[i][e] * V[j][e] for e in range(Ev)) for j in range(S)]
        P.append(p)
        dS.append([p[j] * mpmath.fsum(p[m_] * (dp[j] - dp[m_]) for m_ in range(S))
                   for j in range(S)])
        dq.append([scale * mpmath.fsum(p[j] * p[m_] * (dp[j] - dp[m_]) * (K[j][e] - K[m_][e])
                                       for j in range(S) for m_ in range(j + 1, S))
                   for e in range(E)])
    return {
        "dq": dq,
        "dk": [[scale * mpmath.fsum(dS[i][j] * Q[i][e] for i in range(L)) for e in range(E)]
               for j in range(S)],
        "dv": [[mpmath.fsum(P[i][j] * DO[i][e] for i in range(L)) for e in range(Ev)]
               for j in range(S)],
    }


def _as_double(x: Any) -> float:
    """x rounded to nearest double, keeping the sign of a value that rounds to 0."""
    r = float(x)   # mpmath rounds to nearest
    return math.copysign(0.0, float(mpmath.sign(x))) if r == 0.0 else r


@pytest.mark.parametrize(("seed", "qscale"), [(0, 1e100), (1, 1e200), (2, 1e300), (3, 1e200)])
def test_gradients_of_huge_queries_round_like_mpmath_signs_of_zero_included(
        seed: int, qscale: float) -> None:
    rng = np.random.default_rng(seed)
    L, S, E, Ev = 2, 4, 3, 2
    q = rng.standard_normal((L, E)) * qscale
    k = rng.standard_normal((S, E))
    v = rng.uniform(-1, 1, (S, Ev))
    do = rng.uniform(-1, 1, (L, Ev))
    got = reference_attention_backward(q, k, v, do, scale=0.5)
    with mpmath.workprec(4000):
        want = _mp_gradients(q, k, v, do, mpmath.mpf(1) / 2)
        for name in ("dq", "dk", "dv"):
            r = getattr(got, name).rounded("float64")
            w = np.array([[_as_double(x) for x in row] for row in want[name]])
            assert np.array_equal(r, w), (name, r, w)
            assert np.array_equal(np.signbit(r), np.signbit(w)), (name, r, w)


@pytest.mark.parametrize("qscale", [1e100, 1e300])
def test_one_query_two_keys_matches_the_closed_form(qscale: float) -> None:
    """L = 1, S = 2: dS_0 = −dS_1 = P_0 P_1 (dP_0 − dP_1), so dq = c P_0 P_1 (dP_0 − dP_1)
    (k_0 − k_1) and dk_0 = −dk_1 = c P_0 P_1 (dP_0 − dP_1) q; with P_0 P_1 ≈ e^(−1e100)
    every element rounds to ±0 with the sign of (dP_0 − dP_1)(k_0 − k_1), resp. of
    ±(dP_0 − dP_1) q."""
    q = np.array([[0.75, -1.25, 0.5]]) * qscale
    k = np.array([[0.5, 0.25, -1.0], [-0.75, 0.5, 0.125]])
    v = np.array([[0.5, -0.25], [0.375, 1.0]])
    do = np.array([[1.0, 0.5]])
    g = reference_attention_backward(q, k, v, do)
    dp = (do @ v.T)[0]
    s_dq = np.sign((dp[0] - dp[1]) * (k[0] - k[1]))
    s_dk0 = np.sign((dp[0] - dp[1]) * q[0])
    dq = g.dq.rounded("float64")
    dk = g.dk.rounded("float64")
    assert np.all(dq == 0) and np.all(dk == 0)
    assert np.array_equal(np.where(np.signbit(dq[0]), -1.0, 1.0), s_dq)
    assert np.array_equal(np.where(np.signbit(dk[0]), -1.0, 1.0), s_dk0)
    assert np.array_equal(np.where(np.signbit(dk[1]), -1.0, 1.0), -s_dk0)


@pytest.mark.parametrize(("seed", "qscale", "decides"), [(5, 1.0, "some"), (6, 30.0, "any"),
                                                        (7, 1e100, "all")])
def test_the_dominant_term_rule_agrees_with_mpmath_or_defers(seed: int, qscale: float,
                                                             decides: str) -> None:
    """sign(y − 0) of every dq and dk element by the rule alone: None (no term
    dominates: ordinary scores) or mpmath's sign; with gaps of 1e100 it always decides."""
    from fractions import Fraction

    from flint import arb

    rng = np.random.default_rng(seed)
    L, S, E, Ev = 2, 3, 3, 2
    q = rng.standard_normal((L, E)) * qscale
    k, v, do = rng.standard_normal((S, E)), rng.standard_normal((S, Ev)), rng.standard_normal((L, Ev))
    fld = exact.QField(Fraction(1, 2), E)
    m = exact.IntMatrix.of_doubles
    prob = exact.ExactProblem(fld, m(q), m(k), m(v), m(do), np.ones((L, S), bool), None, None,
                              Fraction(1), np.zeros(L, bool))
    one = (Fraction(1), Fraction(0))
    with mpmath.workprec(4000):
        want = _mp_gradients(q, k, v, do, mpmath.mpf(1) / 2)
        decided = 0
        for name, rows, add in (("dq", L, prob.add_dq), ("dk", S, prob.add_dk)):
            for r in range(rows):
                for col in range(E):
                    acc = exact.Accumulator(fld)
                    add(acc, r, col, one)
                    quick = exact._dominant_sign(acc.decomposition(), Fraction(0),
                                                 lambda: arb(1) / 2)
                    if quick is not None:
                        decided += 1
                        assert quick == int(mpmath.sign(want[name][r][col])), (name, r, col)
                    assert quick is not None or decides != "all"
    if decides == "some":   # ordinary scores: some elements need the expansion
        assert decided < (L + S) * E


def test_the_seed_51_limits_inputs_are_decided_within_the_cpu_limit() -> None:
    """The three over-time inputs of the long harness, seed 51 (limits kind: queries of
    1e100, L = 4, S = 5 or 4): before the rule 5.3–31 CPU s each, the harness's limit 5."""
    from tests.fuzz.ring3 import run_limits

    for payload in [(128540, 3, 3, 1, 4, 5, 0), (611589, 1, 5, 1, 4, 5, 0),
                    (146650, 0, 3, 3, 4, 4, 0)]:
        t0 = time.process_time()
        assert run_limits(payload) == []
        assert time.process_time() - t0 < 5.0
