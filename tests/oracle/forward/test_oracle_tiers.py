"""The oracle's tiers and conventions against the independent reference of
tests/kernels/oracle_reference.py (exact Fraction scores, one arb.exp per key, element
sums, neighbour-search rounding; no oracle code):

* tier 1 (float64 bounds) and tier 2 (double-double) enclosures contain the truth
  and are as tight as claimed; float64 rounding is bit-identical to the reference,
  also for rows of up to 4096 keys (sampled rows), ties, subnormals, huge scores;
* finite, tight enclosures for extreme finite inputs (issue 10, item 2);
* masked_rows="uniform", dropout with an explicit keep mask, dropout_p=0, integer
  masks refused, torch SDPA broadcasting, the sign of zero (issue 10, item 6 and
  the signed-zero defect).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic.errors import ShapeError, SpecError
from mha_symbolic.oracle import reference_attention

flint = pytest.importorskip("flint")
arb = flint.arb

from oracle_reference import (  # noqa: E402
    ball_fractions,
    ball_inside,
    check_against_reference,
    ref_round,
    ref_row,
)


def _check_rows(res: Any, q: Any, k: Any, v: Any, rows: list[tuple[int, int]], *,
                mask: Any = None, scale: Any = None, tight: float | None = None) -> None:
    """Reference balls inside [lower, upper] for the sampled (b, i) rows; with
    ``tight``, the enclosure is at most that relative width (of the column scale)."""
    for b, i in rows:
        keep = np.ones(k.shape[-2], dtype=bool)
        madd = None
        if mask is not None:
            keep = mask[b, i] != -np.inf
            madd = np.where(keep, mask[b, i], 0.0)
        outs, _ = ref_row(q[b, i], k[b], v[b], keep, madd, scale, 256)
        for col, ball in enumerate(outs):
            lo, hi = float(res.lower[b, i, col]), float(res.upper[b, i, col])
            assert ball_inside(ball, lo, hi), (b, i, col, lo, hi, ball)
            assert lo <= res.midpoint[b, i, col] <= hi
            if tight is not None:
                scale_v = float(np.max(np.abs(v[b][:, col]))) or 1.0
                assert hi - lo <= tight * scale_v, (b, i, col, hi - lo)


def _inputs(rng: Any, B: int, L: int, S: int, E: int, Ev: int, dtype: Any = np.float32,
            mult: float = 1.0) -> tuple[Any, Any, Any]:
    return ((rng.standard_normal((B, L, E)) * mult).astype(dtype),
            (rng.standard_normal((B, S, E)) * mult).astype(dtype),
            rng.standard_normal((B, S, Ev)).astype(dtype))


@pytest.mark.parametrize("mult", [1.0, 8.0])
def test_tier1_enclosure_contains_the_truth_before_any_refinement(mult: float) -> None:
    rng = np.random.default_rng(int(mult))
    q, k, v = _inputs(rng, 2, 40, 600, 16, 5, mult=mult)  # S > KEY_BLOCK: blocked sums
    mask = np.where(rng.random((2, 40, 600)) < 0.1, -np.inf, 0.0)
    mask[:, :, :3] = -1e9  # finite sentinels: weights e**-1e9, not zero
    mask[:, 5, :] = -np.inf
    mask[:, 5, 7] = 0.0  # one allowed key: a one-hot row
    res = reference_attention(q, k, v, attn_mask=mask)
    rows = [(b, i) for b in range(2) for i in rng.choice(40, 4, replace=False)] + [(0, 5)]
    _check_rows(res, q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), rows,
                mask=mask, tight=2.0**-30)


def test_tier2_enclosure_is_tight_and_contains_the_truth() -> None:
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, 2, 24, 700, 8, 4, dtype=np.float64, mult=3.0)
    v *= np.exp2(rng.integers(-30, 30, v.shape))  # values of all magnitudes
    res = reference_attention(q, k, v, scale=0.3)
    prob = res._problem
    for b in range(2):
        rows = np.array([0, 5, 23])
        hi, lo, err, ok = prob.refine(b, rows, "output")
        assert ok.all()
        for n_, i in enumerate(rows.tolist()):
            outs, _ = ref_row(q[b, i], k[b], v[b], np.ones(700, bool), None, 0.3, 320)
            old = flint.ctx.prec
            flint.ctx.prec = 320
            try:
                for col, ball in enumerate(outs):
                    c = arb(hi[n_, col]) + arb(lo[n_, col])  # exact at 320 bits
                    assert abs(ball - c) <= arb(err[n_, col]), (b, i, col)
                    assert err[n_, col] <= 2.0**-70 * np.max(np.abs(v[b][:, col]))
            finally:
                flint.ctx.prec = old
    r64 = res.rounded("float64")
    rows = [(b, i) for b in range(2) for i in (0, 5, 23)]
    _check_rows(res, q, k, v, rows, scale=0.3)
    for b, i in rows:
        outs, _ = ref_row(q[b, i], k[b], v[b], np.ones(700, bool), None, 0.3, 320)
        for col, ball in enumerate(outs):
            lo_f, hi_f = ball_fractions(ball)
            assert r64[b, i, col] == ref_round(lo_f, "float64") == ref_round(hi_f, "float64")


def test_float64_rounding_of_long_rows_matches_the_reference() -> None:
    """S = 4096 keys, sampled rows; also the weights of two rows."""
    rng = np.random.default_rng(11)
    q, k, v = _inputs(rng, 1, 64, 4096, 16, 3, dtype=np.float32, mult=2.0)
    res = reference_attention(q, k, v, return_weights=True)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    rows = [((0,), i) for i in rng.choice(64, 6, replace=False)]
    check_against_reference(res, q64, k64, v64, np.ones((1, 64, 4096), bool), None, None,
                            formats=("float64", "float32"), rows=rows[:2])
    r64 = res.rounded("float64")
    for (b,), i in rows[2:]:
        outs, _ = ref_row(q64[b, i], k64[b], v64[b], np.ones(4096, bool), None, None, 256)
        for col, ball in enumerate(outs):
            lo_f, hi_f = ball_fractions(ball)
            assert r64[b, i, col] == ref_round(lo_f, "float64") == ref_round(hi_f, "float64")


EXTREMES = {
    "fp32 inputs near 1e38": (np.float32, 1e38, 1.0, None, None),
    "fp64 inputs near 1e200": (np.float64, 1e200, 1.0, None, None),
    "scale 1e100": (np.float64, 1.0, 1.0, 1e100, None),
    "values near 1e300": (np.float64, 1.0, 1e300, None, None),
    "tiny inputs and values": (np.float64, 1e-200, 1e-300, None, None),
    "mask entries of 1e300": (np.float64, 1.0, 1.0, None, 1e300),
    "scores that overflow to inf in float64": (np.float64, 1e160, 1.0, 1.0, None),
}


@pytest.mark.parametrize("name", list(EXTREMES))
def test_extreme_finite_inputs_give_finite_tight_enclosures(name: str) -> None:
    dtype, qk, vv, scale, mk = EXTREMES[name]
    rng = np.random.default_rng(len(name))
    q = (rng.standard_normal((2, 3, 6)) * qk).astype(dtype)
    k = (rng.standard_normal((2, 4, 6)) * qk).astype(dtype)
    v = (rng.standard_normal((2, 4, 2)) * vv).astype(dtype)
    mask = None if mk is None else rng.standard_normal((3, 4)) * mk
    res = reference_attention(q, k, v, scale=scale, attn_mask=mask, return_weights=True)
    for enc in (res, res.weights):
        assert enc is not None
        assert np.all(np.isfinite(enc.lower)) and np.all(np.isfinite(enc.upper))
        assert np.all(enc.lower <= enc.midpoint) and np.all(enc.midpoint <= enc.upper)
    width = (res.upper - res.lower) / np.maximum(np.abs(res.midpoint), 1e-307)
    assert np.max(width) < 1e-9, name
    madd = None if mask is None else np.broadcast_to(mask, (2, 3, 4))
    check_against_reference(res, q.astype(np.float64), k.astype(np.float64),
                            v.astype(np.float64), np.ones((2, 3, 4), bool), madd, scale)


def test_masked_rows_uniform_is_the_mean_of_all_values() -> None:
    """JAX's convention: a fully masked row gets uniform weights over all keys."""
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, 2, 3, 5, 4, 3, dtype=np.float64)
    mask = np.ones((2, 3, 5), dtype=bool)
    mask[0, 1] = False  # fully masked
    mask[1, 2, :] = False
    res = reference_attention(q, k, v, attn_mask=mask, masked_rows="uniform",
                              return_weights=True)
    for b, i in ((0, 1), (1, 2)):
        for col in range(3):
            mean = sum(Fraction(float(x)) for x in v[b, :, col]) / 5
            assert res.rounded("float64")[b, i, col] == ref_round(mean, "float64")
            assert res.rounded("float16")[b, i, col] == ref_round(mean, "float16")
            assert res.lower[b, i, col] <= mean <= res.upper[b, i, col]
        assert res.weights is not None
        assert res.weights.rounded("float64")[b, i].tolist() == [0.2] * 5
    # the other rows are ordinary attention
    keep = mask.copy()
    check_against_reference(res, q, k, v, keep, None, None, formats=("float64",),
                            rows=[((0,), 0), ((1,), 0)])
    # S = 0: the empty mean is 0
    empty = reference_attention(q, k[:, :0], v[:, :0], masked_rows="uniform")
    assert np.all(empty.rounded("float32") == 0)


@pytest.mark.parametrize("p", [0.1, 0.5, 1 / 3])
def test_dropout_with_a_keep_mask_is_exact(p: float) -> None:
    rng = np.random.default_rng(int(p * 100))
    q, k, v = _inputs(rng, 2, 4, 6, 3, 2, dtype=np.float32)
    keep = rng.random((2, 4, 6)) > p
    res = reference_attention(q, k, v, dropout_p=p, dropout_mask=keep, return_weights=True)
    factor = 1 / (1 - Fraction(p))
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    check_against_reference(res, q64, k64, v64, np.ones((2, 4, 6), bool), None, None,
                            drop=keep, factor=factor)


def test_dropout_ties_are_decided_exactly() -> None:
    """Equal scores, keep = [1, 0, 1, 1], p = 1/2: y = 2·(v0 + v2 + v3)/4 exactly."""
    q = np.zeros((1, 2))
    k = np.ones((4, 2))
    v = np.array([[1.0], [7.0], [2.0], [2.0 ** -53]])
    keep = np.array([[True, False, True, True]])
    res = reference_attention(q, k, v, dropout_p=0.5, dropout_mask=keep)
    exact = Fraction(2) * (1 + 2 + Fraction(1, 2**53)) / 4  # 1.5 + 2**-53: a float64 tie
    assert res.exact((0, 0)) == exact
    assert res.rounded("float64")[0, 0] == ref_round(exact, "float64") == 1.5


def test_dropout_arguments_are_checked() -> None:
    q = np.ones((2, 3))
    r0 = reference_attention(q, q, q, dropout_p=0.0)
    r1 = reference_attention(q, q, q)
    np.testing.assert_array_equal(r0.rounded("float64"), r1.rounded("float64"))
    with pytest.raises(SpecError, match="dropout_mask"):
        reference_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(SpecError, match=r"dropout_p=1\.0"):
        reference_attention(q, q, q, dropout_p=1.0, dropout_mask=np.ones((2, 2), bool))
    with pytest.raises(SpecError, match=r"dropout_mask\.dtype"):
        reference_attention(q, q, q, dropout_p=0.1, dropout_mask=np.ones((2, 2)))


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64])
def test_integer_masks_are_refused_like_torch(dtype: Any) -> None:
    q = np.ones((2, 3))
    with pytest.raises(SpecError, match=r"attn_mask.dtype=.*integer masks are ambiguous"):
        reference_attention(q, q, q, attn_mask=np.ones((2, 2), dtype=dtype))
    with pytest.raises(SpecError, match="integer masks"):
        reference_attention(q, q, q, attn_mask=[[1, 0], [1, 1]])


def test_integer_torch_masks_are_refused() -> None:
    torch = pytest.importorskip("torch")
    q = np.ones((2, 3))
    with pytest.raises(SpecError, match="integer masks"):
        reference_attention(q, q, q, attn_mask=torch.ones(2, 2, dtype=torch.uint8))


@pytest.mark.parametrize(("qs", "ks", "gqa"), [
    ((3, 5, 4), (2, 3, 6, 4), False),
    ((5, 4), (2, 3, 6, 4), False),
    ((6, 5, 4), (2, 3, 6, 4), True),
    ((1, 6, 5, 4), (6, 4), False),
    ((2, 3, 5, 4), (2, 1, 6, 4), False),
    ((2, 6, 5, 4), (3, 6, 4), True),
])
def test_broadcasting_follows_torch_sdpa(qs: Any, ks: Any, gqa: bool) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q = rng.standard_normal(qs)
    k = rng.standard_normal(ks)
    v = rng.standard_normal((*ks[:-1], 7))
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), enable_gqa=gqa).numpy()
    got = reference_attention(q, k, v, enable_gqa=gqa).rounded("float64")
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) < 1e-14


def test_gqa_needs_head_dimensions_like_torch() -> None:
    q = np.ones((5, 4))
    k = np.ones((3, 6, 4))
    with pytest.raises(ShapeError, match="enable_gqa=True every input needs a head"):
        reference_attention(q, k, k, enable_gqa=True)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_value_that_rounds_to_zero_keeps_its_sign(sign: float) -> None:
    """Regression: y = sign·2**-63 (equal scores, v0 + v1 = 2**-62) rounds to ±0 in
    float16; the enclosure straddles 0, and the old test rounded both ends and
    took -0.0 for a positive value."""
    v = sign * np.array([[2.0**-10], [-(2.0**-10 - 2.0**-62)]])
    q = np.array([[1.0, 0.0]])
    k = np.array([[0.5, 0.0], [0.5, 0.0]])
    res = reference_attention(q, k, v)
    exact = sign * Fraction(1, 2**63)
    got16 = float(res.rounded("float16")[0, 0])
    assert got16 == 0.0 and math.copysign(1.0, got16) == sign
    assert float(res.rounded("float32")[0, 0]) == float(exact)
    # an exact zero is +0.0
    z = reference_attention(q, k, np.array([[1.5], [-1.5]]))
    assert math.copysign(1.0, float(z.rounded("bfloat16")[0, 0])) == 1.0


def test_bfloat16_and_float16_inputs_round_trip() -> None:
    rng = np.random.default_rng(9)
    for dt in (np.float16, ml_dtypes.bfloat16):
        q, k, v = _inputs(rng, 1, 4, 9, 4, 2, dtype=dt)
        res = reference_attention(q, k, v)
        check_against_reference(res, q.astype(np.float64), k.astype(np.float64),
                                v.astype(np.float64), np.ones((1, 4, 9), bool), None, None)


def test_progress_is_silent_under_pytest(capsys: Any) -> None:
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, 1, 8, 8, 4, 2)
    reference_attention(q, k, v, progress=True).rounded("float64")
    assert capsys.readouterr().err == ""
