"""compare_attention with rotary embeddings: no false alarm on RoPE written as real code
writes it (tests/kernels/rotary_kernels.py: HF's rotate_half with fp32 inv_freq/cos/sin,
GPT-J's interleaved pairs, FlashAttention-style tables), every rotary bug class caught
and named, and the error hook's term checked against the actual score errors of a real
fp32 RoPE at long positions (the angle term is needed there, and sufficient)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the real-style rotary kernels are torch code")

from rotary_kernels import apply, fa_tables_attention, hf_attention, hf_cos_sin  # noqa: E402

import mha_symbolic as ms  # noqa: E402
from mha_symbolic.errors import AttentionMismatchError  # noqa: E402
from mha_symbolic.oracle.variants.registry import variant_options  # noqa: E402
from mha_symbolic.oracle.variants.rotary import error_terms  # noqa: E402
from mha_symbolic.testing.call import AttentionCall  # noqa: E402
from mha_symbolic.testing.forward.bugs_variants import plain_variant  # noqa: E402
from mha_symbolic.testing.tolerance import error_model  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _qkv(L: int, S: int, E: int, dtype: torch.dtype, seed: int, B: int = 1, H: int = 2):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, E, generator=g).to(dtype) for n in (L, S, S))


HF_CASES = {
    "neox": ({"base": 10000.0}, {"rotary_base": 10000.0}),
    "gptj": ({"base": 10000.0, "interleaved": True},
             {"rotary_base": 10000.0, "rotary_interleaved": True}),
    "partial": ({"base": 10000.0, "rotary_dim": 16}, {"rotary_base": 10000.0, "rotary_dim": 16}),
    "scaled": ({"base": 500000.0, "scale": 4.0},
               {"rotary_base": 500000.0, "rotary_position_scale": 4.0}),
    "fp32_rotation": ({"base": 10000.0, "fp32_rotation": True}, {"rotary_base": 10000.0}),
    "rdim_24": ({"base": 10000.0, "rotary_dim": 24}, {"rotary_base": 10000.0, "rotary_dim": 24}),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(HF_CASES))
@pytest.mark.parametrize("L,S", [(8, 64), (1, 300)])
def test_hf_style_rope_has_no_false_alarm(dtype, case, L, S):
    kern, ours = HF_CASES[case]
    for seed in range(2):
        q, k, v = _qkv(L, S, 32, dtype, seed)
        out = hf_attention(q, k, v, **kern)
        res = ms.compare_attention(out, q, k, v, **ours)
        assert res.passed, res.report()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
def test_flashattention_style_tables_have_no_false_alarm(dtype, interleaved):
    L, S, E = 8, 96, 32
    g = torch.Generator().manual_seed(3)
    ang = torch.rand(S, 8, generator=g) * 2 * torch.pi * 40     # rotary_dim 16
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)         # FA: tables in q's dtype
    for seed in range(2):
        q, k, v = _qkv(L, S, E, dtype, seed)
        out = fa_tables_attention(q, k, v, cos, sin, interleaved=interleaved)
        res = ms.compare_attention(out, q, k, v, rotary_cos=cos, rotary_sin=sin,
                                   rotary_interleaved=interleaved)
        assert res.passed, res.report()


def test_decode_with_kv_cache_rotates_queries_at_the_sequence_end():
    # two sequences of a cache of 40 slots, valid lengths 17 and 40, one new query each:
    # the query of sequence b sits at position cache_seqlens[b] - 1
    S, E = 40, 32
    n = [17, 40]
    q, k, v = _qkv(1, S, E, torch.float32, 5, B=2)
    outs = [hf_attention(q[b:b + 1], k[b:b + 1, :, :n[b]], v[b:b + 1, :, :n[b]],
                         base=10000.0) for b in range(2)]
    out = torch.cat(outs)
    res = ms.compare_attention(out, q, k, v, rotary_base=10000.0,
                               cache_seqlens=np.array(n))
    assert res.passed, res.report()
    wrong = torch.cat([hf_attention(q[b:b + 1], k[b:b + 1, :, :n[b]], v[b:b + 1, :, :n[b]],
                                    base=10000.0, q_offset=S - 1) for b in range(2)])
    res = ms.compare_attention(wrong, q, k, v, rotary_base=10000.0, cache_seqlens=np.array(n))
    assert not res.passed


BUGS_HF = ["rotary_interleaved_swapped", "rotary_positions_not_offset", "rotary_angles_bf16",
           "rotary_angles_fp16", "rotary_dim_ignored", "rotary_inv_freq_head_dim"]
PARTIAL = ("rotary_dim_ignored", "rotary_inv_freq_head_dim")


@pytest.mark.parametrize("bug", BUGS_HF)
def test_each_rotary_bug_is_caught_and_named_fp32(bug):
    q, k, v = _qkv(8, 256, 32, torch.float32, 11)
    kw = {"rotary_dim": 16} if bug in PARTIAL else {}
    out = hf_attention(q, k, v, base=10000.0, bug=bug, **kw)
    res = ms.compare_attention(out, q, k, v, rotary_base=10000.0, **kw)
    assert not res.passed
    assert res.diagnoses and res.diagnoses[0].bug == bug, [d.bug for d in res.diagnoses]


@pytest.mark.parametrize("bug", ["rotary_interleaved_swapped", "rotary_positions_not_offset",
                                 "rotary_dim_ignored", "rotary_inv_freq_head_dim"])
def test_rotary_convention_bugs_are_caught_and_named_bf16(bug):
    q, k, v = _qkv(8, 256, 32, torch.bfloat16, 12)
    kw = {"rotary_dim": 16} if bug in PARTIAL else {}
    out = hf_attention(q, k, v, base=10000.0, bug=bug, **kw)
    res = ms.compare_attention(out, q, k, v, rotary_base=10000.0, **kw)
    assert not res.passed
    assert res.diagnoses and res.diagnoses[0].bug == bug, [d.bug for d in res.diagnoses]


@pytest.mark.parametrize("bug", ["rotary_interleaved_swapped", "rotary_positions_not_offset",
                                 "rotary_angles_bf16"])
def test_flashattention_table_bugs_are_caught_and_named(bug):
    L, S = 8, 128
    g = torch.Generator().manual_seed(4)
    ang = torch.rand(S, 16, generator=g) * 2 * torch.pi * 40
    cos, sin = ang.cos(), ang.sin()
    q, k, v = _qkv(L, S, 32, torch.float32, 13)
    out = fa_tables_attention(q, k, v, cos, sin, interleaved=True, bug=bug)
    res = ms.compare_attention(out, q, k, v, rotary_cos=cos, rotary_sin=sin,
                               rotary_interleaved=True)
    assert not res.passed
    assert res.diagnoses and res.diagnoses[0].bug == bug, [d.bug for d in res.diagnoses]


def test_error_hook_covers_real_fp32_rope_at_long_positions_and_the_angle_term_is_needed():
    # the actual score error of HF's fp32 RoPE against the exact rotation, per score,
    # against the hook's bound: within it, and beyond the bound without the angle term
    L, S, E = 4, 4096, 32
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, L, E, generator=g), torch.randn(1, 1, S, E, generator=g)
    cq, sq = hf_cos_sin(torch.arange(S - L, S), E, 10000.0)
    ck, sk = hf_cos_sin(torch.arange(S), E, 10000.0)
    qr = apply(q, cq, sq, E, False).double().numpy()[0, 0]
    kr = apply(k, ck, sk, E, False).double().numpy()[0, 0]
    opts = variant_options(rotary_base=10000.0)
    qn, kn = q.double().numpy(), k.double().numpy()
    vp = plain_variant(AttentionCall(qn, kn, kn, opts=opts, in_format="float32"))
    c = 1 / np.sqrt(E)
    err = np.abs(c * (qr @ kr.T) - c * (vp.q[0, 0] @ vp.k[0, 0].T))
    model = error_model("float32").with_events(1e3, 1e6)
    ind, var = error_terms(opts, vp, 0, slice(0, L), model)
    assert np.all(err <= ind) and np.all(var > 0)
    # the same rotation with its tables given (no angle term): the real errors exceed it
    c64, s64, _, _ = vp.rotation.spec.float_tables(S, E)
    opts2 = variant_options(rotary_cos=c64, rotary_sin=s64)
    vp2 = plain_variant(AttentionCall(qn, kn, kn, opts=opts2, in_format="float32"))
    ind2, _ = error_terms(opts2, vp2, 0, slice(0, L), model)
    assert np.any(err > 10 * ind2)


def test_check_attention_judges_the_output_and_the_gradients():
    q, k, v = _qkv(4, 16, 16, torch.float32, 21)
    res = ms.check_attention(lambda q, k, v: hf_attention(q, k, v, base=10000.0), q, k, v,
                             rotary_base=10000.0)
    assert res.passed and res.backward is not None and res.backward.passed
    assert not res.no_gradients
    with pytest.raises(AttentionMismatchError):
        ms.check_attention(lambda q, k, v: hf_attention(q, k, v, base=10000.0,
                                                        bug="rotary_interleaved_swapped"),
                           q, k, v, rotary_base=10000.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_worst_case_model_has_no_false_alarm_and_still_catches_a_convention_bug(dtype):
    q, k, v = _qkv(8, 128, 32, dtype, 31)
    out = hf_attention(q, k, v, base=10000.0)
    res = ms.compare_attention(out, q, k, v, rotary_base=10000.0, error_model="worst_case")
    assert res.passed, res.report()
    bad = hf_attention(q, k, v, base=10000.0, bug="rotary_interleaved_swapped")
    assert not ms.compare_attention(bad, q, k, v, rotary_base=10000.0,
                                    error_model="worst_case").passed


@pytest.mark.parametrize("kw,name", [({"rotary_base": -5.0}, "rotary_base"),
                                     ({"rotary_base": 10.0, "rotary_dim": 7}, "rotary_dim"),
                                     ({"rotary_cos": np.ones((4, 8))}, "rotary_sin")])
def test_compare_attention_refuses_bad_rotary_options_in_one_line(kw, name):
    q, k, v = _qkv(2, 8, 16, torch.float32, 1)
    with pytest.raises(ms.MhaSymbolicError) as info:
        ms.compare_attention(v[..., :2, :], q, k, v, **kw)
    assert name in str(info.value) and "\n" not in str(info.value)
