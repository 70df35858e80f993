"""reference_attention_backward: certified gradients of attention.

Expected values come from independent methods: forward-mode differentiation in Arb
(tests/kernels/backward_reference.py: Taylor series through the forward pass, no backward
formula), exact Fractions on constructions whose gradient is derived by hand, and
torch/JAX autograd (agreement only, never exactness).
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

from backward_reference import forward_mode_gradients
from oracle_reference import ball_fractions, ref_round

from mha_symbolic import reference_attention_backward
from mha_symbolic.errors import InputValueError, ShapeError, SpecError

FORMATS = ("float64", "float32", "float16", "bfloat16")
NP = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
      "bfloat16": ml_dtypes.bfloat16}


def _check_enclosure_and_rounding(enc: Any, ref: np.ndarray, fmts: tuple[str, ...] = FORMATS) -> None:
    """Every reference ball lies in [lower, upper]; rounded() is the reference's
    rounding wherever the reference ball decides it."""
    lo, hi = enc.lower, enc.upper
    assert lo.shape == ref.shape
    for idx in np.ndindex(*ref.shape):
        a, b = ball_fractions(ref[idx])
        lo_f, hi_f = Fraction(float(lo[idx])), Fraction(float(hi[idx]))
        if 4 * (b - a) > hi_f - lo_f:
            # the enclosure is tighter than the reference ball (an exact value, a
            # structural zero): the truth is in both, so they must meet
            assert lo_f <= b and a <= hi_f, (idx, ref[idx], lo[idx], hi[idx])
            continue
        assert lo_f <= a and b <= hi_f, (idx, ref[idx], lo[idx], hi[idx])
    for name in fmts:
        got = enc.rounded(name)
        for idx in np.ndindex(*ref.shape):
            a, b = ball_fractions(ref[idx])
            ra, rb = ref_round(a, name), ref_round(b, name)
            if ra == rb:
                assert float(got[idx]) == ra, (name, idx, got[idx], ra)


def _keep(L: int, S: int, causal: bool, align: str, bool_mask: np.ndarray | None) -> np.ndarray:
    keep = np.ones((L, S), dtype=bool)
    if causal:
        off = S - L if align == "bottom_right" else 0
        keep &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    if bool_mask is not None:
        keep &= bool_mask
    return keep


@st.composite
def problems(draw: Any) -> dict[str, Any]:
    dtype = draw(st.sampled_from(FORMATS))
    L, S = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    E, Ev = draw(st.integers(1, 3)), draw(st.integers(1, 2))

    def arr(shape: tuple[int, ...]) -> np.ndarray:
        kind = draw(st.sampled_from(["normal", "small_ints", "repeated"]))
        rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        if kind == "normal":
            a = rng.standard_normal(shape) * draw(st.sampled_from([1.0, 3.0]))
        elif kind == "small_ints":
            a = rng.integers(-3, 4, shape).astype(np.float64) / 2
        else:
            a = np.broadcast_to(rng.standard_normal(shape[-1:]), shape).copy()
        return a.astype(NP[dtype]).astype(np.float64)

    mask_kind = draw(st.sampled_from(["none", "bool", "float"]))
    causal = draw(st.booleans())
    align = draw(st.sampled_from(["top_left", "bottom_right"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    bool_mask = rng.random((L, S)) < 0.8 if mask_kind == "bool" else None
    madd = None
    if mask_kind == "float":
        madd = np.round(rng.standard_normal((L, S)) * 4) / 4
        madd[rng.random((L, S)) < 0.2] = -np.inf
    return dict(dtype=dtype, q=arr((L, E)), k=arr((S, E)), v=arr((S, Ev)), do=arr((L, Ev)),
                causal=causal, align=align, bool_mask=bool_mask, madd=madd,
                scale=draw(st.sampled_from([None, 0.0, 0.5, 1.0, -0.75])),
                policy=draw(st.sampled_from(["zero", "uniform"])))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_gradients_enclose_forward_mode_derivatives_and_round_correctly(c: dict[str, Any]) -> None:
    L, S = c["q"].shape[0], c["k"].shape[0]
    keep = _keep(L, S, c["causal"], c["align"], c["bool_mask"])
    madd = None
    mask: Any = c["bool_mask"]
    if c["madd"] is not None:
        keep &= c["madd"] != -np.inf
        madd = np.where(np.isfinite(c["madd"]), c["madd"], 0.0)
        mask = c["madd"]
    dt = NP[c["dtype"]]
    g = reference_attention_backward(
        c["q"].astype(dt), c["k"].astype(dt), c["v"].astype(dt), c["do"].astype(dt),
        attn_mask=mask, is_causal=c["causal"], causal_alignment=c["align"], scale=c["scale"],
        masked_rows=c["policy"])
    scale = "rsqrt" if c["scale"] is None else Fraction(c["scale"])
    ref = forward_mode_gradients(c["q"], c["k"], c["v"], c["do"], keep, madd, scale,
                                 policy=c["policy"])
    _check_enclosure_and_rounding(g.dq, ref["q"])
    _check_enclosure_and_rounding(g.dk, ref["k"])
    _check_enclosure_and_rounding(g.dv, ref["v"])
    if madd is not None:
        assert g.d_attn_mask is not None
        # -inf entries: the key takes no part, the gradient is exactly 0
        m_ref = np.where(keep, ref["m"], ref["m"] * 0)
        _check_enclosure_and_rounding(g.d_attn_mask, m_ref, ("float32",))
    else:
        assert g.d_attn_mask is None


def test_gqa_and_broadcast_gradients_are_summed_over_copies() -> None:
    rng = np.random.default_rng(3)
    # query (2 batches, 4 heads), key/value 2 kv heads shared by both batches
    q = rng.standard_normal((2, 4, 2, 3)).astype(np.float32).astype(np.float64)
    k = rng.standard_normal((2, 3, 3)).astype(np.float32).astype(np.float64)
    v = rng.standard_normal((2, 3, 2)).astype(np.float32).astype(np.float64)
    do = rng.standard_normal((2, 4, 2, 2)).astype(np.float32).astype(np.float64)
    g = reference_attention_backward(q, k, v, do, enable_gqa=True, is_causal=True)
    keep = _keep(2, 3, True, "top_left", None)
    ref_dk = np.empty(k.shape, dtype=object)
    ref_dv = np.empty(v.shape, dtype=object)
    ref_dq = np.empty(q.shape, dtype=object)
    from flint import arb
    ref_dk.fill(arb(0))
    ref_dv.fill(arb(0))
    for b in range(2):
        for h in range(4):
            kv = h // 2   # repeat_interleave: query heads 0, 1 -> kv 0; 2, 3 -> kv 1
            r = forward_mode_gradients(q[b, h], k[kv], v[kv], do[b, h], keep, None, "rsqrt")
            ref_dq[b, h] = r["q"]
            ref_dk[kv] = ref_dk[kv] + r["k"]
            ref_dv[kv] = ref_dv[kv] + r["v"]
    _check_enclosure_and_rounding(g.dq, ref_dq, ("float32",))
    _check_enclosure_and_rounding(g.dk, ref_dk, ("float32", "bfloat16"))
    _check_enclosure_and_rounding(g.dv, ref_dv, ("float32", "bfloat16"))


def test_float_mask_broadcast_over_rows_sums_the_mask_gradient() -> None:
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 4, 2))
    v, do = rng.standard_normal((2, 4, 1)), rng.standard_normal((2, 3, 1))
    m = np.array([[0.5, -np.inf, 0.0, 1.25]])     # (1, S): one bias per key
    g = reference_attention_backward(q, k, v, do, attn_mask=m)
    assert g.d_attn_mask is not None and g.d_attn_mask.shape == (1, 4)
    keep = np.broadcast_to(m != -np.inf, (3, 4))
    madd = np.broadcast_to(np.where(np.isinf(m), 0.0, m), (3, 4)).copy()
    from flint import arb
    tot = [arb(0)] * 4
    for b in range(2):
        r = forward_mode_gradients(q[b], k[b], v[b], do[b], keep, madd, "rsqrt")
        for j in range(4):
            for i in range(3):
                tot[j] = tot[j] + (r["m"][i, j] if keep[i, j] else arb(0))
    ref = np.empty((1, 4), dtype=object)
    for j in range(4):
        ref[0, j] = tot[j]
    _check_enclosure_and_rounding(g.d_attn_mask, ref, ("float64", "float32"))
    assert g.d_attn_mask.rounded("float32")[0, 1] == 0.0  # -inf entry: exactly 0


def test_dropout_keep_mask_and_factor_are_exact() -> None:
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((3, 2)), rng.standard_normal((4, 2))
    v, do = rng.standard_normal((4, 2)), rng.standard_normal((3, 2))
    drop = rng.random((3, 4)) < 0.7
    p = 0.3   # 1/(1 - p) is not a double: the factor is kept exact
    g = reference_attention_backward(q, k, v, do, dropout_p=p, dropout_mask=drop)
    ref = forward_mode_gradients(q, k, v, do, np.ones((3, 4), bool), None, "rsqrt", drop=drop,
                                 f=1 / (1 - Fraction(p)))
    _check_enclosure_and_rounding(g.dq, ref["q"], ("float64", "float32"))
    _check_enclosure_and_rounding(g.dk, ref["k"], ("float64", "float32"))
    _check_enclosure_and_rounding(g.dv, ref["v"], ("float64", "float32"))


# --------------------------------------------------------------------------------------
# Exact values and ties, derived by hand


def test_scale_zero_gives_uniform_weights_and_exact_rational_gradients() -> None:
    # scale 0: P = 1/S, so dV_j = Σ_i dO_i / S exactly, dQ = dK = 0 exactly
    q = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    v = np.array([[1.0], [2.0], [4.0]])
    do = np.array([[1.0], [2.0], [4.0]])
    g = reference_attention_backward(q, k, v, do, scale=0.0)
    assert g.dv.exact((0, 0)) == Fraction(7, 3)
    assert g.dv.rounded("float64").tolist() == [[7 / 3]] * 3
    assert g.dq.rounded("float64").tolist() == [[0.0, 0.0]] * 3
    assert g.dk.rounded("float32").tolist() == [[0.0, 0.0]] * 3
    assert not np.signbit(g.dq.rounded("float32")).any()


def test_equal_keys_give_dq_exactly_zero_in_float64() -> None:
    # all keys equal: P is uniform whatever q is, dQ = c Σ_j dS_ij k = 0 (Σ_j dS_ij = 0)
    q = np.array([[1.0, 2.0], [-3.0, 1.0]])
    k = np.array([[0.5, 0.25]] * 3)
    v = np.array([[1.0], [3.0], [-2.0]])
    do = np.array([[1.5], [-0.5]])
    g = reference_attention_backward(q, k, v, do)
    assert g.dq.exact((1, 0)) == 0
    assert g.dq.rounded("float64").tolist() == [[0.0, 0.0], [0.0, 0.0]]
    # dV_j = Σ_i dO_i/3 exactly: 1/3
    assert g.dv.exact((2, 0)) == Fraction(1, 3)


@pytest.mark.parametrize("t, expected", [(1 + 2.0**-24, 1.0), (1 + 3 * 2.0**-24, 1 + 2.0**-22)])
def test_mirrored_rows_make_dv_an_exact_tie_rounded_to_even(t: float, expected: float) -> None:
    # row 0 scores (a, b), row 1 scores (b, a): p_00 + p_10 = 1, so dV_0 = t exactly, a
    # float32 midpoint; ties to even
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    k = np.array([[0.75, 0.25], [0.25, 0.75]])
    v = np.array([[1.0], [2.0]])
    g = reference_attention_backward(q, k, v, np.array([[t], [t]]), scale=1.0)
    assert g.dv.exact((0, 0)) == Fraction(t)
    assert g.dv.rounded("float32").tolist() == [[expected], [expected]]


def test_one_hot_rows_give_exact_dv_and_zero_dq() -> None:
    # one allowed key per row: P is one-hot, dV_j = Σ_{i: j allowed} dO_i, dS = 0
    q = np.array([[1.0, 2.0], [3.0, 4.0]])
    k = np.array([[1.0, 1.0], [2.0, -1.0]])
    v = np.array([[1.0], [2.0]])
    do = np.array([[1 + 2.0**-11], [2.0**-11]])   # dV_0 = 1 + 2**-10 + ... : fp16 tie below
    mask = np.array([[True, False], [True, False]])
    g = reference_attention_backward(q, k, v, do, attn_mask=mask)
    assert g.dv.exact((0, 0)) == Fraction(1) + Fraction(2, 2**11)
    assert g.dv.rounded("float16").tolist() == [[1.0009765625], [0.0]]
    assert g.dq.rounded("float64").tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_tie_decided_through_a_minus_1e4_mask_entry() -> None:
    # a finite -1e4 mask puts e^-10000 next to an exact midpoint: the sign is decided
    # exactly (the value is above the midpoint by about e^-10000)
    q = np.array([[0.0, 0.0]])
    k = np.zeros((2, 2))
    v = np.array([[1.0], [1.0 + 2.0**-20]])
    t = 1 + 2.0**-24
    do = np.array([[t]])
    m = np.array([[0.0, -1e4]])
    g = reference_attention_backward(q, k, v, do, attn_mask=m, scale=1.0)
    # dV_0 = t·p_0 with p_0 = 1/(1 + e^-10000) just below 1: below the midpoint t
    assert g.dv.rounded("float32")[0, 0] == 1.0
    assert g.dv.rounded("float32")[1, 0] == 0.0


# --------------------------------------------------------------------------------------
# Fully masked rows


def _masked_row_case() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    v, do = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    return q, k, v, do, mask


def test_masked_row_zero_policy_gives_zero_gradient_for_that_row() -> None:
    q, k, v, do, mask = _masked_row_case()
    g = reference_attention_backward(q, k, v, do, attn_mask=mask)
    assert g.dq.rounded("float64")[1].tolist() == [0.0, 0.0]
    keep = mask.copy()
    ref = forward_mode_gradients(q, k, v, do, keep, None, "rsqrt")
    _check_enclosure_and_rounding(g.dk, ref["k"], ("float64",))
    _check_enclosure_and_rounding(g.dv, ref["v"], ("float64",))


def test_masked_row_uniform_policy_is_jax_mean_of_values() -> None:
    q, k, v, do, mask = _masked_row_case()
    g = reference_attention_backward(q, k, v, do, attn_mask=mask, masked_rows="uniform")
    ref = forward_mode_gradients(q, k, v, do, mask, None, "rsqrt", policy="uniform")
    assert g.dq.rounded("float64")[1].tolist() == [0.0, 0.0]
    _check_enclosure_and_rounding(g.dv, ref["v"], ("float64",))
    _check_enclosure_and_rounding(g.dk, ref["k"], ("float64",))


def test_masked_row_nan_policy_propagates_like_autograd() -> None:
    q, k, v, do, mask = _masked_row_case()
    g = reference_attention_backward(q[None], k[None], v[None], do[None], attn_mask=mask,
                                     masked_rows="nan")
    dq = g.dq.rounded("float32")
    assert np.isnan(dq[0, 1]).all() and np.isfinite(dq[0, [0, 2]]).all()
    assert np.isnan(g.dk.rounded("float32")).all() and np.isnan(g.dv.lower).all()


def test_masked_row_error_policy_names_the_row() -> None:
    q, k, v, do, mask = _masked_row_case()
    with pytest.raises(InputValueError, match=r"query row \(1,\)"):
        reference_attention_backward(q, k, v, do, attn_mask=mask, masked_rows="error")


# --------------------------------------------------------------------------------------
# Against autograd (agreement) and input kinds


@pytest.mark.parametrize("variant", ["plain", "causal_gqa", "float_mask", "broadcast"])
def test_agrees_with_torch_autograd_in_float64(variant: str) -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g_ = torch.Generator().manual_seed(7)

    def t(*shape: int) -> Any:
        return torch.randn(*shape, generator=g_, dtype=torch.float64, requires_grad=True)

    kw: dict[str, Any] = {}
    q, k, v = t(2, 4, 5, 8), t(2, 4, 7, 8), t(2, 4, 7, 6)
    ins = [q, k, v]
    if variant == "causal_gqa":
        k, v = t(2, 2, 7, 8), t(2, 2, 7, 6)
        ins = [q, k, v]
        kw = dict(is_causal=True, enable_gqa=True)
    elif variant == "float_mask":
        m = t(5, 7)
        ins.append(m)
        kw = dict(attn_mask=m)
    elif variant == "broadcast":
        k, v = t(4, 7, 8), t(1, 7, 6)
        ins = [q, k, v]
        kw = dict(scale=0.3)
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    do = torch.randn(out.shape, generator=g_, dtype=torch.float64)
    grads = torch.autograd.grad(out, ins, do)
    ours = reference_attention_backward(q, k, v, do, **kw)
    encs = [ours.dq, ours.dk, ours.dv] + ([ours.d_attn_mask] if len(ins) == 4 else [])
    for enc, tg in zip(encs, grads, strict=True):
        assert enc.shape == tuple(tg.shape)
        np.testing.assert_allclose(enc.midpoint, tg.numpy(), rtol=1e-12, atol=1e-13)


def test_agrees_with_jax_vjp() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 5, 2, 4)).astype(np.float32) for _ in range(3))
    do = rng.standard_normal((1, 5, 2, 4)).astype(np.float32)
    _, vjp = jax.vjp(lambda a, b, c: jax.nn.dot_product_attention(a, b, c),
                       jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    jq, jk, jv = vjp(jnp.asarray(do))
    # jax lays out (B, T, N, H): heads third

    def t(x: Any) -> Any:
        return np.swapaxes(x, 1, 2)

    ours = reference_attention_backward(t(q), t(k), t(v), t(do))
    for enc, jg in ((ours.dq, jq), (ours.dk, jk), (ours.dv, jv)):
        np.testing.assert_allclose(enc.rounded("float32"), t(np.asarray(jg)), rtol=2e-5,
                                   atol=2e-6)


def test_inputs_of_every_kind_are_read_exactly() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    q, k, v, do = (rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16) for _ in range(4))
    ref = reference_attention_backward(q, k, v, do)
    as_lists = reference_attention_backward(*(x.astype(np.float64).tolist() for x in (q, k, v, do)))
    tq = torch.tensor(q.astype(np.float32)).to(torch.bfloat16).requires_grad_(True)
    as_torch = reference_attention_backward(tq, torch.tensor(k.astype(np.float32)),
                                            torch.tensor(v.astype(np.float32)),
                                            torch.tensor(do.astype(np.float32)))
    for name in ("dq", "dk", "dv"):
        a = getattr(ref, name).rounded("float64")
        assert np.array_equal(a, getattr(as_lists, name).rounded("float64"))
        assert np.array_equal(a, getattr(as_torch, name).rounded("float64"))


def test_unpacks_as_dq_dk_dv_and_repr_names_shapes() -> None:
    g = reference_attention_backward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)),
                                     np.ones((2, 1)))
    dq, dk, dv = g
    assert (dq.shape, dk.shape, dv.shape) == ((2, 3), (4, 3), (4, 1))
    assert "dq=(2, 3)" in repr(g)


# --------------------------------------------------------------------------------------
# Errors


def test_grad_output_shape_must_match_the_output() -> None:
    with pytest.raises(ShapeError, match=r"grad_output.shape=\(2, 2\) does not match .*\(2, 1\)"):
        reference_attention_backward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)),
                                     np.ones((2, 2)))


def test_random_dropout_without_its_mask_is_refused() -> None:
    with pytest.raises(SpecError, match="dropout_mask"):
        reference_attention_backward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)),
                                     np.ones((2, 1)), dropout_p=0.1)
    with pytest.raises(SpecError, match=r"dropout_p=1\.0"):
        reference_attention_backward(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)),
                                     np.ones((2, 1)), dropout_p=1.0,
                                     dropout_mask=np.ones((2, 4), bool))


def test_bad_options_and_values_are_named() -> None:
    a = np.ones((2, 3))
    with pytest.raises(SpecError, match="masked_rows='ignore'"):
        reference_attention_backward(a, a, a, a, masked_rows="ignore")
    bad = a.copy()
    bad[1, 2] = math.nan
    with pytest.raises(InputValueError, match=r"grad_output\[1, 2\] = nan"):
        reference_attention_backward(a, a, a, bad)
    with pytest.raises(SpecError, match=r"dropout_mask\.dtype"):
        reference_attention_backward(a, a, a, a, dropout_mask=np.ones((2, 2)))
