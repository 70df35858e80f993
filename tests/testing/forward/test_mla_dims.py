"""MLA-style head dims (issue 24): the value dim differs from the query/key dim, as in
DeepSeek's MLA (192 for q·k — 128 nope + 64 rope — and 128 for v).  Expected values
come from an mpmath loop written here (small case) and from torch's own kernels; the
planted bug is the real one of MLA ports: the scale taken from the value dim."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import mha_symbolic as ms


def test_reference_with_a_value_dim_unlike_the_key_dim_equals_an_mpmath_loop() -> None:
    rng = np.random.default_rng(3)
    L, S, E, Ev = 3, 5, 6, 4
    q, k, v = (rng.standard_normal(s) for s in ((L, E), (S, E), (S, Ev)))
    got = ms.reference_attention(q, k, v).rounded("float64")
    with mpmath.workdps(60):
        c = 1 / mpmath.sqrt(E)
        for i in range(L):
            s = [c * mpmath.fsum(mpmath.mpf(q[i, t]) * mpmath.mpf(k[j, t]) for t in range(E))
                 for j in range(S)]
            m = max(s)
            w = [mpmath.exp(x - m) for x in s]
            z = mpmath.fsum(w)
            for col in range(Ev):
                o = mpmath.fsum(w[j] * mpmath.mpf(v[j, col]) for j in range(S)) / z
                assert got[i, col] == float(o)       # mpmath rounds to nearest


def _bf16_case(seed: int):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    B, H, L, E, Ev = 1, 4, 128, 192, 128
    q = torch.randn(B, H, L, E, generator=g).to(torch.bfloat16)
    k = torch.randn(B, H, L, E, generator=g).to(torch.bfloat16)
    v = torch.randn(B, H, L, Ev, generator=g).to(torch.bfloat16)
    return torch, q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_mla_dims_bf16_sdpa_passes_and_the_value_dim_scale_fails(causal: bool) -> None:
    torch, q, k, v = _bf16_case(7)
    F = torch.nn.functional
    ok = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert ok.shape[-1] == 128
    comp = ms.compare_attention(ok, q, k, v, is_causal=causal)
    assert comp.passed, comp.report()
    # the scale from the value dim: 1/sqrt(128) for 1/sqrt(192)
    bad = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / math.sqrt(128))
    comp = ms.compare_attention(bad, q, k, v, is_causal=causal)
    assert not comp.passed


def test_mla_dims_fp32_gradients_of_torch_autograd_pass() -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 64, 192, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 64, 192, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 64, 128, generator=g, requires_grad=True)
    do = torch.randn(1, 2, 64, 128, generator=g)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(do)
    comp = ms.compare_attention_backward(q.grad, k.grad, v.grad, q.detach(), k.detach(),
                                         v.detach(), do, is_causal=True)
    assert comp.passed, comp.report()
    # dq with the value dim's scale is caught
    wrong = q.grad * math.sqrt(192 / 128)
    assert not ms.compare_attention_backward(wrong, k.grad, v.grad, q.detach(), k.detach(),
                                             v.detach(), do, is_causal=True).passed
