"""Attention forward kernels, correct and planted-buggy, for measuring the oracle's verdicts.

Written from how real kernels compute attention (PyTorch SDPA math, FlashAttention-2's
forward, flash-decoding's split-KV merge, torch eager op-by-op), independently of the
oracle's own error model.  numpy + ml_dtypes; torch only inside the functions that use it.

Every kernel has the signature ``fn(q, k, v, *, scale=None, causal=False, dtype) -> out``:

* ``q`` (B, H, L, E), ``k`` (B, H_kv, S, E), ``v`` (B, H_kv, S, Ev), already stored in
  ``dtype`` (float64, float32, float16, or ml_dtypes.bfloat16; the names "fp32",
  "bf16", ... are accepted too).  GQA: H a multiple of H_kv; query head h reads kv head
  h // (H // H_kv).
* ``scale`` defaults to 1/sqrt(E).
* ``causal``: False; True or "top_left" (query i sees keys j <= i); "bottom_right"
  (query i sees keys j <= i + S - L).  A row that sees no key at all gives 0.
* Correct kernels return ``dtype``.  Mutants return what the bug returns (the
  dtype-promise mutants return another dtype on purpose).

Compute dtype: float64 inputs are computed in float64 throughout; every other dtype is
upcast to float32 (float32 accumulation), which is what the GPU kernels do.

Registries: ``CORRECT`` (name -> fn), ``BUGGY`` (name -> (fn, bug_class)),
``MUTANT_DTYPES`` (name -> the input dtypes at which the mutant is a bug),
``MUTANT_CONDITIONS`` (name -> when the bug can show at all).  ``draw`` makes inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np

F64 = np.dtype(np.float64)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)

_NAMES = {
    "float64": F64, "fp64": F64, "f64": F64, "double": F64,
    "float32": F32, "fp32": F32, "f32": F32, "float": F32,
    "float16": F16, "fp16": F16, "f16": F16, "half": F16,
    "bfloat16": BF16, "bf16": BF16,
}

Kernel = Callable[..., np.ndarray]


def as_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a dtype, a type, or a name ("bf16", "float32", ...)."""
    if isinstance(dtype, str):
        try:
            return _NAMES[dtype.lower()]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}") from None
    dt = np.dtype(dtype)
    if dt not in (F64, F32, F16, BF16):
        raise ValueError(f"unsupported dtype {dt}")
    return dt


def compute_dtype(dtype: Any) -> np.dtype:
    """float64 for float64 inputs, float32 for everything else."""
    return F64 if as_dtype(dtype) == F64 else F32


def rnd(x: np.ndarray, dt: np.dtype, acc: np.dtype) -> np.ndarray:
    """Round ``x`` to ``dt`` (round to nearest even) and hold it in ``acc`` again."""
    if dt == acc:
        return x.astype(acc, copy=False)
    return x.astype(dt).astype(acc)


def round_tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 to TF32 (10 stored mantissa bits), round to nearest even, on the bits.

    Keeps float32 storage; NaN stays NaN; values that round past the largest finite
    TF32 number become inf, as round-to-nearest-even does."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    with np.errstate(over="ignore"):
        r = (u + np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    out = r.view(np.float32)
    return np.where(np.isnan(x), x, out)


# ----------------------------------------------------------------------------- plumbing


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray, dtype: Any) -> np.dtype:
    dt = as_dtype(dtype)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim != 4:
            raise ValueError(f"{name} must be 4-d (B, H, L/S, E), got shape {a.shape}")
        if a.dtype != dt:
            raise TypeError(f"{name} is stored in {a.dtype}, the kernel was told {dt}")
    B, H, _, E = q.shape
    Bk, Hkv, S, Ek = k.shape
    if (Bk, Hkv, S) != v.shape[:3] or Bk != B or Ek != E:
        raise ValueError(f"shapes do not agree: q {q.shape}, k {k.shape}, v {v.shape}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"H = {H} is not a multiple of H_kv = {Hkv}")
    return dt


def _scale(scale: float | None, E: int) -> float:
    return 1.0 / math.sqrt(E) if scale is None else float(scale)


def _expand(x: np.ndarray, H: int) -> np.ndarray:
    """GQA: kv head h // (H // H_kv) for query head h."""
    g = H // x.shape[1]
    return x if g == 1 else np.repeat(x, g, axis=1)


def visible(L: int, S: int, causal: Any, lo: int = 0, hi: int | None = None) -> np.ndarray | None:
    """Boolean (L, hi - lo) mask of the keys lo..hi-1 each query sees; None = all."""
    if causal is False or causal is None:
        return None
    hi = S if hi is None else hi
    if causal is True or causal == "top_left":
        shift = 0
    elif causal == "bottom_right":
        shift = S - L
    else:
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', not {causal!r}")
    i = np.arange(L)[:, None]
    j = np.arange(lo, hi)[None, :]
    return j <= i + shift


def _safe_div(a: np.ndarray, l: np.ndarray) -> np.ndarray:
    out = np.zeros(np.broadcast_shapes(a.shape, l.shape), dtype=a.dtype)
    np.divide(a, l, out=out, where=l > 0)
    return out


def _operands(q, k, v, acc):
    H = q.shape[1]
    return q.astype(acc), _expand(k, H).astype(acc), _expand(v, H).astype(acc)


def _masked_scores(s: np.ndarray, L: int, S: int, causal: Any, lo: int = 0,
                   hi: int | None = None) -> np.ndarray:
    mask = visible(L, S, causal, lo, hi)
    if mask is not None:
        s = np.where(mask, s, np.array(-np.inf, dtype=s.dtype))
    return s


def _row_max_safe(s: np.ndarray) -> np.ndarray:
    m = s.max(axis=-1, keepdims=True)
    return np.where(np.isfinite(m), m, np.zeros((), dtype=s.dtype))


def _swap(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


# ----------------------------------------------------------------------------- correct


def naive_fp32acc(q, k, v, *, scale=None, causal=False, dtype):
    """SDPA math as on a GPU for fp16/bf16: everything in float32 (float64 for float64
    inputs), scores = (q @ kᵀ)·scale, softmax with the row max subtracted, attn @ v,
    one rounding to ``dtype`` at the end."""
    dt = _check(q, k, v, dtype)
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    L, S = q.shape[2], k.shape[2]
    s = (qf @ _swap(kf)) * acc.type(_scale(scale, q.shape[-1]))
    s = _masked_scores(s, L, S, causal)
    p = np.exp(s - _row_max_safe(s))
    attn = _safe_div(p, p.sum(axis=-1, keepdims=True))
    return (attn @ vf).astype(dt)


def eager_lowp(q, k, v, *, scale=None, causal=False, dtype):
    """torch eager op by op in the storage dtype: q @ kᵀ (fp32 accumulation) rounded to
    ``dtype``; ·scale rounded to ``dtype``; softmax computed in fp32 and rounded to
    ``dtype``; attn(dtype) @ v accumulated in fp32 and rounded.  For float32/float64
    this is the same as naive_fp32acc."""
    dt = _check(q, k, v, dtype)
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    L, S = q.shape[2], k.shape[2]
    s = rnd(qf @ _swap(kf), dt, acc)
    s = rnd(s * acc.type(_scale(scale, q.shape[-1])), dt, acc)
    s = _masked_scores(s, L, S, causal)
    p = np.exp(s - _row_max_safe(s))
    attn = rnd(_safe_div(p, p.sum(axis=-1, keepdims=True)), dt, acc)
    return (attn @ vf).astype(dt)


def _fa2_core(qf, kf, vf, scale, causal, lo, hi, block_n, p_dt, *, rescale=True, drop_last_partial=False):
    """FlashAttention-2's inner loop over key blocks lo..hi (vectorised over all query
    rows: the row blocks never interact).  Returns the unnormalised accumulator, the
    running max m and the running sum l (all in the compute dtype)."""
    acc = qf.dtype
    L, S = qf.shape[2], kf.shape[2]
    lead = qf.shape[:3]
    m = np.full((*lead, 1), -np.inf, dtype=acc)
    l = np.zeros((*lead, 1), dtype=acc)
    o = np.zeros((*lead, vf.shape[-1]), dtype=acc)
    sc = acc.type(scale)
    for start in range(lo, hi, block_n):
        end = min(start + block_n, hi)
        if drop_last_partial and end - start < block_n:
            break
        s = (qf @ _swap(kf[:, :, start:end, :])) * sc
        s = _masked_scores(s, L, S, causal, start, end)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        m_safe = np.where(np.isfinite(m_new), m_new, np.zeros((), dtype=acc))
        p = np.exp(s - m_safe)
        alpha = np.exp(m - m_safe)            # exp(m_old - m_new); 0 while m_old = -inf
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        pv = rnd(p, p_dt, acc)                # FA2 feeds P to the PV matmul in the input dtype
        o = (o * alpha if rescale else o) + pv @ vf[:, :, start:end, :]
        m = m_new
    return o, m, l


def _lse(m: np.ndarray, l: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(l > 0, m + np.log(l), -np.inf)[..., 0]


def _p_dtype(dt: np.dtype) -> np.dtype:
    return dt if dt in (F16, BF16) else compute_dtype(dt)


def fa2_blocked(q, k, v, *, scale=None, causal=False, dtype, block_n=128, return_lse=False,
                _rescale=True, _drop_last_partial=False):
    """FlashAttention-2 forward: online softmax over key blocks of ``block_n``;
    S_blk = q @ k_blkᵀ·scale in fp32, m_new = max(m, rowmax), P = exp(S_blk − m_new),
    l = l·exp(m − m_new) + rowsum(P), acc = acc·exp(m − m_new) + P(dtype) @ v_blk
    (P rounded to fp16/bf16 for those inputs, fp32 P for fp32 inputs), out = acc / l
    rounded to ``dtype``.  ``return_lse``: also return lse = m + log(l) (compute dtype,
    shape (B, H, L); -inf for a row that sees no key)."""
    dt = _check(q, k, v, dtype)
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    o, m, l = _fa2_core(qf, kf, vf, _scale(scale, q.shape[-1]), causal, 0, k.shape[2], block_n,
                        _p_dtype(dt), rescale=_rescale, drop_last_partial=_drop_last_partial)
    out = _safe_div(o, l).astype(dt)
    return (out, _lse(m, l)) if return_lse else out


def split_kv(q, k, v, *, scale=None, causal=False, dtype, num_splits=4, block_n=128, return_lse=False):
    """Flash-decoding: the keys cut into ``num_splits`` contiguous chunks of ceil(S/n);
    each chunk runs the FA2 loop and keeps (O_i = acc_i / l_i in fp32, lse_i); the merge
    (fp32): lse = logsumexp_i lse_i, O = Σ_i exp(lse_i − lse)·O_i, rounded to ``dtype``."""
    dt = _check(q, k, v, dtype)
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    S = k.shape[2]
    sc = _scale(scale, q.shape[-1])
    chunk = max(1, -(-S // max(1, int(num_splits))))
    parts = []
    for lo in range(0, S, chunk):
        o, m, l = _fa2_core(qf, kf, vf, sc, causal, lo, min(lo + chunk, S), block_n, _p_dtype(dt))
        parts.append((_safe_div(o, l), _lse(m, l)))
    lses = np.stack([p[1] for p in parts])                      # (n, B, H, L)
    lmax = lses.max(axis=0)
    lmax = np.where(np.isfinite(lmax), lmax, np.zeros((), dtype=acc))
    w = np.exp(lses - lmax)                                     # exp(-inf) = 0 for empty splits
    tot = w.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.where(tot > 0, lmax + np.log(tot), -np.inf).astype(acc)
    out = np.zeros_like(parts[0][0])
    for (o_i, lse_i) in parts:
        with np.errstate(invalid="ignore"):
            wi = np.where(np.isfinite(lse_i), np.exp(lse_i - np.where(np.isfinite(lse), lse, 0)), 0)
        out = out + wi.astype(acc)[..., None] * o_i
    out = out.astype(dt)
    return (out, lse) if return_lse else out


def _to_torch(a: np.ndarray):
    import torch

    if a.dtype == BF16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _from_torch(t, dt: np.dtype) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16)
    return t.numpy().astype(dt, copy=False)


def _torch_sdpa(q, k, v, *, scale, causal, dtype, backend):
    import torch
    import torch.nn.functional as F

    dt = _check(q, k, v, dtype)
    H = q.shape[1]
    L, S = q.shape[2], k.shape[2]
    qt, kt, vt = _to_torch(q), _to_torch(k), _to_torch(v)
    g = H // k.shape[1]
    if g > 1:
        kt, vt = kt.repeat_interleave(g, dim=1), vt.repeat_interleave(g, dim=1)
    kw: dict[str, Any] = {"scale": _scale(scale, q.shape[-1])}
    if causal == "bottom_right":
        kw["attn_mask"] = torch.from_numpy(visible(L, S, causal))
    elif causal:
        visible(L, S, causal)                  # validates the value
        kw["is_causal"] = True
    if backend == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel(SDPBackend.MATH)
    else:
        ctx = nullcontext()
    with torch.no_grad(), ctx:
        out = F.scaled_dot_product_attention(qt, kt, vt, **kw)
    return _from_torch(out, dt)


def torch_sdpa_math(q, k, v, *, scale=None, causal=False, dtype):
    """torch.nn.functional.scaled_dot_product_attention on the CPU, math backend forced."""
    return _torch_sdpa(q, k, v, scale=scale, causal=causal, dtype=dtype, backend="math")


def torch_sdpa_default(q, k, v, *, scale=None, causal=False, dtype):
    """torch.nn.functional.scaled_dot_product_attention on the CPU, backend torch picks
    (the CPU flash kernel where it applies)."""
    return _torch_sdpa(q, k, v, scale=scale, causal=causal, dtype=dtype, backend="default")


def _softmax_parts(q, k, v, scale, causal, dt):
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    s = (qf @ _swap(kf)) * acc.type(_scale(scale, q.shape[-1]))
    s = _masked_scores(s, q.shape[2], k.shape[2], causal)
    return np.exp(s - _row_max_safe(s)), vf


def pairwise_fp32(q, k, v, *, scale=None, causal=False, dtype, max_elems=1 << 22):
    """fp32 (float64 for float64 inputs) with every sum over the keys a numpy pairwise
    sum (np.sum along a contiguous axis): rowsum(P) and Σ_j attn_ij v_j (no BLAS for PV)."""
    dt = _check(q, k, v, dtype)
    p, vf = _softmax_parts(q, k, v, scale, causal, dt)
    attn = _safe_div(p, p.sum(axis=-1, keepdims=True))
    B, H, L, S = attn.shape
    vt = np.ascontiguousarray(_swap(vf))                        # (B, H, Ev, S)
    out = np.empty((B, H, L, vf.shape[-1]), dtype=attn.dtype)
    rows = max(1, max_elems // max(1, B * H * vf.shape[-1] * S))
    for r0 in range(0, L, rows):
        prod = attn[:, :, r0:r0 + rows, None, :] * vt[:, :, None, :, :]    # (B, H, r, Ev, S)
        out[:, :, r0:r0 + rows] = prod.sum(axis=-1)
    return out.astype(dt)


def sequential_fp32(q, k, v, *, scale=None, causal=False, dtype):
    """fp32 (float64 for float64 inputs) with every sum over the keys strictly left to
    right (a loop over S with accumulators vectorised over the rows; no FMA)."""
    dt = _check(q, k, v, dtype)
    p, vf = _softmax_parts(q, k, v, scale, causal, dt)
    l = np.zeros((*p.shape[:-1], 1), dtype=p.dtype)
    for j in range(p.shape[-1]):
        l += p[..., j:j + 1]
    attn = _safe_div(p, l)
    out = np.zeros((*p.shape[:-1], vf.shape[-1]), dtype=p.dtype)
    for j in range(p.shape[-1]):
        out += attn[..., j:j + 1] * vf[:, :, None, j, :]
    return out.astype(dt)


CORRECT: dict[str, Kernel] = {
    "naive_fp32acc": naive_fp32acc,
    "eager_lowp": eager_lowp,
    "fa2_blocked_64": partial(fa2_blocked, block_n=64),
    "fa2_blocked_128": partial(fa2_blocked, block_n=128),
    "split_kv_4": partial(split_kv, num_splits=4),
    "split_kv_16": partial(split_kv, num_splits=16, block_n=64),
    "torch_sdpa_math": torch_sdpa_math,
    "torch_sdpa_default": torch_sdpa_default,
    "pairwise_fp32": pairwise_fp32,
    "sequential_fp32": sequential_fp32,
}
TORCH_KERNELS = frozenset({"torch_sdpa_math", "torch_sdpa_default"})


# ----------------------------------------------------------------------------- mutants


def _fp32_attention(q, k, v, *, scale, causal, dt, k_hook=None, v_hook=None, qk_hook=None,
                    s_hook=None, scale_hook=None, p_hook=None, pv_hook=None, l_fn=None,
                    out_dtype=None):
    """A float32 (float64) attention with a hook at each step a bug can sit in.
    Softmax unnormalised, PV matmul, then division by l (the flash order)."""
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    if k_hook:
        kf = k_hook(kf)
    if v_hook:
        vf = v_hook(vf)
    qa, ka = (qk_hook(qf), qk_hook(kf)) if qk_hook else (qf, kf)
    sc = _scale(scale, q.shape[-1])
    if scale_hook:
        sc = scale_hook(sc)
    s = (qa @ _swap(ka)) * acc.type(sc)
    if s_hook:
        s = s_hook(s)
    s = _masked_scores(s, q.shape[2], k.shape[2], causal)
    p = np.exp(s - _row_max_safe(s))
    l = l_fn(p) if l_fn else p.sum(axis=-1, keepdims=True)
    pp = p_hook(p) if p_hook else p
    if pv_hook:
        pp, vf = pv_hook(pp), pv_hook(vf)
    out = _safe_div(pp @ vf, l)
    return out.astype(dt if out_dtype is None else out_dtype)


def _r(to: np.dtype) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: x.astype(to).astype(x.dtype)


def p_fp16_before_pv(q, k, v, *, scale=None, causal=False, dtype):
    """P = exp(s − max) rounded to float16 before P @ V; l the fp32 sum of unrounded P."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, p_hook=_r(F16))


def p_bf16_before_pv(q, k, v, *, scale=None, causal=False, dtype):
    """P rounded to bfloat16 before P @ V; l the fp32 sum of unrounded P."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, p_hook=_r(BF16))


def kv_cache_fp16(q, k, v, *, scale=None, causal=False, dtype):
    """K and V go through a float16 KV cache before use; the rest in fp32."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, k_hook=_r(F16), v_hook=_r(F16))


def kv_cache_bf16(q, k, v, *, scale=None, causal=False, dtype):
    """K and V go through a bfloat16 KV cache before use; the rest in fp32."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, k_hook=_r(BF16), v_hook=_r(BF16))


def scores_bf16(q, k, v, *, scale=None, causal=False, dtype):
    """The scaled scores q·kᵀ·scale rounded to bfloat16; the rest in fp32."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, s_hook=_r(BF16))


def scale_bf16(q, k, v, *, scale=None, causal=False, dtype):
    """The softmax scale held in bfloat16 (1/sqrt(E) rounded to 8 significant bits); the
    rest in fp32.  A no-op where the scale is exact in bf16 (E = 16, 64, 256, ...)."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt,
                           scale_hook=lambda s: float(np.float32(s).astype(BF16)))


def tf32_matmuls(q, k, v, *, scale=None, causal=False, dtype):
    """Both matmuls with their operands rounded to TF32 (q, k for the scores; P, V for
    PV), fp32 accumulation: allow_tf32 left on for an fp32 kernel."""
    dt = _check(q, k, v, dtype)
    if compute_dtype(dt) != F32:
        raise TypeError("tf32_matmuls computes in float32; give it float32/float16/bfloat16 inputs")
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, qk_hook=round_tf32, pv_hook=round_tf32)


def computed_in_bf16_returned_fp32(q, k, v, *, scale=None, causal=False, dtype):
    """fp32 inputs cast to bfloat16, computed as eager_lowp in bf16, upcast back to the
    input dtype: the dtype promise kept, the precision not."""
    dt = _check(q, k, v, dtype)
    out = eager_lowp(q.astype(BF16), k.astype(BF16), v.astype(BF16), scale=scale, causal=causal, dtype=BF16)
    return out.astype(dt)


def fp16_in_bf16_out(q, k, v, *, scale=None, causal=False, dtype):
    """fp16 inputs cast to bfloat16 (an autocast to the wrong half type), computed as SDPA
    math does in bf16 (fp32 inside), returned in bfloat16."""
    _check(q, k, v, dtype)
    return naive_fp32acc(q.astype(BF16), k.astype(BF16), v.astype(BF16), scale=scale, causal=causal,
                         dtype=BF16)


def fp16_in_fp32_out(q, k, v, *, scale=None, causal=False, dtype):
    """fp16 inputs computed correctly in fp32 and returned as float32 (the final rounding
    to fp16 missing: more accurate than the promise, but not the promised dtype)."""
    dt = _check(q, k, v, dtype)
    acc = compute_dtype(dt)
    qf, kf, vf = q.astype(acc), k.astype(acc), v.astype(acc)
    return naive_fp32acc(qf, kf, vf, scale=scale, causal=causal, dtype=acc)


def no_max_subtraction(q, k, v, *, scale=None, causal=False, dtype):
    """A hand-written softmax without the row max: exp(s) / Σ exp(s), op by op in the
    storage dtype (exp and the sum rounded to it, so fp16 overflows to inf at s > 11.09;
    fp32/bf16 at s > 88.7), then attn @ v.  Exact-ish while nothing overflows."""
    dt = _check(q, k, v, dtype)
    acc = compute_dtype(dt)
    qf, kf, vf = _operands(q, k, v, acc)
    s = rnd(qf @ _swap(kf), dt, acc)
    s = rnd(s * acc.type(_scale(scale, q.shape[-1])), dt, acc)
    s = _masked_scores(s, q.shape[2], k.shape[2], causal)
    with np.errstate(over="ignore", invalid="ignore"):
        e = rnd(np.exp(s), dt, acc)
        tot = rnd(e.sum(axis=-1, keepdims=True), dt, acc)
        attn = rnd(e / tot, dt, acc)
        return (attn @ vf).astype(dt)


def _l_fp16_sequential(p: np.ndarray) -> np.ndarray:
    l = np.zeros((*p.shape[:-1], 1), dtype=F16)
    p16 = p.astype(F16)
    for j in range(p.shape[-1]):
        l = (l + p16[..., j:j + 1]).astype(F16)
    return l.astype(p.dtype)


def sum_in_fp16(q, k, v, *, scale=None, causal=False, dtype):
    """The softmax denominator l = Σ_j exp(s_ij − m_i) accumulated left to right in a
    float16 register; the rest in fp32."""
    dt = _check(q, k, v, dtype)
    return _fp32_attention(q, k, v, scale=scale, causal=causal, dt=dt, l_fn=_l_fp16_sequential)


def last_block_dropped(q, k, v, *, scale=None, causal=False, dtype, block_n=128):
    """fa2_blocked whose key loop runs S // block_n full blocks only: the last partial
    block is skipped when S % block_n != 0."""
    return fa2_blocked(q, k, v, scale=scale, causal=causal, dtype=dtype, block_n=block_n,
                       _drop_last_partial=True)


def rescale_missing(q, k, v, *, scale=None, causal=False, dtype, block_n=128):
    """fa2_blocked that forgets acc ·= exp(m_old − m_new) when the running max grows
    (l is still rescaled)."""
    return fa2_blocked(q, k, v, scale=scale, causal=causal, dtype=dtype, block_n=block_n, _rescale=False)


BUGGY: dict[str, tuple[Kernel, str]] = {
    "p_fp16_before_pv": (p_fp16_before_pv, "intermediate-rounding"),
    "p_bf16_before_pv": (p_bf16_before_pv, "intermediate-rounding"),
    "kv_cache_fp16": (kv_cache_fp16, "input-rounding"),
    "kv_cache_bf16": (kv_cache_bf16, "input-rounding"),
    "scores_bf16": (scores_bf16, "intermediate-rounding"),
    "scale_bf16": (scale_bf16, "scale-rounding"),
    "tf32_matmuls": (tf32_matmuls, "matmul-precision"),
    "computed_in_bf16_returned_fp32": (computed_in_bf16_returned_fp32, "silent-downcast"),
    "fp16_in_bf16_out": (fp16_in_bf16_out, "dtype-promise"),
    "fp16_in_fp32_out": (fp16_in_fp32_out, "dtype-promise"),
    "no_max_subtraction": (no_max_subtraction, "overflow"),
    "sum_in_fp16": (sum_in_fp16, "accumulator-precision"),
    "last_block_dropped": (last_block_dropped, "algorithmic"),
    "rescale_missing": (rescale_missing, "algorithmic"),
}

_FP32 = (F32,)
MUTANT_DTYPES: dict[str, tuple[np.dtype, ...]] = {
    "p_fp16_before_pv": _FP32,
    "p_bf16_before_pv": (F32, F16),
    "kv_cache_fp16": _FP32,
    "kv_cache_bf16": (F32, F16),
    "scores_bf16": (F32, F16),
    "scale_bf16": (F32, F16),
    "tf32_matmuls": _FP32,
    "computed_in_bf16_returned_fp32": _FP32,
    "fp16_in_bf16_out": (F16,),
    "fp16_in_fp32_out": (F16,),
    "no_max_subtraction": (F64, F32, F16, BF16),
    "sum_in_fp16": (F32, F16, BF16),
    "last_block_dropped": (F64, F32, F16, BF16),
    "rescale_missing": (F64, F32, F16, BF16),
}

MUTANT_CONDITIONS: dict[str, str] = {
    "scale_bf16": (
        "only where the scale is not exact in bf16: 1/sqrt(E) is exact for E = 4^n (16, 64, 256), "
        "not for E = 80, 96, 128"
    ),
    "no_max_subtraction": (
        "only where exp(s) overflows the storage dtype: max s > 11.09 (fp16), > 88.7 (fp32/bf16)"
    ),
    "last_block_dropped": "only where S % block_n != 0 (block_n = 128)",
    "rescale_missing": "only where a later key block raises a row's max (almost always for random data)",
    "fp16_in_fp32_out": "values are more accurate than the correct kernel's; only the dtype is wrong",
}


# ----------------------------------------------------------------------------- inputs

KINDS = ("normal", "llm", "shifted")


def draw(rng: np.random.Generator, B: int, H: int, H_kv: int, L: int, S: int, E: int, dtype: Any,
         kind: str = "normal", Ev: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, k, v) in ``dtype``, drawn in float64 and rounded once.

    * "normal": standard normal.
    * "llm": standard normal with the first 3 channels of q and of k multiplied by 6
      (outlier channels: max |q·kᵀ|/sqrt(E) reaches ~40-70 at E = 64 and 10^5-10^6 scores).
    * "shifted": standard normal, v + 3 (a large common mean in v)."""
    dt = as_dtype(dtype)
    Ev = E if Ev is None else Ev
    q = rng.standard_normal((B, H, L, E))
    k = rng.standard_normal((B, H_kv, S, E))
    v = rng.standard_normal((B, H_kv, S, Ev))
    if kind == "llm":
        q[..., :3] *= 6.0
        k[..., :3] *= 6.0
    elif kind == "shifted":
        v += 3.0
    elif kind != "normal":
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if dt == BF16:
        return q.astype(F32).astype(BF16), k.astype(F32).astype(BF16), v.astype(F32).astype(BF16)
    return q.astype(dt), k.astype(dt), v.astype(dt)


def reference_f64(q, k, v, *, scale=None, causal=False) -> np.ndarray:
    """The float64 softmax(q kᵀ·scale) v of the stored inputs (for tables and tests)."""
    return naive_fp32acc(q.astype(F64), k.astype(F64), v.astype(F64), scale=scale, causal=causal, dtype=F64)


def max_abs_err(out: np.ndarray, ref: np.ndarray) -> float:
    d = np.abs(out.astype(F64) - ref)
    return float(np.nanmax(d)) if not np.isnan(d).any() else float("nan")


# ----------------------------------------------------------------------------- table


def error_table(Ss=(256, 1024, 4096, 8192), L=32, E=64, H=4, B=1, kind="normal", seed=0,
                dtype=F32, skip=(), causal=False) -> list[tuple[str, dict[int, float]]]:
    """Max abs error vs the float64 reference, per kernel and S (fp32 normal by default)."""
    rows: dict[str, dict[int, float]] = {}
    have_torch = True
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover
        have_torch = False
    for S in Ss:
        rng = np.random.default_rng([seed, S])
        q, k, v = draw(rng, B, H, H, L, S, E, dtype, kind)
        ref = reference_f64(q, k, v, causal=causal)
        for name, fn in CORRECT.items():
            if name in skip or (name in TORCH_KERNELS and not have_torch):
                continue
            rows.setdefault(name, {})[S] = max_abs_err(fn(q, k, v, causal=causal, dtype=dtype), ref)
        for name, (fn, _) in BUGGY.items():
            if name in skip:
                continue
            rows.setdefault(name, {})[S] = max_abs_err(fn(q, k, v, causal=causal, dtype=dtype), ref)
    return list(rows.items())


if __name__ == "__main__":  # pragma: no cover
    import sys

    Ss = tuple(int(a) for a in sys.argv[1:]) or (256, 1024, 4096, 8192)
    table = error_table(Ss)
    correct_max = {S: max(e[S] for n, e in table if n in CORRECT) for S in Ss}
    print(f"{'kernel':32s}" + "".join(f"{'S=' + str(S):>12s}" for S in Ss) + "   ratio to correct max")
    for name, errs in table:
        ratio = " ".join(f"{errs[S] / correct_max[S]:8.3g}" for S in Ss) if name in BUGGY else ""
        print(f"{name:32s}" + "".join(f"{errs[S]:12.3e}" for S in Ss) + "   " + ratio)
