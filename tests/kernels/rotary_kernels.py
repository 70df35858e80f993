"""Rotary-embedding attention written as real code writes it, for the evaluation of the
testing tool: HF transformers' ``LlamaRotaryEmbedding`` + ``rotate_half`` +
``apply_rotary_pos_emb`` (fp32 inv_freq and cos/sin, cast to the input dtype, the
rotation in the input dtype), a GPT-J interleaved version (``rotate_every_two``), and
FlashAttention-style tables (``rotary_cos``/``rotary_sin`` (seqlen_ro, r/2) given,
the rotation in fp32 and q', k' stored in the input dtype, as its rotary kernel); then
torch SDPA.  One mutant per rotary bug class.

Independent of ``mha_symbolic`` (imports nothing from it).  Inputs (B, H, n, D).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BUGS = ("rotary_interleaved_swapped", "rotary_positions_not_offset", "rotary_angles_bf16",
        "rotary_angles_fp16", "rotary_dim_ignored", "rotary_inv_freq_head_dim")


def hf_cos_sin(positions: torch.Tensor, dim: int, base: float, scale: float = 1.0,
               dtype: torch.dtype = torch.float32, angles_dtype: torch.dtype | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's LlamaRotaryEmbedding.forward: inv_freq = 1 / base^(arange(0, dim, 2)/dim) in
    fp32, freqs = pos · inv_freq in fp32 (linear scaling: pos / scale), emb = cat(freqs,
    freqs), cos/sin in fp32 then cast to ``dtype``.  ``angles_dtype``: the bug of
    computing the angles in a 16-bit dtype."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    t = positions.float() / scale
    if angles_dtype is not None:
        freqs = (t.to(angles_dtype)[:, None] * inv_freq.to(angles_dtype)[None, :])
        cos, sin = freqs.cos(), freqs.sin()
        return cos.to(dtype), sin.to(dtype)
    freqs = t[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, r: int,
          interleaved: bool, compute: torch.dtype | None = None) -> torch.Tensor:
    """x (..., n, D) with the first r dims rotated by cos/sin (n, r/2); in x's dtype
    (HF) or in ``compute`` and stored back in x's dtype (FlashAttention's kernel)."""
    dt = x.dtype
    xc = x if compute is None else x.to(compute)
    cos, sin = cos.to(xc.dtype), sin.to(xc.dtype)
    if interleaved:
        c2 = torch.repeat_interleave(cos, 2, dim=-1)
        s2 = torch.repeat_interleave(sin, 2, dim=-1)
        rot, rest = xc[..., :r], xc[..., r:]
        out = rot * c2 + rotate_every_two(rot) * s2
    else:
        c2, s2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        rot, rest = xc[..., :r], xc[..., r:]
        out = rot * c2 + rotate_half(rot) * s2
    return torch.cat((out, rest), dim=-1).to(dt)


def hf_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, base: float,
                 rotary_dim: int | None = None, scale: float = 1.0, interleaved: bool = False,
                 q_offset: int | None = None, bug: str | None = None, causal: bool = False,
                 fp32_rotation: bool = False) -> torch.Tensor:
    """HF-style RoPE (interleaved: GPT-J's) then SDPA; queries at q_offset + i
    (default S - L), keys at j."""
    L, D = q.shape[-2:]
    S = k.shape[-2]
    r = D if rotary_dim is None else rotary_dim
    off = S - L if q_offset is None else q_offset
    if bug == "rotary_positions_not_offset":
        off = 0
    if bug == "rotary_dim_ignored":
        r = D
    inter = interleaved != (bug == "rotary_interleaved_swapped")
    ad = {"rotary_angles_bf16": torch.bfloat16, "rotary_angles_fp16": torch.float16}.get(bug or "")
    dt = q.dtype if not fp32_rotation else torch.float32
    cq, sq = hf_cos_sin(torch.arange(off, off + L), r, base, scale, dt, ad)
    ck, sk = hf_cos_sin(torch.arange(S), r, base, scale, dt, ad)
    if bug == "rotary_inv_freq_head_dim":      # inv_freq over the head dim, r/2 of them
        cq, sq = (t[:, : r // 2] for t in hf_cos_sin(torch.arange(off, off + L), D, base,
                                                      scale, dt, ad))
        ck, sk = (t[:, : r // 2] for t in hf_cos_sin(torch.arange(S), D, base, scale, dt, ad))
    comp = torch.float32 if fp32_rotation else None
    qr = apply(q, cq, sq, r, inter, comp)
    kr = apply(k, ck, sk, r, inter, comp)
    return F.scaled_dot_product_attention(qr, kr, v, is_causal=causal)


def fa_tables_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, *, interleaved: bool, q_offset: int | None = None,
                        bug: str | None = None) -> torch.Tensor:
    """FlashAttention-style: tables (seqlen_ro, r/2) given; rotation in fp32, q', k'
    stored in the input dtype; queries at rows q_offset + i of the tables."""
    L = q.shape[-2]
    S = k.shape[-2]
    r = 2 * cos.shape[-1]
    off = S - L if q_offset is None else q_offset
    if bug == "rotary_positions_not_offset":
        off = 0
    inter = interleaved != (bug == "rotary_interleaved_swapped")
    if bug in ("rotary_angles_bf16", "rotary_angles_fp16"):
        d = torch.bfloat16 if bug == "rotary_angles_bf16" else torch.float16
        cos, sin = cos.to(d), sin.to(d)
    qr = apply(q, cos[off:off + L], sin[off:off + L], r, inter, torch.float32)
    kr = apply(k, cos[:S], sin[:S], r, inter, torch.float32)
    return F.scaled_dot_product_attention(qr, kr, v)
