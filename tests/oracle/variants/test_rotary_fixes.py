"""Rotary fixes (issue 24, the variant fixes): the diagnosis judged at the verdict's own
tolerance and the rotary bug classes named at bf16/fp16; rotary with d_sinks /
d_alibi_slopes, on the varlen doors, ALiBi + rotary at L != S.  Every kernel here is
plain torch (its own rotary), independent of the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import mha_symbolic as ms

torch = pytest.importorskip("torch")
F = torch.nn.functional


def rope(x, pos, base=10000.0, interleaved=False, rdim=None):
    """HF / GPT-J rotary in float64 torch: x (..., n, E), pos (n,)."""
    E = x.shape[-1]
    r = E if rdim is None else rdim
    inv = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    th = pos.double()[:, None] * inv[None]
    c, s = th.cos(), th.sin()
    x = x.double()
    xr, rest = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        o = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        o = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    return torch.cat((o, rest), -1)


def _qkv(L, S, E, dt, seed=0, H=2):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, n, E, generator=g).to(dt) for n in (L, S, S))


def _names(comp):
    return [d.bug for d in comp.diagnoses]


# --------------------------------------------------------------------------------------
# 1. the diagnosis


DTYPES = [torch.bfloat16, torch.float16]


def _kernel(q, k, v, bug, *, dt, interleaved=False, rdim=None):
    """A kernel rotating in float64, storing q', k' (and v) in ``dt``, SDPA in fp32."""
    L, S = q.shape[-2], k.shape[-2]
    qpos = torch.arange(L) if bug == "rotary_positions_not_offset" else torch.arange(S - L, S)
    inter = (not interleaved) if bug == "rotary_interleaved_swapped" else interleaved
    r = None if bug == "rotary_dim_ignored" else rdim
    qr, kr = rope(q, qpos, interleaved=inter, rdim=r), rope(k, torch.arange(S),
                                                            interleaved=inter, rdim=r)
    vr = rope(v, torch.arange(S), interleaved=inter, rdim=r) if bug == "rotary_on_v" else v
    out = F.scaled_dot_product_attention(qr.to(dt).float(), kr.to(dt).float(),
                                         vr.to(dt).float())
    return out.to(dt)


@pytest.mark.parametrize("dt", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("bug,rdim", [("rotary_on_v", None), ("rotary_interleaved_swapped", None),
                                      ("rotary_positions_not_offset", None),
                                      ("rotary_dim_ignored", 8)])
def test_rotary_bug_planted_in_low_precision_is_named_and_only_it(bug, rdim, dt):
    q, k, v = _qkv(8, 64, 16, dt)
    kw = {"rotary_base": 10000.0} | ({} if rdim is None else {"rotary_dim": rdim})
    assert ms.compare_attention(_kernel(q, k, v, None, dt=dt, rdim=rdim), q, k, v,
                                **kw).passed
    comp = ms.compare_attention(_kernel(q, k, v, bug, dt=dt, rdim=rdim), q, k, v, **kw)
    assert not comp.passed
    assert _names(comp)[:1] == [bug], comp.summary()
    assert "no_scale" not in _names(comp)


def test_a_bug_is_named_exactly_when_its_own_verdict_would_pass_the_output():
    # an output at no_scale's float64 answer plus a growing error: named no_scale
    # exactly when the door's verdict for the buggy call (scale=1) passes it — its own
    # model bound and dtype level, not the truth's tolerance (issue 24, h24w)
    from mha_symbolic.oracle.variants.registry import variant_options
    from mha_symbolic.testing.forward import bugs_variants as bv
    from mha_symbolic.testing.forward import variants as fv

    g = np.random.default_rng(5)
    L, S, E = 4, 16, 8
    q, k, v = (g.standard_normal((1, 1, n, E)).astype(np.float32) for n in (L, S, S))
    opts = variant_options(rotary_base=10000.0)
    x = fv._variant_inputs(q, k, v, opts, attn_mask=None, is_causal=False, scale=None,
                           enable_gqa=False, causal_alignment="top_left", masked_rows="zero")
    bug = bv.plain_variant(x, scale=1.0).out
    seen = set()
    for rel in (0.0, 1e-7, 1e-6, 1e-5, 1e-3):
        actual = (bug * (1 + rel * np.sign(g.standard_normal(bug.shape)))).astype(np.float32)
        comp = ms.compare_attention(actual, q, k, v, rotary_base=10000.0)
        own = ms.compare_attention(actual, q, k, v, rotary_base=10000.0, scale=1.0)
        assert not comp.passed
        named = "no_scale" in [d.bug for d in comp.diagnoses]
        assert named == own.passed, (rel, comp.summary(), own.summary())
        seen.add(named)
    assert seen == {True, False}


# --------------------------------------------------------------------------------------
# 3. rotary on the varlen doors: positions restart per sequence


def _varlen_kernel(q, k, v, cq, ck, *, causal, q_pos="offset", slopes=None, whole=False):
    """Per-sequence plain-torch attention of packed (total, H, E) inputs: rotary at each
    sequence's own positions (keys 0 … S_b-1, queries S_b-L_b+i, FlashAttention's varlen
    rotary restarting at every sequence), ALiBi -slope·|j - (i + S_b - L_b)|; ``whole``:
    the boundaries ignored (one sequence)."""
    if whole:
        cq, ck = [0, cq[-1]], [0, ck[-1]]
    outs = []
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1).double()
        kb = k[ck[b]:ck[b + 1]].transpose(0, 1).double()
        vb = v[ck[b]:ck[b + 1]].transpose(0, 1).double()
        L, S = qb.shape[-2], kb.shape[-2]
        qp = torch.arange(L) if q_pos == "zero" else torch.arange(S - L, S)
        if q_pos is not None:
            qb, kb = rope(qb, qp), rope(kb, torch.arange(S))
        s = qb @ kb.transpose(-1, -2) / qb.shape[-1] ** 0.5
        i, j = torch.arange(L)[:, None] + (S - L), torch.arange(S)[None, :]
        if slopes is not None:
            s = s - torch.as_tensor(slopes, dtype=torch.float64)[:, None, None] * (j - i).abs()
        if causal:
            s = s.masked_fill(j > i, float("-inf"))
        outs.append((s.softmax(-1) @ vb).transpose(0, 1))
    return torch.cat(outs).float()


def _packed(lens, H=2, E=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(sum(lens), H, E, generator=g) for _ in range(3))


def test_varlen_rotary_restarts_positions_per_sequence():
    cu = [0, 3, 8, 12]
    q, k, v = _packed([3, 5, 4])
    ok = _varlen_kernel(q, k, v, cu, cu, causal=True)
    assert ms.compare_attention_varlen(ok, q, k, v, cu, cu, is_causal=True,
                                       rotary_base=10000.0).passed
    ref = ms.reference_attention_varlen(q, k, v, cu, cu, is_causal=True, rotary_base=10000.0)
    assert np.allclose(ref.rounded("float64"), ok.double().numpy(), rtol=0, atol=1e-6)
    # no rotary at all is caught
    plain = _varlen_kernel(q, k, v, cu, cu, causal=True, q_pos=None)
    assert not ms.compare_attention_varlen(plain, q, k, v, cu, cu, is_causal=True,
                                           rotary_base=10000.0).passed


def test_varlen_rotary_queries_fewer_than_keys_are_at_the_sequence_end():
    # L_b < S_b: the queries are each sequence's last rows (S_b - L_b + i), as the
    # batched door; a kernel rotating them at 0 … L_b-1 is caught and named
    cq, ck = [0, 2, 5], [0, 6, 13]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 2, 8, generator=g)
    k, v = torch.randn(13, 2, 8, generator=g), torch.randn(13, 2, 8, generator=g)
    ok = _varlen_kernel(q, k, v, cq, ck, causal=True)
    kw = {"is_causal": True, "causal_alignment": "bottom_right", "rotary_base": 10000.0}
    assert ms.compare_attention_varlen(ok, q, k, v, cq, ck, **kw).passed
    bad = _varlen_kernel(q, k, v, cq, ck, causal=True, q_pos="zero")
    comp = ms.compare_attention_varlen(bad, q, k, v, cq, ck, **kw)
    assert not comp.passed
    assert "rotary_positions_not_offset" in _names(comp), comp.summary()


# --------------------------------------------------------------------------------------
# 4. ALiBi + rotary at L != S (bottom-right causal)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_with_rotary_at_fewer_queries_than_keys(causal):
    L, S, H, E = 4, 12, 2, 8
    g = torch.Generator().manual_seed(4)
    q = torch.randn(L, H, E, generator=g)
    k, v = torch.randn(S, H, E, generator=g), torch.randn(S, H, E, generator=g)
    slopes = np.array([0.5, 0.125])
    kw = {"is_causal": causal, "causal_alignment": "bottom_right", "rotary_base": 10000.0,
          "alibi_slopes": slopes}
    ok = _varlen_kernel(q, k, v, [0, L], [0, S], causal=causal, slopes=slopes)
    batched = lambda t: t.transpose(0, 1)[None]  # noqa: E731  (B, H, n, E)
    comp = ms.compare_attention(batched(ok), batched(q), batched(k), batched(v), **kw)
    assert comp.passed, comp.summary()
    # ALiBi measured from the top-left (|j - i|) is caught
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    qr = rope(batched(q).double(), torch.arange(S - L, S))
    kr = rope(batched(k).double(), torch.arange(S))
    s = qr @ kr.transpose(-1, -2) / E ** 0.5
    s = s - torch.as_tensor(slopes)[:, None, None] * (j - i).abs()
    if causal:
        s = s.masked_fill(j > i + (S - L), float("-inf"))
    bad = (s.softmax(-1) @ batched(v).double()).float()
    assert not ms.compare_attention(bad, batched(q), batched(k), batched(v), **kw).passed


# --------------------------------------------------------------------------------------
# 5. varlen_no_boundaries keeps sequence 0's (H,) ALiBi slopes


@pytest.mark.parametrize("stacked", [False, True])
def test_varlen_no_boundaries_keeps_the_per_head_alibi_slopes(stacked):
    cu = [0, 4, 9, 12]
    q, k, v = _packed([4, 5, 3], seed=7)
    slopes = np.array([0.5, 0.0625])
    arg = np.stack([slopes, slopes / 2, slopes / 4]) if stacked else slopes
    bad = _varlen_kernel(q, k, v, cu, cu, causal=True, q_pos=None, slopes=slopes, whole=True)
    comp = ms.compare_attention_varlen(bad, q, k, v, cu, cu, is_causal=True, alibi_slopes=arg)
    assert not comp.passed
    assert _names(comp)[:1] == ["varlen_no_boundaries"], comp.summary()


# --------------------------------------------------------------------------------------
# 2. d_sinks / d_alibi_slopes with rotary in compare_attention_backward


def _rotary_autograd(q, k, v, do, *, sinks=None, slopes=None, causal=False):
    """A float32 torch kernel (rotation in float64, stored in float32; sinks as a
    denominator-only logit per head; ALiBi -m·|j - (i + S - L)|) and its autograd
    gradients: dq, dk, dv, d_sinks, d_alibi_slopes."""
    q, k, v = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    sk = None if sinks is None else torch.tensor(sinks, requires_grad=True)
    sl = None if slopes is None else torch.tensor(slopes, requires_grad=True)
    qr = rope(q, torch.arange(S - L, S)).float()
    kr = rope(k, torch.arange(S)).float()
    s = qr @ kr.transpose(-1, -2) / E ** 0.5
    i, j = torch.arange(L)[:, None] + (S - L), torch.arange(S)[None, :]
    if sl is not None:
        s = s - sl[:, None, None] * (j - i).abs().float()
    if causal:
        s = s.masked_fill(j > i, float("-inf"))
    if sk is not None:
        col = sk[:, None, None].expand(*s.shape[:-1], 1)
        p = torch.cat([s, col], -1).softmax(-1)[..., :S]
    else:
        p = s.softmax(-1)
    out = p @ v
    out.backward(torch.tensor(do))
    return (q.grad.numpy(), k.grad.numpy(), v.grad.numpy(),
            None if sk is None else sk.grad.numpy(), None if sl is None else sl.grad.numpy())


@pytest.mark.parametrize("param", ["sinks", "alibi"])
def test_rotary_with_parameter_gradients_d_sinks_d_alibi_slopes(param):
    g = np.random.default_rng(11)
    L, S, H, E = 3, 9, 2, 8
    q = g.standard_normal((1, H, L, E)).astype(np.float32)
    k, v = (g.standard_normal((1, H, S, E)).astype(np.float32) for _ in range(2))
    do = g.standard_normal((1, H, L, E)).astype(np.float32)
    w = np.array([0.5, -1.0], np.float32) if param == "sinks" else np.array([0.25, 0.0625],
                                                                             np.float32)
    kw = {"rotary_base": 10000.0, "is_causal": True, "causal_alignment": "bottom_right"}
    if param == "sinks":
        dq, dk, dv, dp, _ = _rotary_autograd(q, k, v, do, sinks=w, causal=True)
        kw |= {"sinks": w}
        name = "d_sinks"
    else:
        dq, dk, dv, _, dp = _rotary_autograd(q, k, v, do, slopes=w, causal=True)
        kw |= {"alibi_slopes": w}
        name = "d_alibi_slopes"
    comp = ms.compare_attention_backward(dq, dk, dv, q, k, v, do, **kw, **{name: dp})
    assert comp.passed, comp.summary()
    assert name in comp.gradients
    # a planted wrong parameter gradient (one head's off by 1 %) fails on it alone
    bad = dp.copy()
    bad[0] *= np.float32(1.01)
    comp = ms.compare_attention_backward(dq, dk, dv, q, k, v, do, **kw, **{name: bad})
    assert not comp.passed
    assert not comp.gradients[name].passed
    assert all(comp.gradients[n].passed for n in ("dq", "dk", "dv"))


def test_varlen_backward_with_rotary_is_torch_autograd_per_sequence():
    g = torch.Generator().manual_seed(2)
    cu = [0, 3, 7]
    q, k, v, do = (torch.randn(7, 2, 8, generator=g, dtype=torch.float64) for _ in range(4))
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    outs = []
    for b in range(2):
        a, z = cu[b], cu[b + 1]
        pos = torch.arange(z - a)       # restarting per sequence
        qb, kb = rope(qq[a:z].transpose(0, 1), pos), rope(kk[a:z].transpose(0, 1), pos)
        s = qb @ kb.transpose(-1, -2) / 8 ** 0.5
        s = s.masked_fill(~torch.ones(z - a, z - a, dtype=torch.bool).tril(), float("-inf"))
        outs.append((s.softmax(-1) @ vv[a:z].transpose(0, 1)).transpose(0, 1))
    torch.cat(outs).backward(do)
    r = ms.reference_attention_varlen_backward(q.numpy(), k.numpy(), v.numpy(), do.numpy(),
                                               cu, cu, is_causal=True, rotary_base=10000.0)
    for name, t in (("dq", qq), ("dk", kk), ("dv", vv)):
        assert np.allclose(getattr(r, name).rounded("float64"), t.grad.numpy(), rtol=0,
                           atol=1e-13), name
