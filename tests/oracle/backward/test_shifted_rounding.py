"""Correct rounding of the gradients at huge queries with grad_output near the float64
maximum (issue 30 item 3; the long harness's ``limits`` kind, seed 73: 42 of its
huge-query inputs raised PrecisionError).  The backward then runs in power-of-two units
(dO × 2^-b, oracle/shifted.py) and its Arb balls were scaled back at python-flint's
default 53 bits: a radius of one ulp of a double that no precision shrank.

Expected values: dV = Pᵀ dO from mpmath (the softmax at 4000 and 8000 bits agreeing),
rounded by mpmath, a rounding tie decided by the dominant e^-gap term (:func:`_mp_dv`)."""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest

import mha_symbolic as ms

_M = float(np.finfo(np.float64).max)


def _mp_float(x: mp.mpf) -> float:
    if abs(x) >= mp.mpf(_M) + mp.ldexp(1, 970):
        return math.copysign(math.inf, float(mp.sign(x)))
    return float(mp.libmp.to_float(x._mpf_, rnd="n"))


def _mp_dv(q: np.ndarray, k: np.ndarray, do: np.ndarray, prec: int) -> np.ndarray:
    """dV = Pᵀ dO rounded.  At 4000 bits a one-hot row's top weight is 1 exactly (its
    1 − P is e^-gap, gaps ≈ 1e100-1e300), so Σ_i P_ij dO_i is the sum of the top rows'
    dO; where that sum is a rounding tie (a midpoint of two doubles: two doubles of
    one binade add to one), the e^-gap corrections decide: the term of the smallest
    gap dominates every other (gaps differ by ≈ 1e100), −dO_i e^-g_il for a row whose
    top key is j, +dO_i e^-g_ij for one whose top key is not."""
    with mp.workprec(prec):
        L, E = q.shape
        S = k.shape[0]
        c = 1 / mp.sqrt(E)
        P, gaps, tops = [], [], []
        for i in range(L):
            s = [c * mp.fsum(mp.mpf(float(q[i, e])) * mp.mpf(float(k[j, e])) for e in range(E))
                 for j in range(S)]
            m = max(s)
            w = [mp.exp(x - m) for x in s]
            z = mp.fsum(w)
            P.append([x / z for x in w])
            gaps.append([m - x for x in s])
            tops.append(s.index(m))
        out = np.zeros((S, do.shape[1]))
        for j in range(S):
            for f in range(do.shape[1]):
                t = mp.fsum(P[i][j] * mp.mpf(float(do[i, f])) for i in range(L))
                lo, hi = (float(mp.libmp.to_float(t._mpf_, rnd=r)) for r in ("f", "c"))
                if lo != hi and t == (mp.mpf(lo) + mp.mpf(hi)) / 2 and abs(t) < _M:
                    terms = [(gaps[i][l], -float(do[i, f])) for i in range(L) if tops[i] == j
                             for l in range(S) if l != j]
                    terms += [(gaps[i][j], float(do[i, f])) for i in range(L) if tops[i] != j]
                    _, coef = min(terms)
                    out[j, f] = hi if coef > 0 else lo
                else:
                    out[j, f] = _mp_float(t)
        return out


def _case(seed: int, L: int, S: int, qs: float, vs: float, ds: float, equal: bool
          ) -> tuple[np.ndarray, ...]:
    """The limits kind's inputs (tests/fuzz/ring3.py run_limits)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, L, 3)) * qs
    k = rng.standard_normal((1, S, 3))
    v = rng.uniform(-1, 1, (1, S, 2)) * vs
    if equal:
        v[:] = v[:, :1]
    do = rng.uniform(-1, 1, (1, L, 2)) * ds
    return q, k, v, do


# (seed, L, S, |q|, |v|, |dO|, equal rows): seed-73 inputs that raised PrecisionError
CASES = [(406381, 4, 3, 1e200, 2.0**400, _M, True),
         (957033, 2, 4, 1e200, 2.0**400, _M, False),
         (988331, 2, 2, 1e100, _M / 8, 1e300, False),
         (270476, 4, 3, 1e300, 1.0, _M / 8, False),
         (92171, 3, 3, 1e100, _M / 8, _M, False),
         (731725, 2, 3, 1e300, 2.0**400, _M, False)]


@pytest.mark.parametrize("case", CASES)
def test_gradients_round_at_huge_queries_and_dO_near_the_maximum(case: tuple) -> None:
    q, k, v, do = _case(*case)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = ms.reference_attention_backward(q, k, v, do)
        dq, dk, dv = (e.rounded("float64") for e in g)
    want = _mp_dv(q[0], k[0], do[0], 4000)
    assert np.array_equal(want, _mp_dv(q[0], k[0], do[0], 8000))
    assert np.array_equal(dv[0], want)
    assert np.array_equal(np.signbit(dv[0]), np.signbit(want))   # ±0 of the e^-huge keys
    # one-hot rows: dQ and dK are ≈ e^(-gap), every float rounds them to ±0
    assert np.all(dq == 0) and np.all(dk == 0)
