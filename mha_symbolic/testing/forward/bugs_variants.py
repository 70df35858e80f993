"""Known bugs of the attention variants, as data, and the float64 evaluation they share.

Each entry of :func:`variant_bug_classes` names a mistake seen in kernels that ship
the variants (FlashAttention, FlexAttention, xformers, vLLM; docs/variants.md lists
them) and the switches of :func:`plain_variant` that reproduce it.  A variant's own
entries live in its module (the protocol's ``bugs``, :class:`BugClass` data); the
plain pipeline's (scale, causal off-by-ones) here.  As in
:mod:`.bugs`, a class is only *named* after it is checked: the actual output fails the
truth's verdict and passes the one the buggy call would get (its own model bound and
dtype level: :func:`mha_symbolic.testing.forward.variants._at_verdict_tolerance`).

:func:`plain_variant` is attention with every variant in float64 — not a reference
(the reference is the oracle's enclosure), but the input of the tolerance model
(:mod:`.tolerance_variants`) and of the bug variants.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import SpecError
from ...oracle.variants.protocol import (
    BugClass,
    VariantOptions,
    own_query_offsets,
    registered,
)
from ...oracle.variants.registry import (
    bug_classes,
    kept,
    per_sequence,
    plain_rotation,
    sink_logits,
)
from ...oracle.variants.semantics import Cap, Geometry
from ..call import AttentionCall
from ..tolerance import ErrorModel
from .model_variants import variant_error_bound
from .plain import fit_ratio

__all__ = ["VariantPlain", "own_kept", "plain_variant", "variant_bug_classes"]


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
    rotation: Any = None          # a variant's rotation of q and k (``rotate_plain``)
    rotation_inputs: tuple[np.ndarray, np.ndarray] | None = None    # q, k flat (B, n, E)
    rotation_outputs: tuple[np.ndarray, np.ndarray] | None = None   # q', k' flat
    rotate_changes: dict[str, Any] | None = None   # a bug's rotation switches (``on_v``)
    v_unrotated: np.ndarray | None = None   # v before a buggy kernel rotated it (``on_v``)

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


def plain_variant(
    x: AttentionCall, *, sink_mode: str = "denominator", scale: float | None = None,
    causal_offset: int = 0, store: Callable[[np.ndarray], np.ndarray] | None = None,
    keep_changes: dict[str, Any] | None = None, rotate_changes: dict[str, Any] | None = None,
    **switches: Any,
) -> VariantPlain:
    """Attention with the variants of ``x`` in float64; the keyword switches make the
    buggy variants of the catalogue (the defaults are the correct semantics of
    :mod:`mha_symbolic.oracle.variants.semantics`): the plain pipeline's (``scale``,
    ``causal_offset``), the protocol's (``sink_mode``: the sinks' logit ignored or also
    in the numerator; ``keep_changes``, ``rotate_changes``) and, in ``switches``, those
    of the variants' testing hooks (``plain_inputs``, ``plain_keep``, ``plain_scores``:
    each takes the switches its keyword parameters name).  ``store`` (rounding to a
    dtype) is applied wherever a plain kernel stores a tensor — the scaled scores, after
    each softcap and bias, the weights P before P·V, the output — for FlashAttention's
    rule."""
    st = store if store is not None else (lambda a: a)
    o = x.opts
    hooks = _Hooks(o, switches)
    q, k, v, lead, H, qk_changed, v_changed = _heads(x, hooks)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    off = 0 if x.causal_alignment == "top_left" else S - L
    geo = Geometry(lead, H, L, S, off)
    # q, k rotated before the scores (as the kernel's, or a buggy kernel's); the switch
    # ``on_v`` of rotate_changes also rotates v as a key (a kernel that rotates V too)
    changes = dict(rotate_changes or {})
    on_v = bool(changes.pop("on_v", False))
    rot, rot_io = plain_rotation(o, geo, q, k, changes)
    v0 = None
    if rot_io is not None:
        if on_v:
            if v.shape[-1] != E:
                raise ValueError("rotary on v needs the value dim of the query's")
            _, v_io = plain_rotation(o, geo, q, v, changes)
            assert v_io is not None
            v0, v = v, v_io[3].reshape(v.shape)
        q, k = rot_io[2].reshape(*lead, L, E), rot_io[3].reshape(*lead, S, E)
    c = (1.0 / math.sqrt(E) if x.scale is None else float(x.scale)) if scale is None else scale
    G = q @ np.swapaxes(k, -1, -2)
    A = abs(c) * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2))
    allowed, madd = _kept_keys(x, geo, G.shape, hooks, causal_offset, keep_changes)
    sc = _Scores(np.abs(c * G), [], 0)
    stages = hooks.score_stages(geo)
    s = _scores(stages, geo, G, c, st, madd, sc)
    for cap in stages["masked"]:
        # the mask applied first, then the cap: a masked score -inf becomes -C, so
        # masked keys take part (the bug FlashAttention's order avoids)
        s = np.where(allowed, cap.C * np.tanh(s / cap.C), -cap.C)
        sc.caps.append((np.where(allowed, np.abs(s), 0.0), np.abs(s)))
        allowed = np.ones_like(allowed)
    sink = None
    logits = sink_logits(o, geo) if sink_mode != "ignored" else None
    if logits is not None:
        sink = (np.broadcast_to(logits.reshape(*lead, 1), (*lead, L)) if lead
                else np.broadcast_to(logits.reshape(1), (L,)))
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
    p, p_sink = _softmax(s, allowed, sink, sink_mode)
    out = st(st(p) @ v) if store is not None else p @ v
    if policy.nan.any():
        out = np.where(policy.nan[..., None], np.nan, out)
    return VariantPlain(out, p, p_sink, None if sink is None else np.asarray(sink, float),
                        q, v, allowed, np.where(allowed, s, 0.0), A, sc.size, sc.caps,
                        v_descaled=v_changed, k=k, scale=c, n_add=sc.n_add,
                        qk_descaled=qk_changed, uniform=uniform, opts=o, rotation=rot,
                        rotation_inputs=None if rot_io is None else rot_io[:2],
                        rotation_outputs=None if rot_io is None else rot_io[2:],
                        rotate_changes=rotate_changes, v_unrotated=v0)


#: the testing hooks of the protocol whose keyword-only parameters are switches
_SWITCHED = ("plain_inputs", "plain_keep", "plain_scores")


@functools.cache
def _switch_names(hook: Callable[..., Any]) -> frozenset[str]:
    """The switches a testing hook takes: its keyword-only parameters."""
    return frozenset(p.name for p in inspect.signature(hook).parameters.values()
                     if p.kind is p.KEYWORD_ONLY)


class _Hooks:
    """The active variants (in pipeline order) and their testing hooks, each hook given
    the switches it names; a switch no registered variant's hook names is refused."""

    def __init__(self, opts: VariantOptions, switches: dict[str, Any]) -> None:
        if switches:
            known = {n for v in registered() for h in _SWITCHED
                     if getattr(v, h) is not None for n in _switch_names(getattr(v, h))}
            unknown = sorted(set(switches) - known)
            if unknown:
                raise TypeError(f"plain_variant() got unexpected switch(es) {unknown}")
        self.opts, self.switches = opts, switches
        self.active = sorted(opts.active(), key=lambda v: v.order)

    def call(self, hook: Callable[..., Any], *args: Any) -> Any:
        names = _switch_names(hook)
        return hook(self.opts, *args, **{n: w for n, w in self.switches.items() if n in names})

    def score_stages(self, geo: Geometry) -> dict[str, list[Any]]:
        """The score operations by stage (``"unscaled"``, ``"scores"`` in pipeline
        order, ``"masked"``): each variant's ``plain_scores``, else its ``scores``."""
        stages: dict[str, list[Any]] = {"unscaled": [], "scores": [], "masked": []}
        for v in self.active:
            if v.plain_scores is not None:
                for stage, op in self.call(v.plain_scores, geo):
                    if stage != "scores" and not isinstance(op, Cap):
                        raise SpecError(f"{v.name}: only a Cap may be applied {stage}")
                    stages[stage].append(op)
            elif v.scores is not None:
                stages["scores"].extend(v.scores(self.opts, geo))
        return stages


def own_kept(opts: VariantOptions) -> tuple[str, ...]:
    """The variants whose kept keys the float64 evaluation makes itself (``plain_keep``):
    left out of the call record's ``mod_keep``."""
    return tuple(v.name for v in opts.active() if v.plain_keep is not None)


def _heads(x: AttentionCall, hooks: _Hooks) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     tuple[int, ...], int, bool, bool]:
    """q, k, v changed by the variants' ``plain_inputs`` (fp8's per-head factors) with
    the key heads repeated to the query heads (GQA), the leading shape, the number of
    heads and whether a factor is folded into the scale and into the output."""
    q, k, v = x.q, x.k, x.v
    hq = q.shape[-3] if q.ndim >= 3 else 1
    hk = k.shape[-3] if k.ndim >= 3 else 1
    group = hq // hk if x.enable_gqa and hk and hq % hk == 0 else 1
    lead = tuple(np.broadcast_shapes(q.shape[:-2], (*k.shape[:-3], hq) if k.ndim >= 3
                                     else (), (*v.shape[:-3], hq) if v.ndim >= 3 else ()))
    H = lead[-1] if lead else 1
    qk_changed = v_changed = False
    for var in hooks.active:
        if var.plain_inputs is not None:
            q, k, v, f_qk, f_v = hooks.call(var.plain_inputs, q, k, v, lead[:-1], H, group)
            qk_changed, v_changed = qk_changed or f_qk, v_changed or f_v
    if group > 1:
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    return q, k, v, lead, H, qk_changed, v_changed


def _kept_keys(x: AttentionCall, geo: Geometry, shape: tuple[int, ...], hooks: _Hooks,
               causal_offset: int, keep_changes: dict[str, Any] | None
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """The keys each query keeps (mask, causal, the ``plain_keep`` variants', the other
    registered variants' kept keys) and the additive part of a float mask (``None``
    without one)."""
    o = x.opts
    L, S, off = geo.L, geo.S, geo.offset
    allowed = np.ones(shape, dtype=bool)
    madd = None
    if x.attn_mask is not None:
        m = x.attn_mask
        if m.dtype == np.bool_:
            allowed = allowed & m
        else:
            allowed = allowed & (m != -np.inf)
            madd = np.where(m == -np.inf, 0.0, m)
    if x.is_causal:
        allowed = allowed & (np.arange(S)[None, :] <= np.arange(L)[:, None] + off
                             + causal_offset)
    for var in hooks.active:
        if var.plain_keep is None:
            continue
        keep, misaligned = hooks.call(var.plain_keep)
        own = own_query_offsets(o, geo)
        if own is None:
            koff = (S - L) - off if misaligned else off
            part = keep(Geometry(geo.batch, geo.heads, L, S, koff))
        else:
            # each sequence's own query positions (the KV cache's); misaligned: measured
            # from the keys' end instead
            part = per_sequence(keep, geo, np.full_like(own, S - L) if misaligned else own)
        if part is not None:
            allowed = allowed & part
    if keep_changes is not None:
        # the registered variants' kept keys with some of their options changed (the
        # bug classes of the kept-key variants: KV-cache lengths, chunk boundaries);
        # the plain_keep variants' are applied above, as for the correct call
        for part in kept(o.replace(**keep_changes), geo, x.is_causal, exclude=own_kept(o)):
            allowed = allowed & part
    elif x.mod_keep is not None:
        allowed = allowed & x.mod_keep
    return allowed, madd


@dataclass
class _Scores:
    """What the score pipeline tells the tolerance model besides the scores."""

    size: np.ndarray                                   # |c q·k| + Σ|biases| + |mask|
    caps: list[tuple[np.ndarray, np.ndarray]]          # (|before|, |after|) per softcap
    n_add: int                                         # additive terms (biases, mask)


def _scores(stages: dict[str, list[Any]], geo: Geometry, G: np.ndarray, c: float,
            st: Callable[[np.ndarray], np.ndarray], madd: np.ndarray | None, sc: _Scores
            ) -> np.ndarray:
    """The scores: the caps before the scale, the scale, the pipeline's operations (caps
    and biases), the mask; each stored by ``st``; ``sc`` collects their sizes and caps."""
    lead, L, S = geo.batch, geo.L, geo.S
    for cap in stages["unscaled"]:
        t = cap.C * np.tanh(G / cap.C)
        sc.caps.append((np.abs(G), np.abs(t)))
        G = t
    s = st(c * G)
    B = math.prod(lead)
    for op in stages["scores"]:
        if isinstance(op, Cap):
            t = op.C * np.tanh(s / op.C)
            sc.caps.append((np.abs(s), np.abs(t)))
            s = st(t)
        else:
            vals, _ = op.floats(geo, range(B))
            vals = vals.reshape(*lead, L, S)
            s = st(s + vals)
            sc.size = sc.size + np.abs(vals)
            sc.n_add += 1
    if madd is not None:
        s = st(s + madd)
        sc.size = sc.size + np.abs(madd)
        sc.n_add += 1
    return s


def _softmax(s: np.ndarray, allowed: np.ndarray, sink: np.ndarray | None, sink_mode: str
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """The weights of the kept keys and the sink's (in the denominator, or where the
    bug puts it); rows with no weight get 0."""
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
    return p, p_sink


# --------------------------------------------------------------------------------------
# The catalogue


def _scaled(x: AttentionCall) -> bool:
    return (1.0 / math.sqrt(x.q.shape[-1]) if x.scale is None else float(x.scale)) != 1.0


#: The mistakes of the plain pipeline, whatever the variants.
_PLAIN_BUGS: tuple[BugClass, ...] = (
    BugClass("no_scale", "scores not multiplied by the scale", _scaled,
             lambda x: {"scale": 1.0}),
    BugClass("causal_excludes_diagonal", "off-by-one causal mask: query i sees keys j < i only",
             lambda x: x.is_causal, lambda x: {"causal_offset": -1}),
    BugClass("causal_sees_next_key", "off-by-one causal mask: query i also sees key i + 1",
             lambda x: x.is_causal, lambda x: {"causal_offset": 1}),
)


def variant_bug_classes() -> tuple[BugClass, ...]:
    """The catalogue: every registered variant's bug classes (from its own module,
    :func:`mha_symbolic.oracle.variants.registry.bug_classes`), then the plain
    pipeline's."""
    return bug_classes() + _PLAIN_BUGS
