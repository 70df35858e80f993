"""Tests of the gradients with variants (mha_symbolic.oracle.variants.backward and the
variant options of reference_attention_backward / compare_attention_backward).

Expected values: the backward formulas written out here in Arb at 800 bits, one
element at a time, from the exact scores of tests/oracle/variants/test_variants.py's conventions
(window as FlashAttention's, ALiBi -slope·|i + off - j|, a sink in the denominator
only: it is a key of value 0, so dP_{i,sink} = 0):
P = softmax over kept keys and the sink, dV = Pᵀ dO, dP = dO Vᵀ, D_i = Σ_j P_ij dP_ij,
dS = P ∘ (dP − D), dQ = c·dS K, dK = c·dSᵀ Q; and torch autograd of explicit masks."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mha_symbolic.errors import ShapeError, SpecError
from mha_symbolic.oracle import reference_attention_backward
from mha_symbolic.testing.backward.compare import compare_attention_backward

flint = pytest.importorskip("flint")
from variant_reference import PREC, A, F, ref_rounded  # noqa: E402  (tests/kernels/)

arb = flint.arb


def ref_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *,
              window: tuple[int, int] | None = None, alibi: np.ndarray | None = None,
              sinks: np.ndarray | None = None, align: str = "top_left"
              ) -> tuple[list[Any], list[Any], list[Any]]:
    """dq, dk, dv as nested lists of balls, (B, H, ·, ·) inputs with equal heads."""
    B, H, L, E = q.shape
    S = k.shape[2]
    off = 0 if align == "top_left" else S - L
    old = flint.ctx.prec
    flint.ctx.prec = PREC
    try:
        c = arb(1) / arb(E).sqrt()
        dq = [[[[arb(0)] * E for _ in range(L)] for _ in range(H)] for _ in range(B)]
        dk = [[[[arb(0)] * E for _ in range(S)] for _ in range(H)] for _ in range(B)]
        dv = [[[[arb(0)] * v.shape[3] for _ in range(S)] for _ in range(H)] for _ in range(B)]
        for b in range(B):
            for h in range(H):
                for i in range(L):
                    kept = []
                    for j in range(S):
                        if window is not None and not (-window[0] <= j - (i + off) <= window[1]):
                            continue
                        g = sum((F(q[b, h, i, e]) * F(k[b, h, j, e]) for e in range(E)),
                                Fraction(0))
                        s = A(g) * c
                        if alibi is not None:
                            s = s - A(F(alibi[h]) * abs(i + off - j))
                        kept.append((j, s))
                    if not kept:
                        continue
                    den = sum((s.exp() for _, s in kept), arb(0))
                    if sinks is not None:
                        den = den + A(F(sinks[h])).exp()
                    p = {j: s.exp() / den for j, s in kept}
                    dp = {j: sum((A(F(do[b, h, i, col])) * A(F(v[b, h, j, col]))
                                  for col in range(v.shape[3])), arb(0)) for j, _ in kept}
                    D = sum((p[j] * dp[j] for j, _ in kept), arb(0))
                    for j, _ in kept:
                        ds = p[j] * (dp[j] - D)
                        for col in range(v.shape[3]):
                            dv[b][h][j][col] += p[j] * A(F(do[b, h, i, col]))
                        for e in range(E):
                            dq[b][h][i][e] += c * ds * A(F(k[b, h, j, e]))
                            dk[b][h][j][e] += c * ds * A(F(q[b, h, i, e]))
        return dq, dk, dv
    finally:
        flint.ctx.prec = old


def _inputs(L: int, S: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, 2, L, 3)).astype(np.float32),
            rng.standard_normal((1, 2, S, 3)).astype(np.float32),
            rng.standard_normal((1, 2, S, 3)).astype(np.float32),
            rng.standard_normal((1, 2, L, 3)).astype(np.float32))


@pytest.mark.parametrize("opts,ref_opts", [
    ({"window": (1, 0)}, {"window": (1, 0)}),
    ({"alibi_slopes": np.array([0.5, 0.25], np.float32), "causal_alignment": "bottom_right"},
     {"alibi": np.array([0.5, 0.25]), "align": "bottom_right"}),
    ({"sinks": np.array([0.5, -1.0], np.float32), "window": (2, 1)},
     {"sinks": np.array([0.5, -1.0]), "window": (2, 1)}),
])
def test_variant_gradients_round_like_the_independent_formulas(opts: dict,
                                                                 ref_opts: dict) -> None:
    q, k, v, do = _inputs(3, 4, seed=40)
    g = reference_attention_backward(q, k, v, do, **opts)
    dq, dk, dv = ref_grads(q, k, v, do, **ref_opts)
    for enc, balls in ((g.dq, dq), (g.dk, dk), (g.dv, dv)):
        for name in ("float32", "bfloat16"):
            np.testing.assert_array_equal(np.asarray(enc.rounded(name), np.float64),
                                          ref_rounded(balls, name), err_msg=name)
    assert g.d_attn_mask is None


def test_torch_autograd_of_an_explicit_window_and_alibi_passes_and_a_shifted_window_fails(
        ) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(41)
    q, k, v, do = (torch.randn(1, 2, 12, 8, generator=gen, dtype=torch.float32)
                   for _ in range(4))
    slopes = torch.tensor([0.5, 0.125])
    i = torch.arange(12)[:, None]
    j = torch.arange(12)[None, :]

    def grads(left: int) -> tuple[Any, ...]:
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        keep = (j <= i) & (j >= i - left)
        bias = -slopes[:, None, None] * (i - j).abs().float()
        mask = torch.where(keep, bias, torch.tensor(-float("inf")))
        out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
        return torch.autograd.grad(out, (qq, kk, vv), do)

    opts = {"window": (3, 0), "is_causal": True, "alibi_slopes": slopes}
    assert compare_attention_backward(*grads(3), q, k, v, do, **opts).passed
    assert not compare_attention_backward(*grads(4), q, k, v, do, **opts).passed


def test_compare_backward_refuses_a_softcap_after_a_bias_with_the_reason() -> None:
    from mha_symbolic import relative_bias_score_mod, softcap_score_mod

    q, k, v, do = _inputs(2, 2, seed=43)
    mods = (relative_bias_score_mod(np.zeros((2, 3))), softcap_score_mod(5.0))
    with pytest.raises(SpecError, match="table then softcap"):
        compare_attention_backward(q, k, v, q, k, v, do, score_mod=mods)


def _softcap_grads(torch: Any, q: Any, k: Any, v: Any, do: Any, cap: float,
                   derivative: bool = True) -> tuple[Any, ...]:
    """Autograd of C·tanh(c q·k / C) + ALiBi, causal softmax (FlashAttention's order);
    ``derivative=False``: the capped scores' forward with the derivative of the
    uncapped ones (the softcap_derivative_missing bug)."""
    qq, kk, vv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    L, S = q.shape[-2], k.shape[-2]
    s = (qq @ kk.transpose(-1, -2)) / float(np.sqrt(q.shape[-1]))
    capped = cap * torch.tanh(s / cap)
    s = capped if derivative else s + (capped - s).detach()
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    s = s - torch.tensor([0.5, 0.25]).view(1, 2, 1, 1) * (i - j).abs()
    s = s.masked_fill(j > i, -float("inf"))
    return tuple(g.detach().numpy() for g in torch.autograd.grad(
        torch.softmax(s, dim=-1) @ vv, (qq, kk, vv), torch.from_numpy(do)))


@pytest.mark.parametrize("cap", [2.0, 30.0])
def test_compare_backward_with_softcap_passes_autograd_and_names_a_missing_derivative(
        cap: float) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(46)
    q, k, v, do = ((rng.standard_normal((1, 2, 7, 8)) * 3).astype(np.float32)
                   for _ in range(4))
    opts = {"softcap": cap, "is_causal": True,
            "alibi_slopes": np.array([0.5, 0.25], np.float32)}
    good = compare_attention_backward(*_softcap_grads(torch, q, k, v, do, cap), q, k, v, do,
                                      **opts)
    assert good.passed, good.report()
    bad = compare_attention_backward(*_softcap_grads(torch, q, k, v, do, cap, False), q, k, v,
                                     do, **opts)
    assert not bad.passed
    assert [d.bug for d in bad.diagnoses][:1] == ["softcap_derivative_missing"], bad.report()


def _gpt_oss_grads(torch: Any, q: Any, k: Any, v: Any, do: Any, sinks: Any | None
                   ) -> tuple[Any, ...]:
    """gpt-oss's sdpa (cat([QK, S]), softmax, sink column dropped; causal) by autograd;
    ``sinks=None``: the sinks-ignored bug (a plain causal softmax)."""
    qq, kk, vv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    L, S = q.shape[-2], k.shape[-2]
    s = (qq @ kk.transpose(-1, -2)) / float(np.sqrt(q.shape[-1]))
    s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(L)[:, None], -float("inf"))
    if sinks is not None:
        col = torch.from_numpy(sinks).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        s = torch.cat([s, col], dim=-1)
    w = torch.softmax(s, dim=-1)[..., :S]
    return tuple(g.detach().numpy() for g in
                 torch.autograd.grad(w @ vv, (qq, kk, vv), torch.from_numpy(do)))


def test_compare_backward_with_sinks_passes_gpt_oss_autograd_and_fails_sinks_ignored() -> None:
    torch = pytest.importorskip("torch")
    q, k, v, do = _inputs(5, 5, seed=44)
    sinks = np.array([1.5, -0.5], np.float32)
    opts = {"sinks": sinks, "is_causal": True}
    good = compare_attention_backward(*_gpt_oss_grads(torch, q, k, v, do, sinks), q, k, v,
                                      do, **opts)
    assert good.passed, good.report()
    bad = compare_attention_backward(*_gpt_oss_grads(torch, q, k, v, do, None), q, k, v, do,
                                     **opts)
    assert not bad.passed


def test_compare_backward_with_sinks_names_a_wrong_dk_row_and_checks_shapes() -> None:
    q, k, v, do = _inputs(3, 4, seed=45)
    sinks = np.array([0.25, 2.0], np.float32)
    g = reference_attention_backward(q, k, v, do, sinks=sinks)
    dq, dk, dv = (e.rounded("float32") for e in (g.dq, g.dk, g.dv))
    assert compare_attention_backward(dq, dk, dv, q, k, v, do, sinks=sinks).passed
    wrong = dk.copy()
    wrong[0, 1, 3] += 0.5          # the last real key's row: judged, not a filled sink row
    assert not compare_attention_backward(dq, wrong, dv, q, k, v, do, sinks=sinks).passed
    with pytest.raises(ShapeError, match=r"dk\.shape"):
        compare_attention_backward(dq, dk[..., :3, :], dv, q, k, v, do, sinks=sinks)


# ---------------------------------------------------------------------------
# Every variant's gradients against forward-mode Arb (tests/kernels/variant_backward_reference.py)
# ---------------------------------------------------------------------------

from variant_backward_reference import reference_gradients as _reference  # noqa: E402
from variant_backward_reference import window_keep as _window_keep  # noqa: E402


def _assert_encloses(enc: Any, balls: np.ndarray) -> None:
    """lower <= truth <= upper elementwise (the truth a narrow reference ball)."""
    lo, hi = np.asarray(enc.lower), np.asarray(enc.upper)
    for idx in np.ndindex(*balls.shape):
        x = balls[idx]
        assert arb(float(lo[idx])) <= x <= arb(float(hi[idx])), (idx, lo[idx], x, hi[idx])


def _assert_rounds_like(enc: Any, balls: np.ndarray, names: tuple[str, ...]) -> None:
    """The enclosure as built (tier 1, tier 2 where it refined rows) contains the
    truth; then each rounding (the narrow formats first, so tier 1 decides them before
    float64 sends rows to tier 2) equals the reference's; the refined enclosure still
    contains the truth."""
    _assert_encloses(enc, balls)
    for name in sorted(names, key=lambda n: n == "float64"):
        np.testing.assert_array_equal(np.asarray(enc.rounded(name), np.float64),
                                      ref_rounded(balls.tolist(), name), err_msg=name)
    _assert_encloses(enc, balls)
    # the Arb tier (exact(): balls at 200 bits) agrees with the reference
    old = flint.ctx.prec
    flint.ctx.prec = 300
    try:
        for idx in list(np.ndindex(*balls.shape))[:: max(1, balls.size // 4)]:
            got = enc.exact(idx, prec=200)
            ball = arb(got.numerator) / got.denominator if isinstance(got, Fraction) else got
            assert abs(ball - balls[idx]) < arb(2.0**-150), (idx, got, balls[idx])
    finally:
        flint.ctx.prec = old


def _rand(shape: tuple[int, ...], rng: Any, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("case", ["softcap", "softcap_window_causal", "softcap_sinks_alibi",
                                  "softcap_gqa_bottom_right", "inexact_alibi"])
def test_transformed_gradients_round_like_forward_mode(case: str) -> None:
    rng = np.random.default_rng({"softcap": 50, "softcap_window_causal": 51,
                                 "softcap_sinks_alibi": 52, "softcap_gqa_bottom_right": 53,
                                 "inexact_alibi": 54}[case])
    H, Hk, L, S, E = 2, 2, 3, 4, 3
    if case == "softcap_gqa_bottom_right":
        H, Hk, L = 4, 2, 2
    q, k, v, do = (_rand((1, H, L, E), rng, 2.0), _rand((1, Hk, S, E), rng, 2.0),
                   _rand((1, Hk, S, E), rng), _rand((1, H, L, E), rng))
    opts: dict[str, Any] = {"softcap": 1.5}
    off = 0
    keep = None
    ref: dict[str, Any] = {"cap": 1.5}
    if case == "softcap_window_causal":   # bottom-right: every row keeps two keys
        opts.update(window=(1, 0), is_causal=True, causal_alignment="bottom_right")
        keep = _window_keep(L, S, (1, 0), True, S - L)
    if case == "softcap_sinks_alibi":
        sinks = np.array([0.25, -0.5], np.float32)
        slopes = np.array([0.5, 0.125], np.float32)
        opts.update(sinks=sinks, alibi_slopes=slopes)
        ref.update(sink=lambda b, h: float(sinks[h]), slope=lambda b, h: float(slopes[h]))
    if case == "softcap_gqa_bottom_right":
        opts.update(enable_gqa=True, causal_alignment="bottom_right", is_causal=True)
        off = S - L
        keep = _window_keep(L, S, None, True, off)
    if case == "inexact_alibi":   # |d| · (1/3) is no double: the transformed path, no cap
        slopes3 = np.array([0.1, 1 / 3])
        opts = {"alibi_slopes": slopes3}
        ref = {"slope": lambda b, h: float(slopes3[h])}
    g = reference_attention_backward(q, k, v, do, **opts)
    want = _reference(q, k, v, do, group=H // Hk, keep=keep, slope_offset=off, **ref)
    for enc, name in ((g.dq, "q"), (g.dk, "k"), (g.dv, "v")):
        _assert_rounds_like(enc, want[name], ("float64", "float32", "bfloat16"))


@pytest.mark.parametrize("cap", [None, 2.0])
def test_sink_and_alibi_slope_gradients_round_like_forward_mode(cap: float | None) -> None:
    rng = np.random.default_rng(55)
    q, k, v, do = (_rand((2, 2, 3, 3), rng, 1.5) for _ in range(4))
    sinks = np.array([0.5, -1.0], np.float32)
    slopes = np.array([[0.5, 0.25], [0.125, 1.0]], np.float32)   # (B, H)
    g = reference_attention_backward(q, k, v, do, sinks=sinks, alibi_slopes=slopes,
                                     window=(1, 1), softcap=cap)
    want = _reference(q, k, v, do, params=("sink", "slope"), keep=_window_keep(3, 3, (1, 1),
                                                                                False, 0),
                      cap=cap, sink=lambda b, h: float(sinks[h]),
                      slope=lambda b, h: float(slopes[b, h]))
    flint.ctx.prec = 300
    try:
        sink_ref = np.array([want["sink"][0, h][0] + want["sink"][1, h][0] for h in range(2)],
                            dtype=object)
    finally:
        flint.ctx.prec = 53
    slope_ref = np.vectorize(lambda x: x[0], otypes=[object])(want["slope"])
    assert g.d_sinks is not None and g.d_alibi_slopes is not None
    assert g.d_sinks.shape == (2,) and g.d_alibi_slopes.shape == (2, 2)
    _assert_rounds_like(g.d_sinks, sink_ref, ("float64", "float32", "bfloat16"))
    _assert_rounds_like(g.d_alibi_slopes, slope_ref, ("float64", "float32"))
    _assert_rounds_like(g.dq, want["q"], ("float64", "float32"))


def test_score_mod_table_and_slopes_gradients_round_like_forward_mode() -> None:
    from mha_symbolic.oracle.variants.score_mods import (
        alibi_score_mod,
        relative_bias_score_mod,
        softcap_score_mod,
    )

    rng = np.random.default_rng(56)
    q, k, v, do = (_rand((1, 2, 4, 3), rng, 1.5) for _ in range(4))
    table = rng.standard_normal((2, 5)).astype(np.float32)   # W = 2, per head
    slopes = np.array([0.25, 0.5], np.float32)
    mods = (softcap_score_mod(3.0), relative_bias_score_mod(table, offset=1),
            alibi_score_mod(slopes))
    g = reference_attention_backward(q, k, v, do, score_mod=mods)
    assert g.d_score_mod is not None and g.d_score_mod[0] is None
    d_tab, d_slopes = g.d_score_mod[1], g.d_score_mod[2]
    want = _reference(q, k, v, do, params=("table", "slope"), cap=3.0,
                      table=lambda b, h: table[h], table_offset=1,
                      slope=lambda b, h: float(slopes[h]))
    tab_ref = np.array([list(want["table"][0, h]) for h in range(2)], dtype=object)
    slope_ref = np.array([want["slope"][0, h][0] for h in range(2)], dtype=object)
    assert d_tab.shape == (2, 5) and d_slopes.shape == (2,)
    _assert_rounds_like(d_tab, tab_ref, ("float64", "float32"))
    _assert_rounds_like(d_slopes, slope_ref, ("float64", "float32"))
    _assert_rounds_like(g.dk, want["k"], ("float64", "float32"))


def test_float_mask_gradient_with_window_and_sinks_rounds_like_forward_mode() -> None:
    rng = np.random.default_rng(57)
    q, k, v, do = (_rand((1, 2, 3, 3), rng) for _ in range(4))
    mask = rng.standard_normal((3, 4)).astype(np.float32)      # (L, S): broadcast over heads
    mask[0, 3] = -np.inf
    k = _rand((1, 2, 4, 3), rng)
    v = _rand((1, 2, 4, 3), rng)
    sinks = np.array([0.0, 1.0], np.float32)
    g = reference_attention_backward(q, k, v, do, attn_mask=mask, window=(2, 1), sinks=sinks)
    want = _reference(q, k, v, do, params=("m",), keep=_window_keep(3, 4, (2, 1), False, 0),
                      madd=mask.astype(np.float64), sink=lambda b, h: float(sinks[h]))
    flint.ctx.prec = 300
    try:
        m_ref = want["m"][0, 0] + want["m"][0, 1]      # summed over the broadcast heads
    finally:
        flint.ctx.prec = 53
    assert g.d_attn_mask is not None and g.d_attn_mask.shape == (3, 4)
    _assert_rounds_like(g.d_attn_mask, m_ref, ("float64", "float32"))
    assert g.d_attn_mask.exact((0, 3)) == 0          # a -inf entry: exactly 0


def test_fp8_descale_gradients_are_the_chain_rule_through_the_descaled_inputs() -> None:
    import ml_dtypes

    rng = np.random.default_rng(58)
    q8, k8, v8, do = ((rng.standard_normal((1, 2, 3, 4)) * 2).astype(ml_dtypes.float8_e4m3fn)
                      for _ in range(4))
    do = np.asarray(do, np.float32)
    dq_s = np.array([[0.5, 0.375]], np.float32)
    dk_s = np.array([[1.25, 0.75]], np.float32)
    dv_s = np.array([[0.3, 2.0]], np.float32)
    g = reference_attention_backward(q8, k8, v8, do, q_descale=dq_s, k_descale=dk_s,
                                     v_descale=dv_s, softcap=4.0)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q8, k8, v8))
    want = _reference(q64, k64, v64, do, cap=4.0,
                      descale=lambda b, h: (float(dq_s[b, h]), float(dk_s[b, h]),
                                            float(dv_s[b, h])))
    for enc, name in ((g.dq, "q"), (g.dk, "k"), (g.dv, "v")):
        _assert_rounds_like(enc, want[name], ("float64", "float32", "bfloat16"))


def test_exact_fractions_softcap_sink_rows_of_equal_scores() -> None:
    """q = 0 and σ = 0: every score is 0, sech²(0) = 1, so every gradient is rational;
    written out with Fractions: P = 1/(n + 1) on the n kept keys and the sink,
    D_i = Σ_j P dO_i·v_j, dS = P(dP − D), dq = c dS K (c = 1/2 for E = 4), dk = 0,
    dv_j = Σ_i P dO_i, dσ = −Σ_i P D_i."""
    rng = np.random.default_rng(59)
    L, S, E = 3, 3, 4
    q = np.zeros((1, 1, L, E), np.float32)
    k, v = (rng.integers(-4, 5, (1, 1, S, E)).astype(np.float32) / 4 for _ in range(2))
    do = rng.integers(-4, 5, (1, 1, L, E)).astype(np.float32) / 8
    g = reference_attention_backward(q, k, v, do, softcap=2.0, sinks=np.zeros(1, np.float32),
                                     is_causal=True)
    fr = np.vectorize(F, otypes=[object])
    K, V, dO = fr(k[0, 0]), fr(v[0, 0]), fr(do[0, 0])
    dq = np.full((L, E), Fraction(0), dtype=object)
    dv = np.full((S, E), Fraction(0), dtype=object)
    dsink = Fraction(0)
    for i in range(L):
        js = list(range(i + 1))
        P = Fraction(1, len(js) + 1)
        dp = {j: sum((dO[i, c] * V[j, c] for c in range(E)), Fraction(0)) for j in js}
        D = sum((P * dp[j] for j in js), Fraction(0))
        for j in js:
            for c in range(E):
                dq[i, c] += Fraction(1, 2) * P * (dp[j] - D) * K[j, c]
                dv[j, c] += P * dO[i, c]
        dsink += -P * D
    for enc, want in ((g.dq, dq), (g.dv, dv), (g.dk, np.full((S, E), Fraction(0), object))):
        for idx in np.ndindex(*want.shape):
            assert enc.exact((0, 0, *idx)) == want[idx]
        for name in ("float32", "float64"):
            np.testing.assert_array_equal(
                np.asarray(enc.rounded(name), np.float64)[0, 0],
                np.vectorize(lambda x: float(x), otypes=[float])(want).astype(
                    np.float32 if name == "float32" else np.float64).astype(np.float64))
    assert g.d_sinks is not None and g.d_sinks.exact((0,)) == dsink


def test_zero_grad_output_rows_give_exact_zero_gradients_through_a_softcap() -> None:
    rng = np.random.default_rng(60)
    q, k, v, do = (_rand((1, 1, 3, 4), rng) for _ in range(4))
    do[0, 0, 1] = 0.0
    g = reference_attention_backward(q, k, v, do, softcap=1.0, window=(1, 0))
    dq32 = g.dq.rounded("float32")
    assert np.all(dq32[0, 0, 1] == 0) and not np.any(np.signbit(dq32[0, 0, 1]))
    assert g.dq.exact((0, 0, 1, 2)) == 0


def test_varlen_backward_packs_each_sequence_and_sums_shared_parameters() -> None:
    from mha_symbolic.oracle import reference_attention_varlen_backward

    rng = np.random.default_rng(61)
    cu = [0, 2, 5]
    H, E = 2, 3
    q, k, v, do = (_rand((5, H, E), rng) for _ in range(4))
    sinks = np.array([0.5, -0.25], np.float32)
    g = reference_attention_varlen_backward(q, k, v, do, cu, cu, 3, 3, is_causal=True,
                                            softcap=2.0, sinks=sinks)
    assert g.dq.shape == (5, H, E) and g.d_sinks.shape == (H,)
    sink_total = [arb(0), arb(0)]
    for b in range(2):
        sl = slice(cu[b], cu[b + 1])
        n = cu[b + 1] - cu[b]
        qb, kb, vb, dob = (np.swapaxes(x[sl], 0, 1)[None] for x in (q, k, v, do))
        want = _reference(qb, kb, vb, dob, params=("sink",), cap=2.0,
                          keep=_window_keep(n, n, None, True, 0),
                          sink=lambda b_, h: float(sinks[h]))
        for enc, name in ((g.dq, "q"), (g.dk, "k"), (g.dv, "v")):
            got = np.asarray(enc.rounded("float32"), np.float64)[sl]
            np.testing.assert_array_equal(np.swapaxes(got, 0, 1),
                                          ref_rounded(want[name][0].tolist(), "float32"))
        flint.ctx.prec = 300
        try:
            for h in range(H):
                sink_total[h] = sink_total[h] + want["sink"][0, h][0]
        finally:
            flint.ctx.prec = 53
    _assert_rounds_like(g.d_sinks, np.array(sink_total, dtype=object), ("float64", "float32"))


def test_descale_with_a_query_broadcast_over_batches_is_refused() -> None:
    q = np.ones((1, 2, 2, 4), np.float32)
    k = np.ones((2, 2, 2, 4), np.float32)
    with pytest.raises(SpecError, match="descale"):
        reference_attention_backward(q, k, k, np.ones((2, 2, 2, 4)),
                                     q_descale=np.array([[1.0, 1.0], [2.0, 2.0]], np.float32))


# ---------------------------------------------------------------------------
# Agreement with real implementations' autograd in float64
# ---------------------------------------------------------------------------

def _close_to(enc: Any, got: Any, rtol: float = 1e-11) -> None:
    """A float64 autograd result agrees with the certified value to within its own
    rounding errors (relative to the largest magnitude of the array)."""
    got = np.asarray(got, dtype=np.float64)
    mid = np.asarray(enc.midpoint, dtype=np.float64)
    assert got.shape == mid.shape
    scale = max(float(np.max(np.abs(mid))), 1e-300)
    np.testing.assert_allclose(got, mid, rtol=0, atol=rtol * scale)


def test_torch_sdpa_float64_autograd_with_window_and_alibi_mask_agrees() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(70)
    q, k, v, do = (torch.randn(2, 3, 6, 5, generator=gen, dtype=torch.float64) for _ in range(4))
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64, requires_grad=True)
    i = torch.arange(6)[:, None]
    j = torch.arange(6)[None, :]
    keep = (j <= i) & (j >= i - 2)
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    bias = -slopes[:, None, None] * (i - j).abs().to(torch.float64)
    mask = torch.where(keep, bias, torch.tensor(-float("inf"), dtype=torch.float64))
    out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
    got = torch.autograd.grad(out, (qq, kk, vv, slopes), do)
    g = reference_attention_backward(q, k, v, do, window=(2, 0), is_causal=True,
                                     alibi_slopes=slopes.detach())
    for enc, t in zip((g.dq, g.dk, g.dv, g.d_alibi_slopes), got, strict=True):
        _close_to(enc, t.detach().numpy())


def _flex(torch: Any) -> Any:
    """FlexAttention with its eager dense backward on CPU: the public API refuses
    backward on CPU ("FlexAttention does not support backward on CPU"), so the device
    check is skipped for the test (the forward and backward are FlexAttention's own
    dense implementations, sdpa_dense and sdpa_dense_backward)."""
    import torch.nn.attention.flex_attention as fa

    fa._validate_device = lambda *a, **k: None
    return fa


def test_flex_attention_float64_backward_with_softcap_table_and_alibi_score_mods_agrees() -> None:
    torch = pytest.importorskip("torch")
    fa = _flex(torch)
    from mha_symbolic.oracle.variants.score_mods import (
        alibi_score_mod,
        relative_bias_score_mod,
        softcap_score_mod,
    )

    gen = torch.Generator().manual_seed(71)
    q, k, v, do = (torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    table = torch.randn(2, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.25, 0.5], dtype=torch.float64, requires_grad=True)

    def score_mod(score: Any, b: Any, h: Any, qi: Any, ki: Any) -> Any:
        s = 2.0 * torch.tanh(score / 2.0)
        s = s + table[h, torch.clamp(ki - qi, -3, 3) + 3]
        return s - slopes[h] * (ki - qi).abs()

    def causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return ki <= qi

    bm = fa.create_block_mask(causal, None, None, 5, 5, device="cpu")
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    out = fa.flex_attention(qq, kk, vv, score_mod=score_mod, block_mask=bm)
    got = torch.autograd.grad(out, (qq, kk, vv, table, slopes), do)
    mods = (softcap_score_mod(2.0), relative_bias_score_mod(table.detach().numpy()),
            alibi_score_mod(slopes.detach().numpy()))
    g = reference_attention_backward(q, k, v, do, score_mod=mods, mask_mod=causal)
    assert g.d_score_mod is not None
    for enc, t in zip((g.dq, g.dk, g.dv, g.d_score_mod[1], g.d_score_mod[2]), got, strict=True):
        _close_to(enc, t.detach().numpy())


def test_gpt_oss_style_sinks_float64_autograd_agrees() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(72)
    q, k, v, do = (torch.randn(2, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(4))
    sinks = torch.tensor([0.75, -0.5], dtype=torch.float64, requires_grad=True)
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    # gpt-oss sdpa: QK = cat([QK, S]); W = softmax(QK); W = W[..., :-1], sliding window 3
    s = (qq @ kk.transpose(-1, -2)) / 2.0
    i = torch.arange(5)[:, None]
    j = torch.arange(5)[None, :]
    s = s.masked_fill((j > i) | (j <= i - 3), -float("inf"))
    s = torch.cat([s, sinks.view(1, 2, 1, 1).expand(2, 2, 5, 1)], dim=-1)
    w = torch.softmax(s, dim=-1)[..., :-1]
    out = w @ vv
    got = torch.autograd.grad(out, (qq, kk, vv, sinks), do)
    g = reference_attention_backward(q, k, v, do, is_causal=True, window=(2, 0), sinks=sinks.detach())
    for enc, t in zip((g.dq, g.dk, g.dv, g.d_sinks), got, strict=True):
        _close_to(enc, t.detach().numpy())


def test_jax_local_window_vjp_agrees() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    rng = np.random.default_rng(73)
    q, k, v, do = (rng.standard_normal((1, 6, 2, 4)) for _ in range(4))   # (B, T, N, H)

    def f(q_: Any, k_: Any, v_: Any) -> Any:
        return jax.nn.dot_product_attention(q_, k_, v_, local_window_size=(2, 1))

    _, vjp = jax.vjp(f, jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    got = vjp(jnp.asarray(do))
    def t(x: Any) -> np.ndarray:   # to (B, N, T, H)
        return np.swapaxes(np.asarray(x), 1, 2)

    g = reference_attention_backward(t(q), t(k), t(v), t(do), window=(2, 1))
    # jax's softmax always runs in float32 (_dot_product_attention_core: "Softmax and it
    # is always carried out in fp32"): agreement to float32 accuracy; a window one key
    # off changes the gradients at the 1e-1 level
    for enc, x in zip((g.dq, g.dk, g.dv), got, strict=True):
        _close_to(enc, t(x), rtol=1e-5)
    wrong = reference_attention_backward(t(q), t(k), t(v), t(do), window=(3, 1))
    assert np.max(np.abs(np.asarray(wrong.dq.midpoint) - t(got[0]))) > 1e-3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_softcap_gradients_of_a_simulated_low_precision_kernel_pass(dtype: str) -> None:
    """plain_backward(dtype=…) rounds every stored tensor (t, the capped scores, P, dP,
    dS', dS'∘(1 − t²), the gradients) as a MATH-style kernel: its gradients lie within
    the softcap model's tolerance, and the same kernel without the derivative does not."""
    import ml_dtypes

    from mha_symbolic.oracle.variants.protocol import VariantOptions
    from mha_symbolic.testing.backward.bugs import plain_backward
    from mha_symbolic.testing.call import AttentionCall

    dt = np.dtype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(47)
    for _ in range(3):
        q, k, v, do = ((rng.standard_normal((1, 2, 12, 16)) * 2).astype(dt) for _ in range(4))
        x = AttentionCall(*(np.asarray(a, np.float64) for a in (q, k, v)),
                          do=np.asarray(do, np.float64),
                          opts=VariantOptions(softcap=3.0),
                           is_causal=True)
        for deriv in (True, False):
            sim = plain_backward(x, dtype=dt, softcap_derivative=deriv)
            got = [np.asarray(g).astype(dt) for g in (sim.dq, sim.dk, sim.dv)]
            res = compare_attention_backward(*got, q, k, v, do, softcap=3.0, is_causal=True)
            assert res.passed == deriv, res.report()


@pytest.mark.parametrize("bug", [None, "window_missing_in_backward",
                                 "alibi_slopes_reversed_in_backward",
                                 "softcap_derivative_missing"])
def test_variant_backward_mutants_of_the_independent_kernel_are_caught_and_named(
        bug: str | None) -> None:
    """tests/kernels/variant_backward_kernels.py (FlashAttention-2-style, written from the
    sources, bf16): the correct kernel passes, each mutant fails with its own name."""
    import ml_dtypes
    import variant_backward_kernels as vbk

    dt = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(48)
    H, E, L, S = 4, 32, 24, 40
    q = (rng.standard_normal((1, H, L, E)) * 2).astype(dt)
    k, v, do = (rng.standard_normal((1, H, n, E)).astype(dt) for n in (S, S, L))
    slopes = np.array([1.0, 0.25, 0.0625, 0.5])
    out = vbk.variant_backward(q, k, v, do, dtype=dt, bug=bug, window=(9, 3), alibi=slopes,
                               softcap=2.0, causal=True, align="bottom_right")
    got = [out[n].astype(dt) for n in ("dq", "dk", "dv")]
    res = compare_attention_backward(*got, q, k, v, do, window=(9, 3), softcap=2.0,
                                     alibi_slopes=slopes.astype(np.float32), is_causal=True,
                                     causal_alignment="bottom_right")
    if bug is None:
        assert res.passed, res.report()
    else:
        assert not res.passed
        assert res.diagnoses and res.diagnoses[0].bug == bug, res.report()
        assert f"'{bug}'" in res.report()


def _sinks_alibi_autograd(torch: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                          do: np.ndarray, sinks: np.ndarray, slopes: np.ndarray
                          ) -> tuple[np.ndarray, ...]:
    """gpt-oss sinks + ALiBi (causal), float32 autograd: dq, dk, dv, d_sinks, d_slopes."""
    sk = torch.from_numpy(sinks).requires_grad_()
    sl = torch.from_numpy(slopes).requires_grad_()
    qq, kk, vv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    B, H, L, E = q.shape
    s = (qq @ kk.transpose(-1, -2)) / float(np.sqrt(E))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    s = (s - sl.view(1, H, 1, 1) * (i - j).abs()).masked_fill(j > i, -float("inf"))
    s = torch.cat([s, sk.view(1, H, 1, 1).expand(B, H, L, 1)], dim=-1)
    out = torch.softmax(s, dim=-1)[..., :-1] @ vv
    return tuple(g.detach().numpy() for g in
                 torch.autograd.grad(out, (qq, kk, vv, sk, sl), torch.from_numpy(do)))


def test_sink_and_slope_gradients_are_judged_and_a_flipped_sign_or_reversed_slopes_fail(
        ) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(49)
    q, k, v, do = (rng.standard_normal((2, 2, 9, 16)).astype(np.float32) for _ in range(4))
    sinks = np.array([0.5, -1.0], np.float32)
    slopes = np.array([0.5, 0.125], np.float32)
    dq, dk, dv, d_sinks, d_slopes = _sinks_alibi_autograd(torch, q, k, v, do, sinks, slopes)
    opts = {"sinks": sinks, "alibi_slopes": slopes, "is_causal": True}
    good = compare_attention_backward(dq, dk, dv, q, k, v, do, d_sinks=d_sinks,
                                      d_alibi_slopes=d_slopes, **opts)
    assert good.passed and set(good.gradients) >= {"d_sinks", "d_alibi_slopes"}, good.report()
    bad = compare_attention_backward(dq, dk, dv, q, k, v, do, d_sinks=-d_sinks,
                                     d_alibi_slopes=d_slopes[::-1].copy(), **opts)
    assert not bad.passed
    assert not bad.gradients["d_sinks"].passed and not bad.gradients["d_alibi_slopes"].passed
    assert bad.gradients["dq"].passed
    with pytest.raises(SpecError, match="d_sinks"):
        compare_attention_backward(dq, dk, dv, q, k, v, do, d_sinks=d_sinks,
                                   alibi_slopes=slopes, is_causal=True)
    with pytest.raises(ShapeError, match="d_alibi_slopes"):
        compare_attention_backward(dq, dk, dv, q, k, v, do, d_alibi_slopes=d_slopes[:1],
                                   **opts)
