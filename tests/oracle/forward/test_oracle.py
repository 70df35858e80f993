"""Tests of the certified attention oracle (mha_symbolic.oracle, mha_symbolic.oracle.arith.formats).

Every expected value comes from an independent method written here:
exact rationals (fractions.Fraction) for the scores, per-element Arb balls at
512+ bits for exp and the sums (no arb_mat, no oracle code), and a separate
round-to-format routine that searches the neighbouring bit patterns of a
candidate and compares exact distances.  The symbolic engine (SymPy) gives a
third opinion on small cases.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mha_symbolic.errors import InputValueError, ShapeError, SpecError
from mha_symbolic.oracle import reference_attention, reference_mha
from mha_symbolic.oracle.arith import formats as fpf

flint = pytest.importorskip("flint")
arb = flint.arb

from oracle_reference import (  # noqa: E402
    DTYPES,
    _finfo,
    ball_fractions,
    ball_inside,
    check_against_reference,
    ref_round,
    ref_row,
)

# ---------------------------------------------------------------------------
# Hypothesis: random shapes, dtypes, masks, alignments, GQA, adversarial values
# ---------------------------------------------------------------------------

@st.composite
def values(draw: Any, shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    n = int(np.prod(shape))
    tiny = float(_finfo(dtype).smallest_subnormal)
    kind = draw(st.sampled_from(["normal", "normal", "small_ints", "subnormal", "huge",
                                 "repeat"]))
    if kind == "normal":
        vals = draw(st.lists(st.floats(-4, 4, width=32), min_size=n, max_size=n))
    elif kind == "small_ints":
        vals = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    elif kind == "subnormal":
        vals = [tiny * m for m in draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n))]
    elif kind == "huge":
        big = 3.0e4 if dtype == "float16" else 1.0e4
        vals = [big * x for x in draw(st.lists(st.floats(-1, 1, width=16), min_size=n,
                                               max_size=n))]
    else:  # one value repeated: equal scores, exact ties, cancellation
        x = draw(st.floats(-4, 4, width=16))
        signs = draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=n, max_size=n))
        vals = [x * s for s in signs]
    arr = np.array(vals, dtype=np.float64).reshape(shape)
    return arr.astype(DTYPES[dtype])


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    dtype = draw(st.sampled_from(list(DTYPES)))
    B = draw(st.integers(1, 2))
    hkv = draw(st.integers(1, 2))
    gqa = draw(st.booleans())
    hq = hkv * draw(st.integers(1, 2)) if gqa else hkv
    L = draw(st.integers(1, 3))
    S = draw(st.integers(1, 4))
    E = draw(st.integers(1, 4))
    Ev = draw(st.integers(1, 3))
    q = draw(values((B, hq, L, E), dtype))
    k = draw(values((B, hkv, S, E), dtype))
    v = draw(values((B, hkv, S, Ev), dtype))
    mask_kind = draw(st.sampled_from(["none", "bool", "float"]))
    mask = None
    if mask_kind == "bool":
        mask = np.array(draw(st.lists(st.booleans(), min_size=L * S, max_size=L * S))
                        ).reshape(L, S)
    elif mask_kind == "float":
        pool = st.sampled_from([0.0, -1.0, 0.5, -math.inf, 3.25, -1e4])
        mask = np.array(draw(st.lists(pool, min_size=L * S, max_size=L * S))).reshape(L, S)
    scale = draw(st.sampled_from([None, None, 0.0, 0.125, 1.0, 300.0, -0.5]))
    return {"q": q, "k": k, "v": v, "mask": mask, "is_causal": draw(st.booleans()),
            "align": draw(st.sampled_from(["top_left", "bottom_right"])), "scale": scale,
            "gqa": gqa}


def _keep_and_madd(case: dict[str, Any], L: int, S: int, batch: tuple[int, ...]) -> Any:
    keep = np.ones((*batch, L, S), dtype=bool)
    madd = None
    m = case["mask"]
    if m is not None:
        if m.dtype == bool:
            keep &= m
        else:
            keep &= m != -np.inf
            madd = np.broadcast_to(np.where(m == -np.inf, 0.0, m), (*batch, L, S))
    if case["is_causal"]:
        i = np.arange(L)[:, None]
        j = np.arange(S)[None, :]
        keep &= (j <= i) if case["align"] == "top_left" else (j <= i + S - L)
    return keep, madd


# Found by hypothesis (i13's run): row q = -1 has scores (-3e6, -1.5e6, 0, 0); the
# two keys at 0 hold v = t, the bf16 midpoint 1 + 2**-8, so their terms cancel in
# sign(y - t) and only terms below e**-1e6 are left, of opposite signs.  The
# reference must let the larger, e**-1.5e6·(0 - t), decide (y rounds down to 1).
_TIE_BELOW_TINY = 1 + 2.0**-8


@settings(max_examples=int(os.environ.get("ORACLE_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example({"q": np.array([[[[0.0]], [[-1.0]]]], dtype=np.float32),
          "k": np.array([[[[1e4], [5e3], [0.0], [0.0]]]], dtype=np.float32),
          "v": np.array([[[[2.0], [0.0], [_TIE_BELOW_TINY], [_TIE_BELOW_TINY]]]],
                        dtype=np.float32),
          "mask": None, "is_causal": False, "align": "top_left", "scale": 300.0,
          "gqa": True})
def test_enclosure_contains_truth_and_rounding_is_correct(case: dict[str, Any]) -> None:
    q, k, v = case["q"], case["k"], case["v"]
    res = reference_attention(q, k, v, attn_mask=case["mask"], is_causal=case["is_causal"],
                              causal_alignment=case["align"], scale=case["scale"],
                              enable_gqa=case["gqa"], return_weights=True)
    rep = q.shape[1] // k.shape[1]
    k64 = np.repeat(k.astype(np.float64), rep, axis=1)  # repeat_interleave, written here
    v64 = np.repeat(v.astype(np.float64), rep, axis=1)
    L, S = q.shape[-2], k.shape[-2]
    keep, madd = _keep_and_madd(case, L, S, q.shape[:2])
    assert res.shape == (*q.shape[:-1], v.shape[-1])
    empty = ~keep.any(axis=-1)
    assert np.all(res.lower[empty] == 0) and np.all(res.upper[empty] == 0)
    assert np.all(res.rounded("float32")[empty] == 0)
    check_against_reference(res, q.astype(np.float64), k64, v64, keep, madd, case["scale"])


# ---------------------------------------------------------------------------
# Adversarial cases written out
# ---------------------------------------------------------------------------

def test_exact_ties_are_decided_exactly_ties_to_even() -> None:
    # scale=0: uniform weights, the output is the mean of the values exactly.
    v = np.array([[1.0, 1 + 2.0**-10], [1 + 2.0**-10, 1 + 2.0**-9]]).T  # S=2, Ev=2
    q = np.ones((1, 3))
    k = np.ones((2, 3))
    res = reference_attention(q, k, v, scale=0.0)
    # means 1 + 2**-11 (tie between 1 and 1+2**-10 in fp16: even is 1) and
    # 1 + 3·2**-11 (tie between 1+2**-10 and 1+2**-9: even is 1+2**-9)
    assert res.rounded("float16").tolist() == [[1.0, 1 + 2.0**-9]]
    assert res.rounded("float32").tolist() == [[1 + 2.0**-11, 1 + 3 * 2.0**-11]]
    assert res.exact((0, 0)) == Fraction(1) + Fraction(1, 2**11)


def test_tie_with_irrational_scale_and_equal_scores_is_exact() -> None:
    # identical keys -> equal scores (1/sqrt(3) irrational) -> exact mean
    q = np.array([[0.5, -1.0, 2.0]])
    k = np.array([[1.0, 2.0, 3.0]] * 4)
    v = np.array([[1.0], [1.0], [1 + 2.0**-9], [1 + 2.0**-9]])  # mean 1 + 2**-10
    res = reference_attention(q, k, v)
    assert res.rounded("bfloat16").astype(np.float64).tolist() == [[1.0]]  # tie -> even
    assert res.rounded("float16").tolist() == [[1 + 2.0**-10]]
    assert res.weights is None


def test_value_within_e_minus_10000_of_a_tie_is_decided() -> None:
    # y = (v0 - e^-10000 v0)/(1 + e^-10000) with v0 = 299/512 exactly halfway between two
    # bfloat16 values: y lies e^-10000 (~2**-14427) below the tie, so it rounds down,
    # and a sentinel of -1e9 (gap e^-1e9, beyond any precision) is decided the same way.
    v0 = 299 / 512
    q = np.zeros((1, 2))
    k = np.zeros((2, 2))
    v = np.array([[v0], [-v0]])
    for gap in (-1e4, -1e9):
        res = reference_attention(q, k, v, attn_mask=np.array([[0.0, gap]]))
        assert res.rounded("bfloat16").astype(np.float64).tolist() == [[298 / 512]]
        assert res.rounded("float32").tolist() == [[v0]]  # representable: no tie
    res = reference_attention(q, k, np.array([[v0], [1.0]]), attn_mask=np.array([[0.0, -1e9]]))
    assert res.rounded("bfloat16").astype(np.float64).tolist() == [[300 / 512]]  # just above


@pytest.mark.parametrize("v01, expect", [((2.0, 0.0), 1.0), ((0.0, 2.0), 1 + 2.0**-7)])
def test_cancelled_top_group_leaves_the_largest_tiny_term_to_decide(
        v01: tuple[float, float], expect: float) -> None:
    # scores (-3e6, -1.5e6, 0, 0); the keys at 0 hold t = 1 + 2**-8, the bfloat16
    # midpoint of 1 and 1 + 2**-7, so y - t = (e**-3e6 (v0 - t) + e**-1.5e6 (v1 - t))/D:
    # its sign is that of v1 - t (the e**-1.5e6 term), whatever v0 - t is.
    t = 1 + 2.0**-8
    q = np.array([[-1.0]], dtype=np.float32)
    k = np.array([[1e4], [5e3], [0.0], [0.0]], dtype=np.float32)
    v = np.array([[v01[0]], [v01[1]], [t], [t]], dtype=np.float32)
    res = reference_attention(q, k, v, scale=300.0)
    assert res.rounded("bfloat16").astype(np.float64).tolist() == [[expect]]
    for fmt in ("float16", "float32", "float64"):  # t representable: within e**-1.5e6 of it
        assert res.rounded(fmt).astype(np.float64).tolist() == [[t]]


def test_one_hot_row_is_the_value_exactly() -> None:
    q = np.array([[1.0, 2.0], [3.0, -1.0]], dtype=np.float32)
    k = np.array([[0.5, 0.25], [1.0, 1.0], [2.0, -3.0]], dtype=np.float32)
    v = np.array([[1 / 3, 7.0], [2.0**-20, -5.5], [1e3, 0.1]], dtype=np.float32)
    mask = np.array([[False, True, False], [False, False, True]])
    res = reference_attention(q, k, v, attn_mask=mask, return_weights=True)
    np.testing.assert_array_equal(res.rounded("float32"), v[[1, 2]])
    assert res.exact((0, 0)) == Fraction(float(v[1, 0]))
    assert res.weights is not None
    assert res.weights.rounded("float64").tolist() == [[0, 1, 0], [0, 0, 1]]


def test_cancellation_to_exact_zero() -> None:
    q = np.zeros((1, 2))
    k = np.array([[1.0, 2.0], [3.0, 4.0]])
    v = np.array([[1e300], [-1e300]])
    res = reference_attention(q, k, v)  # scores 0: weights 1/2, 1/2
    assert res.rounded("float64").tolist() == [[0.0]]
    assert res.lower[0, 0] <= 0 <= res.upper[0, 0]


def test_huge_score_gaps_do_not_overflow() -> None:
    q = np.array([[1.0]])
    k = np.array([[0.0], [1.0], [-1.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    for sc in (1e4, 1e6, 1e300):
        res = reference_attention(q, k, v, scale=sc, return_weights=True)
        assert np.all(np.isfinite(res.lower)) and np.all(np.isfinite(res.upper))
        # weight of key 1 is 1/(1 + e^-sc + e^-2sc): rounds to 1 in every format
        assert res.rounded("float64").tolist() == [[2.0]]
        assert res.lower[0, 0] <= 2.0 <= res.upper[0, 0]
        assert res.upper[0, 0] < 2.0 or res.lower[0, 0] < 2.0  # true value is below 2
        assert res.weights is not None
        assert res.weights.rounded("float32").tolist() == [[0.0, 1.0, 0.0]]
    # e^-1e4 is far below the float64 range but the enclosure is still honest
    res = reference_attention(q, k, np.array([[0.0], [0.0], [1.0]]), scale=1e4)
    assert res.rounded("float64").tolist() == [[0.0]]
    assert res.lower[0, 0] == 0.0 or res.lower[0, 0] < 1e-300


def test_subnormal_results() -> None:
    tiny = 5e-324
    q = np.array([[1.0]])
    k = np.array([[1.0], [0.0]])
    v = np.array([[tiny * 3], [tiny]])
    res = reference_attention(q, k, v, scale=1.0)
    # y = (3e·t + t)/(e + 1) with t = 2**-1074: between 2t and 3t, nearest 3t? compute:
    y = (3 * math.e + 1) / (math.e + 1)  # 2.46 -> rounds to 2 units
    assert res.rounded("float64").tolist() == [[tiny * round(y)]]
    assert res.rounded("float32").tolist() == [[0.0]]


def test_float_mask_minus_inf_gives_weight_exactly_zero() -> None:
    q = np.ones((2, 2))
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[1.0], [2.0], [4.0]])
    m = np.array([[0.0, -np.inf, 0.5], [-np.inf, -np.inf, 0.0]])
    res = reference_attention(q, k, v, attn_mask=m, return_weights=True)
    assert res.weights is not None
    w = res.weights
    assert w.lower[0, 1] == 0.0 and w.upper[0, 1] == 0.0
    assert w.exact((1, 2)) == Fraction(1)
    assert res.rounded("float64")[1, 0] == 4.0


@pytest.mark.parametrize("policy", ["zero", "nan", "error"])
def test_fully_masked_rows_follow_the_policy(policy: str) -> None:
    q = np.ones((1, 2, 3, 2))
    k = np.ones((1, 2, 2, 2))
    v = np.ones((1, 2, 2, 1))
    mask = np.array([[True, True], [False, False], [True, False]])
    if policy == "error":
        with pytest.raises(InputValueError, match=r"row \(0, 0, 1\).*masked_rows='error'"):
            reference_attention(q, k, v, attn_mask=mask, masked_rows=policy)
        return
    res = reference_attention(q, k, v, attn_mask=mask, masked_rows=policy, return_weights=True)
    r = res.rounded("float16").astype(np.float64)
    if policy == "zero":
        assert r[0, :, 1, 0].tolist() == [0.0, 0.0]
        assert res.exact((0, 0, 1, 0)) == 0
        assert res.lower[0, 0, 1, 0] == res.upper[0, 0, 1, 0] == 0
    else:
        assert np.isnan(r[0, :, 1, 0]).all() and np.isnan(res.lower[0, 0, 1, 0])
        assert res.weights is not None and np.isnan(res.weights.upper[0, 1, 1]).all()
    assert r[0, :, 0, 0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize(("L", "S"), [(2, 4), (4, 2), (1, 1), (3, 3), (1, 5)])
def test_causal_alignment(align: str, L: int, S: int) -> None:
    rng = np.random.default_rng(L * 10 + S)
    q = rng.standard_normal((L, 3))
    k = rng.standard_normal((S, 3))
    v = rng.standard_normal((S, 2))
    res = reference_attention(q, k, v, is_causal=True, causal_alignment=align,
                              return_weights=True)
    assert res.weights is not None
    w = res.weights.rounded("float64")
    for i in range(L):
        last = i if align == "top_left" else i + S - L
        if last < 0:  # no key: masked_rows="zero"
            assert res.rounded("float64")[i].tolist() == [0.0, 0.0]
            continue
        assert np.all(w[i, last + 1:] == 0) and np.all(w[i, : last + 1] > 0)
        assert res.weights.lower[i, last + 1:].tolist() == [0.0] * (S - last - 1)


def test_gqa_uses_repeat_interleave_mapping() -> None:
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 2, 3)).astype(np.float32)
    k = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    v = rng.standard_normal((1, 2, 3, 2)).astype(np.float32)
    res = reference_attention(q, k, v, enable_gqa=True).rounded("float32")
    for g in range(4):
        one = reference_attention(q[:, g], k[:, g // 2], v[:, g // 2]).rounded("float32")
        np.testing.assert_array_equal(res[:, g], one)


def test_nan_and_inf_inputs_are_named() -> None:
    q = np.ones((2, 3))
    k = np.ones((2, 3))
    v = np.ones((2, 1))
    bad = k.copy()
    bad[1, 2] = np.nan
    with pytest.raises(InputValueError, match=r"key\[1, 2\] = nan"):
        reference_attention(q, bad, v)
    badv = v.copy()
    badv[0, 0] = np.inf
    with pytest.raises(InputValueError, match=r"value\[0, 0\] = inf"):
        reference_attention(q, k, badv)
    with pytest.raises(InputValueError, match=r"attn_mask\[0, 1\] = inf"):
        reference_attention(q, k, v, attn_mask=np.array([[0.0, np.inf], [0.0, 0.0]]))
    with pytest.raises(InputValueError, match="scale"):
        reference_attention(q, k, v, scale=float("nan"))


def test_shape_errors_name_both_shapes() -> None:
    q = np.zeros((2, 8, 3, 64))
    k = np.zeros((2, 8, 5, 32))
    with pytest.raises(ShapeError) as err:
        reference_attention(q, k, np.zeros((2, 8, 5, 32)))
    assert str(err.value) == ("key.shape=(2, 8, 5, 32) does not match query.shape=(2, 8, 3, 64):"
                              " E must agree (64 vs 32)")
    with pytest.raises(ShapeError, match="S must agree"):
        reference_attention(q, np.zeros((2, 8, 5, 64)), np.zeros((2, 8, 4, 64)))
    with pytest.raises(ShapeError, match="enable_gqa=True"):
        reference_attention(q, np.zeros((2, 2, 5, 64)), np.zeros((2, 2, 5, 64)))
    with pytest.raises(ShapeError, match=r"multiple of H_kv \(8 vs 3\)"):
        reference_attention(q, np.zeros((2, 3, 5, 64)), np.zeros((2, 3, 5, 64)),
                            enable_gqa=True)
    with pytest.raises(ShapeError, match=r"attn_mask\.shape"):
        reference_attention(q, np.zeros((2, 8, 5, 64)), np.zeros((2, 8, 5, 64)),
                            attn_mask=np.ones((4, 5), dtype=bool))
    with pytest.raises(SpecError, match="masked_rows"):
        reference_attention(q, q, q, masked_rows="ignore")


def test_empty_dimensions_give_empty_results() -> None:
    assert reference_attention(np.zeros((2, 0, 4)), np.zeros((2, 3, 4)),
                               np.zeros((2, 3, 5))).rounded("float32").shape == (2, 0, 5)
    assert reference_attention(np.zeros((0, 2, 4)), np.zeros((0, 3, 4)),
                               np.zeros((0, 3, 5))).lower.shape == (0, 2, 5)
    res = reference_attention(np.zeros((2, 4)), np.zeros((0, 4)), np.zeros((0, 5)))
    assert res.rounded("float64").tolist() == [[0.0] * 5] * 2  # no keys: masked_rows="zero"
    res = reference_attention(np.zeros((2, 4)), np.zeros((3, 4)), np.zeros((3, 0)))
    assert res.shape == (2, 0)
    # E = 0: empty dot products are 0, weights uniform
    res = reference_attention(np.zeros((1, 0)), np.zeros((2, 0)), np.array([[1.0], [2.0]]))
    assert res.rounded("float64").tolist() == [[1.5]]


def test_scale_zero_means_zero_not_default() -> None:
    q = np.array([[1.0, 2.0]])
    k = np.array([[3.0, 0.0], [0.0, 5.0]])
    v = np.array([[1.0], [2.0]])
    assert reference_attention(q, k, v, scale=0.0).rounded("float64").tolist() == [[1.5]]
    assert reference_attention(q, k, v, scale=0).rounded("float64").tolist() == [[1.5]]
    default = reference_attention(q, k, v).rounded("float64")[0, 0]
    assert default != 1.5


def test_inputs_of_every_kind_are_read_exactly() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 3, 4)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((2, 5, 4)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((2, 5, 3)).astype(ml_dtypes.bfloat16)
    want = reference_attention(q, k, v).rounded("float64")
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v))
    np.testing.assert_array_equal(reference_attention(tq, tk, tv).rounded("float64"), want)
    lists = [x.astype(np.float64).tolist() for x in (q, k, v)]
    np.testing.assert_array_equal(reference_attention(*lists).rounded("float64"), want)


def test_agrees_with_torch_sdpa_float64() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(7)
    q, k, v = (torch.from_numpy(rng.standard_normal(s)) for s in
               ((2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 3)))
    mask = torch.from_numpy(rng.random((4, 6)) > 0.3)
    mask[:, 0] = True
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()
    res = reference_attention(q, k, v, attn_mask=mask)
    # torch's float64 result is within a few ulps of the correctly rounded one
    assert np.max(np.abs(got - res.rounded("float64"))) < 1e-14


def test_weights_sum_to_one_exactly_in_the_enclosure() -> None:
    rng = np.random.default_rng(11)
    res = reference_attention(rng.standard_normal((3, 4)), rng.standard_normal((5, 4)),
                              rng.standard_normal((5, 2)), return_weights=True)
    assert res.weights is not None
    assert np.all(res.weights.lower.sum(axis=-1) <= 1 + 1e-15)
    assert np.all(res.weights.upper.sum(axis=-1) >= 1 - 1e-15)
    assert res.weights.shape == (3, 5)
    x = res.weights.exact((0, 0), prec=300)
    assert x.rad() < arb(2) ** -250


def test_rounded_accepts_dtype_spellings() -> None:
    res = reference_attention(np.ones((1, 2)), np.ones((2, 2)), np.array([[1.0], [2.0]]))
    for spelling in (np.float16, "fp16", np.dtype("float16"), "half"):
        assert res.rounded(spelling).dtype == np.float16
    assert res.rounded(ml_dtypes.bfloat16).dtype == DTYPES["bfloat16"]
    assert res.rounded("bf16").dtype == DTYPES["bfloat16"]
    with pytest.raises(SpecError, match="dtype='int8'"):
        res.rounded("int8")


# ---------------------------------------------------------------------------
# Against the symbolic engine (SymPy)
# ---------------------------------------------------------------------------

def test_agrees_with_the_symbolic_engine() -> None:
    from mha_symbolic.exact.engine import exact_attention

    q = np.array([[0.5, -1.25, 2.0], [1.0, 0.0, -0.75]])
    k = np.array([[1.0, 2.0, -0.5], [0.25, 0.125, 3.0], [-1.0, 1.5, 0.0]])
    v = np.array([[1.0, -2.0], [0.5, 4.0], [3.0, 0.0625]])
    fr = [[[Fraction(float(x)) for x in row] for row in m] for m in (q, k, v)]
    att = exact_attention(query=fr[0], key=fr[1], value=fr[2])
    out = att.head_output(0)
    res = reference_attention(q, k, v)
    r64 = res.rounded("float64")
    for i in range(2):
        for j in range(2):
            val = Fraction(str(out[i, j].evalf(60)))
            assert res.lower[i, j] <= val <= res.upper[i, j]
            assert r64[i, j] == ref_round(val, "float64")


def test_mha_agrees_with_the_symbolic_engine() -> None:
    from mha_symbolic.exact.engine import exact_attention

    rng = np.random.default_rng(2)
    L, E, H = 2, 4, 2
    x = np.round(rng.standard_normal((L, E)) * 8) / 8
    wq, wk, wv, wo = (np.round(rng.standard_normal((E, E)) * 4) / 4 for _ in range(4))
    bq, bk, bv, bo = (np.round(rng.standard_normal(E) * 4) / 4 for _ in range(4))

    def F(a: Any) -> Any:
        return [[Fraction(float(t)) for t in row] for row in np.atleast_2d(a)]

    # engine convention y = x W + b (W in x out) = torch's x Wᵀ + b with W transposed
    att = exact_attention(x=F(x), w_q=F(wq.T), w_k=F(wk.T), w_v=F(wv.T), w_o=F(wo.T),
                          b_q=F(bq)[0], b_k=F(bk)[0], b_v=F(bv)[0], b_o=F(bo)[0], heads=H)
    out = att.final()
    res = reference_mha(x, x, x, num_heads=H, in_proj_weight=np.concatenate([wq, wk, wv]),
                        in_proj_bias=np.concatenate([bq, bk, bv]), out_proj_weight=wo,
                        out_proj_bias=bo)
    r32 = res.rounded("float32")
    for i in range(L):
        for j in range(E):
            val = Fraction(str(out[i, j].evalf(60)))
            assert res.lower[i, j] <= val <= res.upper[i, j]
            assert r32[i, j] == ref_round(val, "float32")


# ---------------------------------------------------------------------------
# reference_mha against torch.nn.MultiheadAttention
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_module_end_to_end(batch_first: bool) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first, dtype=torch.float64)
    x = torch.randn(2, 3, 8, dtype=torch.float64)  # (N, L, E) or (L, N, E)
    N = 2 if batch_first else 3
    S = 3 if batch_first else 2
    kpm = torch.zeros(N, S, dtype=torch.bool)
    kpm[0, -1] = True  # True = ignore, as torch
    out, _ = m(x, x, x, key_padding_mask=kpm)
    res = reference_mha(x, x, x, module=m, key_padding_mask=kpm)
    assert res.shape == tuple(out.shape)
    o = out.detach().numpy()
    assert np.max(np.abs(res.rounded("float64") - o)) < 1e-14
    assert np.all(res.lower <= res.upper)


def test_mha_cross_attention_kdim_vdim_and_masks() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    m = torch.nn.MultiheadAttention(8, 4, kdim=5, vdim=3, dtype=torch.float64)
    q = torch.randn(4, 2, 8, dtype=torch.float64)
    k = torch.randn(6, 2, 5, dtype=torch.float64)
    v = torch.randn(6, 2, 3, dtype=torch.float64)
    am = torch.rand(4, 6) > 0.3  # True = masked out
    am[:, 1] = False
    out, _ = m(q, k, v, attn_mask=am)
    res = reference_mha(q, k, v, module=m, attn_mask=am)
    assert np.max(np.abs(res.rounded("float64") - out.detach().numpy())) < 1e-14


def test_mha_gqa_matches_repeated_heads() -> None:
    rng = np.random.default_rng(4)
    E, H, Hkv, L = 8, 4, 2, 3
    hd = E // H
    x = rng.standard_normal((L, 1, E)).astype(np.float32)
    wq = rng.standard_normal((E, E)).astype(np.float32)
    wk = rng.standard_normal((Hkv * hd, E)).astype(np.float32)
    wv = rng.standard_normal((Hkv * hd, E)).astype(np.float32)
    wo = rng.standard_normal((E, E)).astype(np.float32)
    got = reference_mha(x, x, x, num_heads=H, num_kv_heads=Hkv, q_proj_weight=wq,
                        k_proj_weight=wk, v_proj_weight=wv, out_proj_weight=wo)
    # repeat_interleave the kv heads' weight rows -> ordinary MHA
    wk_full = wk.reshape(Hkv, hd, E).repeat(H // Hkv, axis=0).reshape(E, E)
    wv_full = wv.reshape(Hkv, hd, E).repeat(H // Hkv, axis=0).reshape(E, E)
    want = reference_mha(x, x, x, num_heads=H, q_proj_weight=wq, k_proj_weight=wk_full,
                         v_proj_weight=wv_full, out_proj_weight=wo)
    np.testing.assert_array_equal(got.rounded("float32"), want.rounded("float32"))


def test_mha_errors() -> None:
    x = np.zeros((2, 1, 8))
    w = np.zeros((24, 8))
    with pytest.raises(ShapeError, match="not divisible by num_heads=3"):
        reference_mha(x, x, x, num_heads=3, in_proj_weight=w, out_proj_weight=np.zeros((8, 8)))
    with pytest.raises(ShapeError, match=r"key_padding_mask.shape=\(2,\)"):
        reference_mha(x, x, x, num_heads=2, in_proj_weight=w, out_proj_weight=np.zeros((8, 8)),
                      key_padding_mask=np.zeros(2, dtype=bool))
    with pytest.raises(InputValueError, match="masked_rows='error'"):
        reference_mha(x, x, x, num_heads=2, in_proj_weight=w, out_proj_weight=np.zeros((8, 8)),
                      attn_mask=np.ones((2, 2), dtype=bool), masked_rows="error")


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(DTYPES))
def test_round_float64_to_matches_independent_rounding(name: str) -> None:
    fmt = fpf.get_format(name)
    rng = np.random.default_rng(1)
    p = fmt.p
    # random doubles, exact midpoints between neighbours (ties), and range edges
    base = rng.standard_normal(300) * np.exp2(rng.integers(-30, 30, 300))
    grid = np.array(fpf.round_float64_to(base, fmt))
    grid = grid[np.isfinite(grid)]
    mids = grid + np.ldexp(np.ones_like(grid), np.frexp(grid)[1] - p - 1)  # half quanta
    edges = [fmt.max_finite, fmt.max_finite * (1 + 2.0**-p), fmt.min_subnormal,
             fmt.min_subnormal / 2, fmt.min_subnormal * 1.5, 5e-324, 1e300, -0.0]
    xs = np.concatenate([base, mids, -mids, edges])
    got = fpf.round_float64_to(xs, fmt)
    for x, g in zip(xs.tolist(), got.tolist(), strict=False):
        want = ref_round(Fraction(x), name)
        assert g == want or (g == 0 and want == 0), (x, g, want)
        m, e = fpf.to_dyadic(x)
        assert fpf.round_dyadic(m, e, fmt) == g or g == 0
        assert fpf.round_fraction(Fraction(x), fmt) == g or g == 0


def test_half_gaps() -> None:
    fmt = fpf.get_format("float16")
    below, above = fpf.half_gaps(np.array([1.0, -1.0, 0.0, 65504.0, 2.0**-14]), fmt)
    assert below.tolist() == [2.0**-12, 2.0**-11, 2.0**-25, 16.0, 2.0**-25]
    assert above.tolist() == [2.0**-11, 2.0**-12, 2.0**-25, 16.0, 2.0**-25]


def test_import_is_light() -> None:
    import subprocess
    import sys

    code = ("import sys, numpy as np, mha_symbolic as m; "
            "r = m.reference_attention(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 1))); "
            "r.rounded('float32'); print('torch' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"]


def test_fast_path_bound_holds_on_random_float32_attention() -> None:
    """Larger case: compare the fast-path enclosure with the reference on sampled rows."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal((2, 16, 32)).astype(np.float32)
    k = rng.standard_normal((2, 24, 32)).astype(np.float32)
    v = rng.standard_normal((2, 24, 8)).astype(np.float32)
    res = reference_attention(q, k, v)
    r32 = res.rounded("float32")
    for b, i in np.ndindex(2, 16):
        outs, _ = ref_row(q[b, i].astype(np.float64), k[b].astype(np.float64),
                          v[b].astype(np.float64), np.ones(24, bool), None, None, 512)
        for col, ball in enumerate(outs):
            lo, hi = ball_fractions(ball)
            assert ball_inside(ball, float(res.lower[b, i, col]), float(res.upper[b, i, col]))
            assert r32[b, i, col] == ref_round(lo, "float32") == ref_round(hi, "float32")
    # float64 inputs (products not exact) with a float mask and a large scale
    q64 = rng.standard_normal((12, 16)) * 3
    k64 = rng.standard_normal((20, 16))
    v64 = rng.standard_normal((20, 5)) * np.exp2(rng.integers(-20, 20, (20, 5)))
    mask = np.where(rng.random((12, 20)) < 0.2, -np.inf, rng.standard_normal((12, 20)))
    res = reference_attention(q64, k64, v64, attn_mask=mask, scale=0.75, return_weights=True)
    assert res.weights is not None
    for i in range(12):
        keep = mask[i] != -np.inf
        outs, ws = ref_row(q64[i], k64, v64, keep, np.where(keep, mask[i], 0.0), 0.75, 512)
        for col, ball in enumerate(outs):
            assert ball_inside(ball, float(res.lower[i, col]), float(res.upper[i, col]))
        for j, ball in enumerate(ws):
            assert ball_inside(ball, float(res.weights.lower[i, j]),
                               float(res.weights.upper[i, j]))
