"""RoPE + attention kernels re-implemented, operation for operation and dtype for dtype,
from real codebases (read in this session through the code index), and buggy versions as
they occur in real bug reports.  Written WITHOUT reading the library's rotary variant or
its tolerance model: the point is to judge the verdicts on kernels the library was not
designed around (bench/bench_rope_independent.py, tests/kernels/test_rope_independent.py).

Every kernel takes q (B, H, L, D), k and v (B, H, S, D) and a :class:`Spec`; the L queries
are the last L of the S positions (decode: queries at the end of the keys), keys at
0 … S-1.  Attention is torch SDPA (causal masks aligned bottom-right, built explicitly).

Sources (the arithmetic of each is kept: which dtype each step runs in):

- ``hf_llama`` — huggingface/transformers src/transformers/models/llama/modeling_llama.py
  (v4.38+): ``LlamaRotaryEmbedding.forward`` (inv_freq from an int64 arange ``.float()``,
  ``freqs = inv_freq @ position_ids`` in fp32 with autocast off, ``emb = cat(freqs, freqs)``,
  ``cos/sin`` cast to ``x.dtype``), ``rotate_half``, ``apply_rotary_pos_emb``
  (``q * cos + rotate_half(q) * sin`` in the input dtype).  ``hf_llama_linear``:
  ``LlamaLinearScalingRotaryEmbedding`` (``position_ids.float() / scaling_factor``).
- ``fa_torch`` / ``fa_triton`` — Dao-AILab/flash-attention flash_attn/layers/rotary.py:
  ``RotaryEmbedding._update_cos_sin_cache`` (t and inv_freq fp32, ``torch.outer``,
  ``cos(freqs).to(dtype)``), ``apply_rotary_emb_torch`` (the rotation in the input dtype,
  first ``ro_dim`` dims, interleaved or not); ``fa_triton`` computes the rotation in fp32 as
  flash_attn/ops/triton/rotary.py does (loads x, cos, sin, converts to fp32, stores in x's
  dtype).  Judged with the tables it was given (``rotary_cos``/``rotary_sin``).
- ``gptj`` — huggingface/transformers models/gptj/modeling_gptj.py:
  ``create_sinusoidal_positions`` (fp32 table ``cat(sin, cos)``), ``rotate_every_two``,
  ``apply_rotary_pos_emb`` with ``repeat_interleave(…, 2)`` — the fp32 table promotes the
  rotation to fp32 — on the first ``rotary_dim`` dims; ``_attn`` casts q, k to fp32.
- ``vllm`` — vllm-project/vllm vllm/model_executor/layers/rotary_embedding.py:
  ``_compute_cos_sin_cache`` (fp32, then ``cache.to(dtype)``), ``forward_native``
  (``positions + offsets``, ``index_select``, ``_apply_rotary_emb_torch``:
  ``o1 = x1 * cos - x2 * sin; o2 = x2 * cos + x1 * sin`` in x's dtype, neox or gptj style,
  partial ``rotary_dim``).
- ``llama_cpp`` — ggml-org/llama.cpp ggml/src/ggml-cpu/ops.cpp (seen in the index through
  ports of it, e.g. ``ggml_rope_cache_init``): ``theta_scale = powf(freq_base, -2.0f /
  n_dims)``, ``theta *= theta_scale`` pair after pair in fp32 (pair m's angle carries m
  roundings), cosf / sinf, the rotation in fp32; mode 0 (interleaved) and NEOX.
- ``meta_llama`` — meta-llama/llama llama/model.py: ``precompute_freqs_cis``
  (``torch.polar`` of fp32 angles: complex64), ``apply_rotary_emb`` (``view_as_complex`` of
  ``x.float()``, complex64 product, ``type_as(x)``), ``freqs_cis[start_pos : start_pos +
  seqlen]``; pairs (2m, 2m+1).

Bugs (``BUGS``; each a change of one step of a correct kernel, as reported):

- ``inv_freq_lowp`` — EleutherAI/gpt-neox#1003, huggingface/transformers#25681, #29496:
  ``model.to(bf16)`` casts the ``inv_freq`` buffer and ``t = arange(...).type_as(inv_freq)``
  follows it: positions, angles and cos/sin all in the model dtype (fp32: no change).
- ``inv_freq_cast`` — sgl-project/sglang-jax#1473, Megatron-LM#744: only ``inv_freq`` cast
  to the model dtype before the (fp32) product with the positions.
- ``pairs_mixup`` — vllm-project/vllm#941 (GPT-J run with the NeoX rotation),
  vllm-ascend#12765: half-split rotation where the model's convention is interleaved.
- ``no_offset`` — the classic KV-cache decode bug (queries rotated at 0 … L-1, not at
  their positions; vllm's ``positions + offsets`` / llama's ``start_pos`` forgotten).
- ``offset_post_append`` — the queries' offset taken from the cache length after the new
  tokens are appended (queries at S … S+L-1): FlashAttention's ``cache_seqlens`` is the
  length before appending (flash_attn_with_kvcache docstring), a convention easy to mix up.
- ``rotary_on_v`` — the rotation applied to v as well.
- ``sign_flip`` — ``rotate_half`` returning ``cat((x2, -x1))`` (a rotation by −θ).
- ``rotary_dim_ignored`` — vllm-project/vllm#747: the whole head rotated where only the
  first ``rotary_dim`` dims should be.
- ``inv_freq_headdim`` — huggingface/transformers#48652 (GPTNeoXJapanese): only
  ``rotary_dim`` dims rotated, but ``inv_freq`` built over the full head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Spec:
    """What the model means: RoPE base, rotated dims (None: the head), pairing, the linear
    position scale, causal (bottom-right) or not."""

    base: float = 10000.0
    rotary_dim: int | None = None
    interleaved: bool = False
    position_scale: float = 1.0
    causal: bool = False


def _positions(q: Any, k: Any) -> tuple[Any, Any]:
    L, S = q.shape[2], k.shape[2]
    return torch.arange(S - L, S), torch.arange(S)


def _sdpa(q: Any, k: Any, v: Any, spec: Spec) -> Any:
    L, S = q.shape[2], k.shape[2]
    mask = None
    if spec.causal:
        mask = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# --- HF Llama -------------------------------------------------------------------------


def _hf_rotate_half(x: Any, sign_bug: bool = False) -> Any:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((x2, -x1), dim=-1) if sign_bug else torch.cat((-x2, x1), dim=-1)


def _hf_cos_sin(x: Any, pos: Any, dim: int, spec: Spec, bug: str | None) -> tuple[Any, Any]:
    inv_freq = 1.0 / (spec.base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    position_ids = pos[None, :].float()
    if spec.position_scale != 1.0:                      # LlamaLinearScalingRotaryEmbedding
        position_ids = position_ids / spec.position_scale
    if bug == "inv_freq_lowp":                          # gpt-neox#1003: buffer cast, t follows
        inv_freq = inv_freq.to(x.dtype)
        position_ids = position_ids.to(x.dtype)
    elif bug == "inv_freq_cast":                        # sglang-jax#1473
        inv_freq = inv_freq.to(x.dtype).float()
    inv_freq_expanded = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
    freqs = (inv_freq_expanded @ position_ids[:, None, :]).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


def hf_llama(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """LlamaRotaryEmbedding + apply_rotary_pos_emb + SDPA (full head; no partial rotary)."""
    qpos, kpos = _positions(q, k)
    if bug == "no_offset":
        qpos = torch.arange(q.shape[2])
    elif bug == "offset_post_append":
        qpos = qpos + q.shape[2]
    D = q.shape[-1]
    cq, sq = _hf_cos_sin(q, qpos, D, spec, bug)
    ck, sk = _hf_cos_sin(k, kpos, D, spec, bug)
    flip = bug == "sign_flip"
    qe = q * cq[:, None] + _hf_rotate_half(q, flip) * sq[:, None]
    ke = k * ck[:, None] + _hf_rotate_half(k, flip) * sk[:, None]
    if bug == "rotary_on_v":
        v = v * ck[:, None] + _hf_rotate_half(v) * sk[:, None]
    return _sdpa(qe, ke, v, spec)


# --- FlashAttention -------------------------------------------------------------------


def fa_tables(spec: Spec, seqlen: int, dtype: Any, head_dim: int) -> tuple[Any, Any]:
    """RotaryEmbedding._update_cos_sin_cache: (seqlen, rotary_dim / 2) tables in ``dtype``."""
    dim = spec.rotary_dim or head_dim
    inv_freq = 1.0 / (spec.base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    t = torch.arange(seqlen, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)


def _fa_rotate_half(x: Any, interleaved: bool) -> Any:
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)   # "... d two -> ... (d two)"


def _fa_apply_torch(x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    """apply_rotary_emb_torch, x in (B, H, S, D) here (cos, sin: (S, ro_dim / 2))."""
    ro_dim = cos.shape[-1] * 2
    assert ro_dim <= x.shape[-1]
    if interleaved:                                     # "... d -> ... 1 (d 2)"
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    else:                                               # "... d -> ... 1 (2 d)"
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    xr = x[..., :ro_dim]
    return torch.cat([xr * cos + _fa_rotate_half(xr, interleaved) * sin, x[..., ro_dim:]], -1)


def _fa_apply_triton(x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    """The Triton kernel's arithmetic: x, cos, sin loaded as fp32, pairs rotated
    (o0 = x0 cos - x1 sin, o1 = x0 sin + x1 cos), stored in x's dtype."""
    half = cos.shape[-1]
    xr = x[..., : 2 * half].float()
    c, s = cos.float(), sin.float()
    if interleaved:
        x0, x1 = xr[..., ::2], xr[..., 1::2]
    else:
        x0, x1 = xr[..., :half], xr[..., half:]
    o0, o1 = x0 * c - x1 * s, x0 * s + x1 * c
    o = torch.stack((o0, o1), -1).flatten(-2) if interleaved else torch.cat((o0, o1), -1)
    return torch.cat([o.to(x.dtype), x[..., 2 * half:]], -1)


def _fa(q: Any, k: Any, v: Any, spec: Spec, bug: str | None, apply: Callable[..., Any]) -> Any:
    S, L = k.shape[2], q.shape[2]
    cos, sin = fa_tables(spec, S + L, q.dtype, q.shape[-1])
    inter = spec.interleaved if bug != "pairs_mixup" else not spec.interleaved
    off = {"no_offset": 0, "offset_post_append": S}.get(bug or "", S - L)
    qe = apply(q, cos[off:off + L], sin[off:off + L], inter)
    ke = apply(k, cos[:S], sin[:S], inter)
    if bug == "rotary_on_v":
        v = apply(v, cos[:S], sin[:S], inter)
    return _sdpa(qe, ke, v, spec)


def fa_torch(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """FlashAttention's RotaryEmbedding tables + apply_rotary_emb_torch + SDPA."""
    return _fa(q, k, v, spec, bug, _fa_apply_torch)


def fa_triton(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """FlashAttention's tables + the Triton kernel's fp32 rotation + SDPA."""
    return _fa(q, k, v, spec, bug, _fa_apply_triton)


# --- HF GPT-J -------------------------------------------------------------------------


def _gptj_positions(num_pos: int, dim: int, base: float) -> Any:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", torch.arange(num_pos, dtype=torch.int64).float(),
                                inv_freq).float()
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def _rotate_every_two(x: Any) -> Any:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _gptj_apply(x: Any, sincos: Any, rd: int) -> Any:
    sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
    sin, cos = sin.repeat_interleave(2, -1), cos.repeat_interleave(2, -1)
    xr = x[..., :rd]
    return torch.cat([(xr * cos) + (_rotate_every_two(xr) * sin), x[..., rd:]], -1)


def gptj(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """GPT-J: fp32 sinusoid table (promotes the rotation to fp32), q, k in fp32 for the
    attention, the output in the input dtype."""
    S, L, D = k.shape[2], q.shape[2], q.shape[-1]
    rd = spec.rotary_dim or D
    table = _gptj_positions(S, rd if bug != "inv_freq_headdim" else D, spec.base)
    if bug == "inv_freq_headdim":
        table = torch.cat((table[:, : rd // 2], table[:, D // 2: D // 2 + rd // 2]), 1)
    if bug == "rotary_dim_ignored":
        rd, table = D, _gptj_positions(S, D, spec.base)
    off = 0 if bug == "no_offset" else S - L
    qe = _gptj_apply(q, table[off:off + L], rd).float()
    ke = _gptj_apply(k, table, rd).float()
    vv = _gptj_apply(v, table, rd) if bug == "rotary_on_v" else v
    return _sdpa(qe, ke, vv.float(), spec).to(q.dtype)


# --- vLLM -----------------------------------------------------------------------------


def _vllm_cache(rotary_dim: int, max_pos: int, base: float, dtype: Any, bug: str | None) -> Any:
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    t = torch.arange(max_pos, dtype=torch.float)
    if bug == "inv_freq_lowp":
        inv_freq, t = inv_freq.to(dtype), t.to(dtype)
    elif bug == "inv_freq_cast":
        inv_freq = inv_freq.to(dtype).float()
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def _vllm_apply(x: Any, cos: Any, sin: Any, neox: bool) -> Any:
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if neox:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    return torch.cat((o1, o2), dim=-1) if neox else torch.stack((o1, o2), dim=-1).flatten(-2)


def _vllm_rotate(x: Any, positions: Any, cache: Any, rd: int, neox: bool) -> Any:
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    return torch.cat((_vllm_apply(x[..., :rd], cos, sin, neox), x[..., rd:]), dim=-1)


def vllm(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """vLLM RotaryEmbedding.forward_native (cache in the model dtype) + SDPA."""
    S, L, D = k.shape[2], q.shape[2], q.shape[-1]
    rd = spec.rotary_dim or D
    if bug == "rotary_dim_ignored":
        rd = D
    cache = _vllm_cache(rd, S, spec.base, q.dtype, bug)
    neox = not spec.interleaved if bug != "pairs_mixup" else spec.interleaved
    qpos = torch.arange(L) + (0 if bug == "no_offset" else S - L)   # positions + offsets
    kpos = torch.arange(S)
    qe, ke = _vllm_rotate(q, qpos, cache, rd, neox), _vllm_rotate(k, kpos, cache, rd, neox)
    if bug == "rotary_on_v":
        v = _vllm_rotate(v, kpos, cache, rd, neox)
    return _sdpa(qe, ke, v, spec)


# --- Meta Llama (complex) --------------------------------------------------------------


def _precompute_freqs_cis(dim: int, end: int, theta: float) -> Any:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def _meta_apply(x: Any, freqs_cis: Any) -> Any:
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(-2).type_as(x)


def meta_llama(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """Meta's llama: complex64 rotation of (2m, 2m+1) pairs, start_pos = S - L."""
    S, L, D = k.shape[2], q.shape[2], q.shape[-1]
    freqs_cis = _precompute_freqs_cis(D, S, spec.base)
    start_pos = 0 if bug == "no_offset" else S - L
    qe = _meta_apply(q, freqs_cis[start_pos:start_pos + L])
    ke = _meta_apply(k, freqs_cis)
    if bug == "rotary_on_v":
        v = _meta_apply(v, freqs_cis)
    return _sdpa(qe, ke, v, spec)


# --- llama.cpp (ggml) -------------------------------------------------------------------


def _ggml_cos_sin(pos: Any, n_dims: int, base: float) -> tuple[Any, Any]:
    """ggml_rope_cache_init: ``theta_scale = powf(freq_base, -2.0f / n_dims)``, ``theta =
    (float) p`` then ``theta *= theta_scale`` pair after pair (fp32: the angle of pair m
    carries m roundings), cosf / sinf of it (rope_yarn with ext_factor 0, mscale 1)."""
    f32 = torch.float32
    theta_scale = torch.tensor(base, dtype=f32) ** (torch.tensor(-2.0, dtype=f32) / n_dims)
    theta = pos.to(f32)
    cols = []
    for _ in range(n_dims // 2):
        cols.append(theta)
        theta = theta * theta_scale
    angles = torch.stack(cols, -1)
    return torch.cos(angles), torch.sin(angles)


def _ggml_apply(x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    """ggml_rope_f32 / rotate_pairs: x0·cos − x1·sin, x0·sin + x1·cos in fp32 (pairs
    (i0, i0 + 1) in mode 0, (i, i + n_dims/2) in NEOX mode), dims ≥ n_dims copied, the
    result stored in x's type."""
    return _fa_apply_triton(x, cos, sin, interleaved)


def llama_cpp(q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """llama.cpp's ggml rope (ggml/src/ggml-cpu/ops.cpp) + SDPA."""
    S, L, D = k.shape[2], q.shape[2], q.shape[-1]
    rd = spec.rotary_dim or D
    cq, sq = _ggml_cos_sin(torch.arange(S - L, S), rd, spec.base)
    ck, sk = _ggml_cos_sin(torch.arange(S), rd, spec.base)
    qe = _ggml_apply(q, cq, sq, spec.interleaved)
    ke = _ggml_apply(k, ck, sk, spec.interleaved)
    return _sdpa(qe, ke, v, spec)


# --- the catalogue ---------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """A kernel, the spec it implements by default, and what it supports."""

    name: str
    fn: Callable[..., Any]
    interleaved: bool
    partial: bool          # supports rotary_dim < head dim
    tables: bool = False   # judged with the tables it was given (rotary_cos / rotary_sin)
    position_scale: float = 1.0


KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("hf_llama", hf_llama, interleaved=False, partial=False),
    Kernel("hf_llama_linear", hf_llama, interleaved=False, partial=False, position_scale=4.0),
    Kernel("fa_torch", fa_torch, interleaved=True, partial=True, tables=True),
    Kernel("fa_torch_neox", fa_torch, interleaved=False, partial=True, tables=True),
    Kernel("fa_torch_base", fa_torch, interleaved=True, partial=True),   # judged by its base
    Kernel("fa_triton", fa_triton, interleaved=True, partial=True, tables=True),
    Kernel("gptj", gptj, interleaved=True, partial=True),
    Kernel("vllm_neox", vllm, interleaved=False, partial=True),
    Kernel("vllm_gptj", vllm, interleaved=True, partial=True),
    Kernel("meta_llama", meta_llama, interleaved=True, partial=False),
    Kernel("llama_cpp", llama_cpp, interleaved=True, partial=True),
    Kernel("llama_cpp_neox", llama_cpp, interleaved=False, partial=True),
)}

#: bug -> the kernels it is planted in (the code path each report is about)
BUGS: dict[str, tuple[str, ...]] = {
    "inv_freq_lowp": ("hf_llama", "vllm_neox"),
    "inv_freq_cast": ("hf_llama", "vllm_neox"),
    "pairs_mixup": ("vllm_gptj", "fa_torch"),
    "no_offset": ("hf_llama", "vllm_neox", "meta_llama", "fa_triton", "gptj"),
    "offset_post_append": ("hf_llama", "fa_triton"),
    "rotary_on_v": ("hf_llama", "meta_llama"),
    "sign_flip": ("hf_llama",),
    "rotary_dim_ignored": ("vllm_neox", "gptj"),
    "inv_freq_headdim": ("gptj",),
}

#: bugs that only exist with partial rotary
PARTIAL_BUGS = ("rotary_dim_ignored", "inv_freq_headdim")


def spec_for(kernel: Kernel, *, rotary_dim: int | None, causal: bool,
             base: float = 10000.0) -> Spec:
    """The kernel's default spec (its pairing and position scale) with these settings."""
    return Spec(base=base, rotary_dim=rotary_dim if kernel.partial else None,
                interleaved=kernel.interleaved, position_scale=kernel.position_scale,
                causal=causal)


def ms_keywords(kernel: Kernel, spec: Spec, q: Any, k: Any) -> dict[str, Any]:
    """The mha_symbolic keywords that state the kernel's spec."""
    kw: dict[str, Any] = {"rotary_interleaved": spec.interleaved}
    if spec.causal:
        kw.update(is_causal=True, causal_alignment="bottom_right")
    if kernel.tables:
        cos, sin = fa_tables(spec, k.shape[2], q.dtype, q.shape[-1])
        kw.update(rotary_cos=cos, rotary_sin=sin)
    else:
        kw["rotary_base"] = spec.base
        if spec.rotary_dim is not None:
            kw["rotary_dim"] = spec.rotary_dim
        if spec.position_scale != 1.0:
            kw["rotary_position_scale"] = spec.position_scale
    return kw


def run(kernel: Kernel, q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """The kernel's output (``bug`` planted if given)."""
    return kernel.fn(q, k, v, spec, bug)


def run64(kernel: Kernel, q: Any, k: Any, v: Any, spec: Spec, bug: str | None = None) -> Any:
    """The same code run on float64 inputs (the naive baseline's reference)."""
    return kernel.fn(q.double(), k.double(), v.double(), spec, bug)


__all__ = [
    "BUGS",
    "KERNELS",
    "PARTIAL_BUGS",
    "Kernel",
    "Spec",
    "fa_tables",
    "ms_keywords",
    "run",
    "run64",
    "spec_for",
]


def run_cache(kernel: Kernel, q: Any, k: Any, v: Any, spec: Spec, seqlens: list[int],
              bug: str | None = None) -> Any:
    """KV-cache decode: sequence b has ``seqlens[b]`` valid keys (the new L included) in a
    cache of k.shape[2] slots; its queries are at seqlens[b] - L …, and it attends to its
    valid keys only (each sequence run through the kernel on its own prefix)."""
    outs = [kernel.fn(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], spec, bug)
            for b, n in enumerate(seqlens)]
    return torch.cat(outs, 0)
