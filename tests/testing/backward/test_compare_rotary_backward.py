"""compare_attention_backward with rotary embeddings: no false alarm on torch autograd
through RoPE written as real code writes it (GPT-NeoX's ``rotate_half`` and GPT-J's
interleaved pairs, here in plain torch, then SDPA) in float32 and float64, with partial
rotary dims, position offsets (L < S, the KV cache), GQA, causal masks and tables; the
two rotary backward bug classes caught and named."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the kernels are torch autograd")
F = pytest.importorskip("torch.nn.functional")

import mha_symbolic as ms  # noqa: E402
from mha_symbolic.errors import SpecError  # noqa: E402


def neox_cos_sin(pos: torch.Tensor, r: int, base: float, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-NeoX / Llama: inv_freq = 1 / base^(arange(0, r, 2)/r), freqs = pos · inv_freq,
    in the model's dtype."""
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=dtype) / r))
    freqs = pos.to(dtype)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
               ) -> torch.Tensor:
    """The first r = 2·cos.shape[-1] dims rotated (GPT-NeoX halves or GPT-J pairs), the
    rest passed through (partial rotary, as GPT-NeoX's rotary_pct)."""
    r = 2 * cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    if interleaved:
        c2, s2 = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        out = rot * c2 + rotate_every_two(rot) * s2
    else:
        c2, s2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        out = rot * c2 + rotate_half(rot) * s2
    return torch.cat((out, rest), dim=-1)


def rope_attention(q, k, v, *, r, base=10000.0, interleaved=False, q_offset=None,
                   causal=False, tables=None, key_len=None, madd=None, bug=None):
    """RoPE then SDPA (GQA: k, v heads repeated); queries at q_offset + i (default
    S - L), keys at j, only the first ``key_len`` keys attended (a KV cache's valid
    rows), ``madd`` (L, S) a float mask added to the scores (HF's additive mask);
    returns (out, (q', k')) with q', k' keeping their .grad."""
    L, S = q.shape[-2], k.shape[-2]
    off = S - L if q_offset is None else q_offset
    if tables is not None:
        cq, sq = tables[0][off:off + L], tables[1][off:off + L]
        ck, sk = tables[0][:S], tables[1][:S]
    else:
        cq, sq = neox_cos_sin(torch.arange(off, off + L), r, base, q.dtype)
        ck, sk = neox_cos_sin(torch.arange(S), r, base, q.dtype)
    if bug == "rotation_missing":
        qr, kr = q, k
    else:
        qr, kr = apply_rope(q, cq, sq, interleaved), apply_rope(k, ck, sk, interleaved)
    qr.retain_grad()
    kr.retain_grad()
    rep = q.shape[-3] // k.shape[-3]
    ke, ve = kr.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    # causal with L < S: bottom-right aligned (the queries are the last positions)
    mask = None
    if causal:
        mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
    if key_len is not None:
        valid = (torch.arange(S) < key_len)[None, :].expand(L, S)
        mask = valid if mask is None else mask & valid
    if madd is not None:
        mask = madd if mask is None else madd.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(qr, ke, ve, attn_mask=mask), (qr, kr)


def _grads(dtype, seed, L, S, E, H=2, Hkv=2, bug=None, **kw):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, L, E, generator=g, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, Hkv, S, E, generator=g, dtype=dtype, requires_grad=True)
            for _ in range(2))
    out, (qr, kr) = rope_attention(q, k, v, bug=bug, **kw)
    do = torch.randn(out.shape, generator=g, dtype=dtype)
    out.backward(do)
    if bug == "rotation_not_transposed":
        dq, dk = qr.grad, kr.grad          # dQ', dK' returned without Rᵀ
    else:
        dq, dk = q.grad, k.grad
    return (dq, dk, v.grad), (q.detach(), k.detach(), v.detach(), do)


CASES = {
    # name: (L, S, E, H, Hkv, kernel keywords, compare_attention_backward keywords)
    "neox": (4, 9, 16, 2, 2, {"r": 16}, {"rotary_base": 10000.0}),
    "gptj": (4, 9, 16, 2, 2, {"r": 16, "interleaved": True},
             {"rotary_base": 10000.0, "rotary_interleaved": True}),
    "neox_partial": (3, 12, 16, 2, 2, {"r": 8}, {"rotary_base": 10000.0, "rotary_dim": 8}),
    "gptj_partial_base500": (3, 12, 16, 2, 2, {"r": 8, "base": 500.0, "interleaved": True},
                             {"rotary_base": 500.0, "rotary_dim": 8,
                              "rotary_interleaved": True}),
    "decode_gqa": (1, 20, 8, 4, 2, {"r": 8}, {"rotary_base": 10000.0, "enable_gqa": True}),
    "causal_offset": (5, 11, 16, 2, 2, {"r": 12, "causal": True},
                      {"rotary_base": 10000.0, "rotary_dim": 12, "is_causal": True,
                       "causal_alignment": "bottom_right"}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_torch_autograd_rope_has_no_false_alarm(dtype, case):
    L, S, E, H, Hkv, kern, ours = CASES[case]
    for seed in range(3):
        grads, (q, k, v, do) = _grads(dtype, seed, L, S, E, H, Hkv, **kern)
        res = ms.compare_attention_backward(*grads, q, k, v, do, **ours)
        assert res.passed, res.report()
        # not vacuous: the worst element uses a small part of its tolerance
        assert max(c.worst.ratio for c in res.gradients.values() if c.worst) < 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_tables_and_kv_cache_positions_have_no_false_alarm(dtype):
    L, S, E = 2, 10, 8
    g = torch.Generator().manual_seed(7)
    ang = torch.rand(16, 3, generator=g, dtype=torch.float64) * 50   # rotary_dim 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    for seed in range(3):
        grads, (q, k, v, do) = _grads(dtype, seed, L, S, E, r=6, tables=(cos, sin))
        res = ms.compare_attention_backward(*grads, q, k, v, do, rotary_cos=cos.numpy(),
                                            rotary_sin=sin.numpy())
        assert res.passed, res.report()
        # the KV cache: the queries are the newest rows of a 7-key sequence (positions
        # 5, 6), the cache's other rows not attended
        grads, (q, k, v, do) = _grads(dtype, seed, L, S, E, r=6, tables=(cos, sin),
                                      q_offset=5, key_len=7)
        res = ms.compare_attention_backward(*grads, q, k, v, do, rotary_cos=cos.numpy(),
                                            rotary_sin=sin.numpy(),
                                            cache_seqlens=np.array([7]))
        assert res.passed, res.report()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_an_additive_float_mask_has_no_false_alarm(dtype):
    # an additive mask: a bias, and -inf on a padded last key (a mask of the dtype's most
    # negative value gets no verdict, as without rotary: its score bound is vacuous)
    L, S, E = 3, 8, 16
    g = torch.Generator().manual_seed(5)
    madd = (torch.rand(L, S, generator=g, dtype=torch.float64) - 0.5).to(dtype)
    madd[:, -1] = float("-inf")
    for seed in range(3):
        grads, (q, k, v, do) = _grads(dtype, seed, L, S, E, r=8, madd=madd)
        res = ms.compare_attention_backward(*grads, q, k, v, do, attn_mask=madd.numpy(),
                                            rotary_base=10000.0, rotary_dim=8)
        assert res.passed, res.report()
        bad, _ = _grads(dtype, seed, L, S, E, r=8, madd=madd, bug="rotation_not_transposed")
        res = ms.compare_attention_backward(*bad, q, k, v, do, attn_mask=madd.numpy(),
                                            rotary_base=10000.0, rotary_dim=8)
        assert [d.bug for d in res.diagnoses][:1] == ["rotation_not_transposed"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bug", ["rotation_not_transposed", "rotation_missing"])
@pytest.mark.parametrize("case", ["neox", "gptj_partial_base500", "decode_gqa"])
def test_rotary_backward_bugs_fail_and_are_named(dtype, bug, case):
    L, S, E, H, Hkv, kern, ours = CASES[case]
    grads, (q, k, v, do) = _grads(dtype, 11, L, S, E, H, Hkv, bug=bug, **kern)
    res = ms.compare_attention_backward(*grads, q, k, v, do, **ours)
    assert not res.passed
    assert res.diagnoses and res.diagnoses[0].bug == bug, res.report()


def test_rotary_backward_check_refuses_what_it_cannot_judge():
    grads, (q, k, v, do) = _grads(torch.float32, 0, 2, 4, 8, r=8)
    with pytest.raises(SpecError, match="rule='flash'"):
        ms.compare_attention_backward(*grads, q, k, v, do, rotary_base=10000.0, rule="flash")


def _hf16_grads(dt, seed, L, S, E, *, bug=None, fp32_rotation=False):
    """HF's RoPE (tests/kernels/rotary_kernels: fp32 angles, the rotation in the input
    dtype, or in fp32 and stored) then SDPA in ``dt``, its autograd gradients; ``bug``:
    a planted backward bug."""
    from rotary_kernels import apply, hf_cos_sin

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, E, generator=g).to(dt).requires_grad_(True)
               for n in (L, S, S))
    do = torch.randn(1, 2, L, E, generator=g).to(dt)
    rd = torch.float32 if fp32_rotation else dt
    cq, sq = hf_cos_sin(torch.arange(S - L, S), E, 10000.0, 1.0, rd)
    ck, sk = hf_cos_sin(torch.arange(S), E, 10000.0, 1.0, rd)
    comp = torch.float32 if fp32_rotation else None
    qr, kr = apply(q, cq, sq, E, False, comp), apply(k, ck, sk, E, False, comp)
    qr.retain_grad()
    kr.retain_grad()
    F.scaled_dot_product_attention(qr, kr, v).backward(do)
    dq, dk = q.grad, k.grad
    if bug == "rotation_applied_twice":      # R dQ' where Rᵀ dQ' belongs (sin's sign)
        dq, dk = apply(qr.grad, cq, sq, E, False, comp), apply(kr.grad, ck, sk, E, False, comp)
    elif bug == "rotation_not_transposed":
        dq, dk = qr.grad, kr.grad
    return (dq, dk, v.grad), (*(x.detach() for x in (q, k, v)), do)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=str)
def test_sixteen_bit_rotation_gets_a_verdict_and_catches_bugs(dt):
    # HF rotates in bf16 (its products and sum rounded to bf16): the worst case of those
    # roundings' effect is vacuous (ToleranceError before); the probabilistic reading
    # decides, passes the correct kernels, fails the wrong rotations
    for seed in range(2):
        for fp32 in (False, True):
            grads, inputs = _hf16_grads(dt, seed, 4, 9, 16, fp32_rotation=fp32)
            res = ms.compare_attention_backward(*grads, *inputs, rotary_base=10000.0)
            assert res.passed, res.report()
        for bug in ("rotation_applied_twice", "rotation_not_transposed"):
            grads, inputs = _hf16_grads(dt, seed, 4, 9, 16, bug=bug)
            res = ms.compare_attention_backward(*grads, *inputs, rotary_base=10000.0)
            assert not res.passed


def test_bf16_rotation_under_the_worst_case_model_still_refuses():
    from mha_symbolic.errors import ToleranceError

    grads, inputs = _hf16_grads(torch.bfloat16, 0, 4, 9, 16)
    with pytest.raises(ToleranceError, match="no verdict"):
        ms.compare_attention_backward(*grads, *inputs, rotary_base=10000.0,
                                      error_model="worst_case")


@pytest.mark.parametrize("cap", [None, 1.5], ids=["plain", "softcap"])
def test_first_order_deviation_matches_the_jacobian_of_torch_autograd(cap):
    # sd of the first-order change of dQ', dK' under independent perturbations of q', k'
    # bounded by eq, ek: Σ J² e², J the Jacobian by torch autograd (double backward)
    from mha_symbolic.testing.backward.bugs import plain_backward
    from mha_symbolic.testing.backward.rotated import _first_order_sd
    from mha_symbolic.testing.call import AttentionCall

    rng = np.random.default_rng(3)
    L, S, E, c = 3, 5, 4, 0.7
    q, k, v, do = (rng.standard_normal((1, n, E)) for n in (L, S, S, L))
    mask = np.ones((1, L, S), dtype=bool)
    mask[0, 0, 3:] = False
    from mha_symbolic.oracle.variants.protocol import VariantOptions

    pb = plain_backward(AttentionCall(q, k, v, do=do, attn_mask=mask, scale=c,
                                      opts=VariantOptions(softcap=cap)))
    eq, ek = rng.random((1, L, E)), rng.random((1, S, E))
    sd_q, sd_k, wc_q, wc_k = _first_order_sd(pb, c, eq, ek, eq, ek)

    def grads(qq, kk):
        s0 = c * qq @ kk.T
        s = s0 if cap is None else cap * torch.tanh(s0 / cap)
        p = torch.softmax(s.masked_fill(~torch.tensor(mask[0]), float("-inf")), -1)
        dp = torch.tensor(do[0]) @ torch.tensor(v[0]).T
        ds = p * (dp - (p * dp).sum(-1, keepdim=True))
        if cap is not None:
            ds = ds * (1 - torch.tanh(s0 / cap) ** 2)
        return torch.cat([(c * ds @ kk).flatten(), (c * ds.T @ qq).flatten()])

    jq, jk = torch.autograd.functional.jacobian(grads, (torch.tensor(q[0]), torch.tensor(k[0])))
    jq, jk = jq.reshape(-1, L * E).numpy(), jk.reshape(-1, S * E).numpy()
    sd = np.sqrt(jq**2 @ (eq[0]**2).ravel() + jk**2 @ (ek[0]**2).ravel())
    np.testing.assert_allclose(sd_q.ravel(), sd[:L * E], rtol=1e-12)
    # dK': the key perturbations' coefficients bounded by Minkowski's inequality
    ratio = sd_k.ravel() / sd[L * E:]
    assert np.all(ratio >= 1 - 1e-12) and float(np.median(ratio)) < 3.0, ratio
    # the worst case of the same linear terms (shared perturbations): Σ |J|·e
    wc = np.abs(jq) @ eq[0].ravel() + np.abs(jk) @ ek[0].ravel()
    for got, want in ((wc_q.ravel(), wc[:L * E]), (wc_k.ravel(), wc[L * E:])):
        r = got / want
        assert np.all(r >= 1 - 1e-12) and float(np.median(r)) < 3.0, r


def pipeline_grads(dtype, seed, L, S, E, *, softcap=None, sink=None, alibi=None,
                   causal=False, bug=None):
    """Gemma-2 / gpt-oss style attention in plain torch, autograd: GPT-NeoX RoPE (all
    dims), scores c·q'·k', C·tanh(s/C) (``softcap``), −slope·|j − i| (``alibi``, L = S),
    the causal mask (bottom-right), gpt-oss's sink column (softmax then dropped);
    ``bug``: a rotary backward bug."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, L, E, generator=g, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, 2, S, E, generator=g, dtype=dtype, requires_grad=True)
            for _ in range(2))
    cq, sq = neox_cos_sin(torch.arange(S - L, S), E, 10000.0, dtype)
    ck, sk = neox_cos_sin(torch.arange(S), E, 10000.0, dtype)
    if bug == "rotation_missing":
        qr, kr = q * 1, k * 1
    else:
        qr, kr = apply_rope(q, cq, sq, False), apply_rope(k, ck, sk, False)
    qr.retain_grad()
    kr.retain_grad()
    s = qr @ kr.transpose(-1, -2) / E ** 0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s - alibi * (torch.arange(S)[None, :] - torch.arange(L)[:, None]).abs().to(dtype)
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(S - L), float("-inf"))
    if sink is not None:
        s = torch.cat([s, torch.full((1, 2, L, 1), sink, dtype=dtype)], dim=-1)
    p = torch.softmax(s, dim=-1)
    out = (p[..., :S] if sink is not None else p) @ v
    do = torch.randn(out.shape, generator=g, dtype=dtype)
    out.backward(do)
    dq, dk = (qr.grad, kr.grad) if bug == "rotation_not_transposed" else (q.grad, k.grad)
    return (dq, dk, v.grad), (q.detach(), k.detach(), v.detach(), do)


PIPELINES = {
    # name: (L, S, E, kernel keywords, compare_attention_backward keywords)
    "gemma2_softcap": (4, 9, 16, {"softcap": 2.0}, {"softcap": 2.0}),
    "gemma2_softcap_causal": (5, 11, 16, {"softcap": 5.0, "causal": True},
                              {"softcap": 5.0, "is_causal": True,
                               "causal_alignment": "bottom_right"}),
    "gpt_oss_sinks_causal": (5, 11, 16, {"sink": 0.5, "causal": True},
                             {"sinks": np.array([0.5, 0.5]), "is_causal": True,
                              "causal_alignment": "bottom_right"}),
    "alibi": (6, 6, 16, {"alibi": 0.25}, {"alibi_slopes": np.array([0.25, 0.25])}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(PIPELINES))
def test_rotary_with_softcap_sinks_alibi_has_no_false_alarm_and_catches_bugs(dtype, case):
    L, S, E, kern, ours = PIPELINES[case]
    kw = {"rotary_base": 10000.0, **ours}
    for seed in range(2):
        grads, inputs = pipeline_grads(dtype, seed, L, S, E, **kern)
        res = ms.compare_attention_backward(*grads, *inputs, **kw)
        assert res.passed, res.report()
        assert max(c.worst.ratio for c in res.gradients.values() if c.worst) < 0.5
    for bug in ("rotation_not_transposed", "rotation_missing"):
        grads, inputs = pipeline_grads(dtype, 3, L, S, E, bug=bug, **kern)
        res = ms.compare_attention_backward(*grads, *inputs, **kw)
        assert not res.passed
        assert res.diagnoses and res.diagnoses[0].bug == bug, res.report()
    # the wrong pipeline: the kernel's gradients without the cap / the sink judged
    # against the call with it
    grads, inputs = pipeline_grads(dtype, 4, L, S, E)
    assert not ms.compare_attention_backward(*grads, *inputs, **kw).passed


def test_sixteen_bit_gqa_decode_gets_a_verdict():
    # 4 query heads on 2 kv heads, 2 new queries over 40 keys, HF's bf16 rotation: a
    # verdict, and a zeroed dk fails
    from rotary_kernels import apply, hf_cos_sin

    dt, L, S, E = torch.bfloat16, 2, 40, 32
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, L, E, generator=g).to(dt).requires_grad_(True)
    k, v = (torch.randn(1, 2, S, E, generator=g).to(dt).requires_grad_(True) for _ in range(2))
    cq, sq = hf_cos_sin(torch.arange(S - L, S), E, 10000.0, 1.0, dt)
    ck, sk = hf_cos_sin(torch.arange(S), E, 10000.0, 1.0, dt)
    out = F.scaled_dot_product_attention(apply(q, cq, sq, E, False), apply(k, ck, sk, E, False),
                                         v, enable_gqa=True)
    do = torch.randn(out.shape, generator=g).to(dt)
    out.backward(do)
    inputs = (q.detach(), k.detach(), v.detach(), do)
    kw = {"rotary_base": 10000.0, "enable_gqa": True}
    assert ms.compare_attention_backward(q.grad, k.grad, v.grad, *inputs, **kw).passed
    assert not ms.compare_attention_backward(q.grad, k.grad * 0, v.grad, *inputs, **kw).passed
