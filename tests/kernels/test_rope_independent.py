"""Fast cases of the independent RoPE kernels (tests/kernels/rope_independent.py): the
kernels transcribed from HF, FlashAttention, GPT-J, vLLM and Meta's llama agree with one
another and with a float64 rotation written here, pass ms.compare_attention, and three
bugs from real reports fail it, named."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import mha_symbolic as ms  # noqa: E402
from tests.kernels import rope_independent as ri  # noqa: E402


def _inputs(L: int, S: int, D: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, D, generator=g).to(dtype) for n in (L, S, S))


def _rotate64(x, pos, rd: int, interleaved: bool, base: float = 10000.0):
    """x' pair by pair in float64 (math.cos/sin of the exact-ish angle), dims >= rd kept."""
    out = x.double().clone()
    for m in range(rd // 2):
        a, b = (2 * m, 2 * m + 1) if interleaved else (m, m + rd // 2)
        theta = pos.double() * base ** (-2 * m / rd)
        c = torch.tensor([math.cos(t) for t in theta.tolist()], dtype=torch.float64)
        s = torch.tensor([math.sin(t) for t in theta.tolist()], dtype=torch.float64)
        xa, xb = x[..., a].double(), x[..., b].double()
        out[..., a], out[..., b] = xa * c - xb * s, xb * c + xa * s
    return out


@pytest.mark.parametrize("name", sorted(ri.KERNELS))
def test_kernels_match_a_float64_rotation(name):
    kern = ri.KERNELS[name]
    L, S, D = 4, 64, 32
    spec = ri.spec_for(kern, rotary_dim=16, causal=True)
    q, k, v = _inputs(L, S, D, torch.float32, 1)
    rd = spec.rotary_dim or D
    qpos = torch.arange(S - L, S) / spec.position_scale
    kpos = torch.arange(S) / spec.position_scale
    q64 = _rotate64(q, qpos, rd, spec.interleaved)
    k64 = _rotate64(k, kpos, rd, spec.interleaved)
    mask = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v.double(), attn_mask=mask)
    out = ri.run(kern, q, k, v, spec)
    assert (out.double() - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", ["hf_llama", "fa_torch", "gptj", "vllm_neox", "meta_llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_correct_kernels_pass(name, dtype):
    kern = ri.KERNELS[name]
    spec = ri.spec_for(kern, rotary_dim=32, causal=True)
    q, k, v = _inputs(8, 512, 64, getattr(torch, dtype), 2)
    out = ri.run(kern, q, k, v, spec)
    res = ms.compare_attention(out, q, k, v, **ri.ms_keywords(kern, spec, q, k))
    assert res, res.summary()


@pytest.mark.parametrize("name, bug, named", [
    ("vllm_neox", "no_offset", "rotary_positions_not_offset"),
    ("vllm_gptj", "pairs_mixup", "rotary_interleaved_swapped"),
    ("hf_llama", "inv_freq_lowp", "rotary_angles_bf16"),
])
def test_bugs_fail_and_are_named(name, bug, named):
    kern = ri.KERNELS[name]
    spec = ri.spec_for(kern, rotary_dim=None, causal=True)
    q, k, v = _inputs(8, 1024, 64, torch.bfloat16, 3)
    out = ri.run(kern, q, k, v, spec, bug)
    res = ms.compare_attention(out, q, k, v, **ri.ms_keywords(kern, spec, q, k))
    assert not res
    assert named in [d.bug for d in res.diagnoses], res.summary()


def test_inv_freq_over_the_head_dim_is_named_first_not_rotary_dim_ignored():
    # transformers#48652's bug (rotary_dim dims rotated, inv_freq over the head dim) fit
    # rotary_dim_ignored's loose bf16 bound; its own class fits it far closer
    kern = ri.KERNELS["gptj"]
    spec = ri.spec_for(kern, rotary_dim=32, causal=True)
    q, k, v = _inputs(8, 1024, 64, torch.bfloat16, 5)
    out = ri.run(kern, q, k, v, spec, "inv_freq_headdim")
    res = ms.compare_attention(out, q, k, v, **ri.ms_keywords(kern, spec, q, k))
    assert not res
    assert res.diagnoses[0].bug == "rotary_inv_freq_head_dim", res.summary()


def test_rotary_on_v_fails():
    kern = ri.KERNELS["meta_llama"]
    spec = ri.spec_for(kern, rotary_dim=None, causal=False)
    q, k, v = _inputs(4, 256, 64, torch.float32, 4)
    out = ri.run(kern, q, k, v, spec, "rotary_on_v")
    assert not ms.compare_attention(out, q, k, v, **ri.ms_keywords(kern, spec, q, k))


@pytest.mark.parametrize("seed", [1, 21])
def test_llama_cpp_running_product_angles_are_not_a_false_alarm(seed):
    # h24k's finding: ggml builds pair m's angle by m fp32 multiplications (theta *=
    # theta_scale), up to ~47 u·θ against HF's ~3 u·θ; at S = 4096 it failed at 1.44×
    # tolerance until the dtype level emulated those angles (and the model bounded them)
    kern, spec = ri.KERNELS["llama_cpp_neox"], ri.Spec(base=10000.0, interleaved=False)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 1, 128, generator=g)
    k = torch.randn(1, 2, 4096, 128, generator=g)
    v = torch.randn(1, 2, 4096, 128, generator=g)
    out = ri.run(kern, q, k, v, spec)
    assert ms.compare_attention(out, q, k, v, rotary_base=10000.0,
                                rotary_interleaved=False).passed
    # the model alone (no dtype level) is sound for it too
    assert ms.compare_attention(out, q, k, v, rotary_base=10000.0, rotary_interleaved=False,
                                rule="model").passed
