"""Finite, tight enclosures and decided verdicts up to the float64 maximum (issue 30,
item 3).  Expected values come from exact fractions (Fraction holds 1.8e308 exactly;
float(Fraction) is correctly rounded) and mpmath at 300 bits, never from the oracle.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import mha_symbolic as ms

M = float(np.finfo(np.float64).max)


def _inside(enc: ms.Enclosure, exact: list[list[Fraction]] | np.ndarray) -> None:
    lo, hi = enc.lower.reshape(-1), enc.upper.reshape(-1)
    flat = [x for row in exact for x in row] if isinstance(exact, list) else list(exact.ravel())
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
    for a, b, x in zip(lo.tolist(), hi.tolist(), flat, strict=True):
        assert Fraction(a) <= x <= Fraction(b)


def test_equal_value_rows_at_the_float_maximum_are_enclosed_exactly() -> None:
    # a convex combination of equal rows is that row: M exactly (the tiers' outward
    # rounding alone gave [M, inf])
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    for top in (M, -M):
        v = np.full((2, 5, 3), top)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = ms.reference_attention(q, k, v)
            assert np.all(r.lower == top) and np.all(r.upper == top)
            assert np.all(r.rounded("float64") == top)
            assert np.all(r.midpoint == top)


def test_uniform_weights_at_the_float_maximum_match_fractions() -> None:
    # scale=0: every weight is exactly 1/S, the output the exact mean of the value rows
    cols = [[M, M, -M], [M, M / 2, M / 4], [-M, -M, np.nextafter(-M, 0)], [M, -M, 1.0]]
    v = np.array(cols).T[None]                      # (1, S=3, 4)
    q, k = np.ones((1, 2, 4)), np.ones((1, 3, 4))
    exact = [[sum((Fraction(x) for x in c), Fraction(0)) / 3 for c in cols] for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = ms.reference_attention(q, k, v, scale=0.0)
        _inside(r, exact)
        assert r.rounded("float64")[0].tolist() == [[float(x) for x in row] for row in exact]


def test_softmax_weights_at_the_float_maximum_match_mpmath() -> None:
    rng = np.random.default_rng(7)
    L, S, E, Ev = 3, 6, 4, 3
    q, k = rng.standard_normal((1, L, E)), rng.standard_normal((1, S, E))
    v = (rng.uniform(0.5, 1.0, (1, S, Ev)) * rng.choice([-1.0, 1.0], (1, S, Ev))) * M
    v[0, 2, 0] = M                                   # the maximum itself
    with mpmath.workprec(300):
        exact = np.empty((L, Ev), dtype=object)
        for i in range(L):
            s = [mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b))
                             for a, b in zip(q[0, i], k[0, j], strict=True)) / mpmath.sqrt(E)
                 for j in range(S)]
            top = max(s)
            w = [mpmath.exp(x - top) for x in s]
            den = mpmath.fsum(w)
            for c in range(Ev):
                exact[i, c] = mpmath.fsum(wj * mpmath.mpf(float(v[0, j, c]))
                                          for j, wj in enumerate(w)) / den
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = ms.reference_attention(q, k, v)
            lo, hi = r.lower[0], r.upper[0]
            assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
            for i in range(L):
                for c in range(Ev):
                    x = exact[i, c]
                    assert mpmath.mpf(float(lo[i, c])) <= x <= mpmath.mpf(float(hi[i, c]))
                    # tight: a few ulps
                    assert hi[i, c] - lo[i, c] <= 8 * np.spacing(abs(float(x)))
            got = r.rounded("float64")[0]
            want = np.array([[float(exact[i, c]) for c in range(Ev)] for i in range(L)])
            assert np.array_equal(got, want)


def test_compare_attention_decides_at_the_float_maximum() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((1, 3, 4), (1, 5, 4), (1, 5, 2)))
    v = np.where(v > 0, M, v)
    t = [torch.tensor(x) for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        good = ms.compare_attention(out, *t)
        assert good.passed and "inf" not in good.summary()
        bad = out.clone()
        bad[0, 1, 1] *= 1 - 2.0**-20
        assert not ms.compare_attention(bad, *t).passed


def test_backward_with_huge_values_and_output_gradients_matches_fractions() -> None:
    # q = 0: every score is 0, the weights exactly 1/S, so every gradient is rational:
    # D_i = Σ_j P dP_ij, dS_ij = P (dP_ij - D_i), dq_i = c Σ_j dS_ij k_j, dv_j = Σ_i P dO_i.
    # |dO|·|v| ≈ 2^1040 (dP and dS beyond every double) but c = 2^-40 brings dq back to
    # ≈ 2^1000: the float64 tiers overflowed here (infinite enclosures)
    rng = np.random.default_rng(3)
    L, S, E, Ev = 2, 3, 2, 2
    q = np.zeros((1, L, E))
    k = rng.integers(-3, 4, (1, S, E)).astype(np.float64)
    v = rng.integers(-2**20, 2**20, (1, S, Ev)).astype(np.float64) * 2.0**600
    do = rng.integers(-2**20, 2**20, (1, L, Ev)).astype(np.float64) * 2.0**400
    c = Fraction(1, 2**40)
    P = Fraction(1, S)
    F = np.vectorize(Fraction, otypes=[object])
    kf, vf, dof = F(k[0]), F(v[0]), F(do[0])
    dP = dof.dot(vf.T)                               # (L, S)
    D = [sum((P * dP[i, j] for j in range(S)), Fraction(0)) for i in range(L)]
    dS = np.array([[P * (dP[i, j] - D[i]) for j in range(S)] for i in range(L)], dtype=object)
    dq = c * dS.dot(kf)
    dv = np.array([[sum((P * dof[i, e] for i in range(L)), Fraction(0)) for e in range(Ev)]
                   for _ in range(S)], dtype=object)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = ms.reference_attention_backward(q, k, v, do, scale=2.0**-40)
        _inside(g.dq, dq)
        _inside(g.dv, dv)
        # q = 0: dk = c dSᵀ q = 0 (enclosed within the tiers' absolute floor, in units 2^n)
        assert np.all(g.dk.lower <= 0) and np.all(g.dk.upper >= 0)
        assert np.all(np.abs(g.dk.lower) < 1e-200) and np.all(g.dk.upper < 1e-200)
        assert np.all(g.dk.rounded("float64") == 0)
        assert g.dq.rounded("float64")[0].tolist() == [[float(x) for x in r] for r in dq]
        assert g.dv.rounded("float64")[0].tolist() == [[float(x) for x in r] for r in dv]


def test_a_gradient_beyond_the_float_range_is_enclosed_by_the_largest_double() -> None:
    # |dq| ≈ 2^1600 is finite but above every double: lower = M <= dq (never +inf),
    # upper = +inf; rounding gives inf, as it must
    q = np.zeros((1, 2, 2))
    k = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    v = np.array([[[1.0, 0.0], [0.0, 0.0]]]) * 2.0**900
    do = np.array([[[1.0, 0.0], [0.0, 0.0]]]) * 2.0**700
    g = ms.reference_attention_backward(q, k, v, do, scale=1.0)
    # dP_00 = 2^1600, D_0 = 2^1599, dS_00 = 2^1598, dS_01 = -2^1598: dq_0 = (2^1598, -2^1598)
    assert g.dq.lower[0, 0, 0] == M and g.dq.upper[0, 0, 0] == np.inf
    assert g.dq.lower[0, 0, 1] == -np.inf and g.dq.upper[0, 0, 1] == -M
    assert g.dq.rounded("float64")[0, 0].tolist() == [np.inf, -np.inf]


def test_compare_attention_backward_decides_at_the_float_maximum() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal(s) for s in ((1, 3, 4), (1, 5, 4), (1, 5, 2), (1, 3, 2)))
    for vv, dd in ((np.where(v > 0, M / 8, v), do), (v, do * 1e307), (v * 1e150, do * 1e150)):
        t = [torch.tensor(x, requires_grad=True) for x in (q, k, vv)]
        grads = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(*t), t,
                                    torch.tensor(dd))
        args = [torch.tensor(x) for x in (q, k, vv, dd)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            res = ms.compare_attention_backward(*grads, *args)   # decided: no ToleranceError
            finite = all(bool(torch.isfinite(x).all()) for x in grads)
            assert res.passed == finite
            if not finite:
                continue
            wrong = [x.clone() for x in grads]
            wrong[0][0, 0, 0] *= 1 - 2.0**-20
            assert not ms.compare_attention_backward(*wrong, *args).passed


def test_rounding_after_the_call_shows_no_runtime_warning_at_the_float_maximum() -> None:
    # the long harness, seed 51 #2452: rounded() runs the double-double tier after the
    # door's errstate has ended; its overflows leaked as "invalid value encountered"
    rng = np.random.default_rng(571896)
    q, k = rng.standard_normal((1, 3, 3)), rng.standard_normal((1, 2, 3))
    v = rng.uniform(-1, 1, (1, 2, 2)) * M
    r = ms.reference_attention(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = r.rounded("float64")
        lo, hi = v.min(axis=-2)[:, None, :], v.max(axis=-2)[:, None, :]
        assert np.all(np.isfinite(out)) and np.all((lo <= out) & (out <= hi))
