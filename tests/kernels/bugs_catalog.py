"""Attention implementations for the evaluation of the testing tool: correct ones
and buggy ones (one per known bug class), plus the random case generator.

Written independently of ``mha_symbolic`` (it imports nothing from it), in plain
numpy with ml_dtypes, so that a verdict on these implementations is a test of the
tool, not of a shared helper.  Used by tests/testing/forward/test_compare.py (a small sample) and
bench/bench_verdicts.py (thousands of cases).

Every implementation stores its tensors in ``dtype`` (inputs, scores, weights,
output) and multiplies/accumulates in ``work`` (float32 for fp16/bf16, like
cuBLAS and the PyTorch MATH path), unless said otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

DTYPES: dict[str, Any] = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
}

# scaled-dot-product bug classes (name -> needs) and multi-head ones
SDPA_BUGS = (
    "no_scale", "scale_1_over_d", "scale_sqrt_d_plus_1", "softmax_over_query_axis",
    "inverted_bool_mask", "causal_misaligned", "causal_excludes_diagonal",
    "causal_sees_next_key", "gqa_tile", "swapped_key_value", "last_key_dropped",
    "finite_mask_sentinel",
)
MHA_BUGS = ("heads_concat_wrong_order", "transposed_out_proj", "missing_bias")
CORRECT_SDPA = ("numpy_plain", "numpy_online_blocks", "numpy_same_dtype_accumulation",
                "numpy_sequential_accumulation", "numpy_fused", "numpy_fused_online")
# the model options that describe each correct kernel (compare_attention keywords):
# "fused" kernels keep the scores in the work dtype (FlashAttention-like); the others
# round the scaled query q·c and the scores to the dtype; the last two also accumulate
# in it
KERNEL_OPTIONS: dict[str, dict[str, Any]] = {
    "numpy_plain": {"kernel": "eager_scaled_query"},
    "numpy_online_blocks": {"kernel": "eager_scaled_query"},
    "numpy_same_dtype_accumulation": {"kernel": "eager_scaled_query",
                                      "accumulation_dtype": "same"},
    "numpy_sequential_accumulation": {"kernel": "eager_scaled_query",
                                      "accumulation_dtype": "same"},
    "numpy_fused": {},
    "numpy_fused_online": {},
}


@dataclass
class Case:
    """One scaled-dot-product attention call (inputs already in ``dtype``)."""

    dtype: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    attn_mask: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    causal_alignment: str = "top_left"
    kind: str = "random"
    options: dict[str, Any] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        return dict(attn_mask=self.attn_mask, is_causal=self.is_causal, scale=self.scale,
                    enable_gqa=self.enable_gqa, causal_alignment=self.causal_alignment)


def _store(a: np.ndarray, dtype: Any, work: Any) -> np.ndarray:
    return np.asarray(a).astype(dtype).astype(work)


def _work(dtype: str) -> Any:
    return np.float64 if dtype == "float64" else np.float32


def numpy_attention(case: Case, *, bug: str | None = None, variant: str = "numpy_plain",
                    block: int = 4) -> np.ndarray:
    """Attention of ``case`` in its dtype; ``bug`` names a bug class to commit,
    ``variant`` a correct implementation strategy. Returns an array of ``case.dtype``."""
    dt = DTYPES[case.dtype]
    if variant == "numpy_sequential_accumulation":
        return _sequential(case)
    fused = variant in ("numpy_fused", "numpy_fused_online")
    wk = dt if variant == "numpy_same_dtype_accumulation" else _work(case.dtype)
    q = case.q.astype(wk)
    k = case.k.astype(wk)
    v = case.v.astype(wk)
    if bug == "swapped_key_value":
        k, v = v, k
    L, E = q.shape[-2], q.shape[-1]
    S = k.shape[-2]
    hq = q.shape[-3]
    if k.shape[-3] != hq:
        rep = hq // k.shape[-3]
        if bug == "gqa_tile":
            k = np.tile(k, (1,) * (k.ndim - 3) + (rep, 1, 1))
            v = np.tile(v, (1,) * (v.ndim - 3) + (rep, 1, 1))
        else:
            k = np.repeat(k, rep, axis=-3)
            v = np.repeat(v, rep, axis=-3)
    scale = 1.0 / math.sqrt(E) if case.scale is None else case.scale
    if bug == "no_scale":
        scale = 1.0
    elif bug == "scale_1_over_d":
        scale = 1.0 / E
    elif bug == "scale_sqrt_d_plus_1":
        scale = 1.0 / math.sqrt(E + 1)
    if fused:   # scores in the work dtype, the scale applied after the product
        s = (q @ np.swapaxes(k, -1, -2)) * wk(scale)
    else:
        s = _store(_store(q * wk(scale), dt, wk) @ np.swapaxes(k, -1, -2), dt, wk)
    keep = np.ones(s.shape, dtype=bool)
    add = np.zeros(s.shape, dtype=wk)
    if case.is_causal:
        off = S - L if case.causal_alignment == "bottom_right" else 0
        if bug == "causal_misaligned":
            off = (S - L) - off
        elif bug == "causal_excludes_diagonal":
            off -= 1
        elif bug == "causal_sees_next_key":
            off += 1
        keep &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    m = case.attn_mask
    sentinel = bug == "finite_mask_sentinel"
    if m is not None:
        if m.dtype == np.bool_:
            mm = ~m if bug == "inverted_bool_mask" else m
            if sentinel:
                add = add + np.where(mm, 0.0, -1e4).astype(wk)
            else:
                keep &= mm
        else:
            mf = m.astype(np.float64)
            if sentinel:
                mf = np.where(np.isinf(mf), -1e4, mf)
            keep &= mf != -np.inf
            add = add + np.where(np.isfinite(mf), mf, 0.0).astype(wk)
    if bug == "last_key_dropped":
        keep &= np.arange(S) < S - 1
    if (m is not None and m.dtype != np.bool_) or sentinel:
        s = s + add if fused else _store(s + _store(add, dt, wk), dt, wk)
    axis = -2 if bug == "softmax_over_query_axis" else -1
    if variant in ("numpy_online_blocks", "numpy_fused_online") and axis == -1:
        out = _online(s, keep, v, dt, wk, block)
    else:
        s = np.where(keep, s, -np.inf)
        with np.errstate(invalid="ignore", over="ignore"):
            mx = np.max(s, axis=axis, keepdims=True) if s.shape[axis] else s
            mx = np.where(np.isfinite(mx), mx, 0)
            e = np.where(keep, np.exp(s - mx), 0).astype(wk)
            tot = np.sum(e, axis=axis, keepdims=True)
            p = _store(np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0), dt, wk)
        out = p @ v
    return np.asarray(out).astype(dt)


def _online(s: np.ndarray, keep: np.ndarray, v: np.ndarray, dt: Any, wk: Any,
            block: int) -> np.ndarray:
    """FlashAttention-style: key blocks, running max and sum, P stored in dtype
    before P@V, one division at the end."""
    S = s.shape[-1]
    m = np.full((*s.shape[:-1], 1), -np.inf, dtype=wk)
    ell = np.zeros((*s.shape[:-1], 1), dtype=wk)
    acc = np.zeros((*s.shape[:-1], v.shape[-1]), dtype=wk)
    with np.errstate(invalid="ignore", over="ignore"):
        for j0 in range(0, S, block):
            sb = np.where(keep[..., j0:j0 + block], s[..., j0:j0 + block], -np.inf)
            m_new = np.maximum(m, np.max(sb, axis=-1, keepdims=True))
            safe = np.where(np.isfinite(m_new), m_new, 0)
            alpha = np.where(np.isfinite(m), np.exp(m - safe), 0).astype(wk)
            pb = np.where(np.isfinite(sb), np.exp(sb - safe), 0).astype(wk)
            ell = alpha * ell + np.sum(pb, axis=-1, keepdims=True)
            acc = alpha * acc + _store(pb, dt, wk) @ v[..., j0:j0 + block, :]
            m = m_new
        return np.where(ell > 0, acc / np.where(ell > 0, ell, 1), 0)


def _sequential(case: Case) -> np.ndarray:
    """Every operation in the dtype itself, sums accumulated one term at a time and
    rounded after each addition (the loosest legitimate plain implementation)."""
    dt = DTYPES[case.dtype]

    def r(a: Any) -> np.ndarray:
        return np.asarray(a, dtype=np.float64).astype(dt).astype(np.float64)

    q, k, v = (x.astype(np.float64) for x in (case.q, case.k, case.v))
    if k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    c = r(1.0 / math.sqrt(E) if case.scale is None else case.scale)
    qs = r(q * c)
    s = np.zeros((*q.shape[:-1], S))
    for e in range(E):
        s = r(s + r(qs[..., :, e:e + 1] * np.swapaxes(k[..., :, e:e + 1], -1, -2)))
    keep = np.ones(s.shape, dtype=bool)
    if case.is_causal:
        off = S - L if case.causal_alignment == "bottom_right" else 0
        keep &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    m = case.attn_mask
    if m is not None:
        if m.dtype == np.bool_:
            keep &= m
        else:
            mf = m.astype(np.float64)
            keep &= mf != -np.inf
            s = r(s + np.where(np.isfinite(mf), mf, 0.0))
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore"):
        mx = np.max(s, axis=-1, keepdims=True) if S else s
        mx = np.where(np.isfinite(mx), mx, 0.0)
        ex = np.where(keep, r(np.exp(r(s - mx))), 0.0)
    tot = np.zeros((*s.shape[:-1], 1))
    for j in range(S):
        tot = r(tot + ex[..., j:j + 1])
    p = np.where(tot > 0, r(ex / np.where(tot > 0, tot, 1.0)), 0.0)
    out = np.zeros((*s.shape[:-1], v.shape[-1]))
    for j in range(S):
        out = r(out + r(p[..., j:j + 1] * v[..., j:j + 1, :]))
    return out.astype(dt)


# ---------------------------------------------------------------------------------
# Multi-head block (torch.nn.MultiheadAttention semantics, batch_first, torch layout)


@dataclass
class MhaCase:
    dtype: str
    query: np.ndarray          # (N, L, E)
    key: np.ndarray            # (N, S, E)
    value: np.ndarray
    num_heads: int
    in_proj_weight: np.ndarray  # (3E, E)
    in_proj_bias: np.ndarray | None
    out_proj_weight: np.ndarray
    out_proj_bias: np.ndarray | None
    key_padding_mask: np.ndarray | None = None  # (N, S) True = ignore

    def kwargs(self) -> dict[str, Any]:
        return dict(num_heads=self.num_heads, batch_first=True,
                    in_proj_weight=self.in_proj_weight,
                    in_proj_bias=self.in_proj_bias, out_proj_weight=self.out_proj_weight,
                    out_proj_bias=self.out_proj_bias, key_padding_mask=self.key_padding_mask)


def numpy_mha(c: MhaCase, *, bug: str | None = None) -> np.ndarray:
    dt = DTYPES[c.dtype]
    wk = _work(c.dtype)
    E = c.query.shape[-1]
    h = c.num_heads
    d = E // h
    W = c.in_proj_weight.astype(wk)
    b = None if c.in_proj_bias is None or bug == "missing_bias" else c.in_proj_bias.astype(wk)

    def lin(x: np.ndarray, w: np.ndarray, bb: np.ndarray | None) -> np.ndarray:
        y = x.astype(wk) @ w.T
        return _store(y if bb is None else y + bb, dt, wk)

    Q = lin(c.query, W[:E], None if b is None else b[:E])
    K = lin(c.key, W[E:2 * E], None if b is None else b[E:2 * E])
    V = lin(c.value, W[2 * E:], None if b is None else b[2 * E:])

    def split(x: np.ndarray) -> np.ndarray:
        N, n, _ = x.shape
        return x.reshape(N, n, h, d).transpose(0, 2, 1, 3)

    s = _store(_store(split(Q) * wk(1 / math.sqrt(d)), dt, wk)
               @ np.swapaxes(split(K), -1, -2), dt, wk)
    if c.key_padding_mask is not None:
        s = np.where(c.key_padding_mask[:, None, None, :], -np.inf, s)
    mx = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - mx)
    p = _store(e / np.sum(e, axis=-1, keepdims=True), dt, wk)
    O = _store(p @ split(V), dt, wk)
    if bug == "heads_concat_wrong_order":
        O = O[:, ::-1]
    N, _, L, _ = O.shape
    O = O.transpose(0, 2, 1, 3).reshape(N, L, E)
    Wo = c.out_proj_weight.astype(wk)
    if bug == "transposed_out_proj":
        Wo = Wo.T
    bo = None if c.out_proj_bias is None or bug == "missing_bias" else c.out_proj_bias
    return lin(O, Wo, None if bo is None else bo.astype(wk)).astype(dt)


# ---------------------------------------------------------------------------------
# Random cases


def _arr(rng: np.random.Generator, shape: tuple[int, ...], dtype: str,
         s: float = 1.0) -> np.ndarray:
    return (s * rng.standard_normal(shape)).astype(DTYPES[dtype])


def random_case(rng: np.random.Generator, dtype: str, *, kind: str | None = None,
                max_len: int = 16, max_e: int = 16) -> Case:
    """A random attention call; ``kind`` picks a hard family: 'long_rows',
    'large_range', 'near_ties', 'cancelling', 'fully_masked_row', or a random
    option mix ('random')."""
    kinds = ("random", "random", "long_rows", "large_range", "near_ties", "cancelling",
             "fully_masked_row")
    kind = kind or str(rng.choice(kinds))
    B = int(rng.integers(1, 3))
    Hkv = int(rng.choice([1, 2]))
    gqa = bool(rng.random() < 0.3)
    Hq = Hkv * (int(rng.choice([2, 3])) if gqa else 1)
    gqa = Hq != Hkv
    L = int(rng.integers(1, max_len + 1))
    S = int(rng.integers(1, max_len + 1))
    if kind == "long_rows":
        L, S = int(rng.integers(1, 5)), int(rng.integers(4 * max_len, 8 * max_len + 1))
    E = int(rng.integers(1, max_e + 1))
    Ev = E if rng.random() < 0.6 else int(rng.integers(1, max_e + 1))
    qs = 1.0
    if kind == "large_range":
        qs = float(rng.choice([4.0, 8.0]))
    q = _arr(rng, (B, Hq, L, E), dtype, qs)
    k = _arr(rng, (B, Hkv, S, E), dtype, qs)
    v = _arr(rng, (B, Hkv, S, Ev), dtype)
    if kind == "near_ties":
        base = rng.standard_normal((B, Hkv, 1, E))
        k = (base + 1e-3 * rng.standard_normal((B, Hkv, S, E))).astype(DTYPES[dtype])
    if kind == "cancelling":
        half = (S + 1) // 2
        vv = rng.standard_normal((B, Hkv, half, Ev)) * 10
        v = np.concatenate([vv, -vv], axis=-2)[..., :S, :].astype(DTYPES[dtype])
        k = np.concatenate([k[..., :half, :], k[..., :half, :]], axis=-2)[..., :S, :]
    case = Case(dtype, q, k, v, enable_gqa=gqa, kind=kind)
    r = rng.random()
    if r < 0.25:
        case.is_causal = True
        case.causal_alignment = str(rng.choice(["top_left", "bottom_right"]))
        if case.causal_alignment == "bottom_right" and S < L:
            case.causal_alignment = "top_left"
    elif r < 0.5:
        m = rng.random((L, S)) < 0.7
        m[:, 0] = True  # no fully masked row (that policy is tested separately)
        case.attn_mask = m
    elif r < 0.65:
        m = np.where(rng.random((L, S)) < 0.7, rng.standard_normal((L, S)), -np.inf)
        m[:, 0] = 0.0
        case.attn_mask = m.astype(DTYPES[dtype])
    if kind == "fully_masked_row":            # a row with no key: output 0 by policy
        m = rng.random((L, S)) < 0.7
        m[:, 0] = True
        m[int(rng.integers(0, L))] = False
        case.attn_mask = m
        case.is_causal = False
    if rng.random() < 0.2:
        case.scale = float(rng.choice([0.5, 0.125, 1.0]))
    return case


def bug_applies(bug: str, c: Case) -> bool:
    """Is the bug class meaningful for this case (does the code path exist)?"""
    L, S, E = c.q.shape[-2], c.k.shape[-2], c.q.shape[-1]
    m = c.attn_mask
    return {
        "no_scale": c.scale is None and E > 1,
        "scale_1_over_d": c.scale is None and E > 1,
        "scale_sqrt_d_plus_1": c.scale is None,
        "softmax_over_query_axis": L > 1,
        "inverted_bool_mask": m is not None and m.dtype == np.bool_,
        "causal_misaligned": c.is_causal and L != S,
        "causal_excludes_diagonal": c.is_causal,
        "causal_sees_next_key": c.is_causal,
        "gqa_tile": c.enable_gqa and c.k.shape[-3] > 1,
        "swapped_key_value": c.k.shape == c.v.shape,
        "last_key_dropped": S > 1,
        "finite_mask_sentinel": m is not None and (m.dtype == np.bool_
                                                   or bool(np.any(np.isinf(m)))),
    }[bug]


def random_mha_case(rng: np.random.Generator, dtype: str, *, bias: bool = True) -> MhaCase:
    h = int(rng.choice([1, 2, 4]))
    E = h * int(rng.integers(1, 5))
    N = int(rng.integers(1, 3))
    L, S = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    x = _arr(rng, (N, L, E), dtype)
    kv = _arr(rng, (N, S, E), dtype)
    w = _arr(rng, (3 * E, E), dtype, 1 / math.sqrt(E))
    wo = _arr(rng, (E, E), dtype, 1 / math.sqrt(E))
    bi = _arr(rng, (3 * E,), dtype) if bias else None
    bo = _arr(rng, (E,), dtype) if bias else None
    kpm = None
    if rng.random() < 0.4 and S > 1:
        kpm = rng.random((N, S)) < 0.3
        kpm[:, 0] = False
    self_attn = rng.random() < 0.5 and S == L
    key = x if self_attn else kv
    return MhaCase(dtype, x, key, key, h, w, bi, wo, bo, kpm)
