"""The rounding-error model (mha_symbolic/testing/tolerance.py).

Expected values come from independent methods: hand-derived constants, numpy's
own ``spacing`` for ulps, and an exact attention computed here with Python
Fractions and mpmath at 50 digits, against which simulated worst-case rounding
patterns are measured.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import mpmath
import numpy as np
import pytest

from mha_symbolic.errors import SpecError
from mha_symbolic.testing.tolerance import (
    FORMATS,
    attention_error_bound,
    format_of,
    gamma,
    linear_error_bound,
    ulp,
)

U = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.mark.parametrize("name", list(U))
def test_unit_roundoff_is_half_an_ulp_of_one(name: str) -> None:
    assert FORMATS[name].u == U[name]


def test_format_of_accepts_numpy_ml_dtypes_and_names() -> None:
    assert format_of(np.float16).name == "float16"
    assert format_of(ml_dtypes.bfloat16).name == "bfloat16"
    assert format_of("float32").name == "float32"
    with pytest.raises(SpecError, match="int32"):
        format_of(np.int32)


def test_gamma_is_k_u_over_one_minus_k_u_and_infinite_past_one() -> None:
    u = 2.0**-24
    assert float(gamma(3, u)) == 3 * u / (1 - 3 * u)
    assert float(gamma(300, 2.0**-8)) == math.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_ulp_agrees_with_numpy_spacing(dtype: type) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200) * 10.0 ** rng.integers(-6, 4, 200)).astype(dtype)
    x = np.concatenate([x, np.array([1.0, 0.5, 2.0 ** -20, 0.0], dtype=dtype)])
    fmt = format_of(dtype)
    expected = np.abs(np.spacing(np.abs(x))).astype(np.float64)
    assert np.array_equal(ulp(x.astype(np.float64), fmt), expected)


def test_ulp_of_bfloat16_by_hand() -> None:
    fmt = format_of("bfloat16")
    assert float(ulp(np.array(1.0), fmt)) == 2.0**-7
    assert float(ulp(np.array(3.0), fmt)) == 2.0**-6
    assert float(ulp(np.array(0.0), fmt)) == 2.0**-133      # smallest subnormal


# ---------------------------------------------------------------------------------
# The bound against an exact computation


def _exact_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Exact scores (Fractions), exp at 50 digits (mpmath), 2-D arrays only."""
    mpmath.mp.dps = 50
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


def _perturbed_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                         u: float, rng: np.random.Generator, worst: bool) -> np.ndarray:
    """A plain implementation whose every rounding is an explicit relative error of
    size u (random signs, or the signs that widen the softmax most), in float64."""
    def d(shape: tuple[int, ...]) -> np.ndarray:
        return 1.0 + u * (np.ones(shape) if worst else rng.choice([-1.0, 1.0], shape))

    qs = q * (scale * d(())) * d(q.shape)                    # scale rounded, then q*c
    L, S = q.shape[0], k.shape[0]
    s = np.zeros((L, S))
    for e in range(q.shape[1]):                              # sequential dot product
        s = (s + np.outer(qs[:, e], k[:, e]) * d((L, S))) * d((L, S))
    s = s * d((L, S))                                        # store the scores
    if worst:   # push the largest score up and the others down
        top = s == s.max(axis=1, keepdims=True)
        s = np.where(top, s * (1 + 4 * u * np.sign(s)), s * (1 - 4 * u * np.sign(s)))
    m = s.max(axis=1, keepdims=True)
    ex = np.exp((s - m) * d((L, S))) * d((L, S)) ** 2       # argument, exp (2 ulps)
    tot = ex.sum(axis=1, keepdims=True) * (1 + (S - 1) * u)
    p = ex / tot * d((L, S)) * d((L, S))                    # division, store P
    y = np.zeros((L, v.shape[1]))
    for j in range(S):
        y = (y + np.outer(p[:, j], v[j]) * d(y.shape)) * d(y.shape)
    return y * d(y.shape)                                    # final store


def _float64_parts(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    s = scale * (q @ k.T)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("worst", [False, True])
def test_bound_covers_simulated_rounding_patterns(name: str, worst: bool) -> None:
    rng = np.random.default_rng(7 + len(name) + worst)
    fmt = FORMATS[name]
    for trial in range(6):
        L, S, E = (int(x) for x in rng.integers(1, 7, 3))
        big = 6.0 if trial % 3 == 2 else 1.0                 # a wide score range
        q, k = (big * rng.standard_normal((n, E)) for n in (L, S))
        v = rng.standard_normal((S, 3))
        if trial % 3 == 1:                                   # cancelling values
            v[-1] = -v[0]
        scale = 1 / math.sqrt(E)
        exact = _exact_attention(q, k, v, scale)
        p = _float64_parts(q, k, scale)
        bound = attention_error_bound(q, k, v, p, scale=scale, allowed=np.ones((L, S), bool),
                                      mask_add=None, out=exact, fmt=fmt, acc=fmt)
        for _ in range(4):
            y = _perturbed_attention(q, k, v, scale, fmt.u, rng, worst)
            assert np.all(np.abs(y - exact) <= bound), (name, trial, np.abs(y - exact) / bound)


def test_natural_scale_is_sum_of_weighted_abs_values_not_abs_output() -> None:
    # two keys with equal scores, values +1 and -1: y = 0 exactly, yet a plain
    # implementation's error scales with Σ p_j |v_j| = 1
    fmt = FORMATS["float32"]
    q = np.zeros((1, 2))
    k = np.zeros((2, 2))
    v = np.array([[1.0], [-1.0]])
    p = np.array([[0.5, 0.5]])
    b = attention_error_bound(q, k, v, p, scale=1.0, allowed=np.ones((1, 2), bool),
                              mask_add=None, out=np.zeros((1, 1)), fmt=fmt, acc=fmt)
    assert float(b[0, 0]) >= float(gamma(2, fmt.u))          # not u * |y| = 0
    assert float(b[0, 0]) < 20 * fmt.u


def test_wider_accumulation_tightens_the_bound() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((4, 16)), rng.standard_normal((9, 16)), rng.standard_normal(
        (9, 5))
    p = _float64_parts(q, k, 0.25)
    args = dict(scale=0.25, allowed=np.ones((4, 9), bool), mask_add=None, out=p @ v)
    b16 = attention_error_bound(q, k, v, p, fmt=FORMATS["bfloat16"], acc=FORMATS["bfloat16"],
                                **args)
    b32 = attention_error_bound(q, k, v, p, fmt=FORMATS["bfloat16"], acc=FORMATS["float32"],
                                **args)
    assert np.all(b32 < b16)
    # and the final rounding u|y| stays: never below half an ulp of bf16
    assert np.all(b32 >= FORMATS["bfloat16"].u * np.abs(p @ v))


def test_masked_keys_do_not_count() -> None:
    fmt = FORMATS["float32"]
    q = np.ones((1, 1))
    k = np.array([[1.0], [1e6]])          # an enormous score, but masked out
    v = np.array([[1.0], [1e6]])
    allowed = np.array([[True, False]])
    p = np.array([[1.0, 0.0]])
    b = attention_error_bound(q, k, v, p, scale=1.0, allowed=allowed, mask_add=None,
                              out=np.ones((1, 1)), fmt=fmt, acc=fmt)
    assert float(b[0, 0]) < 1e-5


def test_linear_bound_covers_a_float32_product() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((7, 12)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    exact = np.array([[float(sum(Fraction(float(x[i, e])) * Fraction(float(w[o, e]))
                                 for e in range(12)) + Fraction(float(b[o])))
                       for o in range(7)] for i in range(5)])
    got = (x @ w.T + b).astype(np.float64)
    fmt = FORMATS["float32"]
    bound = linear_error_bound(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                               y=exact, fmt=fmt, acc=fmt)
    assert np.all(np.abs(got - exact) <= bound)
    assert np.all(bound < 1e-4)
