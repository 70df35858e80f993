"""Example: testing a numpy attention implementation against the exact answer.

Run with ``python -m pytest examples/test_numpy_attention.py``.  The kernel below
stands for yours: it takes inputs in any float dtype, computes in float32 for
fp16/bf16 (as GPU kernels do) and returns the dtype of its inputs.  The tests need
no tolerance of their own: the default comes from the rounding-error model of a
kernel accumulating in float32 (docs/testing.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_symbolic import AttentionMismatchError, assert_attention_close
from mha_symbolic.testing.pytest_plugin import AttentionOracle

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]


def my_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, mask: np.ndarray | None = None,
                 is_causal: bool = False, scale: float | None = None) -> np.ndarray:
    """Scaled dot-product attention; bool mask True = takes part; GQA by repeat."""
    dt = q.dtype
    work = np.float64 if dt == np.float64 else np.float32
    q, k, v = (x.astype(work) for x in (q, k, v))
    if k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    c = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * work(c)
    L, S = s.shape[-2:]
    keep = np.ones((L, S), dtype=bool)
    if is_causal:
        keep &= np.arange(S)[None, :] <= np.arange(L)[:, None]
    if mask is not None:
        keep = keep & mask
    s = np.where(keep, s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True) @ v).astype(dt)


@pytest.fixture
def oracle(request: pytest.FixtureRequest) -> AttentionOracle:
    """The plugin's fixture when the package is installed (pytest11 entry point),
    the same object otherwise."""
    try:
        fixture: AttentionOracle = request.getfixturevalue("attention_oracle")
    except pytest.FixtureLookupError:
        fixture = AttentionOracle()
    return fixture


def _inputs(dtype: object, shape_q: tuple[int, ...], shape_kv: tuple[int, ...],
            seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape_q).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_self_attention(oracle: AttentionOracle, dtype: object) -> None:
    q, k, v = _inputs(dtype, (2, 4, 8, 16), (2, 4, 8, 16))
    oracle.assert_close(my_attention(q, k, v), q, k, v)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_causal_cross_attention_with_mask(oracle: AttentionOracle, dtype: object) -> None:
    q, k, v = _inputs(dtype, (1, 2, 6, 8), (1, 2, 9, 8), seed=1)
    mask = np.random.default_rng(2).random((6, 9)) < 0.8
    mask[:, 0] = True
    out = my_attention(q, k, v, mask=mask, is_causal=True)
    oracle.assert_close(out, q, k, v, attn_mask=mask, is_causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_grouped_query_attention(oracle: AttentionOracle, dtype: object) -> None:
    q, k, v = _inputs(dtype, (1, 6, 5, 8), (1, 2, 7, 8), seed=3)
    oracle.assert_close(my_attention(q, k, v), q, k, v, enable_gqa=True)


def test_float32_accumulation_is_the_default_and_said_so(oracle: AttentionOracle) -> None:
    q, k, v = _inputs(ml_dtypes.bfloat16, (1, 2, 8, 16), (1, 2, 8, 16), seed=4)
    result = oracle.compare(my_attention(q, k, v), q, k, v)
    assert result.passed and result.accumulation == "float32 (default)"


def test_a_kernel_that_accumulates_in_bfloat16_says_so(oracle: AttentionOracle) -> None:
    # every operation rounded to bfloat16 (sums included): state it, or the default
    # (float32 accumulation) may rightly reject the extra rounding error
    q, k, v = _inputs(ml_dtypes.bfloat16, (1, 2, 8, 16), (1, 2, 8, 16), seed=6)
    bf = ml_dtypes.bfloat16
    s = (q @ np.swapaxes(k, -1, -2)) * bf(0.25)               # rounded to bf16 (bf16 @)
    w = np.exp(s - s.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True)) @ v
    oracle.assert_close(out.astype(bf), q, k, v, kernel="eager", accumulation_dtype="same")


def test_a_wrong_scale_is_caught_and_diagnosed() -> None:
    q, k, v = _inputs(np.float32, (1, 2, 8, 16), (1, 2, 8, 16), seed=5)
    wrong = my_attention(q, k, v, scale=1.0 / 16)             # 1/d_k instead of 1/sqrt(d_k)
    with pytest.raises(AttentionMismatchError, match="scale_1_over_d"):
        assert_attention_close(wrong, q, k, v)
