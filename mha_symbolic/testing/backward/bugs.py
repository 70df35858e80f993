"""Known bug classes of attention *backward* code, as data, and the diagnosis built
on them (the backward counterpart of :mod:`.bugs`).

Each entry of :data:`BACKWARD_BUG_CLASSES` names a mistake of real backward kernels
(FlashAttention-2's Algorithm 2 and autograd formulas: see docs/gradients.md §9) and
gives the float64 gradients the buggy formula produces.  A diagnosis names a class only
after checking it: every gradient the kernel returned lies within the model tolerance
of that class's gradients, while the kernel does not lie within tolerance of the truth.

Also here: :func:`plain_backward`, the float64 backward that the bug variants and the
tolerance model (:mod:`.backward`) share.  It is not a reference: the reference is
the oracle's certified enclosure (:func:`mha_symbolic.reference_attention_backward`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...oracle.variants.registry import backward_bug_classes, plain_cap
from ..call import AttentionCall

__all__ = [
    "BACKWARD_BUG_CLASSES",
    "BackwardBugClass",
    "PlainBackward",
    "plain_backward",
]

Arr = np.ndarray
# work dtype of a plain kernel storing tensors in a dtype: fp16/bf16 multiply-accumulate
# and take softmax in float32 (cuBLAS, torch MATH, FlashAttention)
_WORK = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}


@dataclass(frozen=True)
class PlainBackward:
    """Float64 gradients (shaped like the inputs) and the per-problem intermediates
    the tolerance model needs (arrays over the broadcast batch, heads matched)."""

    dq: Arr
    dk: Arr
    dv: Arr
    d_mask: Arr | None
    q: Arr           # (..., L, E)
    k: Arr           # (..., S, E), kv heads repeated for their query heads
    v: Arr
    do: Arr
    p: Arr           # weights the backward uses (..., L, S)
    w: Arr           # dropout weights f·keep∘P (= p without dropout)
    dp: Arr          # f·keep∘(dO Vᵀ)
    d: Arr           # (..., L, 1)
    ds: Arr
    out: Arr         # the forward output
    allowed: Arr
    mask_add: Arr | None
    scale: float
    rep: int         # GQA: query heads per kv head (1 without GQA)
    f: float         # dropout factor
    # the structure of the formulas (the catalogue's variants change it)
    dq_scale: float = 1.0          # dQ = dq_scale · (dS or dSᵀ) K
    dk_scale: float = 1.0
    ds_transposed: bool = False
    dv_p_transposed: bool = True
    gqa_reduce: str = "sum"
    # a cap first on the scaled score (a variant's ``cap_of`` hook: softcap's): C,
    # t = tanh(c q·k / C), the capped scores C·t, and dS' = P ∘ (dP − D) before the
    # factor 1 − t² (``ds`` holds dS' ∘ (1 − t²), what dQ and dK take)
    cap: float | None = None
    cap_t: Arr | None = None
    capped: Arr | None = None
    ds_pre: Arr | None = None
    cap_factor: bool = True        # ds = ds_pre ∘ (1 − t²) (False: the factor forgotten)


def _expand(x: Arr, rep: int, batch: tuple[int, ...]) -> Arr:
    if rep > 1:
        x = np.repeat(x, rep, axis=-3)
    return np.broadcast_to(x, (*batch, *x.shape[-2:]))


def reduce_to(g: Arr, shape: tuple[int, ...], rep: int, mode: str = "sum") -> Arr:
    """Sum a gradient over the copies of its input: the GQA group of each kv head
    (``mode`` "sum": query heads g // rep = h; "tile": g % H_kv = h; "first": only
    the first query head of the group is taken) and broadcast leading axes."""
    if rep > 1:
        hq = g.shape[-3]
        hkv = hq // rep
        lead = g.shape[:-3]
        if mode == "sum":
            g = g.reshape(*lead, hkv, rep, *g.shape[-2:]).sum(axis=-3)
        elif mode == "tile":
            g = g.reshape(*lead, rep, hkv, *g.shape[-2:]).sum(axis=-4)
        else:
            g = g.reshape(*lead, hkv, rep, *g.shape[-2:])[..., 0, :, :]
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape, strict=True)) if b == 1 and a != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)



def _scores_and_masks(x: AttentionCall, qe: Arr, ke: Arr, c: float, st: Callable[[Any], Arr],
                      wk: Any, simulated: bool) -> tuple[Any, ...]:
    """(raw scores, tanh of the softcap's argument, capped scores, the attention mask's
    keys, the float mask's additive part, the kept keys, the final scores) of the
    forward (``simulated``: torch MATH in the work dtype, q and k pre-scaled by √c)."""
    L, S = qe.shape[-2], ke.shape[-2]
    if not simulated:
        raw = c * (qe @ np.swapaxes(ke, -1, -2))
    else:  # torch MATH: q and k each pre-scaled by sqrt(c) in the dtype
        rc = wk.type(math.sqrt(abs(c)))
        raw = st(st(qe * rc) @ np.swapaxes(st(ke * (rc if c >= 0 else -rc)), -1, -2))
    cap_t = capped = None
    cap = plain_cap(x.opts)
    if cap is not None:
        # FlashAttention's softcap: C·tanh(s/C) on the scaled score, masks added after
        C = cap
        cap_t = st(np.tanh(raw / wk.type(C)))
        capped = st(wk.type(C) * cap_t)
        raw = capped
    user = np.ones(raw.shape, dtype=bool)       # the attention mask's keys
    mask_add = None
    m = x.attn_mask
    if m is not None:
        if m.dtype == np.bool_:
            user = user & m
        else:
            mf = np.asarray(m, dtype=np.float64)
            user = user & (mf != -np.inf)
            mask_add = np.broadcast_to(st(np.where(np.isfinite(mf), mf, 0.0)), raw.shape)
    allowed = user
    if x.is_causal:
        off = S - L if x.causal_alignment == "bottom_right" else 0
        allowed = allowed & (np.arange(S)[None, :] <= np.arange(L)[:, None] + off)
    s = raw if mask_add is None else st(raw + mask_add)
    return raw, cap_t, capped, user, mask_add, allowed, s


def _recomputed_weights(x: AttentionCall, raw: Arr, s: Arr, p: Arr, lse: Arr, empty: Arr,
                        user: Arr, st: Callable[[Any], Arr], mask_in_backward: str,
                        backward_attn_mask: Any) -> Arr:
    """The weights the backward recomputes (P = exp(S − lse) on the keys it masks)."""
    L, S = raw.shape[-2], raw.shape[-1]
    # the weights the backward recomputes: P = exp(S - lse) on the keys it masks
    # ("all": the forward's; "no_causal": the causal part forgotten; "none": no mask),
    # so keys the forward excluded come back with weight exp(s - lse)
    if backward_attn_mask is not None:
        mb = np.asarray(backward_attn_mask)
        if mb.dtype == np.bool_:
            keys_b, s_b = np.broadcast_to(mb, raw.shape), raw
        else:
            mbf = np.asarray(mb, dtype=np.float64)
            keys_b = np.broadcast_to(mbf != -np.inf, raw.shape)
            s_b = st(raw + np.broadcast_to(st(np.where(np.isfinite(mbf), mbf, 0.0)), raw.shape))
        if x.is_causal:
            off_b = S - L if x.causal_alignment == "bottom_right" else 0
            keys_b = keys_b & (np.arange(S)[None, :] <= np.arange(L)[:, None] + off_b)
        with np.errstate(over="ignore", invalid="ignore"):
            pb = st(np.where(empty, p, np.where(keys_b, np.exp(np.minimum(s_b - lse, 700.0)),
                                                0.0)))
    elif mask_in_backward == "all":
        pb = p
    else:
        bwd_keys = user if mask_in_backward == "no_causal" else np.ones(raw.shape, dtype=bool)
        with np.errstate(over="ignore", invalid="ignore"):
            pb = st(np.where(empty, p, np.where(bwd_keys, np.exp(np.minimum(s - lse, 700.0)), 0.0)))
    return pb


def _row_term(d_term: str, pb: Arr, dp: Arr, do: Arr, out: Arr, allowed: Arr,
              mask_in_backward: str, dropout_in_backward: bool,
              backward_attn_mask: Any) -> Arr:
    """The row term D of dS = P ∘ (dP − D), correct or as the catalogue's bugs take it."""
    if d_term == "correct":
        # rowsum(P ∘ dP) = rowsum(dO ∘ O) for the correct kernel; a kernel with a wrong P
        # in the backward still takes D from the forward's O (FlashAttention does)
        d = np.sum(pb * dp, axis=-1, keepdims=True) if mask_in_backward == "all" and \
            dropout_in_backward and backward_attn_mask is None \
            else np.sum(do * out, axis=-1, keepdims=True)
    elif d_term == "missing":
        d = np.zeros((*dp.shape[:-1], 1))
    elif d_term == "from_grad_output":
        d = np.sum(do * do, axis=-1, keepdims=True)
    else:  # "unweighted": rowsum(dP), the weights forgotten
        d = np.sum(np.where(allowed, dp, 0.0), axis=-1, keepdims=True)
    return np.asarray(d)


def _storage(dtype: Any) -> tuple[Callable[[Any], Arr], np.dtype]:
    """(store, work dtype): a simulated kernel's rounding of what it stores to ``dtype``
    (kept in its work dtype), or float64 throughout (dtype None)."""
    if dtype is not None:
        dt = np.dtype(dtype)
        wk = np.dtype(_WORK.get(dt.name, "float64"))

        def st(a: Any) -> Arr:
            return np.asarray(a).astype(dt).astype(wk)
        return st, wk

    def st64(a: Any) -> Arr:
        return np.asarray(a, dtype=np.float64)
    return st64, np.dtype(np.float64)


def _f64(a: Any) -> Arr:
    return np.asarray(a, dtype=np.float64)


def _forward_weights(x: AttentionCall, raw: Arr, s: Arr, allowed: Arr,
                     st: Callable[[Any], Arr], S: int) -> tuple[Arr, Arr, Arr, Any]:
    """The forward's softmax of the scores s over the allowed keys: (P stored, lse,
    the rows without a key (…, L, 1), the call's masked-row policy for them); a
    uniform row's P is 1/S."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        sm = np.where(allowed, s, -np.inf)
        mx = np.max(sm, axis=-1, keepdims=True) if S else np.zeros((*raw.shape[:-1], 1))
        mx = np.where(np.isfinite(mx), mx, 0.0)
        e = np.where(allowed, np.exp(sm - mx), 0.0)
        tot = np.sum(e, axis=-1, keepdims=True)
        empty = tot == 0
        p = st(np.where(empty, 0.0, e / np.where(empty, 1.0, tot)))
        lse = mx + np.log(np.where(empty, 1.0, tot))
    policy = x.masked(empty[..., 0], S)
    if policy.uniform.any():
        p = np.where(policy.uniform[..., None], st(1.0 / S), p)
    return p, lse, empty, policy


def _score_gradient(pb: Arr, dp: Arr, d: Arr, policy: Any, cap_t: Arr | None,
                    st: Callable[[Any], Arr], jacobian: str, softcap_derivative: bool
                    ) -> tuple[Arr, Arr | None]:
    """(dS, dS before the cap's factor or None): the softmax Jacobian diag(P) − P Pᵀ
    applied to dP ("diagonal": its diagonal only), zero on uniform rows; with a cap,
    times d(C tanh(s/C))/ds = 1 − tanh²(s/C) ("softcap_derivative=False": forgotten)."""
    ds = st(pb * (1.0 - pb) * dp) if jacobian == "diagonal" else st(pb * (dp - d))
    if policy.uniform.any():
        ds = np.where(policy.uniform[..., None], 0.0, ds)
    ds_pre = None
    if cap_t is not None:
        ds_pre = ds
        if softcap_derivative:
            ds = st(ds_pre * st(1.0 - cap_t * cap_t))
    return ds, ds_pre


def plain_backward(
    x: AttentionCall, *,
    d_term: str = "correct",
    dq_scale_power: int = 1,
    dk_scale_power: int = 1,
    ds_transposed: bool = False,
    mask_in_backward: str = "all",
    gqa_reduce: str = "sum",
    dv_p_transposed: bool = True,
    jacobian: str = "full",
    dropout_in_backward: bool = True,
    dtype: Any = None,
    softcap_derivative: bool = True,
    backward_attn_mask: Any = None,
) -> PlainBackward:
    """The float64 backward of ``x``; the keyword switches produce the catalogue's
    buggy variants (defaults: the correct formulas).

    With ``dtype`` (numpy dtype, ml_dtypes bfloat16 included) it simulates a plain
    kernel in that dtype instead, as torch's MATH backend runs: the inputs and every
    tensor it stores (scaled q and k, scores, P, dP, dS, the gradients) rounded to the
    dtype, products and softmax in float32 for fp16/bf16 (the dtype itself otherwise).
    The returned arrays are float64 holding those values.

    ``backward_attn_mask`` (a variant kernel's bug: the attention mask, bool or float,
    with which the backward recomputes P = exp(S − lse), the forward's lse kept, e.g. a
    window or ALiBi slopes lowered differently than in the forward)."""
    st, wk = _storage(dtype)
    q, k, v, do = st(x.q), st(x.k), st(x.v), st(x.do)
    rep = 1
    if x.enable_gqa and q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
    batch = tuple(np.broadcast_shapes(q.shape[:-2], (*k.shape[:-3], k.shape[-3] * rep)
                                      if k.ndim >= 3 else k.shape[:-2],
                                      (*v.shape[:-3], v.shape[-3] * rep)
                                      if v.ndim >= 3 else v.shape[:-2]))
    qe, ke, ve = _expand(q, 1, batch), _expand(k, rep, batch), _expand(v, rep, batch)
    c = x.effective_scale
    S = k.shape[-2]
    raw, cap_t, capped, user, mask_add, allowed, s = _scores_and_masks(
        x, qe, ke, c, st, wk, simulated=dtype is not None)
    p, lse, empty, policy = _forward_weights(x, raw, s, allowed, st, S)
    keep = None if x.dropout_mask is None else np.broadcast_to(x.dropout_mask, raw.shape)
    f = 1.0 / (1.0 - x.dropout_p)
    w = p if keep is None else st(np.where(keep, wk.type(f) * p, 0.0))
    out = st(w @ ve)
    pb = _recomputed_weights(x, raw, s, p, lse, empty, user, st, mask_in_backward,
                             backward_attn_mask)
    wb = pb if keep is None or not dropout_in_backward else st(np.where(keep, wk.type(f) * pb, 0.0))
    dpo = st(do @ np.swapaxes(ve, -1, -2))
    dp = dpo if keep is None or not dropout_in_backward else st(np.where(keep, wk.type(f) * dpo, 0.0))
    d = _row_term(d_term, pb, dp, do, out, allowed, mask_in_backward, dropout_in_backward,
                  backward_attn_mask)
    ds, ds_pre = _score_gradient(pb, dp, d, policy, cap_t, st, jacobian, softcap_derivative)
    dst = np.swapaxes(ds, -1, -2)
    cq, ck = wk.type(c ** dq_scale_power), wk.type(c ** dk_scale_power)
    dq = st(cq * st((dst if ds_transposed else ds) @ ke))
    dk = st(ck * st((ds if ds_transposed else dst) @ qe))
    dv = st((np.swapaxes(wb, -1, -2) if dv_p_transposed else wb) @ do)
    if policy.nan.any():  # NaN rows: their dq, and dk, dv of the problems holding one
        bad = np.any(policy.nan, axis=-1)[..., None, None]
        dq, dk, dv = (np.where(policy.nan[..., None], np.nan, dq), np.where(bad, np.nan, dk),
                      np.where(bad, np.nan, dv))
    dq_in = _f64(st(reduce_to(dq, q.shape, 1)))
    dk_in = _f64(st(reduce_to(dk, k.shape, rep, gqa_reduce)))
    dv_in = _f64(st(reduce_to(dv, v.shape, rep, gqa_reduce)))
    d_mask = None
    m = x.attn_mask
    if mask_add is not None and m is not None:
        d_mask = _f64(st(reduce_to(np.where(allowed, ds if ds_pre is None else ds_pre, 0.0),
                                   m.shape, 1)))
    f64 = _f64
    return PlainBackward(dq_in, dk_in, dv_in, d_mask, f64(qe), f64(ke), f64(ve), f64(do),
                         f64(pb), f64(wb), f64(dp), f64(d), f64(ds), f64(out), allowed,
                         None if mask_add is None else f64(mask_add), c, rep, f,
                         c ** dq_scale_power, c ** dk_scale_power, ds_transposed,
                         dv_p_transposed, gqa_reduce, plain_cap(x.opts),
                         None if cap_t is None else f64(cap_t),
                         None if capped is None else f64(capped),
                         None if ds_pre is None else f64(ds_pre), softcap_derivative)


# --------------------------------------------------------------------------------------
# The catalogue


@dataclass(frozen=True)
class BackwardBugClass:
    """``variant(x)``: the bug's float64 gradients; ``variant(x, dtype=...)``: a plain
    kernel with the bug, simulated in that dtype."""

    name: str
    description: str
    applies: Callable[[AttentionCall], bool]
    variant: Callable[..., PlainBackward]


def _always(x: AttentionCall) -> bool:
    return True


def _square(x: AttentionCall) -> bool:
    return x.q.shape[-2] == x.k.shape[-2] and x.q.shape[-2] > 1


def _scaled(x: AttentionCall) -> bool:
    return x.effective_scale not in (0.0, 1.0, -1.0)


def _gqa(x: AttentionCall) -> bool:
    return (x.enable_gqa and x.q.ndim >= 3 and x.k.ndim >= 3
            and x.k.shape[-3] not in (1, x.q.shape[-3]))


def _gqa_tile_differs(x: AttentionCall) -> bool:
    # with one kv head every mapping is the same; with H_kv = H_q / 2 ... they differ
    return _gqa(x) and x.k.shape[-3] > 1


def _has_bool_mask(x: AttentionCall) -> bool:
    """The attention mask excludes some key (a bool False or a float −inf)."""
    m = x.attn_mask
    return m is not None and bool(np.any(~m) if m.dtype == np.bool_ else np.any(np.isneginf(m)))


def _v(**kw: Any) -> Callable[..., PlainBackward]:
    return lambda x, dtype=None: plain_backward(x, dtype=dtype, **kw)


BACKWARD_BUG_CLASSES: tuple[BackwardBugClass, ...] = (
    BackwardBugClass("d_term_missing",
                     "D = rowsum(dO ∘ O) left out: dS = P ∘ dP instead of P ∘ (dP − D)",
                     _always, _v(d_term="missing")),
    BackwardBugClass("d_term_from_grad_output",
                     "D computed from the wrong tensor: rowsum(dO ∘ dO) instead of rowsum(dO ∘ O)",
                     _always, _v(d_term="from_grad_output")),
    BackwardBugClass("d_term_unweighted",
                     "D computed as rowsum(dP), the weights P forgotten (should be rowsum(P ∘ dP))",
                     _always, _v(d_term="unweighted")),
    BackwardBugClass("scale_missing_in_dq", "dQ = dS K without the softmax scale",
                     _scaled, _v(dq_scale_power=0)),
    BackwardBugClass("scale_missing_in_dk", "dK = dSᵀ Q without the softmax scale",
                     _scaled, _v(dk_scale_power=0)),
    BackwardBugClass("scale_missing_in_dq_and_dk", "dQ and dK both without the softmax scale",
                     _scaled, _v(dq_scale_power=0, dk_scale_power=0)),
    BackwardBugClass("scale_applied_twice_in_dq_and_dk",
                     "dQ and dK multiplied by the scale twice (scale² instead of scale)",
                     _scaled, _v(dq_scale_power=2, dk_scale_power=2)),
    BackwardBugClass("ds_transposed", "dS transposed: dQ = scale·dSᵀ K and dK = scale·dS Q",
                     _square, _v(ds_transposed=True)),
    BackwardBugClass("dv_p_not_transposed", "dV = P dO instead of Pᵀ dO",
                     _square, _v(dv_p_transposed=False)),
    BackwardBugClass("causal_mask_missing_in_backward",
                     "causal mask not applied when the backward recomputes P = exp(S − lse)",
                     lambda x: x.is_causal, _v(mask_in_backward="no_causal")),
    BackwardBugClass("mask_missing_in_backward",
                     "attention mask (bool or −inf) not applied when the backward recomputes P",
                     _has_bool_mask, _v(mask_in_backward="none")),
    BackwardBugClass("gqa_not_reduced",
                     "GQA: dK, dV of a kv head taken from one query head instead of summed "
                     "over its group", _gqa, _v(gqa_reduce="first")),
    BackwardBugClass("gqa_reduced_with_tile_mapping",
                     "GQA: dK, dV summed over query heads g % H_kv (tile) instead of "
                     "g // (H_q/H_kv) (repeat_interleave)", _gqa_tile_differs,
                     _v(gqa_reduce="tile")),
    BackwardBugClass("softmax_jacobian_diagonal_only",
                     "softmax Jacobian's diagonal only: dS = P(1 − P) ∘ dP, the cross terms "
                     "−P_i P_j dropped", _always, _v(jacobian="diagonal")),
    BackwardBugClass("dropout_missing_in_backward",
                     "dropout keep-mask and 1/(1 − p) not applied in the backward",
                     lambda x: x.dropout_mask is not None, _v(dropout_in_backward=False)),
)


def describe_backward(name: str) -> str:
    """The description of a backward bug class: the catalogue's or a variant's."""
    for bug in (*BACKWARD_BUG_CLASSES, *backward_bug_classes()):
        if bug.name == name:
            return bug.description
    raise KeyError(name)
