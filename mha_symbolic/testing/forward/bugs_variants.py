"""Known bugs of the attention variants, as data, and the float64 evaluation they share.

Each entry of :data:`VARIANT_BUG_CLASSES` names a mistake seen in kernels that ship
the variants (FlashAttention, FlexAttention, xformers, vLLM; docs/variants.md lists
them) and the switches of :func:`plain_variant` that reproduce it.  As in
:mod:`.bugs`, a class is only *named* after it is checked: the actual output lies
within the model tolerance of the buggy variant and not within tolerance of the truth.

:func:`plain_variant` is attention with every variant in float64 — not a reference
(the reference is the oracle's enclosure), but the input of the tolerance model
(:mod:`.tolerance_variants`) and of the bug variants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...oracle.variants.protocol import VariantOptions
from ...oracle.variants.registry import kept, score_pipeline
from ...oracle.variants.rotary import rotate_for_testing
from ...oracle.variants.semantics import Bias, Cap, Geometry, per_problem, window_allowed
from ..call import AttentionCall
from ..tolerance import ErrorModel
from .bugs import _matching
from .model_variants import variant_error_bound
from .plain import fit_ratio

__all__ = ["VARIANT_BUG_CLASSES", "VariantPlain", "diagnose_variant",
           "plain_variant"]


@dataclass(frozen=True)
class VariantPlain:
    """A float64 evaluation and what the tolerance model needs (arrays (..., L, S))."""

    out: np.ndarray
    p: np.ndarray                 # weights of the keys (the sink's weight apart)
    p_sink: np.ndarray | None     # (..., L)
    sink_logit: np.ndarray | None
    q: np.ndarray                 # descaled, heads matched
    v: np.ndarray
    allowed: np.ndarray
    s: np.ndarray                 # final scores (finite where allowed)
    A: np.ndarray                 # |c| Σ|q||k|
    size: np.ndarray              # |c q·k| + Σ|biases| + |mask|
    caps: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    v_descaled: bool = False
    k: np.ndarray | None = None   # descaled, heads matched
    scale: float = 1.0
    n_add: int = 0                # additive terms of the scores (biases, the mask)
    qk_descaled: bool = False     # q_descale or k_descale multiplied into the scale
    uniform: np.ndarray | None = None   # (..., L) rows given uniform weights
    opts: VariantOptions | None = None  # the variants (their ``error`` hooks)
    rotary: Any = None            # the Rotation of a rotary call
    rotary_inputs: tuple[np.ndarray, np.ndarray] | None = None    # q, k flat (B, n, E)
    rotary_outputs: tuple[np.ndarray, np.ndarray] | None = None   # q', k' flat

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.out.shape)

    def bound(self, model: ErrorModel, events: tuple[float, float] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(tolerance, vacuous) of every output element under ``model`` (λ for the
        check's ``events``, by default this evaluation's own)."""
        return variant_error_bound(self, model, events)

    def fits(self, actual: np.ndarray, model: ErrorModel, safety: float) -> tuple[bool, float]:
        """Is ``actual`` within ``safety`` × this evaluation's bound of its output?"""
        w = fit_ratio(np.asarray(actual, dtype=np.float64), self.out, self.bound(model)[0],
                      safety)
        return w <= 1.0, w


def _descale(x: np.ndarray, d: np.ndarray | None, power: int, heads_kv: int, group: int,
             outer: tuple[int, ...]) -> np.ndarray:
    if d is None or power == 0:
        return x
    dd = np.broadcast_to(d, (*outer, heads_kv))
    if group > 1:
        dd = np.repeat(dd, group, axis=-1)
    return x * (dd ** power)[..., None, None]


def plain_variant(
    x: AttentionCall, *, window: Any = "same", flip_window_alignment: bool = False,
    softcap_mode: str = "right", alibi_sign: float = 1.0, alibi_reverse: bool = False,
    flip_alibi_alignment: bool = False, sink_mode: str = "denominator",
    descale_power: tuple[int, int, int] = (1, 1, 1), scale: float | None = None,
    causal_offset: int = 0, store: Callable[[np.ndarray], np.ndarray] | None = None,
    keep_changes: dict[str, Any] | None = None, rotary_changes: dict[str, Any] | None = None,
) -> VariantPlain:
    """Attention with the variants of ``x`` in float64; the keyword switches make the
    buggy variants of the catalogue (the defaults are the correct semantics of
    :mod:`mha_symbolic.oracle.variants.semantics`).  ``store`` (rounding to a dtype) is applied
    wherever a plain kernel stores a tensor — the scaled scores, after each softcap
    and bias, the weights P before P·V, the output — for FlashAttention's rule."""
    st = store if store is not None else (lambda a: a)
    o = x.opts
    q, k, v = x.q, x.k, x.v
    hq = q.shape[-3] if q.ndim >= 3 else 1
    hk = k.shape[-3] if k.ndim >= 3 else 1
    group = hq // hk if x.enable_gqa and hk and hq % hk == 0 else 1
    lead = tuple(np.broadcast_shapes(q.shape[:-2], (*k.shape[:-3], hq) if k.ndim >= 3
                                     else (), (*v.shape[:-3], hq) if v.ndim >= 3 else ()))
    H = lead[-1] if lead else 1
    outer = lead[:-1]
    pq, pk, pv = descale_power
    q = _descale(q, o.q_descale, pq, H // group, group, outer)
    k = _descale(k, o.k_descale, pk, H // group, 1, outer)
    v = _descale(v, o.v_descale, pv, H // group, 1, outer)
    if group > 1:
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    align = x.causal_alignment
    off = 0 if align == "top_left" else S - L
    rot = rot_io = None
    if o.rotary is not None:
        # q, k rotated before the scores (as the kernel's, or a buggy kernel's)
        rot, rot_io = rotate_for_testing(o, Geometry(lead, H, L, S, off), q, k,
                                         **(rotary_changes or {}))
        q, k = rot_io[2].reshape(*lead, L, E), rot_io[3].reshape(*lead, S, E)
    woff = (S - L) - off if flip_window_alignment else off
    c = (1.0 / math.sqrt(E) if x.scale is None else float(x.scale)) if scale is None else scale
    G = q @ np.swapaxes(k, -1, -2)
    A = abs(c) * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2))
    size = np.abs(c * G)
    # keys kept
    allowed = np.ones(G.shape, dtype=bool)
    madd = None
    if x.attn_mask is not None:
        m = x.attn_mask
        if m.dtype == np.bool_:
            allowed = allowed & m
        else:
            allowed = allowed & (m != -np.inf)
            madd = np.where(m == -np.inf, 0.0, m)
    win = o.window if window == "same" else window
    if x.is_causal:
        allowed = allowed & (np.arange(S)[None, :] <= np.arange(L)[:, None] + off
                             + causal_offset)
    wk = window_allowed(win, False, Geometry(lead, H, L, S, woff))
    if wk is not None:
        allowed = allowed & wk
    if keep_changes is not None:
        # the registered variants' kept keys with some of their options changed (the
        # bug classes of the kept-key variants: KV-cache lengths, chunk boundaries);
        # the window is applied above, as for the correct call
        for part in kept(o.replace(**keep_changes), Geometry(lead, H, L, S, off), x.is_causal,
                         exclude=("window",)):
            allowed = allowed & part
    elif x.mod_keep is not None:
        allowed = allowed & x.mod_keep
    # scores: the keyword softcap (where the mode puts it), the menu, ALiBi, the mask
    geo = Geometry(lead, H, L, S, off)
    ops = list(score_pipeline(o.replace(softcap=None, alibi_slopes=None), geo))
    cap = o.softcap
    caps: list[tuple[np.ndarray, np.ndarray]] = []
    if cap is not None and softcap_mode == "before_scale":
        t = cap * np.tanh(G / cap)
        caps.append((np.abs(G), np.abs(t)))
        s = st(c * t)
    else:
        s = st(c * G)
        if cap is not None and softcap_mode == "right":
            ops.insert(0, Cap(cap))
    if o.alibi_slopes is not None:

        slopes = per_problem(o.alibi_slopes, geo, "alibi_slopes") * alibi_sign
        if alibi_reverse:
            slopes = slopes[:, ::-1]
        aoff = (S - L) - off if flip_alibi_alignment else off
        ops.append(Bias("alibi", np.ascontiguousarray(slopes), aoff))
    B = math.prod(lead)
    n_add = 0
    for op in ops:
        if isinstance(op, Cap):
            t = op.C * np.tanh(s / op.C)
            caps.append((np.abs(s), np.abs(t)))
            s = st(t)
        else:
            vals, _ = op.floats(geo, range(B))
            vals = vals.reshape(*lead, L, S)
            s = st(s + vals)
            size = size + np.abs(vals)
            n_add += 1
    if madd is not None:
        s = st(s + madd)
        size = size + np.abs(madd)
        n_add += 1
    if cap is not None and softcap_mode == "after_mask":
        # the mask applied first, then the softcap: a masked score -inf becomes -C,
        # so masked keys take part (the bug FlashAttention's order avoids)
        s = np.where(allowed, cap * np.tanh(s / cap), -cap)
        caps.append((np.where(allowed, np.abs(s), 0.0), np.abs(s)))
        allowed = np.ones_like(allowed)
    # softmax, the sink in the denominator (or where the bug puts it)
    sink = None
    if o.sinks is not None and sink_mode != "ignored":
        sink = np.broadcast_to(o.sinks.reshape(H, 1), (*lead, L)) if lead else np.broadcast_to(
            o.sinks.reshape(1), (L,))
    # the rows with no key (none with a sink: its logit is in every row's softmax)
    dead = (~np.any(allowed, axis=-1) if sink is None
            else np.zeros(allowed.shape[:-1], dtype=bool))
    policy = x.masked(dead, S)
    uniform = None
    if policy.uniform.any():
        # JAX's policy: a row with no key gets uniform weights over all keys
        uniform = policy.uniform
        allowed = allowed | uniform[..., None]
        s = np.where(uniform[..., None], 0.0, s)
    sm = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.max(sm, axis=-1, initial=-np.inf)
        if sink is not None:
            top = np.maximum(top, sink)
        top = np.where(np.isfinite(top), top, 0.0)
        e = np.where(allowed, np.exp(sm - top[..., None]), 0.0)
        den = np.sum(e, axis=-1)
        es = None
        if sink is not None:
            es = np.exp(sink - top)
            den = den + es
            if sink_mode == "numerator":
                e = np.where(allowed, e + es[..., None], 0.0)
        empty = den == 0
        p = np.where(empty[..., None], 0.0, e / np.where(empty, 1.0, den)[..., None])
        p_sink = None if es is None else np.where(empty, 0.0, es / np.where(empty, 1.0, den))
    out = st(st(p) @ v) if store is not None else p @ v
    if policy.nan.any():
        out = np.where(policy.nan[..., None], np.nan, out)
    return VariantPlain(out, p, p_sink, None if sink is None else np.asarray(sink, float),
                        q, v, allowed, np.where(allowed, s, 0.0), A, size, caps,
                        v_descaled=o.v_descale is not None, k=k, scale=c, n_add=n_add,
                        qk_descaled=o.q_descale is not None or o.k_descale is not None,
                        uniform=uniform, opts=o, rotary=rot,
                        rotary_inputs=None if rot_io is None else rot_io[:2],
                        rotary_outputs=None if rot_io is None else rot_io[2:])


# --------------------------------------------------------------------------------------
# The catalogue


@dataclass(frozen=True)
class VariantBugClass:
    name: str
    description: str
    applies: Callable[[AttentionCall], bool]
    switches: Callable[[AttentionCall], dict[str, Any]]


def _win(x: AttentionCall) -> tuple[int | None, int | None]:
    w = x.opts.window
    return w if w is not None else (None, None)


def _shift(side: int, d: int) -> Callable[[AttentionCall], dict[str, Any]]:
    """The window with one edge moved by d keys (the edge is bounded: see _has_side)."""
    def make(x: AttentionCall) -> dict[str, Any]:
        w = list(_win(x))
        w[side] = int(w[side] or 0) + d
        return {"window": (w[0], w[1])}
    return make


def _has_side(side: int, positive: bool = False) -> Callable[[AttentionCall], bool]:
    def test(x: AttentionCall) -> bool:
        w = _win(x)[side]
        return w is not None and (w > 0 or not positive)
    return test


def _l_ne_s(x: AttentionCall) -> bool:
    return x.q.shape[-2] != x.k.shape[-2]


def _has_cap(x: AttentionCall) -> bool:
    return x.opts.softcap is not None


def _cap_and_mask(x: AttentionCall) -> bool:
    return _has_cap(x) and (x.is_causal or x.opts.window is not None
                            or x.mod_keep is not None or x.attn_mask is not None)


def _alibi(x: AttentionCall) -> bool:
    return x.opts.alibi_slopes is not None


def _alibi_asym(x: AttentionCall) -> bool:
    s = x.opts.alibi_slopes
    return s is not None and s.shape[-1] > 1 and not np.array_equal(s, s[..., ::-1])


def _sinks(x: AttentionCall) -> bool:
    return x.opts.sinks is not None


def _has(name: str) -> Callable[[AttentionCall], bool]:
    return lambda x: getattr(x.opts, name) is not None


def _any_descale(x: AttentionCall) -> bool:
    return any(d is not None for d in (x.opts.q_descale, x.opts.k_descale, x.opts.v_descale))


def _kv(x: AttentionCall) -> bool:
    return x.opts.cache_seqlens is not None


def _kv_short(x: AttentionCall) -> bool:
    return _kv(x) and bool(np.any(x.opts.cache_seqlens < x.k.shape[-2]))


def _kv_nonempty(x: AttentionCall) -> bool:
    return _kv(x) and bool(np.any(x.opts.cache_seqlens > 0))


def _kv_leftpad(x: AttentionCall) -> bool:
    return _kv(x) and x.opts.cache_leftpad is not None and bool(np.any(x.opts.cache_leftpad))


def _chunk(x: AttentionCall) -> bool:
    return x.opts.attention_chunk is not None


def _chunk_shift(d: int) -> dict[str, Any]:
    return {"keep_changes": {"attention_chunk_shift": d}}


def _chunk_flip(x: AttentionCall) -> dict[str, Any]:
    # the chunk of i + (S - L - off) for that of i + off: the grid of the other corner
    L, S = x.q.shape[-2], x.k.shape[-2]
    off = 0 if x.causal_alignment == "top_left" else S - L
    return _chunk_shift(S - L - 2 * off)


def _rot(x: AttentionCall) -> bool:
    return x.opts.rotary is not None


def _rot_offset(x: AttentionCall) -> bool:
    return _rot(x) and (x.opts.cache_seqlens is not None or _l_ne_s(x))


def _rot_partial(x: AttentionCall) -> bool:
    sp = x.opts.rotary
    return (sp is not None and not sp.tables and sp.dim is not None
            and sp.dim < x.q.shape[-1] - x.q.shape[-1] % 2)


VARIANT_BUG_CLASSES: tuple[VariantBugClass, ...] = (
    VariantBugClass("window_left_off_by_one_wide",
                    "sliding window one key too wide on the left (sees key i - left - 1)",
                    _has_side(0), _shift(0, 1)),
    VariantBugClass("window_left_off_by_one_narrow",
                    "sliding window one key too narrow on the left (misses key i - left)",
                    _has_side(0, True), _shift(0, -1)),
    VariantBugClass("window_right_off_by_one_wide",
                    "sliding window one key too wide on the right (sees key i + right + 1)",
                    _has_side(1), _shift(1, 1)),
    VariantBugClass("window_right_off_by_one_narrow",
                    "sliding window one key too narrow on the right (misses key i + right)",
                    _has_side(1, True), _shift(1, -1)),
    VariantBugClass("window_misaligned",
                    "sliding window aligned to the other corner (top-left vs bottom-right, "
                    "FlashAttention aligns bottom-right)",
                    lambda x: x.opts.window is not None and _l_ne_s(x),
                    lambda x: {"flip_window_alignment": True}),
    VariantBugClass("softcap_before_scale", "softcap applied before the scale: "
                    "c·C·tanh(q·k/C) instead of C·tanh(c·q·k/C)", _has_cap,
                    lambda x: {"softcap_mode": "before_scale"}),
    VariantBugClass("softcap_after_mask", "softcap applied after the mask: masked scores "
                    "-inf become -C and the masked keys take part", _cap_and_mask,
                    lambda x: {"softcap_mode": "after_mask"}),
    VariantBugClass("softcap_missing", "softcap not applied", _has_cap,
                    lambda x: {"softcap_mode": "none"}),
    VariantBugClass("alibi_sign_flipped", "ALiBi bias added with the wrong sign "
                    "(+slope·|i - j|: distant keys favoured)", _alibi,
                    lambda x: {"alibi_sign": -1.0}),
    VariantBugClass("alibi_slopes_reversed", "ALiBi slopes applied in reversed head order",
                    _alibi_asym, lambda x: {"alibi_reverse": True}),
    VariantBugClass("alibi_misaligned", "ALiBi distance measured from the other corner "
                    "(|i - j| vs |i + S - L - j|)", lambda x: _alibi(x) and _l_ne_s(x),
                    lambda x: {"flip_alibi_alignment": True}),
    VariantBugClass("alibi_missing", "ALiBi bias not added", _alibi,
                    lambda x: {"alibi_sign": 0.0}),
    VariantBugClass("sinks_ignored", "attention sinks ignored (plain softmax)", _sinks,
                    lambda x: {"sink_mode": "ignored"}),
    VariantBugClass("sink_in_numerator", "the sink's e^σ also added to every key's "
                    "numerator (weights no longer leave the sink its share)", _sinks,
                    lambda x: {"sink_mode": "numerator"}),
    VariantBugClass("q_descale_missing", "FP8 q_descale not applied", _has("q_descale"),
                    lambda x: {"descale_power": (0, 1, 1)}),
    VariantBugClass("k_descale_missing", "FP8 k_descale not applied", _has("k_descale"),
                    lambda x: {"descale_power": (1, 0, 1)}),
    VariantBugClass("v_descale_missing", "FP8 v_descale not applied", _has("v_descale"),
                    lambda x: {"descale_power": (1, 1, 0)}),
    VariantBugClass("descale_missing", "no FP8 descale factor applied", _any_descale,
                    lambda x: {"descale_power": (0, 0, 0)}),
    VariantBugClass("descale_applied_twice", "FP8 descale factors applied twice",
                    _any_descale, lambda x: {"descale_power": (2, 2, 2)}),
    VariantBugClass("kv_cache_lengths_ignored", "cache_seqlens ignored: stale cache entries "
                    "past each sequence's length attended", _kv,
                    lambda x: {"keep_changes": {"cache_seqlens": None, "cache_leftpad": None}}),
    VariantBugClass("kv_cache_length_one_long", "off-by-one cache_seqlens: one stale key past "
                    "each sequence's length attended", _kv_short,
                    lambda x: {"keep_changes": {"cache_seqlens": np.minimum(
                        x.opts.cache_seqlens + 1, x.k.shape[-2])}}),
    VariantBugClass("kv_cache_length_one_short", "off-by-one cache_seqlens: each sequence's "
                    "newest key not attended", _kv_nonempty,
                    lambda x: {"keep_changes": {"cache_seqlens": np.maximum(
                        x.opts.cache_seqlens - 1, 0)}}),
    VariantBugClass("kv_cache_leftpad_ignored", "cache_leftpad ignored: the left padding "
                    "attended", _kv_leftpad, lambda x: {"keep_changes": {"cache_leftpad": None}}),
    VariantBugClass("attention_chunk_ignored", "attention_chunk ignored: keys of other "
                    "chunks attended", _chunk,
                    lambda x: {"keep_changes": {"attention_chunk": None}}),
    VariantBugClass("attention_chunk_misaligned", "chunks counted from the other corner "
                    "(query i's chunk from i, not i + S - L, or the reverse)",
                    lambda x: _chunk(x) and _l_ne_s(x), _chunk_flip),
    VariantBugClass("attention_chunk_boundary_off_by_one", "chunk boundaries one position "
                    "early (the chunk of p + 1 for query position p)", _chunk,
                    lambda x: _chunk_shift(1)),
    VariantBugClass("attention_chunk_boundary_off_by_one_late", "chunk boundaries one "
                    "position late (the chunk of p - 1 for query position p)", _chunk,
                    lambda x: _chunk_shift(-1)),
    VariantBugClass("rotary_interleaved_swapped", "rotary pairs of the other convention "
                    "(GPT-J interleaved 2m, 2m+1 vs GPT-NeoX halves m, m + r/2)", _rot,
                    lambda x: {"rotary_changes": {"interleaved_swapped": True}}),
    VariantBugClass("rotary_positions_not_offset", "rotary: queries rotated at positions "
                    "0 … L-1, not offset by the cache (cache_seqlens - L) or by S - L",
                    _rot_offset, lambda x: {"rotary_changes": {"no_offset": True}}),
    VariantBugClass("rotary_angles_bf16", "rotary cos/sin computed in bfloat16 (angles "
                    "pos·inv_freq, or the tables, in bf16)", _rot,
                    lambda x: {"rotary_changes": {"angles_dtype": "bfloat16"}}),
    VariantBugClass("rotary_angles_fp16", "rotary cos/sin computed in float16 (angles "
                    "pos·inv_freq, or the tables, in fp16)", _rot,
                    lambda x: {"rotary_changes": {"angles_dtype": "float16"}}),
    VariantBugClass("rotary_dim_ignored", "rotary_dim ignored: every dimension rotated "
                    "(inv_freq built from the head dim)", _rot_partial,
                    lambda x: {"rotary_changes": {"all_dims": True}}),
    VariantBugClass("no_scale", "scores not multiplied by the scale",
                    lambda x: (1.0 / math.sqrt(x.q.shape[-1]) if x.scale is None
                               else float(x.scale)) != 1.0, lambda x: {"scale": 1.0}),
    VariantBugClass("causal_excludes_diagonal",
                    "off-by-one causal mask: query i sees keys j < i only",
                    lambda x: x.is_causal, lambda x: {"causal_offset": -1}),
    VariantBugClass("causal_sees_next_key", "off-by-one causal mask: query i also sees key "
                    "i + 1", lambda x: x.is_causal, lambda x: {"causal_offset": 1}),
)


def diagnose_variant(actual: np.ndarray, x: AttentionCall, *, model: ErrorModel,
                     safety: float) -> tuple[Any, ...]:
    """The variant bug classes whose float64 output ``actual`` matches within
    ``safety`` times the buggy variant's own bound under ``model``, best first
    (callers have found that ``actual`` does not match the truth)."""

    class _Entry:
        def __init__(self, bug: VariantBugClass) -> None:
            self.name, self.description, self.bug = bug.name, bug.description, bug

        def applies(self, xx: AttentionCall) -> bool:
            return self.bug.applies(xx)

        def variant(self, xx: AttentionCall) -> VariantPlain:
            return plain_variant(xx, **self.bug.switches(xx))

    entries = tuple(_Entry(b) for b in VARIANT_BUG_CLASSES)
    return _matching(actual, x, entries, model, safety)
