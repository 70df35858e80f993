"""A kernel that flushes subnormal results to zero is named in the report (a note that
points at ``subnormals="flush"``), and only then."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mha_symbolic as ms

BF16 = ml_dtypes.bfloat16

TINY32 = 2.0 ** -126  # the smallest normal float32


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # one key: the output is v itself, exactly (softmax of one score is 1)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 3, 4)).astype(BF16)
    k = rng.standard_normal((1, 1, 1, 4)).astype(BF16)
    v = np.array([[[[3e-39, -5e-39, 0.25, -1.5]]]], dtype=np.float32).astype(BF16)
    return q, k, v


def test_a_flushing_kernel_fails_by_default_with_the_hint_and_passes_when_declared() -> None:
    q, k, v = _inputs()
    exact = np.broadcast_to(v, (1, 1, 3, 4)).copy()  # P = 1 on the one key
    assert np.all(exact[..., :2].astype(np.float64) != 0)  # two subnormals, kept by bf16
    flushed = np.where(np.abs(exact.astype(np.float64)) < TINY32, 0, exact).astype(BF16)
    assert np.count_nonzero(flushed != exact) == 6  # the subnormals of every row are gone
    res = ms.compare_attention(flushed, q, k, v)
    assert not res.passed
    assert any("flushes subnormal" in n and 'subnormals="flush"' in n for n in res.notes)
    # declared, the flushed elements are no mismatch: the rest passes, and an exact value
    # below the flush floor has no verdict at all (a flushing kernel may return 0 there)
    with pytest.raises(ms.errors.ToleranceError, match="vacuous"):
        ms.compare_attention(flushed, q, k, v, subnormals="flush")
    normal = flushed.copy()
    normal[..., :2] = 0  # the subnormal features of v set to 0 in the inputs themselves
    v0 = v.copy()
    v0[..., :2] = 0
    assert ms.compare_attention(normal, q, k, v0, subnormals="flush").passed
    assert ms.compare_attention(exact, q, k, v).passed  # gradual underflow: no mismatch


def test_no_flush_hint_for_an_error_that_is_not_a_flushed_subnormal() -> None:
    q, k, v = _inputs()
    wrong = np.broadcast_to(v, (1, 1, 3, 4)).copy()
    wrong[..., 2] = 0.5   # 0.25 is exact: a plain wrong value
    res = ms.compare_attention(wrong, q, k, v)
    assert not res.passed
    assert not any("flushes subnormal" in n for n in res.notes)


@pytest.mark.parametrize("value", [0.0, 1e-30])
def test_no_hint_when_the_flushed_value_was_not_below_the_smallest_normal(value: float) -> None:
    q, k, _ = _inputs()
    v = np.array([[[[1e-30, 0.5, 0.25, -1.5]]]], dtype=np.float32).astype(BF16)
    out = np.broadcast_to(v, (1, 1, 3, 4)).copy()
    out[..., 0] = value if value == 0.0 else -1e-30   # 1e-30 is normal in bfloat16
    res = ms.compare_attention(out, q, k, v)
    assert not res.passed
    assert not any("flushes subnormal" in n for n in res.notes)
