"""check_attention and the fixture's .check: a kernel run forward and backward through
its own autograd, output and gradients judged in one call."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mha_symbolic import AttentionMismatchError, check_attention
from mha_symbolic.errors import SpecError


def test_torch_sdpa_passes_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    torch.manual_seed(0)
    q = torch.randn(1, 4, 9, 16, dtype=torch.bfloat16)
    k2 = torch.randn(1, 2, 9, 16, dtype=torch.bfloat16)
    v2 = torch.randn(1, 2, 9, 16, dtype=torch.bfloat16)
    res = check_attention(F.scaled_dot_product_attention, q, k2, v2, is_causal=True,
                          enable_gqa=True)
    assert res.passed and res.framework == "torch" and res.backward is not None
    assert res.grad_output is not None and tuple(res.grad_output.shape) == (1, 4, 9, 16)
    assert "grad_key (dk): passed" in res.report()
    # the caller's tensors are untouched (no grad attached to them)
    assert q.grad is None and not q.requires_grad


def test_a_kernel_with_a_backward_bug_fails_with_the_diagnosis() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    class NoScaleInDq(torch.autograd.Function):
        """Exact forward; the backward forgets the scale in dQ (a bug of the catalogue)."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            ctx.save_for_backward(q, k, v)
            return F.scaled_dot_product_attention(q, k, v)

        @staticmethod
        def backward(ctx: Any, do: Any) -> Any:
            q, k, v = ctx.saved_tensors
            c = q.shape[-1] ** -0.5
            p = torch.softmax(c * q @ k.transpose(-1, -2), dim=-1)
            dp = do @ v.transpose(-1, -2)
            ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            return ds @ k, c * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do

    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 6, 16) for _ in range(3))
    with pytest.raises(AttentionMismatchError) as info:
        check_attention(NoScaleInDq.apply, q, k, v)
    text = str(info.value)
    assert "grad_query (dq): FAILED" in text and "scale_missing_in_dq" in text
    assert "attention output is close to" in text


def test_float_mask_gradient_is_checked_when_it_requires_grad() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 5, 8, dtype=torch.float64) for _ in range(3))
    m = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    res = check_attention(F.scaled_dot_product_attention, q, k, v, attn_mask=m)
    assert res.backward is not None and "d_attn_mask" in res.backward.gradients


def test_jax_kernel_is_differentiated_with_vjp() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def attn(q: Any, k: Any, v: Any) -> Any:   # (L, E) inputs, plain softmax attention
        s = q @ k.T / jnp.sqrt(q.shape[-1])
        return jax.nn.softmax(s, axis=-1) @ v

    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal((6, 8)).astype(np.float32)) for _ in range(3))
    res = check_attention(attn, q, k, v, pass_options=False)
    assert res.passed and res.framework == "jax" and res.backward is not None


def test_numpy_kernel_is_checked_forward_only() -> None:
    def attn(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        s = q @ k.T / np.sqrt(q.shape[-1])
        w = np.exp(s - s.max(-1, keepdims=True))
        return (w / w.sum(-1, keepdims=True)) @ v

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((4, 8)) for _ in range(3))
    res = check_attention(attn, q, k, v)
    assert res.passed and res.backward is None and "output only" in res.report()
    res = check_attention(lambda q, k, v: 0 * attn(q, k, v), q, k, v, raise_on_failure=False)
    assert not res.passed


def test_unknown_options_are_refused() -> None:
    with pytest.raises(SpecError, match=r"check_attention\(\) got an unexpected keyword "
                       r"argument 'tolerance'"):
        check_attention(lambda q, k, v: q, np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                        tolerance=3)


pytest_plugins = ["pytester"]


def test_fixture_check_runs_forward_and_backward(pytester: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import importlib.metadata
    import os
    from pathlib import Path

    import mha_symbolic

    root = str(Path(mha_symbolic.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", root if not old else root + os.pathsep + old)
    eps = importlib.metadata.entry_points(group="pytest11")
    args = [] if any(ep.value == "mha_symbolic.testing.pytest_plugin" for ep in eps) else [
        "-p", "mha_symbolic.testing.pytest_plugin"]
    pytester.makepyfile("""
        import torch, torch.nn.functional as F

        def test_sdpa(attention_oracle):
            q, k, v = (torch.randn(1, 3, 16) for _ in range(3))
            res = attention_oracle.check(F.scaled_dot_product_attention, q, k, v)
            assert res.backward.passed

        def test_broken(attention_oracle):
            q, k, v = (torch.randn(1, 3, 16) for _ in range(3))
            attention_oracle.check(lambda q, k, v: F.scaled_dot_product_attention(q, v, k), q, k, v)
    """)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*AttentionMismatchError*"])


def _windowed_sdpa(torch: Any, left: int, slopes: Any = None) -> Any:
    """SDPA with a causal sliding window of ``left`` keys (and ALiBi) as an explicit
    float mask, as a kernel under test would apply them itself."""
    def fn(q: Any, k: Any, v: Any) -> Any:
        L, S = q.shape[-2], k.shape[-2]
        i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
        keep = (j <= i) & (j >= i - left)
        bias = torch.zeros(L, S, dtype=q.dtype)
        if slopes is not None:
            bias = -torch.as_tensor(slopes, dtype=q.dtype)[:, None, None] * (i - j).abs()
        mask = torch.where(keep, bias, torch.tensor(-float("inf"), dtype=q.dtype))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return fn


def test_variants_describe_the_exact_answer_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=gen) for _ in range(3))
    slopes = np.array([0.5, 0.25], np.float32)
    opts = {"window": (2, 0), "is_causal": True, "alibi_slopes": slopes}
    res = check_attention(_windowed_sdpa(torch, 2, slopes), q, k, v, pass_options=False,
                          **opts)
    assert res.passed and res.backward is not None
    # a window one key too wide: forward and gradients both fail
    bad = check_attention(_windowed_sdpa(torch, 3, slopes), q, k, v, pass_options=False,
                          raise_on_failure=False, **opts)
    assert not bad.passed and bad.backward is not None and not bad.backward.passed
    assert not bad.output.passed


def test_softcap_is_checked_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen) * 2 for _ in range(3))

    def capped(q_: Any, k_: Any, v_: Any, derivative: bool = True) -> Any:
        s = (q_ @ k_.transpose(-1, -2)) / 8 ** 0.5
        c = 5.0 * torch.tanh(s / 5.0)
        s = c if derivative else s + (c - s).detach()
        return torch.softmax(s, dim=-1) @ v_

    res = check_attention(capped, q, k, v, softcap=5.0)
    assert res.passed and res.backward is not None
    bad = check_attention(lambda a, b, c: capped(a, b, c, False), q, k, v, softcap=5.0,
                          raise_on_failure=False)
    assert bad.output.passed and bad.backward is not None and not bad.backward.passed
    assert "softcap_derivative_missing" in bad.report()
