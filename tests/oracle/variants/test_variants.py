"""Tests of the attention variants of the oracle (mha_symbolic.oracle.variants.semantics,
variant_forward, transformed, score_mods, views; the fp8 formats).

Every expected value comes from an independent method written here: exact scores
as fractions.Fraction from the conventions *as FlashAttention / gpt-oss /
FlexAttention state them* (written out again below, index by index), exp and tanh
as python-flint arb balls at 800 bits, one element at a time (no arb_mat, no oracle
code), and a rounding by exact comparison with the neighbouring bit patterns of the
format (ml_dtypes gives the bit patterns).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha_symbolic.errors import InputValueError, ShapeError, SpecError
from mha_symbolic.oracle import reference_attention
from mha_symbolic.oracle.arith import formats as fpf
from mha_symbolic.oracle.arith.tanh import E_TANH, tanh_proved
from mha_symbolic.oracle.variants.forward import reference_attention_varlen
from mha_symbolic.oracle.variants.score_mods import (
    alibi_score_mod,
    relative_bias_score_mod,
    softcap_score_mod,
)

flint = pytest.importorskip("flint")
from variant_reference import (  # noqa: E402  (the independent Arb reference, tests/kernels/)
    DT,
    PREC,
    arb,
    ctx,
    fmpq,
    ref_attention,
    ref_rounded,
)


def _inputs(shape: tuple[int, ...], dtype: Any = np.float32, seed: int = 0,
            scale: float = 1.0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal(shape) * scale).astype(dtype) for _ in range(3))


def _check(r: Any, balls: list[Any], names: tuple[str, ...] = ("float32", "float16",
                                                                 "bfloat16")) -> None:
    for name in names:
        got = np.asarray(r.rounded(name), dtype=np.float64)
        want = ref_rounded(balls, name)
        np.testing.assert_array_equal(got, want, err_msg=name)
    lo, hi = r.lower, r.upper
    with_prec = ctx.prec
    ctx.prec = PREC
    try:
        flat = np.array(balls, dtype=object).ravel()
        for x, a, bnd in zip(flat, lo.ravel(), hi.ravel(), strict=True):
            assert arb(float(a)) <= x.mid() <= arb(float(bnd))
    finally:
        ctx.prec = with_prec


# ---------------------------------------------------------------------------
# Window
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("window,causal,align,L,S", [
    ((1, 0), False, "top_left", 4, 4),
    ((0, 1), False, "bottom_right", 3, 5),
    ((2, -1), False, "bottom_right", 5, 3),
    ((-1, 1), True, "bottom_right", 3, 5),
    ((1, 2), True, "top_left", 4, 6),
])
def test_window_rounding_is_bit_identical_to_flash_attention_convention(
        window: tuple[int, int], causal: bool, align: str, L: int, S: int) -> None:
    q, _, _ = _inputs((1, 2, L, 4), seed=1)
    _, k, v = _inputs((1, 2, S, 4), seed=2)
    r = reference_attention(q, k, v, window=window, is_causal=causal, causal_alignment=align)
    _check(r, ref_attention(q, k, v, window=window, causal=causal, align=align))


def test_window_masked_rows_follow_the_policy() -> None:
    q, _, _ = _inputs((1, 1, 4, 2), seed=3)
    _, k, v = _inputs((1, 1, 2, 2), seed=4)
    # bottom-right, window (0, 0): query i sees key i - 2 only; rows 0, 1 see nothing
    r = reference_attention(q, k, v, window=(0, 0), causal_alignment="bottom_right")
    assert np.all(r.rounded("float32")[0, 0, :2] == 0)
    r = reference_attention(q, k, v, window=(0, 0), causal_alignment="bottom_right",
                            masked_rows="nan")
    assert np.all(np.isnan(r.rounded("float32")[0, 0, :2]))
    with pytest.raises(InputValueError, match="every key masked"):
        reference_attention(q, k, v, window=(0, 0), causal_alignment="bottom_right",
                            masked_rows="error")


@pytest.mark.parametrize("bad", [(1,), (1, -2), (1.5, 0), "ab", 3])
def test_window_refuses_malformed_sizes(bad: Any) -> None:
    q, k, v = _inputs((1, 2, 2))
    with pytest.raises(SpecError, match="window"):
        reference_attention(q, k, v, window=bad)


@pytest.mark.parametrize("dropout", [{"dropout_p": 0.5, "dropout_mask": True},
                                     {"dropout_p": 0.0, "dropout_mask": True},
                                     {"dropout_p": 0.25}])
def test_variants_refuse_dropout_forward_and_backward(dropout: dict[str, Any]) -> None:
    from mha_symbolic.oracle import reference_attention_backward

    q, k, v = _inputs((1, 2, 2))
    with pytest.raises(SpecError, match="dropout with attention variants"):
        reference_attention(q, k, v, window=(1, 0), **dropout)
    with pytest.raises(SpecError, match="dropout with attention variants"):
        reference_attention_backward(q, k, v, np.ones((1, 2, 2)), window=(1, 0), **dropout)


def test_window_unbounded_both_sides_is_plain_attention() -> None:
    q, k, v = _inputs((1, 2, 3, 4), seed=5)
    a = reference_attention(q, k, v, window=(-1, -1)).rounded("float32")
    b = reference_attention(q, k, v).rounded("float32")
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Softcap
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("cap", [0.5, 3.0, 50.0])
def test_softcap_rounding_is_bit_identical_to_arb_tanh(cap: float) -> None:
    q, k, v = _inputs((1, 2, 3, 4), seed=6, scale=2.0)
    r = reference_attention(q, k, v, softcap=cap)
    _check(r, ref_attention(q, k, v, softcap=cap), names=("float64", "float32", "bfloat16"))


def test_softcap_with_causal_mask_is_applied_before_the_mask() -> None:
    q, k, v = _inputs((1, 1, 4, 3), seed=7, scale=3.0)
    r = reference_attention(q, k, v, softcap=1.0, is_causal=True)
    _check(r, ref_attention(q, k, v, softcap=1.0, causal=True))


def test_softcap_zero_means_off_as_flash_attention() -> None:
    q, k, v = _inputs((1, 2, 3, 4), seed=8)
    np.testing.assert_array_equal(reference_attention(q, k, v, softcap=0.0).rounded("float32"),
                                  reference_attention(q, k, v).rounded("float32"))


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_softcap_refuses_negative_and_nonfinite(bad: float) -> None:
    q, k, v = _inputs((1, 2, 2))
    with pytest.raises(InputValueError, match="softcap"):
        reference_attention(q, k, v, softcap=bad)


def test_tanh_proved_is_within_its_stated_bound() -> None:
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.standard_normal(300) * 3, rng.standard_normal(100) * 1e-6,
                         rng.uniform(-0.2, 0.2, 300), [0.17325, -0.17325, 0.1733, 0.3466],
                         [0.0, -0.0, 1e-300, -400.0, 400.0, 19.0, -19.5, 1e308]])
    got, err = tanh_proved(xs)
    assert np.all(err <= E_TANH)
    old = ctx.prec
    ctx.prec = 300
    try:
        for x, t, e in zip(xs.tolist(), got.tolist(), err.tolist(), strict=True):
            exact = arb(x).tanh()
            assert abs(arb(t) - exact) <= arb(e)
    finally:
        ctx.prec = old


def test_softcap_derivative_bounds_hold_for_every_argument_within_e_x() -> None:
    """sech2_proved (float64) and _sech2_dd (double-double) bound sech²(x) for every x
    within e_x of the computed argument: checked against Arb's sech at the computed
    argument and at both ends of the interval (sech² is monotone on each side of 0,
    so the ends and 0 bound it); e_x > 1/4 gives an infinite bound."""
    from mha_symbolic.oracle.arith.tanh import _sech2_dd, _sech2_dd_err, _tanh_dd, sech2_proved

    rng = np.random.default_rng(1)
    xs = np.concatenate([rng.standard_normal(200) * 3, rng.uniform(-0.2, 0.2, 100),
                         [0.0, -0.0, 1e-300, 20.0, -299.0, 301.0, 355.0, -400.0, 1e300]])
    old = ctx.prec
    ctx.prec = 300
    try:
        for e_x in (0.0, 2.0**-40, 1e-3):
            f, err = sech2_proved(xs, np.full(xs.shape, e_x))
            fh, fl, err2 = _sech2_dd(xs, np.zeros_like(xs), np.full(xs.shape, e_x))
            # the fused tanh + sech² of the pipeline (1 - t² on the series branch)
            _, _, _, gh, gl = _tanh_dd(xs, np.zeros_like(xs), want_sech2=True)
            err3 = _sech2_dd_err(gh, np.full(xs.shape, e_x))
            for n, x in enumerate(xs.tolist()):
                if abs(x) > 1e4:   # sech² < 4e^-20000: the results must be within err of 0
                    assert abs(float(f[n])) <= err[n] and abs(float(fh[n])) <= err2[n]
                    assert abs(float(gh[n])) <= err3[n]
                    continue
                ends = [arb(x)] + ([arb(x) - e_x, arb(x) + e_x] if e_x else [])
                if e_x and abs(x) <= e_x:
                    ends.append(arb(0))
                for y in ends:
                    exact = y.sech() ** 2
                    assert abs(arb(float(f[n])) - exact) <= arb(float(err[n])), (x, e_x)
                    assert abs(arb(float(fh[n])) + arb(float(fl[n])) - exact) <= arb(
                        float(err2[n])), (x, e_x)
                    assert abs(arb(float(gh[n])) + arb(float(gl[n])) - exact) <= arb(
                        float(err3[n])), (x, e_x)
        assert np.all(np.isinf(sech2_proved(xs, np.full(xs.shape, 0.3))[1]))
        assert np.all(np.isinf(_sech2_dd(xs, np.zeros_like(xs), np.full(xs.shape, 0.3))[2]))
    finally:
        ctx.prec = old


# ---------------------------------------------------------------------------
# ALiBi
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["h", "bh"])
@pytest.mark.parametrize("align,L,S", [("top_left", 3, 3), ("bottom_right", 2, 4)])
def test_alibi_rounding_is_bit_identical(shape: str, align: str, L: int, S: int) -> None:
    q, _, _ = _inputs((2, 3, L, 4), seed=9)
    _, k, v = _inputs((2, 3, S, 4), seed=10)
    slopes_h = np.array([2.0**-1, 2.0**-2, 2.0**-3], dtype=np.float32)
    slopes = slopes_h if shape == "h" else np.stack([slopes_h, slopes_h * 3])
    r = reference_attention(q, k, v, alibi_slopes=slopes, causal_alignment=align)
    _check(r, ref_attention(q, k, v, alibi=np.broadcast_to(slopes, (2, 3)), align=align))


def test_alibi_float64_slopes_that_are_not_exact_products_take_the_transformed_path() -> None:
    q, _, _ = _inputs((1, 2, 3, 4), seed=11)
    _, k, v = _inputs((1, 2, 5, 4), seed=12)
    slopes = np.array([0.1, 1 / 3])  # 53-bit significands: slope·|d| is not a double
    r = reference_attention(q, k, v, alibi_slopes=slopes, causal_alignment="bottom_right")
    _check(r, ref_attention(q, k, v, alibi=np.broadcast_to(slopes, (1, 2)),
                            align="bottom_right"), names=("float64", "float32"))


def test_alibi_causal_form_of_flash_attention_gives_identical_outputs() -> None:
    # FA's attn_bias_from_alibi_slopes(causal=True) adds -slope·(S - 1 - j): a float
    # mask here.  On kept keys it differs from -slope·|i + S - L - j| by a row constant.
    L, S = 3, 5
    q, _, _ = _inputs((1, 2, L, 4), seed=13)
    _, k, v = _inputs((1, 2, S, 4), seed=14)
    slopes = np.array([0.5, 0.25])
    causal_form = -slopes[:, None, None] * (S - 1 - np.arange(S))[None, None, :]
    keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + S - L
    fmask = np.where(keep, np.broadcast_to(causal_form, (2, L, S)), -np.inf)[None]
    a = reference_attention(q, k, v, attn_mask=fmask)
    b = reference_attention(q, k, v, alibi_slopes=slopes, is_causal=True,
                            causal_alignment="bottom_right")
    for name in ("float64", "float32", "float16"):
        np.testing.assert_array_equal(a.rounded(name), b.rounded(name))


def test_alibi_slopes_of_the_wrong_shape_are_refused() -> None:
    q, k, v = _inputs((1, 2, 3, 4))
    with pytest.raises(ShapeError, match="alibi_slopes"):
        reference_attention(q, k, v, alibi_slopes=[1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------
# Sinks
# ---------------------------------------------------------------------------

def test_sinks_rounding_is_bit_identical_to_gpt_oss_convention() -> None:
    q, k, v = _inputs((2, 3, 3, 4), seed=15)
    sinks = np.array([0.5, -2.0, 3.0], dtype=np.float32)
    r = reference_attention(q, k, v, sinks=sinks, is_causal=True, return_weights=True)
    _check(r, ref_attention(q, k, v, sinks=sinks, causal=True))
    w = r.weights.rounded("float64")
    assert w.shape == (2, 3, 3, 3)
    assert np.all(w.sum(-1) < 1)  # the sink takes its share


def test_sinks_make_a_fully_masked_row_exactly_zero_whatever_the_policy() -> None:
    q, k, v = _inputs((1, 2, 2, 2), seed=16)
    keep = np.array([[False, False], [True, True]])
    for policy in ("zero", "nan", "error"):
        r = reference_attention(q, k, v, attn_mask=keep, sinks=[0.0, 1.0],
                                masked_rows=policy)
        assert np.all(r.rounded("float32")[:, :, 0] == 0)
        assert np.all(r.lower[:, :, 0] <= 0) and np.all(r.upper[:, :, 0] >= 0)
        assert r.exact((0, 1, 0, 1)) == 0   # decided exactly: the sink takes all the weight


def test_sinks_with_softcap_take_the_transformed_path_and_agree() -> None:
    q, k, v = _inputs((1, 2, 3, 4), seed=17, scale=2.0)
    sinks = np.array([1.0, -0.5])
    r = reference_attention(q, k, v, sinks=sinks, softcap=2.0, window=(1, 1),
                            return_weights=True)
    _check(r, ref_attention(q, k, v, sinks=sinks, softcap=2.0, window=(1, 1)))
    assert r.weights.shape == (1, 2, 3, 3)


def test_sinks_of_the_wrong_shape_are_refused() -> None:
    q, k, v = _inputs((1, 2, 3, 4))
    with pytest.raises(ShapeError, match="sinks"):
        reference_attention(q, k, v, sinks=[1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------
# mask_mod, BlockMask, score_mod menu
# ---------------------------------------------------------------------------

def _doc_mask(b: Any, h: Any, qi: Any, ki: Any) -> Any:
    return ((qi // 2) == (ki // 2)) & (ki <= qi)


def test_mask_mod_vectorised_is_bit_identical() -> None:
    q, k, v = _inputs((2, 2, 5, 4), seed=18)
    r = reference_attention(q, k, v, mask_mod=_doc_mask)

    def keep(b: int, h: int, i: int, j: int) -> bool:
        return i // 2 == j // 2 and j <= i

    _check(r, ref_attention(q, k, v, keep=keep))


def test_mask_mod_that_needs_python_ints_falls_back_to_a_loop() -> None:
    q, k, v = _inputs((1, 2, 4, 4), seed=19)
    calls = []

    def scalar_only(b: Any, h: Any, qi: Any, ki: Any) -> bool:
        calls.append(1)
        return bool(qi >= ki) if h == 0 else True   # `h == 0` on arrays is ambiguous

    r = reference_attention(q, k, v, mask_mod=scalar_only)
    _check(r, ref_attention(q, k, v, keep=lambda b, h, i, j: i >= j if h == 0 else True),
           names=("float32",))
    assert len(calls) >= 2 * 4 * 4


def test_mask_mod_that_is_not_elementwise_is_refused() -> None:
    q, k, v = _inputs((1, 2, 4, 4), seed=20)
    with pytest.raises(SpecError, match="not elementwise"):
        reference_attention(q, k, v, mask_mod=lambda b, h, qi, ki: ki <= np.max(qi) - 1)


def test_mask_mod_returning_integers_is_refused() -> None:
    q, k, v = _inputs((1, 2, 4, 4), seed=21)
    with pytest.raises(SpecError, match="expected bool"):
        reference_attention(q, k, v, mask_mod=lambda b, h, qi, ki: (qi >= ki).astype(int))


def test_arbitrary_score_mod_callable_is_refused_with_the_reason() -> None:
    q, k, v = _inputs((1, 2, 4, 4))
    with pytest.raises(SpecError, match="cannot be certified"):
        reference_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 2)


def test_score_mod_menu_matches_keywords_and_the_independent_reference() -> None:
    q, k, v = _inputs((1, 2, 3, 4), seed=22, scale=2.0)
    slopes = np.array([0.5, 0.125])
    a = reference_attention(q, k, v, score_mod=(softcap_score_mod(2.0),
                                                alibi_score_mod(slopes)))
    b = reference_attention(q, k, v, softcap=2.0, alibi_slopes=slopes)
    np.testing.assert_array_equal(a.rounded("float64"), b.rounded("float64"))
    table = np.array([[0.0, 0.5, 1.0, 1.5, 2.0], [1.0, -1.0, 0.25, 0.0, 3.0]])
    r = reference_attention(q, k, v, score_mod=relative_bias_score_mod(table))
    _check(r, ref_attention(q, k, v, rel_table=table))


def test_score_mod_objects_compute_the_same_modification_in_numpy() -> None:
    qi = np.arange(4)[:, None]
    ki = np.arange(6)[None, :]
    s = np.zeros((4, 6))
    m = alibi_score_mod([0.5, 0.25], offset=2)
    np.testing.assert_array_equal(m(s, 0, 1, qi, ki), -0.25 * np.abs(ki - qi - 2))
    t = relative_bias_score_mod([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(t(s, 0, 0, qi, ki), np.array([1.0, 2.0, 3.0])[
        np.clip(ki - qi, -1, 1) + 1])


# ---------------------------------------------------------------------------
# FP8 formats and descale
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_rounding_of_doubles_matches_ml_dtypes(name: str) -> None:
    fmt = fpf.get_format(name)
    rng = np.random.default_rng(1)
    fi = ml_dtypes.finfo(DT[name])
    xs = np.concatenate([rng.standard_normal(2000) * float(fi.max) / 8,
                         rng.standard_normal(2000) * float(fi.smallest_subnormal) * 20,
                         [float(fi.max), float(fi.max) * 1.03, float(fi.smallest_subnormal) / 2]])
    got = fpf.round_float64_to(xs, fmt).astype(DT[name]).astype(np.float64)
    want = xs.astype(DT[name]).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    got2 = np.array([fpf.round_fraction(Fraction(x), fmt) for x in xs]).astype(
        DT[name]).astype(np.float64)
    np.testing.assert_array_equal(got2, want)


def test_fp8_e4m3fn_limits() -> None:
    fmt = fpf.get_format("float8_e4m3fn")
    assert fmt.max_finite == 448.0
    assert fpf.round_fraction(Fraction(464), fmt) == 448.0   # tie: the even pattern
    assert fpf.round_fraction(Fraction(465), fmt) == math.inf
    assert fpf.get_format("torch.float8_e5m2").max_finite == 57344.0


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_inputs_with_descale_are_bit_identical(name: str) -> None:
    q, k, v = (x.astype(DT[name]) for x in _inputs((2, 2, 3, 4), np.float32, seed=23, scale=2))
    dq = np.array([[0.5, 0.75], [1.25, 0.1]], dtype=np.float32)
    dk = np.array([[2.0, 0.3], [1.0, 1.5]], dtype=np.float32)
    dv = np.array([[0.2, 3.0], [1.0, 0.7]], dtype=np.float32)
    r = reference_attention(q, k, v, q_descale=dq, k_descale=dk, v_descale=dv)
    _check(r, ref_attention(q, k, v, dq=dq, dk=dk, dv=dv),
           names=("float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"))


def test_descale_gqa_query_heads_share_their_kv_heads_factor() -> None:
    rng = np.random.default_rng(24)
    q = rng.standard_normal((1, 4, 3, 4)).astype(ml_dtypes.float8_e4m3fn)
    k = rng.standard_normal((1, 2, 3, 4)).astype(ml_dtypes.float8_e4m3fn)
    v = rng.standard_normal((1, 2, 3, 4)).astype(ml_dtypes.float8_e4m3fn)
    dq = np.array([[0.5, 2.0]], dtype=np.float32)
    r = reference_attention(q, k, v, enable_gqa=True, q_descale=dq)
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    _check(r, ref_attention(q, kk, vv, dq=np.repeat(dq, 2, axis=1)), names=("float32",))


def test_descale_that_is_not_an_exact_product_is_refused() -> None:
    q, k, v = _inputs((1, 2, 3, 4), np.float64)
    with pytest.raises(InputValueError, match="not exactly representable"):
        reference_attention(q, k, v, q_descale=np.full((1, 2), 0.1))


def test_torch_fp8_tensors_are_read_exactly() -> None:
    torch = pytest.importorskip("torch")
    x = torch.tensor([[0.1, 300.0, -2.5]]).to(torch.float8_e4m3fn)
    r = reference_attention(x, x, x, scale=0.0)
    np.testing.assert_array_equal(r.rounded("float32")[0], x.float().numpy()[0])


# ---------------------------------------------------------------------------
# varlen
# ---------------------------------------------------------------------------

def test_varlen_is_each_sequence_on_its_own() -> None:
    rng = np.random.default_rng(25)
    cu_q, cu_k = [0, 2, 2, 5], [0, 3, 4, 6]
    q = rng.standard_normal((5, 2, 4)).astype(np.float32)
    k = rng.standard_normal((6, 2, 4)).astype(np.float32)
    v = rng.standard_normal((6, 2, 3)).astype(np.float32)
    slopes = np.array([[0.5, 0.25], [1.0, 2.0], [0.125, 0.5]])
    r = reference_attention_varlen(q, k, v, cu_q, cu_k, 3, 3, is_causal=True,
                                   causal_alignment="bottom_right", alibi_slopes=slopes)
    got = r.rounded("float32")
    assert got.shape == (5, 2, 3)
    for b in range(3):
        qs = np.swapaxes(q[cu_q[b]:cu_q[b + 1]], 0, 1)[None]
        ks = np.swapaxes(k[cu_k[b]:cu_k[b + 1]], 0, 1)[None]
        vs = np.swapaxes(v[cu_k[b]:cu_k[b + 1]], 0, 1)[None]
        if qs.shape[2] == 0:
            continue
        want = ref_rounded(ref_attention(qs, ks, vs, causal=True, align="bottom_right",
                                         alibi=slopes[b][None]), "float32")
        np.testing.assert_array_equal(np.swapaxes(got[cu_q[b]:cu_q[b + 1]], 0, 1), want[0])
    assert isinstance(r.exact((4, 1, 2)), (Fraction, type(arb(0))))


@pytest.mark.parametrize("cu,msg", [([1, 2], "nondecreasing"), ([0, 3, 2], "nondecreasing"),
                                    ([0, 2], "nondecreasing"), ([[0, 3]], "1-D")])
def test_varlen_refuses_malformed_offsets(cu: Any, msg: str) -> None:
    x = np.zeros((3, 1, 2))
    with pytest.raises(SpecError, match=msg):
        reference_attention_varlen(x, x, x, np.array(cu), np.array([0, 3]))


def test_varlen_refuses_a_max_seqlen_below_the_longest_sequence() -> None:
    x = np.zeros((3, 1, 2))
    with pytest.raises(SpecError, match="max_seqlen_q"):
        reference_attention_varlen(x, x, x, [0, 3], [0, 3], max_seqlen_q=2)


# ---------------------------------------------------------------------------
# FlexAttention's BlockMask (torch)
# ---------------------------------------------------------------------------

def test_block_mask_is_the_mask_its_kernel_uses() -> None:
    torch = pytest.importorskip("torch")
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = _inputs((1, 2, 6, 4), seed=26)

    def sliding(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (qi - ki >= 0) & (qi - ki <= 2)

    bm = fa.create_block_mask(sliding, None, None, 6, 6, device="cpu", BLOCK_SIZE=2)
    a = reference_attention(q, k, v, mask_mod=bm).rounded("float32")
    b = reference_attention(q, k, v, window=(2, 0)).rounded("float32")
    np.testing.assert_array_equal(a, b)
    del torch


@pytest.mark.parametrize("module", ["oracle.variants.registry", "oracle.variants.score_mods",
                                    "oracle.variants.forward", "oracle.api",
                                    "oracle.conventions",
                                    "exact.variants", "testing.forward.variants"])
def test_doctests_of_the_variant_modules(module: str) -> None:
    import doctest
    import importlib

    mod = importlib.import_module(f"mha_symbolic.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


# ---------------------------------------------------------------------------
# Random combinations (hypothesis)
# ---------------------------------------------------------------------------

@st.composite
def _variant_case(draw: Any) -> tuple[Any, ...]:
    L, S, E = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31))
    q, _, _ = _inputs((1, 2, L, E), seed=seed, scale=2.0)
    _, k, v = _inputs((1, 2, S, E), seed=seed + 1)
    opts: dict[str, Any] = {}
    ref: dict[str, Any] = {}
    align = draw(st.sampled_from(["top_left", "bottom_right"]))
    opts["causal_alignment"] = ref["align"] = align
    if draw(st.booleans()):
        w = (draw(st.integers(-1, 3)), draw(st.integers(-1, 3)))
        opts["window"] = ref["window"] = w
    if draw(st.booleans()):
        opts["is_causal"] = ref["causal"] = True
    if draw(st.booleans()):
        cap = draw(st.sampled_from([0.5, 1.0, 4.0]))
        opts["softcap"] = ref["softcap"] = cap
    if draw(st.booleans()):
        sl = np.array([draw(st.sampled_from([0.5, 0.25, 0.75, 1 / 3])) for _ in range(2)])
        opts["alibi_slopes"] = sl
        ref["alibi"] = sl[None]
    if draw(st.booleans()):
        sk = np.array([draw(st.floats(-3, 3, width=32)) for _ in range(2)])
        opts["sinks"] = ref["sinks"] = sk
    return q, k, v, opts, ref


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_variant_case())
def test_random_variant_combinations_round_like_the_independent_reference(
        case: tuple[Any, ...]) -> None:
    q, k, v, opts, ref = case
    r = reference_attention(q, k, v, **opts)
    _check(r, ref_attention(q, k, v, **ref), names=("float64", "float32", "bfloat16"))


def test_tanh_series_coefficients_are_the_taylor_coefficients() -> None:
    import sympy as sp

    from mha_symbolic.oracle.arith.tanh import TANH_SERIES

    x = sp.Symbol("x")
    series = sp.series(sp.tanh(x), x, 0, 2 * len(TANH_SERIES) + 1).removeO()
    assert [Fraction(str(series.coeff(x, 2 * n - 1))) for n in range(1, len(TANH_SERIES) + 1)
            ] == TANH_SERIES


# ---------------------------------------------------------------------------
# Layouts and edge cases
# ---------------------------------------------------------------------------

def test_two_dimensional_inputs_take_variants() -> None:
    q, k, v = _inputs((3, 4), seed=30)
    r = reference_attention(q, k, v, window=(1, 0), sinks=[0.5], softcap=2.0)
    balls = ref_attention(q[None, None], k[None, None], v[None, None], window=(1, 0),
                          sinks=np.array([0.5]), softcap=2.0)
    np.testing.assert_array_equal(r.rounded("float32"), ref_rounded(balls, "float32")[0, 0])


def test_gqa_with_window_and_alibi_per_query_head() -> None:
    rng = np.random.default_rng(31)
    q = rng.standard_normal((1, 4, 3, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    slopes = np.array([0.5, 0.25, 0.125, 1.0], dtype=np.float32)
    r = reference_attention(q, k, v, enable_gqa=True, window=(2, 0), alibi_slopes=slopes,
                            causal_alignment="bottom_right")
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    _check(r, ref_attention(q, kk, vv, window=(2, 0), alibi=slopes[None],
                            align="bottom_right"), names=("float32",))


def test_no_keys_with_sinks_gives_zeros_and_without_follows_the_policy() -> None:
    q = np.ones((1, 2, 3, 2))
    k = np.ones((1, 2, 0, 2))
    v = np.ones((1, 2, 0, 4))
    assert np.all(reference_attention(q, k, v, sinks=[0.0, 1.0]).rounded("float32") == 0)
    assert np.all(np.isnan(reference_attention(q, k, v, softcap=1.0,
                                               masked_rows="nan").rounded("float32")))


def test_huge_window_sizes_mean_unbounded() -> None:
    q, k, v = _inputs((1, 2, 3, 4), seed=32)
    np.testing.assert_array_equal(
        reference_attention(q, k, v, window=(10**30, 10**30)).rounded("float32"),
        reference_attention(q, k, v).rounded("float32"))


def test_torch_and_jax_arguments_are_read_exactly() -> None:
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    q, k, v = _inputs((1, 2, 3, 4), seed=33)
    slopes = [0.5, 0.25]
    a = reference_attention(q, k, v, alibi_slopes=torch.tensor(slopes),
                            sinks=jnp.asarray([0.5, -0.5], dtype=jnp.float32))
    b = reference_attention(q, k, v, alibi_slopes=np.array(slopes),
                            sinks=np.array([0.5, -0.5], np.float32))
    np.testing.assert_array_equal(a.rounded("float64"), b.rounded("float64"))


def test_uniform_policy_with_a_softcap_gives_the_mean_of_the_values() -> None:
    q, k, v = _inputs((1, 1, 3, 2), seed=34)
    keep = np.array([[True, True, False], [False, False, False], [True, True, True]])
    r = reference_attention(q, k, v, attn_mask=keep, softcap=2.0, masked_rows="uniform")
    mean = [float(sum(Fraction(float(x)) for x in v[0, 0, :, c]) / 3) for c in range(2)]
    assert r.exact((0, 0, 1, 0)) == sum(Fraction(float(x)) for x in v[0, 0, :, 0]) / 3
    np.testing.assert_allclose(r.midpoint[0, 0, 1], mean, rtol=1e-15)
    assert np.all(np.isfinite(r.rounded("float32")))


def test_softcap_tier2_values_lie_within_their_bound_against_arb() -> None:
    q, k, v = _inputs((1, 2, 5, 4), seed=35, scale=2.0)
    r = reference_attention(q, k, v, softcap=3.0, sinks=[0.5, -0.5],
                            alibi_slopes=np.array([0.1, 1 / 3]), window=(2, 1))
    problem = r._problem
    old = ctx.prec
    for b in range(2):
        hi, lo, err, ok = problem.refine(b, np.arange(5), "output")
        assert ok.all() and np.all(err < 1e-20)
        balls = ref_attention(q, k, v, softcap=3.0, sinks=np.array([0.5, -0.5]),
                              alibi=np.array([[0.1, 1 / 3]]), window=(2, 1))[0][b]
        ctx.prec = PREC
        try:
            for i in range(5):
                for c in range(4):
                    d = abs(balls[i][c] - arb(float(hi[i, c])) - arb(float(lo[i, c])))
                    assert d < arb(float(err[i, c]))
        finally:
            ctx.prec = old


def test_softcap_compiled_and_numpy_twins_are_bit_identical() -> None:
    from mha_symbolic.oracle.arith import tanh as transformed
    from mha_symbolic.oracle.arith.jit import _kernels

    if _kernels() is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(36)
    s = np.concatenate([rng.standard_normal(2000) * 4, rng.standard_normal(50) * 1e3,
                        [0.0, -0.0, 1e-300, 700.0, -1e9]]).reshape(5, -1)
    for cap in (0.5, 30.0):
        t, _ = transformed.tanh_proved(s / cap, need_err=False)
        np.testing.assert_array_equal(transformed.softcap_array(s, cap), cap * t)


def test_fused_softcap_rows_and_dd_tanh_twins_are_bit_identical() -> None:
    """The compiled scale-softcap-maxima pass, the double-double tanh and sech² give the
    numpy twins' arrays bit for bit (series, exp branch, far branch, signed zeros,
    masks)."""
    from mha_symbolic.oracle.arith import tanh as transformed
    from mha_symbolic.oracle.arith.jit import _kernels

    if _kernels() is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(37)
    g = np.concatenate([rng.standard_normal(1500) * 8, rng.standard_normal(40) * 1e4,
                        [0.0, -0.0, 1e-300, 5000.0, -1e12]]).reshape(5, -1)
    allowed = rng.random(g.shape) < 0.7
    for c_f, cap, al in ((0.125, 30.0, None), (1.0, 0.5, allowed), (-0.3, 2.0, allowed)):
        got = transformed.softcap_rows(g, c_f, cap, al)
        want = transformed._np_softcap_rows(g, c_f, cap, al)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
            assert np.array_equal(np.signbit(a), np.signbit(b))
    xh = np.concatenate([rng.standard_normal(600) * 0.1, rng.standard_normal(600) * 3,
                         [0.0, -0.0, 0.17325, -0.17325, 299.0, 301.0, -1e6]])
    xl = xh * rng.standard_normal(xh.size) * 2.0**-60
    for want_sech2 in (False, True):
        got = transformed._tanh_dd(xh, xl, want_sech2)
        want = transformed._np_tanh_dd(xh, xl, want_sech2)
        assert len(got) == len(want) == (5 if want_sech2 else 3)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    got = transformed._sech2_dd(xh, xl, np.zeros_like(xh))[:2]
    want = transformed._np_sech2_dd(xh, xl)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tier1_weighted_magnitude_bound_holds_against_arb(seed: int) -> None:
    """fast.tier1_block(want_abs) bounds Σ_j P_j |v_j| (the perturbation lemma's
    magnitude): the exact value in Arb from the scores (exact doubles) lies below it,
    and the bound is tight (within 1e-9 relative)."""
    from mha_symbolic.oracle.conventions import Block
    from mha_symbolic.oracle.forward.fast import KV, tier1_block

    rng = np.random.default_rng(seed)
    L, S, Ev = 4, 7, 3
    s = rng.standard_normal((L, S)) * (1.0, 30.0, 0.01)[seed]
    v = rng.standard_normal((S, Ev)) * 10.0 ** rng.integers(-3, 3, size=(1, Ev))
    allowed = rng.random((L, S)) < 0.8
    allowed[:, 0] = True
    res = tier1_block(np.zeros((L, 0)), None, KV(np.zeros((S, 0)), v),
                      Block(allowed, np.where(allowed, s, 0.0), None, None), 0.0, 0.0,
                      want_abs=True)
    assert res.a_up is not None
    old = ctx.prec
    ctx.prec = 300
    try:
        for i in range(L):
            js = np.flatnonzero(allowed[i]).tolist()
            w = {j: arb(fmpq(*Fraction(float(s[i, j])).as_integer_ratio())).exp() for j in js}
            den = sum(w.values(), arb(0))
            for col in range(Ev):
                exact = sum((w[j] * arb(abs(float(v[j, col]))) for j in js), arb(0)) / den
                assert exact < arb(float(res.a_up[i, col]))
                assert float(res.a_up[i, col]) <= float(exact.mid()) * (1 + 1e-9)
    finally:
        ctx.prec = old
