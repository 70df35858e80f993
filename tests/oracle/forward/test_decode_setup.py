"""Issue 29 item 5: decode set-up.  Short rows of the query heads of one GQA group go
through tier 1 as one block (per-head set-up shared), keys and values are widened to
float64 one head at a time, and finiteness is checked without a float64 copy.  The
results are checked against the independent Fraction/Arb reference and against the
same call one head at a time."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic import reference_attention
from mha_symbolic.errors import InputValueError
from tests.kernels.oracle_reference import check_against_reference


def test_decode_gqa_groups_agree_with_the_independent_reference() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 8, 1, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 300, 16)).astype(np.float32) for _ in range(2))
    enc = reference_attention(q, k, v, enable_gqa=True, return_weights=True)
    kk, vv = np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1)
    check_against_reference(enc, q.astype(np.float64), kk.astype(np.float64),
                            vv.astype(np.float64), np.ones((2, 8, 1, 300), bool), None, None,
                            formats=("float64", "float32", "bfloat16"))


@pytest.mark.parametrize("L", [1, 3])
def test_grouped_heads_round_as_each_head_alone(L: int) -> None:
    rng = np.random.default_rng(L)
    q = rng.standard_normal((1, 8, L, 32)).astype(ml_dtypes.bfloat16)
    k, v = (rng.standard_normal((1, 2, 2000, 32)).astype(ml_dtypes.bfloat16) for _ in range(2))
    mask = rng.random((L, 2000)) < 0.3                # a bool mask: blocks of the group
    mask[:, 1500:] = False                            # and a range of keys nobody sees
    enc = reference_attention(q, k, v, enable_gqa=True, attn_mask=mask, return_weights=True)
    for h in range(8):
        one = reference_attention(q[:, h:h + 1], k[:, h // 4:h // 4 + 1],
                                  v[:, h // 4:h // 4 + 1], attn_mask=mask, return_weights=True)
        for dt in ("float64", "float32"):
            assert np.array_equal(enc.rounded(dt)[:, h:h + 1], one.rounded(dt))
            assert np.array_equal(enc.weights.rounded(dt)[:, h:h + 1], one.weights.rounded(dt))
        assert np.all(enc.lower[:, h:h + 1] <= one.upper)
        assert np.all(one.lower <= enc.upper[:, h:h + 1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_input_is_still_named_by_its_index(dtype: object, bad: float) -> None:
    q = np.ones((1, 2, 3, 4), dtype=dtype)
    k = np.ones((1, 2, 5, 4), dtype=dtype)
    k[0, 1, 3, 2] = bad
    with pytest.raises(InputValueError, match=r"key\[0, 1, 3, 2\]"):
        reference_attention(q, k, k)


def test_float64_values_whose_sum_overflows_are_finite() -> None:
    k = np.full((1, 4, 2), 1.5e308)
    enc = reference_attention(np.zeros((1, 1, 2)), k, np.ones((1, 4, 2)))
    assert np.array_equal(enc.rounded("float64"), np.ones((1, 1, 2)))


def test_float32_values_whose_float32_sum_overflows_are_finite() -> None:
    # float32 inputs are checked by a float32 sum: its overflow must not refuse them
    k = np.full((1, 6, 2), 3e38, dtype=np.float32)
    k[0, 3] = np.float32(3.3e38)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.add.reduce(k, axis=None))
    enc = reference_attention(np.zeros((1, 1, 2), np.float32), k, np.ones((1, 6, 2), np.float32))
    assert np.array_equal(enc.rounded("float64"), np.ones((1, 1, 2)))
    k[0, 4, 1] = np.inf
    with pytest.raises(InputValueError, match=r"key\[0, 4, 1\]"):
        reference_attention(np.zeros((1, 1, 2), np.float32), k, k)


@pytest.mark.parametrize("qs,ks,rep", [((2, 8, 1, 4), (2, 2, 5, 4), 4), ((3, 4, 1, 4), (1, 4, 5, 4), 1),
                                       ((2, 3, 6, 1, 4), (1, 3, 2, 5, 4), 3), ((1, 4), (5, 4), 1)])
def test_stack_head_ids_and_queries_agree_with_its_index(qs: tuple[int, ...],
                                                         ks: tuple[int, ...], rep: int) -> None:
    # the decode groups' bookkeeping (Stack.kv_ids, Stack.queries) against Stack.index
    from mha_symbolic.oracle.forward.attention import Stack
    rng = np.random.default_rng(len(qs))
    q, k = rng.standard_normal(qs), rng.standard_normal(ks)
    kb = (*ks[:-3], ks[-3] * rep) if rep > 1 else ks[:-2]
    batch = tuple(np.broadcast_shapes(qs[:-2], kb))
    for qq in (q, np.broadcast_to(q, (*batch, *qs[-2:])).copy()[..., ::-1, :]):
        st = Stack(qq, k, k, batch, rep)
        B = int(np.prod(batch))
        kidx = [st.index(c)[1] for c in range(B)]
        ids = st.kv_ids()
        assert [[ids[a] == ids[b] for b in range(B)] for a in range(B)] == \
            [[kidx[a] == kidx[b] for b in range(B)] for a in range(B)]
        for c in range(B):
            for n in range(1, B - c + 1):
                want = np.concatenate([st.q[st.index(g)[0]] for g in range(c, c + n)])
                assert np.array_equal(st.queries(c, n), want)
