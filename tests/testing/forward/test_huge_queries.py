"""compare_attention at queries scaled by 1e100-1e300 (float64; issue 30 item 3): the
exact output passes, a perturbed one fails, both decided, with values up to the float64
maximum; the model's own tolerance is finite and not vacuous (the worst case where the
probabilistic bound's squared terms meet 0·inf); no RuntimeWarning reaches the caller.

Expected outputs come from mpmath at 4000 bits (softmax and the weighted sum), rounded
to float64 by mpmath, never from the oracle under test."""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.testing.forward.model import attention_error_bound
from mha_symbolic.testing.tolerance import error_model

_M = float(np.finfo(np.float64).max)


def _mp_float(x: mp.mpf) -> float:
    """x rounded to the nearest float64 (ties to even; beyond the maximum: inf)."""
    if abs(x) >= mp.mpf(_M) + mp.ldexp(1, 970):
        return math.copysign(math.inf, float(mp.sign(x)))
    return float(mp.libmp.to_float(x._mpf_, rnd="n"))


def _mp_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q kᵀ/√E) v of one head (L, E), (S, E), (S, Ev) at 4000 bits, rounded."""
    with mp.workprec(4000):
        L, E = q.shape
        S, Ev = v.shape
        c = 1 / mp.sqrt(E)
        out = np.zeros((L, Ev))
        for i in range(L):
            s = [c * mp.fsum(mp.mpf(float(q[i, e])) * mp.mpf(float(k[j, e])) for e in range(E))
                 for j in range(S)]
            m = max(s)
            w = [mp.exp(x - m) for x in s]
            z = mp.fsum(w)
            for f in range(Ev):
                out[i, f] = _mp_float(mp.fsum(wj * mp.mpf(float(v[j, f]))
                                              for wj, j in zip(w, range(S), strict=True)) / z)
        return out


def _case(seed: int, L: int, S: int, qs: float, vs: float) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, L, 3)) * qs
    k = rng.standard_normal((1, S, 3))
    v = rng.uniform(-1, 1, (1, S, 2)) * vs
    return q, k, v


CASES = [(seed, L, S, qs, vs)
         for seed, (L, S) in enumerate([(1, 1), (2, 4), (3, 2), (4, 5), (5, 3)])
         for qs in (1e100, 1e200, 1e300)
         for vs in (1.0, 2.0**600, 1e300, _M)]


@pytest.mark.parametrize(("seed", "L", "S", "qs", "vs"), CASES[::3] + CASES[1::7])
def test_huge_queries_exact_passes_perturbed_fails(seed: int, L: int, S: int, qs: float,
                                                   vs: float) -> None:
    q, k, v = _case(seed, L, S, qs, vs)
    exact = _mp_attention(q[0], k[0], v[0])[None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(ms.reference_attention(q, k, v).rounded("float64"), exact)
        assert ms.compare_attention(exact, q, k, v).passed
        bad = exact.copy()
        bad[0, 0, 0] = bad[0, 0, 0] * (1 - 2.0**-8) if bad[0, 0, 0] else 1e-3
        assert not ms.compare_attention(bad, q, k, v).passed


@pytest.mark.parametrize("kind", ["probabilistic", "worst_case"])
@pytest.mark.parametrize("qs", [1e100, 1e300])
@pytest.mark.parametrize("vs", [1.0, 2.0**600])
def test_model_tolerance_finite_at_huge_queries(kind: str, qs: float, vs: float) -> None:
    """The certified level alone decides: one-hot rows (gaps ≈ 1e100-1e300 far above the
    score errors ≈ 1e84-1e284) give a tolerance of a few ulps of the output, finite and
    not vacuous; before, NaN (0·inf in the squared terms) made it vacuous."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((8, 16)) * qs
    k = rng.standard_normal((8, 16))
    v = rng.standard_normal((8, 16)) * vs
    b = attention_error_bound(q, k, v, scale=0.25, allowed=np.ones((8, 8), bool),
                              model=error_model("float64", kind=kind))
    assert np.all(np.isfinite(b.tol)) and not b.vacuous.any()
    assert np.all(b.tol <= 1e-13 * np.max(np.abs(v)))


def test_shape_1_2_8_16_at_1e300() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 8, 16)) * 1e300
    k, v = (rng.standard_normal((1, 2, 8, 16)) for _ in range(2))
    exact = np.stack([_mp_attention(q[0, h], k[0, h], v[0, h]) for h in range(2)])[None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ms.compare_attention(exact, q, k, v).passed
        bad = exact * (1 - 2.0**-8)
        assert not ms.compare_attention(bad, q, k, v).passed
