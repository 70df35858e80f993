"""The bound of attention (mha_symbolic/testing/forward/model.py).

Expected values come from independent methods: an exact attention computed here
(Fraction scores, mpmath exp at 50 digits) against which simulated kernels with
explicit rounding errors of size u (random, or chosen adversarially) are measured;
brute-force counts; closed forms by hand.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import mpmath
import numpy as np
import pytest

from mha_symbolic.testing.forward.model import _tie_counts, attention_error_bound
from mha_symbolic.testing.tolerance import error_model

mpmath.mp.dps = 50


def test_tie_counts_match_a_brute_force_count() -> None:
    rng = np.random.default_rng(4)
    s = rng.integers(0, 4, (6, 9)).astype(np.float64)
    allowed = rng.random((6, 9)) < 0.8
    got = _tie_counts(s, allowed)
    for i in range(6):
        for j in range(9):
            want = sum(1 for jj in range(9) if allowed[i, jj] and s[i, jj] == s[i, j]) \
                if allowed[i, j] else 1
            assert got[i, j] == want


# ---------------------------------------------------------------------------------
# The bound against an exact computation and simulated kernels


def _exact_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Exact scores (Fractions), exp at 50 digits (mpmath), 2-D arrays only."""
    L, S = q.shape[0], k.shape[0]
    out = np.zeros((L, v.shape[1]))
    c = Fraction(scale)
    for i in range(L):
        s = [c * sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(q[i], k[j],
                                                                             strict=True))
             for j in range(S)]
        m = max(s)
        e = [mpmath.exp(mpmath.mpf(x.numerator) / x.denominator - mpmath.mpf(m.numerator)
                        / m.denominator) for x in s]
        tot = mpmath.fsum(e)
        for f in range(v.shape[1]):
            out[i, f] = float(mpmath.fsum(e[j] * float(v[j, f]) for j in range(S)) / tot)
    return out


class _Rounder:
    """Explicit relative rounding errors of size u (``worst``: all +u, or a sign the
    caller chooses; else uniformly random in [−u, u])."""

    def __init__(self, rng: np.random.Generator, worst: bool) -> None:
        self.rng, self.worst = rng, worst

    def __call__(self, a: np.ndarray, u: float, sign: np.ndarray | float | None = None
                 ) -> np.ndarray:
        if self.worst:
            d = u * (np.ones(np.shape(a)) if sign is None else np.sign(sign) + (np.sign(sign) == 0))
        else:
            d = u * self.rng.uniform(-1.0, 1.0, np.shape(a))
        return a * (1.0 + d)


def _simulated_kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, kernel: str,
                      u: float, ua: float, rnd: _Rounder) -> np.ndarray:
    """A plain kernel in float64 whose every rounding is an explicit relative error:
    the scale held in u_a, the scaled query (eager_scaled_query) or the scores
    (eager) stored in u, sequential sums in u_a, exp within 2 ulps of u_a, P stored
    in u, the output stored in u.  In the worst pattern every score rounding pushes
    the row's top score up and the others down."""
    L, S = q.shape[0], k.shape[0]
    c = rnd(np.array(scale), ua)
    top = None
    qs = rnd(q * c, u) if kernel == "eager_scaled_query" else q
    s = np.zeros((L, S))
    for e in range(q.shape[1]):                              # sequential dot product
        s = rnd(s + rnd(np.outer(qs[:, e], k[:, e]), ua), ua)
    exact_s = scale * (q @ k.T)
    top = exact_s == exact_s.max(axis=1, keepdims=True)
    push = np.where(top, np.sign(s), -np.sign(s))            # widen the softmax
    if kernel == "fused":
        s = rnd(s * c, ua, push)
    elif kernel == "eager":
        s = rnd(rnd(s, u, push) * c, u, push)
    else:
        s = rnd(s, u, push)
    m = s.max(axis=1, keepdims=True)
    ex = rnd(rnd(np.exp(rnd(s - m, ua)), ua), ua)            # argument, exp (2 ulps)
    tot = ex[:, :1].copy()
    for j in range(1, S):
        tot = rnd(tot + ex[:, j:j + 1], ua)
    p = rnd(rnd(ex / tot, ua), u)                            # division, store P
    y = np.zeros((L, v.shape[1]))
    for j in range(S):
        y = rnd(y + rnd(np.outer(p[:, j], v[j]), ua), ua)
    return rnd(y, u)                                         # final store


@pytest.mark.parametrize(("name", "kernel", "acc"), [
    ("float32", "fused", None), ("bfloat16", "fused", None), ("float16", "fused", None),
    ("bfloat16", "eager", "same"), ("float16", "eager_scaled_query", "same"),
    ("float32", "eager_scaled_query", None)])
@pytest.mark.parametrize("worst", [False, True])
def test_bound_covers_simulated_kernels(name: str, kernel: str, acc: str | None,
                                        worst: bool) -> None:
    rng = np.random.default_rng(7 + len(name) + 3 * worst + len(kernel))
    base = error_model(name, accumulation_dtype=acc, kernel=kernel)
    for kind in ("worst_case", "probabilistic"):
        if worst and kind == "probabilistic":
            continue      # the probabilistic model is for rounding errors that are random
        model = error_model(name, accumulation_dtype=acc, kernel=kernel, kind=kind)
        for trial in range(5):
            L, S, E = (int(x) for x in rng.integers(1, 7, 3))
            big = 6.0 if trial % 3 == 2 else 1.0             # a wide score range
            q, k = (big * rng.standard_normal((n, E)) for n in (L, S))
            v = rng.standard_normal((S, 3))
            if trial % 3 == 1:                               # cancelling values
                v[-1] = -v[0]
            scale = 1 / math.sqrt(E)
            exact = _exact_attention(q, k, v, scale)
            m = model.with_events(L * 3, 4 * S * L * 3)
            b = attention_error_bound(q, k, v, scale=scale, allowed=np.ones((L, S), bool),
                                      model=m)
            for _ in range(4):
                y = _simulated_kernel(q, k, v, scale, kernel, base.u, base.ua,
                                      _Rounder(rng, worst))
                ok = np.abs(y - exact) <= b.tol
                assert np.all(ok | b.vacuous), (kind, trial, np.abs(y - exact) / b.tol)


def test_natural_scale_is_sum_of_weighted_abs_values_not_abs_output() -> None:
    # two keys with equal scores, values +1 and -1: y = 0 exactly, yet a plain
    # implementation's error scales with Σ p_j |v_j| = 1
    q = np.zeros((1, 2))
    k = np.zeros((2, 2))
    v = np.array([[1.0], [-1.0]])
    b = attention_error_bound(q, k, v, scale=1.0, allowed=np.ones((1, 2), bool),
                              model=error_model("float32", kind="worst_case"))
    u = 2.0**-24
    assert float(b.tol[0, 0]) >= u                 # not u·|y| = 0: P stores and sums
    assert float(b.tol[0, 0]) < 40 * u
    assert not b.vacuous.any()


def test_wider_accumulation_tightens_the_bound() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((4, 16)), rng.standard_normal((9, 16)), rng.standard_normal(
        (9, 5))
    args = dict(scale=0.25, allowed=np.ones((4, 9), bool))
    b16 = attention_error_bound(q, k, v, model=error_model("bfloat16", accumulation_dtype="same"),
                                **args)
    b32 = attention_error_bound(q, k, v, model=error_model("bfloat16"), **args)
    assert np.all(b32.tol < b16.tol)
    # and the final rounding stays: never below half an ulp of bf16 at the output
    s = 0.25 * q @ k.T
    p = np.exp(s - s.max(1, keepdims=True))
    y = (p / p.sum(1, keepdims=True)) @ v
    assert np.all(b32.tol >= 2.0**-8 * np.abs(y))


def test_masked_keys_do_not_count() -> None:
    q = np.ones((1, 1))
    k = np.array([[1.0], [1e6]])          # an enormous score, but masked out
    v = np.array([[1.0], [1e6]])
    allowed = np.array([[True, False]])
    b = attention_error_bound(q, k, v, scale=1.0, allowed=allowed,
                              model=error_model("float32"))
    assert float(b.tol[0, 0]) < 1e-5


def test_a_fully_masked_row_expects_an_exact_zero() -> None:
    b = attention_error_bound(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2)), scale=1.0,
                              allowed=np.array([[True] * 4, [False] * 4]),
                              model=error_model("float32"))
    # row 1: only underflow slack, the final store 2η_u and 4η_a (n = 0 keys), with
    # η_u = η_a = 2^-150 in float32
    assert np.all(b.tol[1] == 6 * 2.0**-150)
    assert not b.vacuous.any()


def test_identical_keys_cancel_the_shared_scaled_query_error() -> None:
    # every key equal: a shared error of the scores (the scaled query rounded to bf16)
    # shifts every score of a row alike and changes no weight, so the bound must equal
    # that of the same kernel without the scaled-query rounding
    from dataclasses import replace

    from mha_symbolic.testing.tolerance import KernelModel

    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 8))
    k = np.tile(rng.standard_normal((1, 8)), (5, 1))
    v = rng.standard_normal((5, 4))
    m = error_model("bfloat16", kernel="eager_scaled_query", kind="worst_case")
    without = replace(m, kernel=KernelModel("no_query_store", "", 1, False))
    args = dict(scale=1 / math.sqrt(8), allowed=np.ones((3, 5), bool))
    b = attention_error_bound(q, k, v, model=m, **args)
    b0 = attention_error_bound(q, k, v, model=without, **args)
    assert np.allclose(b.tol, b0.tol, rtol=1e-5, atol=0)   # 2^-20: the norms' slack
    # with distinct keys the rounded scaled query does count
    k2 = rng.standard_normal((5, 8))
    assert np.all(attention_error_bound(q, k2, v, model=m, **args).tol
                  > attention_error_bound(q, k2, v, model=without, **args).tol)


# ---------------------------------------------------------------------------------
# Never inf, never NaN, never vacuous by default


@pytest.mark.parametrize(("qs", "ks", "vs", "scale"), [
    (1e200, 1e200, 1.0, None),         # scores beyond float64
    (1.0, 1.0, 1.0, 1e300),            # an enormous scale
    (1.0, 1.0, 1e300, None),           # enormous values: (v − y)² would overflow
    (3.0e38, 1.0, 3.0e38, None),       # float32's largest values
    (1e-300, 1e-300, 1e-300, None),    # subnormal products
])
def test_bound_is_finite_for_every_finite_input(qs: float, ks: float, vs: float,
                                                scale: float | None) -> None:
    rng = np.random.default_rng(8)
    q = qs * rng.standard_normal((3, 4))
    k = ks * rng.standard_normal((5, 4))
    v = vs * rng.standard_normal((5, 2))
    c = 0.5 if scale is None else scale
    for name in ("float64", "float32", "bfloat16"):
        for kind in ("probabilistic", "worst_case"):
            with np.errstate(all="raise"):
                pass
            b = attention_error_bound(q, k, v, scale=c, allowed=np.ones((3, 5), bool),
                                      mask_add=np.full((3, 5), -1e308) if qs == 3e38 else None,
                                      model=error_model(name, kind=kind))
            assert np.all(np.isfinite(b.tol)) and np.all(b.tol >= 0), (name, kind)


def test_rows_whose_kernel_overflows_are_vacuous() -> None:
    # |q·k| = 2^130 > float32's range: a float32 kernel overflows on row 0 only
    q = np.array([[2.0**65, 0.0], [1.0, 0.0]])
    k = np.array([[2.0**65, 0.0], [1.0, 1.0]])
    v = np.array([[1.0], [2.0]])
    b = attention_error_bound(q, k, v, scale=1.0, allowed=np.ones((2, 2), bool),
                              model=error_model("float32"))
    assert b.vacuous[:, 0].tolist() == [True, False]
    assert np.all(np.isfinite(b.tol))
    # float64 holds 2^130 easily: nothing vacuous
    b64 = attention_error_bound(q, k, v, scale=1.0, allowed=np.ones((2, 2), bool),
                                model=error_model("float64"))
    assert not b64.vacuous.any()


def test_default_bfloat16_bound_at_production_size_is_meaningful() -> None:
    # bf16, 4096 keys, E = 128: worst case γ_n is meaningless here (nu = 16); the default
    # (float32 accumulation, probabilistic) must stay a small fraction of Σ p|v|
    rng = np.random.default_rng(9)
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((8, 128)).astype(bf).astype(np.float64)
    k = rng.standard_normal((4096, 128)).astype(bf).astype(np.float64)
    v = rng.standard_normal((4096, 16)).astype(bf).astype(np.float64)
    m = error_model("bfloat16").with_events(8 * 16, 8 * 16 * 8192)
    b = attention_error_bound(q, k, v, scale=128**-0.5, allowed=np.ones((8, 4096), bool),
                              model=m)
    s = q @ k.T / math.sqrt(128)
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    pv = p @ np.abs(v)
    assert not b.vacuous.any()
    assert np.all(b.tol < 2.0**-8 * pv)            # below one rounding of the natural scale
    # while bf16 accumulation over 4096 terms is vacuous in the worst case (γ_8192 ~ e^32)
    worst = error_model("bfloat16", accumulation_dtype="same", kind="worst_case")
    bw = attention_error_bound(q, k, v, scale=128**-0.5, allowed=np.ones((8, 4096), bool),
                               model=worst)
    assert bw.vacuous.all() and np.all(np.isfinite(bw.tol))


