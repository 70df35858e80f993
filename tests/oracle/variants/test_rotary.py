"""Rotary embeddings (issue 24, item 3): the certified reference against an independent
mpmath loop (tests/kernels/rotary_reference.py), exact ties, hostile input, the doors."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from rotary_reference import rotary_attention, rounded

import mha_symbolic as ms
from mha_symbolic.errors import InputValueError, MhaSymbolicError, ShapeError, SpecError

RNG = np.random.default_rng(2024)


def _qkv(L: int, S: int, E: int, dtype: type = np.float32, B: int = 1, H: int = 1):
    q = RNG.standard_normal((B, H, L, E)).astype(dtype)
    k = RNG.standard_normal((B, H, S, E)).astype(dtype)
    v = RNG.standard_normal((B, H, S, E)).astype(dtype)
    return q, k, v


CASES = [
    # (L, S, E, keywords of reference_attention, keywords of the mpmath loop)
    (3, 6, 8, {"rotary_base": 10000.0}, {"base": 10000.0}),
    (3, 6, 8, {"rotary_base": 10000.0, "rotary_interleaved": True},
     {"base": 10000.0, "interleaved": True}),
    (2, 7, 8, {"rotary_base": 500.0, "rotary_dim": 4}, {"base": 500.0, "rotary_dim": 4}),
    (2, 5, 6, {"rotary_base": 10000.0, "rotary_dim": 4, "rotary_interleaved": True,
               "rotary_position_scale": 4.0},
     {"base": 10000.0, "rotary_dim": 4, "interleaved": True, "scale_pos": 4.0}),
    (1, 9, 4, {"rotary_base": 10.0}, {"base": 10.0}),       # decode: one query at 8
    (4, 4, 4, {"rotary_base": 2.5}, {"base": 2.5}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("L,S,E,kw,ref_kw", CASES)
def test_rotary_base_rounds_as_an_independent_mpmath_loop(L, S, E, kw, ref_kw, dtype):
    q, k, v = _qkv(L, S, E, np.float32 if dtype == "float32" else np.float64)
    got = ms.reference_attention(q, k, v, **kw).rounded(dtype)[0, 0]
    want = rounded(rotary_attention(q[0, 0], k[0, 0], v[0, 0], **ref_kw), dtype)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_tables_are_taken_as_exact_values(interleaved):
    # tables of exact dyadic fractions (3/5-like values rounded to float32), rotary_dim
    # 4 of E = 6: the loop reads the same numbers
    L, S, E = 3, 7, 6
    q, k, v = _qkv(L, S, E)
    ang = RNG.uniform(0, 2 * np.pi, (S, 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    for dtype in ("float32", "float64"):
        got = ms.reference_attention(q, k, v, rotary_cos=cos, rotary_sin=sin,
                                     rotary_interleaved=interleaved).rounded(dtype)[0, 0]
        want = rounded(rotary_attention(q[0, 0], k[0, 0], v[0, 0], cos=cos, sin=sin,
                                        interleaved=interleaved), dtype)
        assert np.array_equal(got, want)


def test_rotary_tables_are_used_as_given_even_when_not_a_rotation():
    # cos = 3/4, sin = 1/2 at every position (c² + s² = 13/16): the semantics take these
    # numbers, so the score of a pair with itself at equal positions is (13/16)·q·k —
    # checked against exact fractions by hand: softmax of two keys, one row
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[1.0, 0.0], [0.0, 0.0]]]])
    v = np.array([[[[1.0], [0.0]]]])
    cos, sin = np.full((2, 1), 0.75), np.full((2, 1), 0.5)
    got = ms.reference_attention(q, k, v, rotary_cos=cos, rotary_sin=sin).rounded("float64")
    # q' = (3/4, 1/2), k'_0 = (3/4, 1/2), k'_1 = 0: scores (13/16)/sqrt(2) and 0
    import mpmath as mp

    with mp.workprec(300):
        s0 = mp.mpf(13) / 16 / mp.sqrt(2)
        want = float(mp.exp(s0) / (mp.exp(s0) + 1))
    assert got[0, 0, 0, 0] == want
    plain = ms.reference_attention(q, k, v).rounded("float64")
    assert got[0, 0, 0, 0] != plain[0, 0, 0, 0]


def test_rotary_with_kv_cache_rotates_queries_at_cache_seqlens_minus_L():
    L, S, E = 2, 8, 4
    q, k, v = _qkv(L, S, E, B=2)
    n = np.array([5, 8])
    got = ms.reference_attention(q, k, v, rotary_base=100.0, cache_seqlens=n,
                                 is_causal=True, causal_alignment="bottom_right"
                                 ).rounded("float32")
    for b in range(2):
        keep = [[j < n[b] and j <= i + n[b] - L for j in range(S)] for i in range(L)]
        want = rounded(rotary_attention(q[b, 0], k[b, 0], v[b, 0], base=100.0,
                                        q_offset=int(n[b]) - L, keep=keep), "float32")
        assert np.array_equal(got[b, 0], want)


def test_rotary_gqa_and_heads_share_positions():
    q = RNG.standard_normal((1, 4, 2, 4)).astype(np.float32)
    k = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    got = ms.reference_attention(q, k, v, enable_gqa=True, rotary_base=1000.0).rounded("float32")
    for h in range(4):
        want = rounded(rotary_attention(q[0, h], k[0, h // 2], v[0, h // 2], base=1000.0),
                       "float32")
        assert np.array_equal(got[0, h], want)


@pytest.mark.parametrize("mode", ["base", "tables"])
def test_rotary_exact_tie_constant_values_give_the_value_exactly(mode):
    q, k, _ = _qkv(2, 6, 8, np.float64, B=2, H=2)
    v = np.full((2, 2, 6, 8), 0.1)
    ang = RNG.uniform(0, 6, (6, 4))
    kw = ({"rotary_base": 10000.0} if mode == "base"
          else {"rotary_cos": np.cos(ang), "rotary_sin": np.sin(ang)})
    out = ms.reference_attention(q, k, v, **kw)
    assert np.all(out.rounded("float64") == 0.1)
    assert np.all(out.rounded("float32") == np.float32(0.1))


def test_rotary_changes_the_answer_and_rotary_dim_zero_part_does_not_rotate():
    q, k, v = _qkv(3, 6, 8)
    plain = ms.reference_attention(q, k, v).rounded("float32")
    assert not np.array_equal(plain, ms.reference_attention(q, k, v, rotary_base=10.0)
                              .rounded("float32"))
    # keys and queries whose first 4 dims are 0: rotary_dim=4 changes nothing
    q2, k2 = q.copy(), k.copy()
    q2[..., :4] = 0
    k2[..., :4] = 0
    assert np.array_equal(ms.reference_attention(q2, k2, v).rounded("float64"),
                          ms.reference_attention(q2, k2, v, rotary_base=10.0, rotary_dim=4)
                          .rounded("float64"))


def test_rotary_weights_are_enclosed():
    q, k, v = _qkv(2, 5, 4)
    out = ms.reference_attention(q, k, v, rotary_base=10000.0, return_weights=True)
    w = out.weights.rounded("float64")[0, 0]
    assert np.allclose(w.sum(axis=-1), 1.0, atol=1e-15)


BAD = [
    ({"rotary_base": -1.0}, InputValueError, "rotary_base"),
    ({"rotary_base": 0.0}, InputValueError, "rotary_base"),
    ({"rotary_base": 1e300}, InputValueError, "rotary_base"),
    ({"rotary_base": float("nan")}, InputValueError, "rotary_base"),
    ({"rotary_base": "1e4"}, SpecError, "rotary_base"),
    ({"rotary_base": 10.0, "rotary_position_scale": 0.0}, InputValueError,
     "rotary_position_scale"),
    ({"rotary_base": 10.0, "rotary_position_scale": float("inf")}, InputValueError,
     "rotary_position_scale"),
    ({"rotary_base": 10.0, "rotary_position_scale": 1e30}, InputValueError,
     "rotary_position_scale"),
    ({"rotary_base": 10.0, "rotary_dim": 3}, InputValueError, "rotary_dim"),
    ({"rotary_base": 10.0, "rotary_dim": 0}, InputValueError, "rotary_dim"),
    ({"rotary_base": 10.0, "rotary_dim": 10}, ShapeError, "rotary_dim"),
    ({"rotary_base": 10.0, "rotary_dim": 2.0}, SpecError, "rotary_dim"),
    ({"rotary_base": 10.0, "rotary_interleaved": 1}, SpecError, "rotary_interleaved"),
    ({"rotary_dim": 4}, SpecError, "rotary_dim"),
    ({"rotary_cos": np.ones((6, 4))}, SpecError, "rotary_sin"),
    ({"rotary_cos": np.ones((6, 4)), "rotary_sin": np.ones((6, 3))}, ShapeError,
     "rotary_sin.shape"),
    ({"rotary_cos": np.ones(4), "rotary_sin": np.ones(4)}, ShapeError, "rotary_cos.shape"),
    ({"rotary_cos": np.ones((3, 4)), "rotary_sin": np.ones((3, 4))}, ShapeError,
     "rotary_cos.shape"),
    ({"rotary_cos": np.ones((6, 5)), "rotary_sin": np.ones((6, 5))}, ShapeError, "rotary_dim"),
    ({"rotary_cos": np.ones((6, 2)), "rotary_sin": np.ones((6, 2)), "rotary_dim": 8},
     ShapeError, "rotary_dim"),
    ({"rotary_cos": np.full((6, 4), np.nan), "rotary_sin": np.ones((6, 4))},
     InputValueError, "rotary_cos"),
    ({"rotary_cos": np.ones((6, 4)), "rotary_sin": np.full((6, 4), np.inf)},
     InputValueError, "rotary_sin"),
    ({"rotary_cos": np.ones((6, 4)), "rotary_sin": np.ones((6, 4)), "rotary_base": 10.0},
     SpecError, "rotary_base"),
    ({"rotary_cos": np.ones((6, 4)), "rotary_sin": np.ones((6, 4)),
      "rotary_position_scale": 2.0}, SpecError, "rotary_position_scale"),
    ({"rotary_cos": np.ones((6, 4), dtype=bool), "rotary_sin": np.ones((6, 4))}, SpecError,
     "rotary_cos"),
]


@pytest.mark.parametrize("kw,err,name", BAD)
def test_rotary_hostile_input_is_one_clear_error_naming_the_argument(kw, err, name):
    q, k, v = _qkv(2, 6, 8)
    with pytest.raises(err) as info:
        ms.reference_attention(q, k, v, **kw)
    assert name in str(info.value)
    assert isinstance(info.value, MhaSymbolicError)


def test_rotary_refuses_more_queries_than_positions():
    # (with cache_leftpad rotary reads cache indices: tests/oracle/variants/test_kvcache.py)
    q, k, v = _qkv(5, 3, 4)
    with pytest.raises(InputValueError, match="negative"):
        ms.reference_attention(q, k, v, rotary_base=10.0)


def test_rotary_interleaved_alone_is_no_rotary_as_flashattention():
    q, k, v = _qkv(2, 4, 4)
    assert np.array_equal(ms.reference_attention(q, k, v).rounded("float64"),
                          ms.reference_attention(q, k, v, rotary_interleaved=True)
                          .rounded("float64"))


@pytest.mark.parametrize("door", ["reference_attention", "compare_attention",
                                  "assert_attention_close", "check_attention"])
def test_rotary_keywords_reach_every_door(door):
    params = inspect.signature(getattr(ms, door)).parameters
    for kw in ("rotary_cos", "rotary_sin", "rotary_interleaved", "rotary_dim", "rotary_base",
               "rotary_position_scale"):
        assert kw in params, (door, kw)
