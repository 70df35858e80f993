"""moments.nonneg_product: float32 products of non-negative arrays as rigorous upper
bounds (issue 29), against exact rational sums (fractions.Fraction of every float64
operand: an independent evaluation)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mha_symbolic.testing.forward.moments import NONNEG_F32_MAX_TERMS, nonneg_product


def _exact(a: np.ndarray, b: np.ndarray) -> list[list[Fraction]]:
    return [[sum((Fraction(float(a[i, j])) * Fraction(float(b[j, k]))
                  for j in range(a.shape[1])), Fraction(0))
             for k in range(b.shape[1])] for i in range(a.shape[0])]


def _operands(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    R, n, m = 5, 37, 4
    b = rng.random((n, m))
    if kind == "weights":
        a = rng.random((R, n))
        a /= a.sum(axis=-1, keepdims=True)
    elif kind == "one_hot":
        a = np.zeros((R, n))
        a[np.arange(R), rng.integers(0, n, R)] = 1.0
    elif kind == "tiny":                 # far below float32's range: scaled first
        a = rng.random((R, n)) * 2.0**-700
    elif kind == "spread":               # 2^-300 .. 1 in one matrix: underflow in float32
        a = 2.0 ** -rng.integers(0, 300, (R, n)).astype(np.float64) * rng.random((R, n))
        b[:, 0] = 2.0 ** -rng.integers(100, 200, n)       # a column of tiny values
    elif kind == "large":
        a = rng.random((R, n)) * 2.0**500
    else:                                # zeros: rows and columns with nothing
        a = rng.random((R, n)) * (rng.random((R, n)) < 0.3)
        a[0] = 0.0
        b[:, 1] = 0.0
    return a, b


@pytest.mark.parametrize("kind", ["weights", "one_hot", "tiny", "spread", "large", "zeros"])
def test_the_float32_product_bounds_the_exact_product_from_above_and_tightly(kind: str
                                                                            ) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    a, b = _operands(kind, rng)
    up, nom = nonneg_product(a, b.astype(np.float32), b)
    ex = _exact(a, b)
    n = a.shape[1]
    scale = float(np.max(a))
    for i in range(a.shape[0]):
        for k in range(b.shape[1]):
            assert Fraction(float(up[i, k])) >= ex[i][k]
            # tight: the float32 result's own rounding (≤ n + 2 roundings) and the
            # slack added (n + 3), and the 5n η absolute term at the scale 2^e
            slack = (float(ex[i][k]) * 2 * (n + 4) * 2.0**-24
                     + 6 * n * 2.0**-126 * max(1.0, 2 * scale))
            assert float(up[i, k]) - float(ex[i][k]) <= slack
            if ex[i][k] == 0:
                assert nom[i, k] == 0.0          # the vacuity test's natural scale


def test_non_finite_and_long_sums_fall_back_to_float64() -> None:
    rng = np.random.default_rng(1)
    b = rng.random((6, 2))
    a = rng.random((3, 6))
    a[1, 2] = np.inf
    with np.errstate(invalid="ignore"):
        up, nom = nonneg_product(a, b.astype(np.float32), b)
    assert np.array_equal(up, a @ b) and up is nom
    a = rng.random((2, 3))
    b = rng.random((3, 2))
    up, _ = nonneg_product(a, b.astype(np.float32), b, n_terms=NONNEG_F32_MAX_TERMS + 1)
    assert np.array_equal(up, a @ b)
