"""Certified gradients of attention with variants: sliding window, softcap, ALiBi and
bias tables, attention sinks, FlexAttention's mask_mod / BlockMask, FP8 descale
factors, and the packed varlen layout (:func:`reference_attention_varlen_backward`).

Two routes, as the forward (:mod:`.variant_forward`):

1. **Lowering** (no softcap, every additive bias a double): the variant is plain
   attention of other exact inputs, so its gradients are the plain problem's
   (:mod:`.backward`); a sink is an extra key with k = 0, v = 0 and score σ, whose
   row of dk and dv is not a gradient of the user's inputs and is dropped (dq needs
   nothing: the sink contributes c·dS_{i,sink}·0).
2. **Transformed scores** (a softcap, or a bias that is not a double): the backward's
   tiers on the scores of :mod:`.transformed` through the hooks of
   :mod:`.transformed_backward` — dQ = c·(Φ∘dS)K and dK = c·(Φ∘dS)ᵀQ with Φ the
   product of sech²(s/C) over the softcaps.

Gradients of the variant parameters (linear functionals of dS, the gradient of the
final scores; :mod:`.backward.functionals`):

* ``d_sinks`` (H,): σ_h enters row i's softmax as a key of value 0, so
  ∂L/∂σ_h = Σ_{batch, i} dS_{i,sink} = Σ_i P_{i,sink}(dP_{i,sink} − D_i) = −Σ_i P_{i,sink} D_i
  (dP_{i,sink} = dO_i·v_sink = 0; P_sink = e^σ/(Σ_j e^{s_ij} + e^σ), D_i = dO_i·O_i);
* ``d_alibi_slopes`` (the slopes' shape): ∂s_ij/∂slope = −|j − (i + off)|;
* ``d_score_mod``: per score_mod item, the gradient of its tensor — an ALiBi
  score_mod's slopes as above, a relative bias table's entries Σ of dS over the
  (i, j) whose clipped distance selects the entry; None for a softcap (a constant);
* ``d_attn_mask``: a float mask's gradient, dS summed over its broadcast dimensions.

FP8 descale factors (FlashAttention-3's ``q_descale``, ``k_descale``, ``v_descale``):
the exact inputs are q·d_q, k·d_k, v·d_v, so the gradients with respect to the fp8
tensors themselves are, by the chain rule, d_q·dq', d_k·dk', d_v·dv' (dq' the
gradient with respect to the descaled query; the query heads of a GQA group share
their kv head's d_q).  FlashAttention-3's own backward takes no descale factors and
refuses fp8 inputs (``mha_bwd``: "FlashAttention only support fp16 and bf16 data
type"), and its autograd returns None for the descale arguments: here, likewise, no
gradient of the descale factors is given.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..._validate import check_bits, door
from ...errors import ShapeError, SpecError
from ..backward.attention import AttentionGradients, backward_enclosures, plain_attention_backward
from ..backward.functionals import ScoreFunctional
from ..conventions import exact_scale, masked_rows_of, read_mask
from ..inputs import as_exact_array
from .forward import Prepared, lowered, prepare, varlen_inputs
from .protocol import VariantOptions, own_query_offsets
from .registry import require_gradients, with_variant_keywords
from .score_mods import AlibiScoreMod, RelativeBiasScoreMod, SoftcapScoreMod
from .transformed import TransformedProblem
from .transformed_backward import TransformHooks
from .views import DropLast, PackedEnclosure, scaled, summed

__all__ = ["reference_attention_varlen_backward", "variant_attention_backward"]

Arr = np.ndarray[Any, Any]


def _target(shape: tuple[int, ...], lead: tuple[int, ...], name: str) -> Arr:
    """For every flat problem over ``lead``, the flat index of a parameter of ``shape``
    broadcast against it (a parameter shared by broadcast copies sums their terms)."""
    idx = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    try:
        return np.broadcast_to(idx, lead).reshape(-1).copy()
    except ValueError:
        raise ShapeError(f"{name}.shape={shape} does not broadcast to (batch..., heads) = "
                         f"{lead}") from None


class _Functionals:
    """The functionals of one call (:mod:`.backward.functionals`) and where each
    result goes."""

    def __init__(self, prep: Prepared, opts: VariantOptions, attn_mask: Any) -> None:
        geo = prep.geo
        flat_lead = prep.lead if prep.lead else (1,)
        self.items: list[ScoreFunctional] = []
        self.sinks: int | None = None
        self.slopes: int | None = None
        self.mods: list[int | None] = []
        self.mask: int | None = None
        n_keys = geo.S + (0 if prep.sinks is None else 1)

        def add(fn: ScoreFunctional) -> int:
            self.items.append(fn)
            return len(self.items) - 1

        if prep.sinks is not None:
            self.sinks = add(_sink_functional(geo, n_keys))
        if opts.alibi_slopes is not None:
            own = own_query_offsets(opts, geo)
            self.slopes = add(_alibi_functional(
                "alibi_slopes", opts.alibi_slopes, geo.offset if own is None
                else np.asarray(own), geo, flat_lead, n_keys))
        for m in opts.score_mods:
            if isinstance(m, AlibiScoreMod):
                self.mods.append(add(_alibi_functional("score_mod_slopes", np.asarray(m.slopes),
                                                       m.offset, geo, flat_lead, n_keys)))
            elif isinstance(m, RelativeBiasScoreMod):
                self.mods.append(add(_table_functional(m, geo, n_keys)))
            else:
                assert isinstance(m, SoftcapScoreMod)
                self.mods.append(None)
        if prep.user_madd is not None:
            self.mask = add(_mask_functional(attn_mask, geo, flat_lead, n_keys))


def _rel(n_keys: int, rows: Arr, offset: int) -> Arr:
    """d = j - (i + offset) for the rows, over every key column (the sink's included)."""
    return np.arange(n_keys)[None, :] - (rows[:, None] + offset)


def _sink_functional(geo: Any, n_keys: int) -> ScoreFunctional:
    """∂/∂σ_h: the sink's column (index S) of dS, per head."""
    S, H = geo.S, geo.heads
    cols = np.arange(n_keys)

    def sink_index(e: int, rows: Arr) -> tuple[Arr, Arr]:
        col = np.where(cols == S, 0, -1)
        return np.broadcast_to(col, (rows.size, n_keys)), np.ones((rows.size, n_keys))

    return ScoreFunctional("grad_sinks", (H,), H, 1, 1, np.arange(geo.B, dtype=np.int64) % H,
                           False, sink_index)


def _alibi_functional(name: str, slopes: Arr, offset: Any, geo: Any,
                      flat_lead: tuple[int, ...], n_keys: int) -> ScoreFunctional:
    """∂/∂slope: −|j − (i + off)| against dS; ``offset`` one for the call or an array of
    each outer batch element's own offset (a KV cache's)."""
    S, H = geo.S, geo.heads
    cols = np.arange(n_keys)
    if slopes.ndim == 2 and slopes.shape == (geo.n_outer, H):
        # (batch, heads) over the flattened outer dimensions, as the forward
        target = np.arange(geo.B, dtype=np.int64)
    else:
        target = _target(slopes.shape, flat_lead, name)

    def index(e: int, rows: Arr) -> tuple[Arr, Arr]:
        d = _rel(n_keys, rows, int(offset[e // H]) if np.ndim(offset) else offset)
        return (np.broadcast_to(np.where(cols < S, 0, -1), d.shape),
                -np.abs(d).astype(np.float64))

    return ScoreFunctional(f"grad_{name}", tuple(slopes.shape), int(slopes.size), 1, 1,
                           target, False, index)


def _table_functional(m: RelativeBiasScoreMod, geo: Any, n_keys: int) -> ScoreFunctional:
    """∂/∂table[h, w]: dS summed over the scores at clipped distance w − W."""
    S, H, B = geo.S, geo.heads, geo.B
    cols = np.arange(n_keys)
    tab = np.asarray(m.table)
    W = (tab.shape[-1] - 1) // 2
    per_head = tab.ndim == 2 and tab.shape[0] > 1
    target = np.arange(B, dtype=np.int64) % H if per_head else np.zeros(B, dtype=np.int64)

    def t_index(e: int, rows: Arr) -> tuple[Arr, Arr]:
        d = _rel(n_keys, rows, int(m.offset[e // H]) if np.ndim(m.offset) else m.offset)
        col = np.where(cols[None, :] < S, np.clip(d, -W, W) + W, -1)
        return col, np.ones(col.shape)

    return ScoreFunctional("grad_score_mod_table", tuple(tab.shape),
                           tab.shape[0] if per_head else 1, 1, tab.shape[-1], target, False,
                           t_index)


def _mask_functional(attn_mask: Any, geo: Any, flat_lead: tuple[int, ...], n_keys: int
                     ) -> ScoreFunctional:
    """∂/∂(float mask): dS itself, summed where the mask broadcasts."""
    L, S = geo.L, geo.S
    cols = np.arange(n_keys)
    shape = tuple(read_mask(attn_mask, "attn_mask").shape)
    m2 = (1,) * max(0, 2 - len(shape)) + shape
    bl, bs = m2[-2] == 1 and L != 1, m2[-1] == 1 and S != 1
    target = _target(m2[:-2], flat_lead, "attn_mask")

    def m_index(e: int, rows: Arr) -> tuple[Arr, Arr]:
        col = np.where(cols < S, 0 if bs else cols, -1)
        return np.broadcast_to(col, (rows.size, n_keys)), np.ones((rows.size, n_keys))

    return ScoreFunctional("grad_attn_mask", shape, math.prod(m2[:-2]), 1 if bl else L,
                           1 if bs else S, target, not bl, m_index)


def _descale_factor(d: Arr | None, x_lead: tuple[int, ...], prep: Prepared, kv: bool
                    ) -> Arr | None:
    """The descale factor of every flat problem of an input with leading shape x_lead
    (FlashAttention-3: (batch, nheads_k), the query heads of a group sharing their kv
    head's factor)."""
    if d is None:
        return None
    geo = prep.geo
    hk = geo.heads // prep.group
    full = np.broadcast_to(d, (*geo.outer, hk))
    if not kv and prep.group > 1:
        full = np.repeat(full, prep.group, axis=-1)
    try:
        return np.broadcast_to(full, x_lead).reshape(-1)
    except ValueError:  # pragma: no cover - the forward's checks refuse it first
        raise ShapeError(f"descale factors of shape {d.shape} do not match {x_lead}") from None


def _check_descale_shapes(prep: Prepared, query: Any, key: Any, value: Any,
                          opts: VariantOptions) -> None:
    """The gradient of an fp8 input broadcast over batches with different descale
    factors would be a sum of differently scaled copies: refused."""

    for name, x, x64, d in (("query", query, prep.q64, opts.q_descale),
                            ("key", key, prep.k64, opts.k_descale),
                            ("value", value, prep.v64, opts.v_descale)):
        if d is not None and tuple(as_exact_array(x, name).shape) != tuple(x64.shape):
            raise SpecError(f"{name}.shape does not cover the descale factors' batch: pass "
                            f"{name} with its batch dimension (shape {x64.shape}) for the "
                            "backward with descale factors")


def variant_attention_backward(
    query: Any, key: Any, value: Any, grad_output: Any, opts: VariantOptions, *,
    attn_mask: Any, is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str,
    masked_rows: str, progress: bool | None = None,
) -> Any:
    """reference_attention_backward with variants (options validated by the caller)."""

    require_gradients(opts)
    prep = prepare(query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
                   scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                   masked_rows=masked_rows)
    if any(d is not None for d in (opts.q_descale, opts.k_descale, opts.v_descale)):
        _check_descale_shapes(prep, query, key, value, opts)
    fns = _Functionals(prep, opts, attn_mask)
    common = {"scale": scale, "enable_gqa": prep.group > 1, "masked_rows": masked_rows,
              "progress": progress, "functionals": tuple(fns.items)}
    own = [v.backward for v in opts.active() if v.backward is not None]
    if len(own) > 1:
        raise SpecError("two variants compute the gradients themselves")
    if own:
        res = own[0](opts, prep, grad_output, **common)
    elif prep.lowerable:
        k64, v64, mask = lowered(prep)
        res = backward_enclosures(prep.q64, k64, v64, grad_output, attn_mask=mask,
                                  mask_grad=False, **common)
    else:
        q64, k64, v64, mask, hooks = _transformed_inputs(prep, scale, masked_rows)
        res = backward_enclosures(q64, k64, v64, grad_output, attn_mask=mask, hooks=hooks,
                                  **common)
    dq: Any = res["dq"]
    dk: Any = res["dk"]
    dv: Any = res["dv"]
    for name, d, x64, kv in (("dq", opts.q_descale, prep.q64, False),
                             ("dk", opts.k_descale, prep.k64, True),
                             ("dv", opts.v_descale, prep.v64, True)):
        f = _descale_factor(d, tuple(x64.shape[:-2]), prep, kv)
        if f is not None:
            scaled_enc = scaled(res[name], f)
            if name == "dq":
                dq = scaled_enc
            elif name == "dk":
                dk = scaled_enc
            else:
                dv = scaled_enc
    if prep.sinks is not None:  # the views offer the Enclosure API without the sink key
        dk, dv = DropLast(dk, axis=-2), DropLast(dv, axis=-2)

    def fn(n: int | None) -> Any:
        return None if n is None else res[f"fn{n}"]

    mods = tuple(fn(n) for n in fns.mods) if opts.score_mods else None
    return AttentionGradients(dq, dk, dv, fn(fns.mask), d_sinks=fn(fns.sinks),
                              d_alibi_slopes=fn(fns.slopes), d_score_mod=mods)


def _transformed_inputs(prep: Prepared, scale: Any, masked_rows: str
                        ) -> tuple[Arr, Arr, Arr, Arr, Any]:
    """The backward's inputs for transformed scores: q, k and v with one zero key (the
    sink) appended, the allowed keys as a bool mask (the sink always allowed), and
    the hooks on a :class:`.transformed.TransformedProblem` of the flat problems."""

    geo, lead = prep.geo, prep.lead
    L, S, B = geo.L, geo.S, geo.B
    q64, k64, v64 = prep.q64, prep.k64, prep.v64
    E = q64.shape[-1]
    Ev = v64.shape[-1]
    kr = np.repeat(k64, prep.group, axis=-3) if prep.group > 1 else k64
    vr = np.repeat(v64, prep.group, axis=-3) if prep.group > 1 else v64
    qf = np.broadcast_to(q64, (*lead, L, E)).reshape(B, L, E)
    kf = np.broadcast_to(kr, (*lead, S, E)).reshape(B, S, E)
    vf = np.broadcast_to(vr, (*lead, S, Ev)).reshape(B, S, Ev)
    keep = prep.keep
    allowed = (np.ones((B, L, S), dtype=bool) if keep is None else
               np.ascontiguousarray(np.broadcast_to(keep, (*lead, L, S)).reshape(B, L, S)))
    madd = (None if prep.user_madd is None else np.ascontiguousarray(
        np.broadcast_to(prep.user_madd, (*lead, L, S)).reshape(B, L, S)))
    uniform = None
    # a sink's logit is in every row: no row is empty then
    empty: Arr = (np.asarray(~allowed.any(axis=-1)) if prep.sinks is None
                  else np.zeros(allowed.shape[:-1], dtype=bool))
    rows = masked_rows_of(masked_rows, empty, S, lead, what="", check=False)
    if rows.uniform.any():
        uniform = rows.uniform
        allowed = allowed.copy()
        allowed[uniform] = True
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    tp = TransformedProblem(qf, kf, vf, allowed, madd, prep.ops, prep.sinks, scale_exact, E, geo,
                            uniform)
    mask = keep if keep is not None else np.ones((L, S), dtype=bool)
    if prep.sinks is not None:
        k64 = np.concatenate([k64, np.zeros((*k64.shape[:-2], 1, E))], axis=-2)
        v64 = np.concatenate([v64, np.zeros((*v64.shape[:-2], 1, Ev))], axis=-2)
        mask = np.concatenate([mask, np.ones((*mask.shape[:-1], 1), dtype=bool)], axis=-1)
    return q64, k64, v64, mask, TransformHooks(tp, c_f, rho_c)


# --------------------------------------------------------------------------------------
# varlen


@with_variant_keywords
@functools.partial(door, quiet=True)
def reference_attention_varlen_backward(
    query: Any, key: Any, value: Any, grad_output: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, *,
    is_causal: bool = False, scale: float | None = None, causal_alignment: str = "top_left",
    masked_rows: str = "zero", **variants: Any,
) -> Any:
    """Certified gradients of packed variable-length attention
    (:func:`~mha_symbolic.oracle.variants.forward.reference_attention_varlen`'s
    conventions; FlashAttention's ``flash_attn_varlen_func`` backward): ``grad_output``
    (total_q, H, E_v); returns ``dq`` (total_q, H, E), ``dk``, ``dv`` (total_k, H_kv, ·)
    packed like the inputs, and the variant parameters' gradients — a parameter shared
    by the sequences (sinks, slopes of shape (H,), a bias table) sums their terms,
    one of shape (batch, H) gets each sequence's.

    >>> import numpy as np
    >>> x = np.arange(12.0).reshape(3, 1, 4) / 8
    >>> g = reference_attention_varlen_backward(x, x, x, np.ones((3, 1, 4)), [0, 1, 3],
    ...                                         [0, 1, 3], scale=0.0)
    >>> g.dv.rounded("float32")[:, 0, 0].tolist()   # key 0 serves only query 0
    [1.0, 1.0, 1.0]
    """

    vl = varlen_inputs(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, **variants)
    q, k, v, cq, ck, H, hk = vl.q, vl.k, vl.v, vl.cq, vl.ck, vl.H, vl.hk
    do = as_exact_array(grad_output, "grad_output")
    if do.shape != (q.shape[0], H, v.shape[2]):
        raise ShapeError(f"grad_output.shape={do.shape} does not match the output's shape "
                         f"{(q.shape[0], H, v.shape[2])} (total_q, H, E_v)")
    grads = []
    for b in range(vl.n):
        rq, rk, opts = vl.sequence(b)
        qb, kb, vb, dob = (np.swapaxes(x[r], 0, 1)
                           for x, r in ((q, rq), (k, rk), (v, rk), (do, rq)))
        common: dict[str, Any] = {"is_causal": is_causal, "scale": scale, "enable_gqa": hk != H,
                  "causal_alignment": causal_alignment, "masked_rows": masked_rows}
        if opts.empty:
            grads.append(plain_attention_backward(qb, kb, vb, dob, **common))
        else:
            grads.append(variant_attention_backward(qb, kb, vb, dob, opts, attn_mask=None,
                                                    **common))
    dq: Any = PackedEnclosure([g.dq for g in grads], cq, (H, q.shape[2]))
    dk: Any = PackedEnclosure([g.dk for g in grads], ck, (hk, k.shape[2]))
    dv: Any = PackedEnclosure([g.dv for g in grads], ck, (hk, v.shape[2]))

    def shared(get: Any) -> Any:
        parts = [get(g) for g in grads]
        return None if not parts or parts[0] is None else summed(parts)

    d_slopes = None
    slopes = vl.opts.alibi_slopes
    if slopes is not None:
        parts = [g.d_alibi_slopes for g in grads]
        d_slopes = _Stacked(parts) if slopes.ndim == 2 else summed(parts)
    mods = None
    if vl.opts.score_mods:
        mods = tuple(shared(lambda g, _n=n: g.d_score_mod[_n])
                     for n in range(len(vl.opts.score_mods)))
    return AttentionGradients(dq, dk, dv, None, d_sinks=shared(lambda g: g.d_sinks),
                              d_alibi_slopes=d_slopes, d_score_mod=mods)


class _Stacked:
    """Per-sequence gradients (H,) stacked as (batch, H) with the Enclosure API."""

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts
        self.shape = (len(parts), *parts[0].shape)

    def _stack(self, get: Any) -> Arr:
        return np.stack([np.asarray(get(p)) for p in self._parts])

    @property
    def lower(self) -> Arr:
        return self._stack(lambda p: p.lower)

    @property
    def upper(self) -> Arr:
        return self._stack(lambda p: p.upper)

    @property
    def midpoint(self) -> Arr:
        return self._stack(lambda p: p.midpoint)

    def rounded(self, dtype: Any = "float64") -> Arr:
        return self._stack(lambda p: p.rounded(dtype))

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        prec = check_bits(prec)
        idx = tuple(int(i) for i in index)
        if len(idx) != len(self.shape) or not all(-n <= i < n for i, n in
                                                  zip(idx, self.shape, strict=True)):
            raise SpecError(f"index={idx} is out of range for shape={self.shape}")
        return self._parts[idx[0] % self.shape[0]].exact(idx[1:], prec=prec)

    def __repr__(self) -> str:
        return f"Enclosure(shape={self.shape}, {len(self._parts)} sequences)"

