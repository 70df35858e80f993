"""Known bug classes of attention code, as data, and the diagnosis built on them.

Each entry of :data:`BUG_CLASSES` names a mistake seen in real attention code
(see docs/testing.md) and gives a function that computes, in float64, what the
buggy formula outputs for the same inputs.  The diagnosis only *names* a bug
class after checking it: the actual output must lie within the model tolerance
of that buggy variant while it does not lie within tolerance of the truth.

Also here: the float64 plain attention (:func:`plain_attention`) the bug
variants and the tolerance model share, and the same for the whole multi-head
block (:func:`plain_mha`).  Neither is a reference: the reference is the
oracle's certified enclosure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .tolerance import FloatFormat, attention_error_bound, linear_error_bound

__all__ = [
    "BUG_CLASSES",
    "MHA_BUG_CLASSES",
    "AttentionInputs",
    "BugClass",
    "Plain",
    "diagnose",
    "plain_attention",
]


@dataclass(frozen=True)
class AttentionInputs:
    """Inputs and options of one scaled-dot-product attention call, in float64."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    attn_mask: np.ndarray | None = None   # bool (True = takes part) or float (added)
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    causal_alignment: str = "top_left"
    masked_rows: str = "zero"

    @property
    def effective_scale(self) -> float:
        """1/sqrt(E) by default (float64 is enough here: this is not the reference)."""
        return 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else float(self.scale)


@dataclass(frozen=True)
class Plain:
    """A float64 evaluation: output, weights, and what the tolerance model needs."""

    out: np.ndarray
    p: np.ndarray
    q: np.ndarray
    k: np.ndarray                # heads matched to the query (GQA expanded)
    v: np.ndarray
    scale: float
    allowed: np.ndarray
    mask_add: np.ndarray | None  # finite part of a float mask
    softmax_axis: int = -1

    def bound(self, fmt: FloatFormat, acc: FloatFormat) -> np.ndarray:
        return attention_error_bound(
            self.q, self.k, self.v, self.p, scale=self.scale, allowed=self.allowed,
            mask_add=self.mask_add, out=self.out, fmt=fmt, acc=acc,
            softmax_axis=self.softmax_axis,
        )


def _expand_heads(x: np.ndarray, hq: int, *, tile: bool = False) -> np.ndarray:
    """GQA: query head g uses key/value head g // (H_q / H_kv) (repeat_interleave)."""
    if x.ndim < 3 or x.shape[-3] == hq:
        return x
    rep = hq // x.shape[-3]
    if tile:
        reps = [1] * x.ndim
        reps[-3] = rep
        return np.tile(x, reps)
    return np.repeat(x, rep, axis=-3)


def plain_attention(
    x: AttentionInputs,
    *,
    softmax_axis: int = -1,
    tile_gqa: bool = False,
    causal_offset: int = 0,
    invert_bool_mask: bool = False,
) -> Plain:
    """Float64 attention with the options of ``reference_attention``; the keyword
    switches produce the buggy variants of the catalogue."""
    q, k, v = x.q, x.k, x.v
    hq = q.shape[-3] if q.ndim >= 3 else 1
    k = _expand_heads(k, hq, tile=tile_gqa)
    v = _expand_heads(v, hq, tile=tile_gqa)
    c = x.effective_scale
    L, S = q.shape[-2], k.shape[-2]
    s = c * (q @ np.swapaxes(k, -1, -2))
    allowed = np.ones(s.shape, dtype=bool)
    mask_add = None
    if x.is_causal:
        # top-left: j <= i; bottom-right: j <= i + S - L; the offset makes the
        # off-by-one variants of the catalogue
        off = causal_offset + (S - L if x.causal_alignment == "bottom_right" else 0)
        allowed &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    m = x.attn_mask
    if m is not None:
        if m.dtype == np.bool_:
            allowed &= ~m if invert_bool_mask else m
        else:
            mf = np.asarray(m, dtype=np.float64)
            allowed &= mf != -np.inf
            mask_add = np.where(np.isfinite(mf), mf, 0.0)
            s = s + mask_add
            mask_add = np.broadcast_to(mask_add, s.shape)
    s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if s.shape[softmax_axis] == 0:
            p = np.zeros(s.shape)
        else:
            smax = np.max(s, axis=softmax_axis, keepdims=True)
            e = np.where(allowed, np.exp(s - np.where(np.isfinite(smax), smax, 0.0)), 0.0)
            tot = np.sum(e, axis=softmax_axis, keepdims=True)
            empty = tot == 0
            p = np.where(empty, 0.0, e / np.where(empty, 1.0, tot))
    out = p @ v
    if x.masked_rows == "nan" and softmax_axis == -1:
        dead = ~np.any(allowed, axis=-1)
        out = np.where(dead[..., None], np.nan, out)
    return Plain(out, p, q, k, v, c, allowed, mask_add, softmax_axis)


# --------------------------------------------------------------------------------------
# The catalogue: name -> (description, applies-to predicate, buggy variant)


@dataclass(frozen=True)
class BugClass:
    name: str
    description: str
    applies: Callable[[AttentionInputs], bool]
    variant: Callable[[AttentionInputs], Plain]


def _always(x: AttentionInputs) -> bool:
    return True


def _with_scale(c: Callable[[AttentionInputs], float]) -> Callable[[AttentionInputs], Plain]:
    return lambda x: plain_attention(replace(x, scale=c(x)))


def _swap_kv(x: AttentionInputs) -> Plain:
    return plain_attention(replace(x, k=x.v, v=x.k))


def _drop_last_key(x: AttentionInputs) -> Plain:
    S = x.k.shape[-2]
    keep = np.ones(S, dtype=bool)
    keep[-1] = False
    m = x.attn_mask
    base = np.ones((x.q.shape[-2], S), dtype=bool) if m is None or m.dtype != np.bool_ else m
    if m is not None and m.dtype != np.bool_:
        mf = np.where(keep, np.asarray(m, dtype=np.float64), -np.inf)
        return plain_attention(replace(x, attn_mask=mf))
    return plain_attention(replace(x, attn_mask=base & keep))


def _finite_mask(x: AttentionInputs) -> Plain:
    m = x.attn_mask
    if m is None:
        return plain_attention(x)
    mf = np.where(m, 0.0, -1e4) if m.dtype == np.bool_ else np.where(np.isinf(m), -1e4, m)
    return plain_attention(replace(x, attn_mask=mf))


def _has_bool_mask(x: AttentionInputs) -> bool:
    return x.attn_mask is not None and x.attn_mask.dtype == np.bool_


def _has_any_mask(x: AttentionInputs) -> bool:
    m = x.attn_mask
    return m is not None and (m.dtype == np.bool_ or bool(np.any(np.isneginf(m))))


BUG_CLASSES: tuple[BugClass, ...] = (
    BugClass("no_scale", "scores not multiplied by the scale (scale 1 instead of 1/sqrt(d_k))",
             lambda x: x.effective_scale != 1.0, _with_scale(lambda x: 1.0)),
    BugClass("scale_1_over_d", "scale 1/d_k instead of 1/sqrt(d_k)",
             lambda x: x.scale is None and x.q.shape[-1] > 1,
             _with_scale(lambda x: 1.0 / x.q.shape[-1])),
    BugClass("scale_sqrt_d_plus_1", "scale 1/sqrt(d_k + 1) instead of 1/sqrt(d_k)",
             lambda x: x.scale is None, _with_scale(lambda x: 1.0 / math.sqrt(x.q.shape[-1] + 1))),
    BugClass("softmax_over_query_axis", "softmax taken over the query axis instead of the keys",
             lambda x: x.q.shape[-2] > 1, lambda x: plain_attention(x, softmax_axis=-2)),
    BugClass("inverted_bool_mask",
             "boolean mask polarity inverted (True read as 'masked out', torch MHA convention)",
             _has_bool_mask, lambda x: plain_attention(x, invert_bool_mask=True)),
    BugClass("causal_misaligned",
             "causal mask aligned to the other corner (top-left vs bottom-right)",
             lambda x: x.is_causal and x.q.shape[-2] != x.k.shape[-2],
             lambda x: plain_attention(replace(x, causal_alignment="bottom_right"
                                               if x.causal_alignment == "top_left"
                                               else "top_left"))),
    BugClass("causal_excludes_diagonal", "off-by-one causal mask: query i sees keys j < i only",
             lambda x: x.is_causal, lambda x: plain_attention(x, causal_offset=-1)),
    BugClass("causal_sees_next_key", "off-by-one causal mask: query i also sees key i + 1",
             lambda x: x.is_causal, lambda x: plain_attention(x, causal_offset=1)),
    BugClass("gqa_tile", "GQA heads mapped by tile (g % H_kv) instead of repeat_interleave",
             lambda x: x.enable_gqa and x.q.ndim >= 3 and x.k.shape[-3] not in (1, x.q.shape[-3]),
             lambda x: plain_attention(x, tile_gqa=True)),
    BugClass("swapped_key_value", "key and value swapped",
             lambda x: x.k.shape == x.v.shape, _swap_kv),
    BugClass("last_key_dropped", "last key left out (loop bound off by one)",
             lambda x: x.k.shape[-2] > 1, _drop_last_key),
    BugClass("finite_mask_sentinel", "masked keys given a finite score -1e4 instead of -inf",
             _has_any_mask, _finite_mask),
)


# --------------------------------------------------------------------------------------
# Multi-head attention (torch layout: y = x W^T + b, W (out, in))


@dataclass(frozen=True)
class MhaInputs:
    query: np.ndarray            # (..., L, E)
    key: np.ndarray              # (..., S, kdim)
    value: np.ndarray            # (..., S, vdim)
    num_heads: int
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    bo: np.ndarray | None
    keep: np.ndarray | None      # (N, H, L, S), True = takes part
    mask_add: np.ndarray | None  # (N, H, L, S) finite float mask added to the scores
    num_kv_heads: int | None = None
    masked_rows: str = "zero"


@dataclass(frozen=True)
class PlainMha:
    out: np.ndarray
    bound_fn: Callable[[FloatFormat, FloatFormat], np.ndarray]


def _split(x: np.ndarray, h: int) -> np.ndarray:
    *lead, n, e = x.shape
    return np.swapaxes(x.reshape(*lead, n, h, e // h), -2, -3)


def _merge(x: np.ndarray, *, reverse: bool = False) -> np.ndarray:
    if reverse:
        x = x[..., ::-1, :, :]
    y = np.swapaxes(x, -2, -3)
    return y.reshape(*y.shape[:-2], y.shape[-2] * y.shape[-1])


def plain_mha(
    x: MhaInputs, *, reverse_heads: bool = False, transpose_wo: bool = False,
    drop_bias: bool = False,
) -> PlainMha:
    """Float64 multi-head attention block (torch.nn.MultiheadAttention semantics)."""
    def lin(a: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        y = a @ w.T
        return y + b if (b is not None and not drop_bias) else y

    h = x.num_heads
    g = h if x.num_kv_heads is None else x.num_kv_heads
    Q, K, V = lin(x.query, x.wq, x.bq), lin(x.key, x.wk, x.bk), lin(x.value, x.wv, x.bv)
    qh, kh, vh = _split(Q, h), _split(K, g), _split(V, g)
    if x.keep is not None and x.mask_add is not None:
        mask: np.ndarray | None = np.where(x.keep, x.mask_add, -np.inf)
    elif x.keep is not None:
        mask = x.keep
    else:
        mask = x.mask_add
    att = plain_attention(AttentionInputs(qh, kh, vh, attn_mask=mask, enable_gqa=g != h,
                                          masked_rows=x.masked_rows))
    O = _merge(att.out, reverse=reverse_heads)
    wo = x.wo.T if transpose_wo else x.wo
    out = lin(O, wo, x.bo)

    def bound(fmt: FloatFormat, acc: FloatFormat) -> np.ndarray:
        dQ = linear_error_bound(x.query, x.wq, x.bq, y=Q, fmt=fmt, acc=acc)
        dK = linear_error_bound(x.key, x.wk, x.bk, y=K, fmt=fmt, acc=acc)
        dV = linear_error_bound(x.value, x.wv, x.bv, y=V, fmt=fmt, acc=acc)
        dO = attention_error_bound(
            att.q, att.k, att.v, att.p, scale=att.scale, allowed=att.allowed,
            mask_add=att.mask_add, out=att.out, fmt=fmt, acc=acc,
            dq=_split(dQ, h), dk=_expand_heads(_split(dK, g), h),
            dv=_expand_heads(_split(dV, g), h),
        )
        return linear_error_bound(O, wo, x.bo, y=out, fmt=fmt, acc=acc, dx=_merge(dO))

    return PlainMha(out, bound)


@dataclass(frozen=True)
class MhaBugClass:
    name: str
    description: str
    applies: Callable[[MhaInputs], bool]
    variant: Callable[[MhaInputs], PlainMha]


MHA_BUG_CLASSES: tuple[MhaBugClass, ...] = (
    MhaBugClass("heads_concat_wrong_order", "heads concatenated in reverse order before W^O",
                lambda x: x.num_heads > 1, lambda x: plain_mha(x, reverse_heads=True)),
    MhaBugClass("transposed_out_proj", "output projection applied as W^O instead of W^O^T",
                lambda x: True, lambda x: plain_mha(x, transpose_wo=True)),
    MhaBugClass("missing_bias", "projection biases left out",
                lambda x: any(b is not None and bool(np.any(b != 0))
                              for b in (x.bq, x.bk, x.bv, x.bo)),
                lambda x: plain_mha(x, drop_bias=True)),
)


# --------------------------------------------------------------------------------------
# Diagnosis


@dataclass(frozen=True)
class Candidate:
    """A bug class whose output the actual output matches (checked)."""

    name: str
    description: str
    ratio: float        # max |actual - buggy| / tolerance of the buggy variant (<= 1)


def _fits(actual: np.ndarray, out: np.ndarray, bound: np.ndarray) -> tuple[bool, float]:
    """Is ``actual`` within ``bound`` of the float64 ``out`` everywhere (NaN = NaN)?"""
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(actual) & np.isnan(out)
        # float64 evaluation error of the variant itself: a few ulps of the terms
        slack = bound + 1e-12 * (np.abs(out) + bound)
        err = np.where(both_nan, 0.0, np.abs(actual - out))
        err = np.where(np.isnan(err), np.inf, err)
        ratio = np.where(err == 0, 0.0, err / np.where(slack > 0, slack, np.inf))
    worst = float(np.max(ratio)) if ratio.size else 0.0
    return worst <= 1.0, worst


def diagnose(
    actual: np.ndarray,
    x: AttentionInputs,
    *,
    fmt: FloatFormat,
    acc: FloatFormat,
    safety: float,
    catalogue: tuple[BugClass, ...] = BUG_CLASSES,
) -> tuple[Candidate, ...]:
    """Bug classes whose float64 variant ``actual`` matches within the model
    tolerance (times ``safety``), best match first.  The caller has already
    established that ``actual`` does not match the truth."""
    return _matching(actual, x, catalogue, lambda pv: pv.bound(fmt, acc), safety)


def diagnose_mha(
    actual: np.ndarray, x: MhaInputs, *, fmt: FloatFormat, acc: FloatFormat, safety: float,
) -> tuple[Candidate, ...]:
    """As :func:`diagnose`, for the multi-head bug classes."""
    return _matching(actual, x, MHA_BUG_CLASSES, lambda pv: pv.bound_fn(fmt, acc), safety)


def _matching(actual: np.ndarray, x: Any, catalogue: Any, bound: Callable[[Any], np.ndarray],
              safety: float) -> tuple[Candidate, ...]:
    """The bug classes of ``catalogue`` whose variant output fits ``actual`` within
    ``safety`` times its bound, best match first."""
    found: list[Candidate] = []
    a = np.asarray(actual, dtype=np.float64)
    for bug in catalogue:
        try:
            if not bug.applies(x):
                continue
            pv = bug.variant(x)
            if pv.out.shape != a.shape:
                continue
            ok, ratio = _fits(a, pv.out, safety * bound(pv))
        except (ValueError, IndexError):  # a variant that makes no sense for these shapes
            continue
        if ok:
            found.append(Candidate(bug.name, bug.description, ratio))
    return tuple(sorted(found, key=lambda c: c.ratio))


def describe(name: str) -> str:
    for bug in BUG_CLASSES:
        if bug.name == name:
            return bug.description
    for mbug in MHA_BUG_CLASSES:
        if mbug.name == name:
            return mbug.description
    raise KeyError(name)


# --------------------------------------------------------------------------------------
# A plain implementation in a given dtype, simulated (for the FlashAttention-style rule)

# work dtype of a plain implementation whose tensors are stored in `dtype`: fp16 and
# bf16 kernels multiply-accumulate and take softmax in float32 (cuBLAS, the PyTorch MATH
# path and FlashAttention all do); fp32 and fp64 work in their own dtype.
_WORK = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}


def plain_in_dtype(x: AttentionInputs, dtype: object, work: object | None = None) -> np.ndarray:
    """What a plain same-dtype implementation outputs (float64 array of its values).

    Every tensor it stores is rounded to ``dtype``: the inputs, the scaled query, the
    scores (after the mask), the weights P, the output; the products and the softmax
    run in ``work`` (float32 for fp16/bf16 by default).  This is the "out_pt" of
    FlashAttention's tests, computed here instead of by a second implementation.
    """
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    wk = np.dtype(work if work is not None else _WORK[dt.name])  # type: ignore[call-overload]

    def st(a: np.ndarray) -> np.ndarray:          # store: round to dtype, back to work
        return np.asarray(a).astype(dt).astype(wk)

    base = plain_attention(x)                    # for `allowed`, `mask_add`, expanded k, v
    q, k, v = st(base.q), st(base.k), st(base.v)
    qs = st(q * wk.type(base.scale))
    s = st(qs @ np.swapaxes(k, -1, -2))
    if base.mask_add is not None:
        s = st(s + st(base.mask_add))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = np.where(base.allowed, s, -np.inf)
        if s.shape[-1] == 0:
            p = np.zeros(s.shape, dtype=wk)
        else:
            smax = np.max(s, axis=-1, keepdims=True)
            e = np.where(base.allowed, np.exp(s - np.where(np.isfinite(smax), smax, 0)), 0)
            tot = np.sum(e, axis=-1, keepdims=True)
            p = np.where(tot == 0, 0, e / np.where(tot == 0, 1, tot)).astype(wk)
        out = st(st(p) @ v).astype(np.float64)
    if x.masked_rows == "nan":
        out = np.where(~np.any(base.allowed, axis=-1)[..., None], np.nan, out)
    return out
