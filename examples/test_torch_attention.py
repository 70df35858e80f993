"""Example: testing PyTorch's attention on CPU against the exact answer.

``torch.nn.functional.scaled_dot_product_attention`` (default and MATH backends)
and ``torch.nn.MultiheadAttention``, in float64/float32/float16/bfloat16, with
boolean and additive masks, causal masks, grouped-query attention and
cross-attention.  Skipped when torch is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch example needs torch (pip install torch)")
F = torch.nn.functional

from mha_symbolic import AttentionMismatchError, assert_attention_close  # noqa: E402
from mha_symbolic.testing.forward.mha import assert_mha_close  # noqa: E402

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
BACKENDS = ["default", "math"]


def _sdpa(backend: str, *args: Any, **kwargs: Any) -> Any:
    if backend == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(*args, **kwargs)
    return F.scaled_dot_product_attention(*args, **kwargs)


def _qkv(dtype: Any, hq: int, hkv: int, L: int, S: int, E: int, seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, hq, L, E, generator=g).to(dtype),
            torch.randn(2, hkv, S, E, generator=g).to(dtype),
            torch.randn(2, hkv, S, E, generator=g).to(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_self_attention(dtype: Any, backend: str) -> None:
    q, k, v = _qkv(dtype, 4, 4, 12, 12, 16, seed=0)
    assert_attention_close(_sdpa(backend, q, k, v), q, k, v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_causal_cross_attention(dtype: Any, backend: str) -> None:
    q, k, v = _qkv(dtype, 2, 2, 7, 11, 8, seed=1)            # n_q != n_k: top-left causal
    out = _sdpa(backend, q, k, v, is_causal=True)
    assert_attention_close(out, q, k, v, is_causal=True, causal_alignment="top_left")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_bool_and_float_masks(dtype: Any, backend: str) -> None:
    q, k, v = _qkv(dtype, 2, 2, 6, 9, 8, seed=2)
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(6, 9, generator=g) < 0.7                # True = takes part
    keep[:, 0] = True
    assert_attention_close(_sdpa(backend, q, k, v, attn_mask=keep), q, k, v, attn_mask=keep)
    bias = torch.randn(6, 9, generator=g).to(dtype)
    assert_attention_close(_sdpa(backend, q, k, v, attn_mask=bias), q, k, v, attn_mask=bias)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sdpa_grouped_query_attention(dtype: Any, backend: str) -> None:
    q, k, v = _qkv(dtype, 6, 2, 5, 8, 8, seed=4)
    out = _sdpa(backend, q, k, v, enable_gqa=True)
    assert_attention_close(out, q, k, v, enable_gqa=True)


def test_a_gqa_mapping_by_tile_is_caught_and_diagnosed() -> None:
    q, k, v = _qkv(torch.float32, 4, 2, 5, 8, 8, seed=5)
    k_tiled, v_tiled = k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1)  # tile, not interleave
    wrong = F.scaled_dot_product_attention(q, k_tiled, v_tiled)
    with pytest.raises(AttentionMismatchError, match="gqa_tile"):
        assert_attention_close(wrong, q, k, v, enable_gqa=True)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multihead_attention_module(dtype: Any, batch_first: bool) -> None:
    torch.manual_seed(6)
    E, h = 16, 4
    mha = torch.nn.MultiheadAttention(E, h, batch_first=batch_first).to(dtype).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    x = torch.randn(2, 5, E).to(dtype)                         # (N, L, E)
    mem = torch.randn(2, 7, E).to(dtype)                       # cross-attention memory
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, -2:] = True                                         # True = ignore (torch MHA)
    xs, ms = (x, mem) if batch_first else (x.transpose(0, 1), mem.transpose(0, 1))
    with torch.no_grad():
        out, _ = mha(xs, ms, ms, key_padding_mask=pad, need_weights=False)
    assert_mha_close(
        out, xs, ms, ms, num_heads=h, batch_first=batch_first,
        in_proj_weight=mha.in_proj_weight, in_proj_bias=mha.in_proj_bias,
        out_proj_weight=mha.out_proj.weight, out_proj_bias=mha.out_proj.bias,
        key_padding_mask=pad,
    )


def test_multihead_attention_module_read_through_module_argument() -> None:
    torch.manual_seed(7)
    mha = torch.nn.MultiheadAttention(12, 3, batch_first=True).eval()
    x = torch.randn(2, 6, 12)
    with torch.no_grad():
        out, _ = mha(x, x, x, need_weights=False, attn_mask=torch.ones(6, 6).triu(1).bool())
    causal = torch.ones(6, 6).triu(1).bool()                  # True = masked out (torch MHA)
    assert_mha_close(out, x, x, x, module=mha, attn_mask=causal,
                     accumulation_dtype="float32")
