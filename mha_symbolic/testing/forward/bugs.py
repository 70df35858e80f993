"""Known bug classes of attention code, as data, and the diagnosis built on them.

Each entry of :data:`BUG_CLASSES` names a mistake seen in real attention code
(see docs/testing.md) and gives a function that evaluates, in float64, what the
buggy formula outputs for the same inputs (a :class:`~.plain.Plain`, chunked).  The
diagnosis only *names* a bug class after checking it: the actual output must lie
within the model tolerance of that buggy variant while it does not lie within
tolerance of the truth.

Also here: the float64 multi-head block (:func:`plain_mha`) the multi-head bug
variants and the tolerance share.  Neither is a reference: the reference is the
oracle's certified enclosure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..call import AttentionCall
from ..tolerance import ErrorModel, linear_error_bound
from .plain import Plain, fit_ratio, plain_attention

__all__ = [
    "BUG_CLASSES",
    "MHA_BUG_CLASSES",
    "BugClass",
    "Candidate",
    "diagnose",
    "diagnose_mha",
    "plain_attention",
    "plain_mha",
]


# --------------------------------------------------------------------------------------
# The catalogue: name -> (description, applies-to predicate, buggy variant)


@dataclass(frozen=True)
class BugClass:
    name: str
    description: str
    applies: Callable[[AttentionCall], bool]
    variant: Callable[[AttentionCall], Plain]


def _always(x: AttentionCall) -> bool:
    return True


def _with_scale(c: Callable[[AttentionCall], float]) -> Callable[[AttentionCall], Plain]:
    return lambda x: plain_attention(replace(x, scale=c(x)))


def _swap_kv(x: AttentionCall) -> Plain:
    return plain_attention(replace(x, k=x.v, v=x.k))


def _drop_last_key(x: AttentionCall) -> Plain:
    S = x.k.shape[-2]
    keep = np.ones(S, dtype=bool)
    keep[-1] = False
    m = x.attn_mask
    base = np.ones((x.q.shape[-2], S), dtype=bool) if m is None or m.dtype != np.bool_ else m
    if m is not None and m.dtype != np.bool_:
        mf = np.where(keep, np.asarray(m, dtype=np.float64), -np.inf)
        return plain_attention(replace(x, attn_mask=mf))
    return plain_attention(replace(x, attn_mask=base & keep))


def _finite_mask(x: AttentionCall) -> Plain:
    m = x.attn_mask
    if m is None:
        return plain_attention(x)
    mf = np.where(m, 0.0, -1e4) if m.dtype == np.bool_ else np.where(np.isinf(m), -1e4, m)
    return plain_attention(replace(x, attn_mask=mf))


def _has_bool_mask(x: AttentionCall) -> bool:
    return x.attn_mask is not None and x.attn_mask.dtype == np.bool_


def _has_any_mask(x: AttentionCall) -> bool:
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
    """A float64 multi-head block: ``out`` and ``bound(model)`` -> (tol, vacuous)."""

    out: np.ndarray
    bound: Callable[[ErrorModel], tuple[np.ndarray, np.ndarray]]
    events: tuple[float, float] = (1.0, 1.0)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.out.shape)

    def fits(self, actual: np.ndarray, model: ErrorModel, safety: float) -> tuple[bool, float]:
        """Is ``actual`` within ``safety`` × the bound of this block's output?"""
        w = fit_ratio(np.asarray(actual, dtype=np.float64), self.out, self.bound(model)[0],
                      safety)
        return w <= 1.0, w


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
    ax = AttentionCall(qh, kh, vh, attn_mask=mask, enable_gqa=g != h,
                         masked_rows=x.masked_rows)
    att = Plain(ax)
    O = _merge(att.out, reverse=reverse_heads)
    wo = x.wo.T if transpose_wo else x.wo
    out = lin(O, wo, x.bo)
    N, L = x.query.shape[0], x.query.shape[1]
    E_in = max(x.query.shape[-1], x.key.shape[-1], x.value.shape[-1], O.shape[-1])
    n_el, n_terms = att.events()
    lin_out = 4.0 * N * max(L, x.key.shape[1]) * x.wq.shape[0]
    events = (n_el + lin_out, n_terms + lin_out * (E_in + 2))

    def bound(model: ErrorModel) -> tuple[np.ndarray, np.ndarray]:
        dQ = linear_error_bound(x.query, x.wq, x.bq, y=Q, model=model)
        dK = linear_error_bound(x.key, x.wk, x.bk, y=K, model=model)
        dV = linear_error_bound(x.value, x.wv, x.bv, y=V, model=model)
        errs = Plain(replace(ax, dq=_split(dQ, h), dk=_split(dK, g), dv=_split(dV, g)))
        dO, vac = errs.bound(model)
        tol = linear_error_bound(O, wo, x.bo, y=out, model=model, dx=_merge(dO))
        # an output feature mixes every head's features: one vacuous feature spoils it
        vrow = np.any(_merge(vac.astype(np.float64)) > 0, axis=-1, keepdims=True)
        return tol, np.broadcast_to(vrow, tol.shape) | ~np.isfinite(tol)

    return PlainMha(out, bound, events)


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


def diagnose(
    actual: np.ndarray,
    x: AttentionCall,
    *,
    model: ErrorModel,
    safety: float,
    catalogue: tuple[BugClass, ...] = BUG_CLASSES,
) -> tuple[Candidate, ...]:
    """Bug classes whose float64 variant ``actual`` matches within the model
    tolerance (times ``safety``), best match first.  The caller has already
    established that ``actual`` does not match the truth."""
    return _matching(actual, x, catalogue, model, safety)


def diagnose_mha(
    actual: np.ndarray, x: MhaInputs, *, model: ErrorModel, safety: float,
) -> tuple[Candidate, ...]:
    """As :func:`diagnose`, for the multi-head bug classes."""
    return _matching(actual, x, MHA_BUG_CLASSES, model, safety)


def _matching(actual: np.ndarray, x: Any, catalogue: Any, model: ErrorModel,
              safety: float) -> tuple[Candidate, ...]:
    """The bug classes of ``catalogue`` whose variant fits ``actual``, best first."""
    found: list[Candidate] = []
    a = np.asarray(actual, dtype=np.float64)
    for bug in catalogue:
        try:
            if not bug.applies(x):
                continue
            pv = bug.variant(x)
            if pv.shape != a.shape:
                continue
            ok, ratio = pv.fits(a, model, safety)
        except (ValueError, IndexError):  # a variant that makes no sense for these shapes
            continue
        if ok:
            found.append(Candidate(bug.name, bug.description, ratio))
    return tuple(sorted(found, key=lambda c: c.ratio))


def _fits(actual: np.ndarray, out: np.ndarray, bound: np.ndarray) -> tuple[bool, float]:
    """Is ``actual`` within ``bound`` of ``out`` everywhere (NaN = NaN)?  (fits, worst
    ratio), as the backward diagnosis asks it."""
    w = fit_ratio(np.asarray(actual, dtype=np.float64), np.asarray(out, dtype=np.float64),
                  np.asarray(bound, dtype=np.float64), 1.0)
    return w <= 1.0, w


def describe(name: str) -> str:
    """The description of a bug class by name.

    >>> describe("no_scale")
    'scores not multiplied by the scale (scale 1 instead of 1/sqrt(d_k))'
    """
    for bug in BUG_CLASSES:
        if bug.name == name:
            return bug.description
    for mbug in MHA_BUG_CLASSES:
        if mbug.name == name:
            return mbug.description
    raise KeyError(name)
