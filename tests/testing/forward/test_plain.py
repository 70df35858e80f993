"""The chunked float64 evaluation (mha_symbolic/testing/forward/plain.py).

Expected outputs come from a direct numpy evaluation written here (broadcasting by
numpy's matmul, GQA by np.repeat), and from closed forms by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from mha_symbolic.testing.call import AttentionCall
from mha_symbolic.testing.forward.plain import Plain, fit_ratio, plain_in_dtype
from mha_symbolic.testing.tolerance import error_model


def _direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
            keep: np.ndarray | None = None) -> np.ndarray:
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("rows", [1, 3, 1 << 19])
def test_chunks_of_any_size_give_the_same_output(rows: int) -> None:
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 5, 4)), \
        rng.standard_normal((2, 3, 5, 6))
    pl = Plain(AttentionCall(q, k, v))
    flat = np.zeros((6, 7, 6))
    for ch in pl.chunks(max_scores=rows * 5):
        assert ch.q.shape[0] <= max(rows, 1)
        flat[ch.b, ch.rows] = pl._eval(ch)
    assert np.allclose(flat.reshape(2, 3, 7, 6), _direct(q, k, v, 0.5), rtol=1e-13, atol=0)


def test_broadcasting_a_query_with_fewer_leading_dims() -> None:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((7, 4))
    k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 5, 6))
    out = Plain(AttentionCall(q, k, v)).out
    assert out.shape == (2, 3, 7, 6)
    assert np.allclose(out, _direct(q, k, v, 0.5), rtol=1e-13, atol=0)


def test_gqa_maps_query_head_g_to_kv_head_g_div_rep() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((1, 6, 4, 8)), rng.standard_normal((1, 2, 5, 8)), \
        rng.standard_normal((1, 2, 5, 3))
    out = Plain(AttentionCall(q, k, v, enable_gqa=True)).out
    want = _direct(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), 8**-0.5)
    assert np.allclose(out, want, rtol=1e-13, atol=0)


def test_dropout_multiplies_the_weights_by_keep_over_one_minus_p() -> None:
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    keep = rng.random((3, 4)) < 0.6
    out = Plain(AttentionCall(q, k, v, dropout_p=0.25, dropout_mask=keep)).out
    s = (q @ k.T) / np.sqrt(2)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert np.allclose(out, (w * keep / 0.75) @ v, rtol=1e-13, atol=0)


def test_fully_masked_rows_follow_each_policy() -> None:
    q, k = np.ones((2, 1)), np.ones((3, 1))
    v = np.array([[1.0], [2.0], [6.0]])
    mask = np.array([[True, False, True], [False, False, False]])
    zero = Plain(AttentionCall(q, k, v, attn_mask=mask)).out
    assert zero[:, 0].tolist() == [3.5, 0.0]                 # (1 + 6)/2, then 0
    uniform = Plain(AttentionCall(q, k, v, attn_mask=mask, masked_rows="uniform")).out
    assert uniform[1, 0] == pytest.approx(3.0, rel=1e-15)   # the mean of every value
    nan = Plain(AttentionCall(q, k, v, attn_mask=mask, masked_rows="nan")).out
    assert nan[0, 0] == pytest.approx(3.5) and np.isnan(nan[1, 0])


def test_events_count_elements_and_sum_terms() -> None:
    x = AttentionCall(np.zeros((2, 3, 4)), np.zeros((2, 5, 4)), np.zeros((2, 5, 6)))
    # 2·3·6 = 36 output elements; sums of 2S = 10 terms for each of them and each row
    assert Plain(x).events() == (36.0, 10.0 * (36 + 6) + 1)


def test_bound_is_output_shaped_and_finite() -> None:
    rng = np.random.default_rng(5)
    x = AttentionCall(rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 6, 4)),
                        rng.standard_normal((1, 2, 6, 5)), is_causal=True)
    pl = Plain(x)
    tol, vac = pl.bound(error_model("float32").with_events(*pl.events()))
    assert tol.shape == vac.shape == (1, 2, 3, 5)
    assert np.all(np.isfinite(tol)) and not vac.any()


def test_simulated_float16_kernel_counts_its_overflow() -> None:
    # one score of 300 · 300 · 1 = 90000 > 65504: the simulated fp16 kernel's scores
    # overflow (inf − inf = NaN in its softmax) on that row only
    q = np.array([[[300.0], [1.0]]])
    k = np.array([[[300.0], [1.0]]])
    v = np.array([[[1.0], [2.0]]])
    run = plain_in_dtype(AttentionCall(q, k, v, scale=1.0), np.float16)
    assert run.n_overflow == 1 and run.overflow_index == (0, 0, 0)
    # row 1: scores (300, 1): weights (1, e^-299) round to (1, 0) in fp16, output v_0 = 1
    assert run.out[0, 1, 0] == 1.0


def test_fit_ratio_matches_nan_with_nan() -> None:
    a = np.array([1.0, np.nan, 3.0])
    assert fit_ratio(a, np.array([1.0, np.nan, 3.5]), np.ones(3), 1.0) == pytest.approx(0.5)
    assert fit_ratio(a, np.array([1.0, 2.0, 3.0]), np.ones(3), 1.0) == np.inf


def test_unmasked_bound_runs_in_chunks_of_2_17_scores_with_the_same_values() -> None:
    """Issue 29: without a mask the model's chunks hold twice the rows (2^17 scores) where
    the rows of a 2^16 chunk are a multiple of 32; the tolerances are bit-identical to
    those of 2^16 chunks (each chunk's bound recomputed here at 2^16 scores)."""
    from mha_symbolic.testing.forward import plain as plain_mod
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, n, 16)) for n in (600, 512, 512))
    pl = Plain(AttentionCall(q, k, v))
    model = error_model("bfloat16").with_events(*pl.events())
    rows = [ch.rows for ch, _, _ in pl._bound_chunks(model)]
    assert [r.stop - r.start for r in rows] == [256, 256, 88]      # 2^17 / 512 rows each
    tol, vac = pl.bound(model)
    ref = np.zeros((600, 16))
    for ch in pl.chunks(plain_mod.BOUND_CHUNK_SCORES):       # 128 rows each
        assert ch.rows.stop - ch.rows.start <= 128
        ref[ch.rows] = pl._bound_chunk(ch.restricted(), model)[0]
    assert np.array_equal(tol.reshape(600, 16), ref) and not vac.any()
    causal = Plain(AttentionCall(q, k, v, is_causal=True))
    assert {ch.rows.stop - ch.rows.start for ch, _, _ in causal._bound_chunks(model)} <= {128, 88}
    odd = Plain(AttentionCall(q, k[..., :500, :], v[..., :500, :]))   # 131 rows: unchanged
    assert odd._bound_chunk_scores() == plain_mod.BOUND_CHUNK_SCORES
