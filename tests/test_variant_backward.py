"""Tests of the gradients with variants (mha_symbolic.oracle.variant_backward and the
variant options of reference_attention_backward / compare_attention_backward).

Expected values: the backward formulas written out here in Arb at 800 bits, one
element at a time, from the exact scores of tests/test_variants.py's conventions
(window as FlashAttention's, ALiBi -slope·|i + off - j|, a sink in the denominator
only: it is a key of value 0, so dP_{i,sink} = 0):
P = softmax over kept keys and the sink, dV = Pᵀ dO, dP = dO Vᵀ, D_i = Σ_j P_ij dP_ij,
dS = P ∘ (dP − D), dQ = c·dS K, dK = c·dSᵀ Q; and torch autograd of explicit masks."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mha_symbolic.errors import SpecError
from mha_symbolic.oracle.backward import reference_attention_backward
from mha_symbolic.testing.backward import compare_attention_backward

flint = pytest.importorskip("flint")
from test_variants import PREC, A, F, ref_rounded  # noqa: E402  (tests/ is on sys.path)

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


@pytest.mark.parametrize("opts,msg", [
    ({"softcap": 2.0}, "softcap"),
    ({"q_descale": np.ones((1, 2), np.float32)}, "descale"),
    ({"alibi_slopes": np.array([0.1, 1 / 3])}, "exact double"),
])
def test_backward_refuses_what_it_cannot_certify(opts: dict, msg: str) -> None:
    q, k, v, do = _inputs(4, 4, seed=42)   # |d| = 3: 0.1·3 is not a double
    with pytest.raises(SpecError, match=msg):
        reference_attention_backward(q, k, v, do, **opts)


def test_compare_backward_refuses_sinks_with_the_reason() -> None:
    q, k, v, do = _inputs(2, 2, seed=43)
    with pytest.raises(SpecError, match="sinks"):
        compare_attention_backward(q, k, v, q, k, v, do, sinks=[0.0, 0.0])
