"""Certified attention with the variants of :mod:`.variants`: sliding window, softcap,
ALiBi, sinks, FlexAttention masks and the certified score_mod menu, FP8 descale, and
the packed variable-length layout (:func:`reference_attention_varlen`).

Two routes, both exact by construction:

1. **Lowering** (no softcap; every additive bias a double).  The variant is plain
   scaled dot-product attention of other exact inputs, computed by the plain oracle:

   * descale: q·dq, k·dk, v·dv are exact doubles (an fp8 value has <= 4 significant
     bits, an fp32 factor 24; the product needs <= 28 of the 53) — checked, refused
     otherwise;
   * window, causal, mask_mod, BlockMask: a boolean mask of the kept keys;
   * ALiBi / bias table / float mask: one additive mask, exact (checked with
     TwoProduct and TwoSum: every product and sum is a double);
   * sinks: one extra key with k = 0, v = 0 and additive mask σ_h, never masked:
     e^{c·q·0 + σ} = e^σ joins the denominator and adds 0 to the numerator, which is
     gpt-oss's cat([QK, S]) softmax with the sink column dropped.

2. **Transformed scores** (a softcap, or a bias that is not a double):
   :mod:`.transformed` — proved float64 scores with an error bound, a perturbation
   lemma, and Arb (``tanh`` included) where that is not enough.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..._validate import door
from ...errors import ShapeError, SpecError
from ..conventions import ALIGNMENTS, POLICIES, exact_scale, read_mask
from ..forward.attention import plain_attention
from ..inputs import as_exact_array, to_float64, validate_finite
from .protocol import VariantOptions
from .registry import (
    exact_inputs,
    kept,
    rotation,
    score_pipeline,
    sink_logits,
    split_variant_keywords,
    variant_options,
    with_variant_keywords,
)
from .semantics import Bias, Cap, Geometry, window_allowed
from .transformed import transformed_attention
from .views import DropLastColumn, PackedEnclosure

__all__ = ["Varlen", "lse_problem", "reference_attention_varlen", "variant_attention",
           "varlen_inputs"]


def _read(x: Any, name: str) -> np.ndarray[Any, Any]:
    arr = as_exact_array(x, name)
    if arr.dtype == bool:
        raise SpecError(f"{name}.dtype=bool: expected a float array")
    if arr.ndim < 2:
        raise ShapeError(f"{name}.shape={arr.shape}: expected at least 2 dimensions (..., L, E)")
    validate_finite(arr, name)
    return arr


def _exact_sum(parts: list[np.ndarray[Any, Any]]) -> tuple[np.ndarray[Any, Any], bool]:
    """Σ parts in float64 and whether every partial sum is exact (TwoSum error 0)."""
    total = parts[0]
    exact = True
    for p in parts[1:]:
        s = total + p
        bb = s - total
        err = (total - (s - bb)) + (p - bb)
        exact = exact and bool(np.all(err[np.isfinite(s)] == 0))
        total = s
    return total, exact


@dataclass
class Prepared:
    """A call with variants, validated: exact float64 inputs (descaled, heads not yet
    expanded), the geometry, the kept keys and the additive parts in broadcast-minimal
    shapes, the score pipeline and the sink logits."""

    q64: np.ndarray[Any, Any]
    k64: np.ndarray[Any, Any]
    v64: np.ndarray[Any, Any]
    lead: tuple[int, ...]
    group: int
    geo: Geometry
    keep: np.ndarray[Any, Any] | None
    user_madd: np.ndarray[Any, Any] | None
    ops: tuple[Any, ...]
    sinks: np.ndarray[Any, Any] | None
    total: np.ndarray[Any, Any] | None  # Σ additive parts, exact doubles (lowerable)
    lowerable: bool  # no softcap and every additive part a double

    @property
    def extra_keys(self) -> int:
        """The keys the lowering appends (the sink logit's one key, k = v = 0)."""
        return 0 if self.sinks is None else 1

    def flat(self) -> tuple[Any, Any, Any, Any, Any]:
        """The flat problems (B = the broadcast batch and heads): q (B, L, E), k (B, S,
        E) and v (B, S, Ev) with the key/value heads repeated per GQA group (views where
        no copy is needed), the kept keys (B, L, S) and the user's float mask (B, L, S)
        or None."""
        geo, lead = self.geo, self.lead
        L, S, B = geo.L, geo.S, geo.B
        E, Ev = self.q64.shape[-1], self.v64.shape[-1]
        kr = np.repeat(self.k64, self.group, axis=-3) if self.group > 1 else self.k64
        vr = np.repeat(self.v64, self.group, axis=-3) if self.group > 1 else self.v64
        qf = np.broadcast_to(self.q64, (*lead, L, E)).reshape(B, L, E)
        kf = np.broadcast_to(kr, (*lead, S, E)).reshape(B, S, E)
        vf = np.broadcast_to(vr, (*lead, S, Ev)).reshape(B, S, Ev)
        allowed = (np.ones((B, L, S), dtype=bool) if self.keep is None else
                   np.ascontiguousarray(np.broadcast_to(self.keep, (*lead, L, S))
                                        .reshape(B, L, S)))
        madd = (None if self.user_madd is None else np.ascontiguousarray(
            np.broadcast_to(self.user_madd, (*lead, L, S)).reshape(B, L, S)))
        return qf, kf, vf, allowed, madd


def prepare(query: Any, key: Any, value: Any, opts: VariantOptions, *, attn_mask: Any,
            is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str,
            masked_rows: str) -> Prepared:
    """Validate a call with variants and build its exact pieces (module docstring)."""

    if masked_rows not in POLICIES:
        raise SpecError(f"masked_rows={masked_rows!r}: expected one of {POLICIES}")
    if causal_alignment not in ALIGNMENTS:
        raise SpecError(f"causal_alignment={causal_alignment!r}: expected one of {ALIGNMENTS}")
    q, k, v = _read(query, "query"), _read(key, "key"), _read(value, "value")
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"key.shape={k.shape} does not match query.shape={q.shape}: "
                         f"E must agree ({q.shape[-1]} vs {k.shape[-1]})")
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(f"value.shape={v.shape} does not match key.shape={k.shape}: "
                         f"S must agree ({k.shape[-2]} vs {v.shape[-2]})")
    hq = q.shape[-3] if q.ndim >= 3 else 1
    hk = k.shape[-3] if k.ndim >= 3 else 1
    group = hq // hk if (enable_gqa and q.ndim >= 3 and k.ndim >= 3 and hk
                         and hq % hk == 0) else 1
    try:
        lead = tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])) \
            if group == 1 else tuple(np.broadcast_shapes(
                q.shape[:-2], (*k.shape[:-3], hq), (*v.shape[:-3], hq)))
    except ValueError:
        # the plain oracle words the message (GQA hint included)
        plain_attention(query, key, value, enable_gqa=enable_gqa)
        raise  # pragma: no cover - the line above raises
    L, E = q.shape[-2:]
    S = k.shape[-2]
    geo = Geometry(lead, lead[-1] if lead else 1, L, S,
                   0 if causal_alignment == "top_left" else S - L)
    q64, k64, v64 = exact_inputs(opts, q, k, v, geo, group)
    exact_scale(scale, E)  # validates the scale

    # Keys kept and additive parts, each in the smallest shape that broadcasts to
    # (*lead, L, S): the plain oracle reads masks block by block from broadcast views,
    # so a window costs L·S booleans, ALiBi H·L·S doubles, whatever the batch.
    keeps: list[np.ndarray[Any, Any]] = []
    adds: list[np.ndarray[Any, Any]] = []
    user_madd = None
    if attn_mask is not None:
        m = read_mask(attn_mask, "attn_mask")
        try:
            if np.broadcast_shapes(m.shape, (*lead, L, S)) != (*lead, L, S):
                raise ValueError
        except ValueError:
            raise ShapeError(f"attn_mask.shape={m.shape} does not broadcast to the scores' "
                             f"shape {(*lead, L, S)} (batch..., L, S)") from None
        if m.dtype == bool:
            keeps.append(m)
        else:
            validate_finite(m, "attn_mask", allow_neg_inf=True)
            m64 = to_float64(m)
            keeps.append(m64 != -np.inf)
            user_madd = np.where(m64 == -np.inf, 0.0, m64)
            adds.append(user_madd)
    causal = window_allowed(None, is_causal, geo)  # SDPA's own causal limit
    if causal is not None:
        keeps.append(causal)
    keeps.extend(kept(opts, geo, is_causal))
    keep = None
    for part in keeps:
        keep = part if keep is None else np.logical_and(keep, part)

    ops = score_pipeline(opts, geo)
    sinks = sink_logits(opts, geo)
    exact = True
    for op in ops:
        if isinstance(op, Bias):
            vals, ok = op.floats_min(geo)
            adds.append(vals)
            exact = exact and ok
    total = None
    if not opts.has_cap and exact and adds:
        total, exact = _exact_sum(adds)
    return Prepared(q64, k64, v64, lead, group, geo, keep, user_madd, ops, sinks, total,
                    exact and not opts.has_cap)


def lowered(prep: Prepared) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any],
                                     np.ndarray[Any, Any] | None]:
    """(key, value, attn_mask) of the plain problem a lowerable call equals (module
    docstring, 1.): the sink as one extra key (k = 0, v = 0) whose mask column is σ."""
    k64, v64 = prep.k64, prep.v64
    L, S = prep.geo.L, prep.geo.S
    keep, total, sinks, lead = prep.keep, prep.total, prep.sinks, prep.lead
    if sinks is not None:
        E = k64.shape[-1]
        k64 = np.concatenate([k64, np.zeros((*k64.shape[:-2], 1, E))], axis=-2)
        v64 = np.concatenate([v64, np.zeros((*v64.shape[:-2], 1, v64.shape[-1]))], axis=-2)
    mask: np.ndarray[Any, Any] | None = keep
    if total is not None or sinks is not None:
        base = np.zeros((L, S)) if total is None else total
        mask = base if keep is None else np.where(keep, base, -np.inf)
        if sinks is not None:
            # the sink column: σ of each head (a head axis is needed for it)
            H = prep.geo.heads
            per_head = sinks[:H] if lead else sinks[:1]
            shape = np.broadcast_shapes(mask.shape, (H, 1, 1) if lead else (1, 1))
            mask = np.broadcast_to(mask, shape)
            col = np.broadcast_to(per_head.reshape((H, 1, 1) if lead else (1, 1)),
                                  (*shape[:-1], 1))
            mask = np.concatenate([mask, col], axis=-1)
    return k64, v64, mask


def lowered_after_cap(prep: Prepared) -> tuple[float, np.ndarray[Any, Any],
                                                np.ndarray[Any, Any],
                                                np.ndarray[Any, Any] | None]:
    """(C, key, value, attn_mask) of a call whose score pipeline is one softcap on the
    scaled score followed by exact-double biases: C·tanh(c q·k / C) + mask of the plain
    problem :func:`lowered` builds from the rest (FlashAttention's order: the cap
    before masks, ALiBi and sinks).  Refused otherwise (a cap after a bias, two caps,
    a bias that is not a double) with the reason."""

    caps = [i for i, op in enumerate(prep.ops) if isinstance(op, Cap)]
    if caps != [0]:
        raise SpecError("the gradients' tolerance takes one softcap applied first, on the "
                        "scaled score (softcap= or a softcap score_mod before any bias); "
                        f"this call's score pipeline is {_pipeline_text(prep.ops)}")
    total, exact = summed_biases(prep, prep.ops[1:])
    if not exact:
        require_lowerable(prep)
    k64, v64, mask = lowered(replace(prep, total=total, lowerable=True))
    return float(prep.ops[0].C), k64, v64, mask


def summed_biases(prep: Prepared, ops: tuple[Any, ...]) -> tuple[Any, bool]:
    """The user's float mask and the additive score operations ``ops`` as one exact
    float64 sum (None when there is nothing to add or a part is not exact), and whether
    every part (and the sum) is exact."""
    adds = [] if prep.user_madd is None else [prep.user_madd]
    exact = True
    for op in ops:
        vals, ok = op.floats_min(prep.geo)
        adds.append(vals)
        exact = exact and ok
    total = None
    if adds and exact:
        total, exact = _exact_sum(adds)
    return total, exact


def _pipeline_text(ops: tuple[Any, ...]) -> str:

    return " then ".join("softcap" if isinstance(op, Cap) else op.kind for op in ops)


def lse_problem(query: Any, key: Any, value: Any, opts: VariantOptions, *, attn_mask: Any,
                is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any],
                           np.ndarray[Any, Any] | None, bool]:
    """(query, key, attn_mask, enable_gqa) of the plain problem whose log-sum-exp is
    the variant call's: the lowering of :func:`lowered` (kept keys, exact biases, FP8
    descale, the sink as one more key whose score is its logit, so the LSE holds the
    sink's e^σ, which is in the softmax's denominator).  Refused for a call that does
    not lower (a softcap, a bias that is not a double): its scores are not doubles.

    >>> import numpy as np
    >>> from mha_symbolic.oracle.variants.registry import variant_options
    >>> x = np.zeros((1, 2, 3))
    >>> q, k, m, gqa = lse_problem(x, x, x, variant_options(window=(0, 0)), attn_mask=None,
    ...                            is_causal=False, scale=None, enable_gqa=False,
    ...                            causal_alignment="top_left")
    >>> m.tolist()                       # each query keeps its own key
    [[True, False], [False, True]]
    """
    prep = prepare(query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
                   scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                   masked_rows="zero")
    if not prep.lowerable:
        raise SpecError("return_lse / lse= with a softcap or a bias that is not an exact "
                        "double is not supported: the log-sum-exp is certified for variants "
                        "that lower to plain attention (window, ALiBi with fp32 slopes, "
                        "sinks, mask_mod, KV cache, FP8 descale)")
    k64, _, mask = lowered(prep)
    return prep.q64, k64, mask, prep.group > 1


def require_lowerable(prep: Prepared) -> None:
    """Refuse, for the backward, a call that is not plain attention of exact inputs."""
    if not prep.lowerable:
        raise SpecError("the backward needs every additive bias to be an exact double "
                        "(ALiBi slopes with at most 24 significant bits, as fp32 slopes)")


def variant_attention(
    query: Any, key: Any, value: Any, opts: VariantOptions, *, attn_mask: Any,
    is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str, masked_rows: str,
    return_weights: bool,
) -> Any:
    """reference_attention with variants (the options are validated by the caller)."""
    prep = prepare(query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
                   scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                   masked_rows=masked_rows)
    if not prep.lowerable:

        lead, geo = prep.lead, prep.geo
        L, S, B = geo.L, geo.S, geo.B

        def flat(a: np.ndarray[Any, Any] | None, dtype: Any) -> np.ndarray[Any, Any] | None:
            if a is None:
                return None
            return np.ascontiguousarray(np.broadcast_to(a, (*lead, L, S)).reshape(B, L, S),
                                        dtype=dtype)

        kept = flat(prep.keep, bool)
        allowed = kept if kept is not None else np.ones((B, L, S), dtype=bool)
        return transformed_attention(
            prep.q64, prep.k64, prep.v64, lead=lead, group=prep.group, geo=geo,
            allowed=allowed, madd=flat(prep.user_madd, np.float64), ops=prep.ops,
            sinks=prep.sinks, scale=scale, masked_rows=masked_rows,
            return_weights=return_weights,
            rotation=rotation(opts, geo, int(prep.q64.shape[-1])))
    k64, v64, mask = lowered(prep)
    out = plain_attention(prep.q64, k64, v64, attn_mask=mask, scale=scale,
                              enable_gqa=prep.group > 1, masked_rows=masked_rows,
                              return_weights=return_weights)
    if return_weights and prep.sinks is not None:
        # the view offers the Enclosure API without the sink's column
        out.weights = DropLastColumn(out.weights)  # type: ignore[assignment]
    return out


# --------------------------------------------------------------------------------------
# varlen


def _cu(x: Any, name: str, total: int) -> list[int]:
    arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if arr.ndim != 1 or arr.size < 1 or arr.dtype.kind not in "iu":
        raise SpecError(f"{name}: expected a 1-D integer array (batch + 1,), got "
                        f"shape={arr.shape} dtype={arr.dtype}")
    cu = [int(c) for c in arr.tolist()]
    if cu[0] != 0 or any(b < a for a, b in itertools.pairwise(cu)) or cu[-1] != total:
        raise SpecError(f"{name}={cu[:8]}{'…' if len(cu) > 8 else ''}: expected "
                        f"nondecreasing offsets from 0 to the number of tokens ({total})")
    return cu


@dataclass
@dataclass(frozen=True)
class Varlen:
    """A varlen call, validated: packed (total, heads, dim) inputs, the offsets, the
    variant options of the whole batch, and per sequence b its rows and options
    (:meth:`sequence`)."""

    q: np.ndarray[Any, Any]
    k: np.ndarray[Any, Any]
    v: np.ndarray[Any, Any]
    cq: list[int]
    ck: list[int]
    H: int
    hk: int
    opts: VariantOptions

    @property
    def n(self) -> int:
        return len(self.cq) - 1

    def sequence(self, b: int) -> tuple[slice, slice, VariantOptions]:
        """(query rows, key rows, options) of sequence b: each variant's ``sequence``
        hook gives its fields for the sequence (a per-batch parameter's row b, a
        mask_mod given the sequence as its batch index); the others are shared."""
        fields = self.opts.fields
        for var in self.opts.active():
            if var.sequence is not None:
                fields.update(var.sequence(self.opts, b, self.n))
        return (slice(self.cq[b], self.cq[b + 1]), slice(self.ck[b], self.ck[b + 1]),
                VariantOptions(**fields))


def varlen_inputs(query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                  max_seqlen_q: Any, max_seqlen_k: Any, **variants: Any) -> Varlen:
    """Validate a varlen call (FlashAttention's ``flash_attn_varlen_func`` layout);
    ``variants``: the registered variants' keywords (refused for a variant that is not
    ``packed``)."""
    q, k, v = _read(query, "query"), _read(key, "key"), _read(value, "value")
    for name, arr in (("query", q), ("key", k), ("value", v)):
        if arr.ndim != 3:
            raise ShapeError(f"{name}.shape={arr.shape}: expected (total, heads, dim) for "
                             "varlen attention")
    if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1]:
        raise ShapeError(f"value.shape={v.shape} does not match key.shape={k.shape}: total_k "
                         "and heads must agree")
    cq = _cu(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    ck = _cu(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
    if len(cq) != len(ck):
        raise ShapeError(f"cu_seqlens_q has {len(cq) - 1} sequences but cu_seqlens_k has "
                         f"{len(ck) - 1}")
    for name, mx, cu in (("max_seqlen_q", max_seqlen_q, cq), ("max_seqlen_k", max_seqlen_k, ck)):
        longest = max((b - a for a, b in itertools.pairwise(cu)), default=0)
        if mx is not None and (isinstance(mx, bool) or not isinstance(mx, (int, np.integer))
                               or mx < longest):
            raise SpecError(f"{name}={mx!r}: expected an integer >= the longest sequence "
                            f"({longest})")
    H, hk = q.shape[1], k.shape[1]
    if hk == 0 or H % hk:
        raise ShapeError(f"query.shape={q.shape}, key.shape={k.shape}: H must be a multiple "
                         f"of H_kv ({H} vs {hk})")
    split_variant_keywords(variants, door="reference_attention_varlen")
    opts = variant_options(**variants) or VariantOptions()
    for var in opts.active():
        if not var.packed:
            raise SpecError(f"{' / '.join(var.keywords)}: the {var.name} variant is not "
                            "available for packed varlen calls")
    vl = Varlen(q, k, v, cq, ck, H, hk, opts)
    for b in range(vl.n):       # every per-sequence parameter checked before any work
        vl.sequence(b)
    return vl


@with_variant_keywords
@functools.partial(door, quiet=True)
def reference_attention_varlen(
    query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, *,
    is_causal: bool = False, scale: float | None = None, causal_alignment: str = "top_left",
    masked_rows: str = "zero", **variants: Any,
) -> PackedEnclosure:
    """Certified attention of packed variable-length sequences, as FlashAttention's
    ``flash_attn_varlen_func``: query (total_q, H, E), key (total_k, H_kv, E), value
    (total_k, H_kv, E_v); sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of
    the query and ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of key and value, and attends
    to its own keys only.  Returns an enclosure of shape (total_q, H, E_v).

    ``max_seqlen_*`` are accepted (as FlashAttention) and checked to bound the lengths.
    Positions (causal, window, ALiBi) count within each sequence, aligned by
    ``causal_alignment`` (FlashAttention: "bottom_right").  ``alibi_slopes`` (H,) or
    (batch, H), descale factors (batch, H_kv); a ``mask_mod`` gets b = the sequence and
    indices within it.  GQA when H_kv divides H.

    >>> import numpy as np
    >>> x = np.arange(12.0).reshape(3, 1, 4) / 8
    >>> r = reference_attention_varlen(x, x, x, [0, 1, 3], [0, 1, 3], scale=0.0)
    >>> r.rounded("float32")[0].tolist()   # the first sequence sees its own key only
    [[0.0, 0.125, 0.25, 0.375]]
    """
    vl = varlen_inputs(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, **variants)
    parts = []
    for b in range(vl.n):
        rq, rk, opts = vl.sequence(b)
        qb, kb, vb = (np.swapaxes(x[r], 0, 1) for x, r in ((vl.q, rq), (vl.k, rk), (vl.v, rk)))
        if opts.empty:
            parts.append(plain_attention(qb, kb, vb, is_causal=is_causal, scale=scale,
                                         enable_gqa=vl.hk != vl.H,
                                         causal_alignment=causal_alignment,
                                         masked_rows=masked_rows))
        else:
            parts.append(variant_attention(qb, kb, vb, opts, attn_mask=None,
                                           is_causal=is_causal, scale=scale,
                                           enable_gqa=vl.hk != vl.H,
                                           causal_alignment=causal_alignment,
                                           masked_rows=masked_rows, return_weights=False))
    return PackedEnclosure(parts, vl.cq, (vl.H, vl.v.shape[2]))
