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

Gradients of the variant parameters are linear functionals of dS, the gradient of
the final scores (:mod:`.backward.functionals`), each declared by its variant (the
``grad_params`` hook, :class:`.protocol.GradParam`): the sink logits' (:mod:`.sinks`),
the ALiBi slopes' (:mod:`.alibi`), a score_mod's tensors (:mod:`.score_mod`); here
only ``d_attn_mask``, a float mask's gradient (dS summed over its broadcast
dimensions).  An exact input change is undone by its variant's chain rule (the
``backward_inputs`` hook: FP8 descale, :mod:`.fp8`).  This module names no variant.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..._validate import check_bits, door
from ...errors import ShapeError, SpecError
from ..backward.attention import AttentionGradients, backward_enclosures, plain_attention_backward
from ..backward.functionals import ScoreFunctional, broadcast_target
from ..conventions import exact_scale, masked_rows_of, read_mask
from ..inputs import as_exact_array
from .forward import Prepared, lowered, prepare, varlen_inputs
from .protocol import VariantOptions
from .registry import grad_params, require_gradients, with_variant_keywords
from .transformed import TransformedProblem
from .transformed_backward import TransformHooks
from .views import DropLast, PackedEnclosure, summed

__all__ = ["reference_attention_varlen_backward", "variant_attention_backward"]

Arr = np.ndarray[Any, Any]


class _Functionals:
    """The functionals of one call (:mod:`.backward.functionals`) and where each
    result goes: the active variants' parameter gradients (their ``grad_params``
    hooks, in registration order) and a float mask's."""

    def __init__(self, prep: Prepared, opts: VariantOptions, attn_mask: Any) -> None:
        geo = prep.geo
        flat_lead = prep.lead if prep.lead else (1,)
        self.items: list[ScoreFunctional] = []
        #: keyword -> (index per item, or None for an item without a gradient; many)
        self.params: dict[str, tuple[list[int | None], bool]] = {}
        self.mask: int | None = None
        n_keys = geo.S + prep.extra_keys

        def add(fn: ScoreFunctional | None) -> int | None:
            if fn is None:
                return None
            self.items.append(fn)
            return len(self.items) - 1

        for _, param in grad_params(opts):
            fns = param.functionals(opts, prep, flat_lead, n_keys)
            self.params[param.keyword] = ([add(f) for f in fns], param.many)
        if prep.user_madd is not None:
            self.mask = add(_mask_functional(attn_mask, geo, flat_lead, n_keys))

    def results(self, res: dict[str, Any]) -> dict[str, Any]:
        """The parameter gradients' Enclosures, by keyword."""
        def fn(n: int | None) -> Any:
            return None if n is None else res[f"fn{n}"]
        return {kw: tuple(fn(n) for n in idx) if many else fn(idx[0])
                for kw, (idx, many) in self.params.items()}


def _mask_functional(attn_mask: Any, geo: Any, flat_lead: tuple[int, ...], n_keys: int
                     ) -> ScoreFunctional:
    """∂/∂(float mask): dS itself, summed where the mask broadcasts."""
    L, S = geo.L, geo.S
    cols = np.arange(n_keys)
    shape = tuple(read_mask(attn_mask, "attn_mask").shape)
    m2 = (1,) * max(0, 2 - len(shape)) + shape
    bl, bs = m2[-2] == 1 and L != 1, m2[-1] == 1 and S != 1
    target = broadcast_target(m2[:-2], flat_lead, "attn_mask")

    def m_index(e: int, rows: Arr) -> tuple[Arr, Arr]:
        col = np.where(cols < S, 0 if bs else cols, -1)
        return np.broadcast_to(col, (rows.size, n_keys)), np.ones((rows.size, n_keys))

    return ScoreFunctional("grad_attn_mask", shape, math.prod(m2[:-2]), 1 if bl else L,
                           1 if bs else S, target, not bl, m_index)


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
    chains = [v.backward_inputs(opts, prep, query, key, value) for v in opts.active()
              if v.backward_inputs is not None]
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
    grads: dict[str, Any] = {"dq": res["dq"], "dk": res["dk"], "dv": res["dv"]}
    for chain in chains:
        grads = chain(grads)
    dq, dk, dv = grads["dq"], grads["dk"], grads["dv"]
    if prep.extra_keys:  # the views offer the Enclosure API without the sink key
        dk, dv = DropLast(dk, axis=-2), DropLast(dv, axis=-2)
    d_mask = None if fns.mask is None else res[f"fn{fns.mask}"]
    return AttentionGradients(dq, dk, dv, d_mask, **fns.results(res))


def _transformed_inputs(prep: Prepared, scale: Any, masked_rows: str
                        ) -> tuple[Arr, Arr, Arr, Arr, Any]:
    """The backward's inputs for transformed scores: q, k and v with one zero key (the
    sink) appended, the allowed keys as a bool mask (the sink always allowed), and
    the hooks on a :class:`.transformed.TransformedProblem` of the flat problems."""

    geo, lead = prep.geo, prep.lead
    L, S = geo.L, geo.S
    qf, kf, vf, allowed, madd = prep.flat()
    q64, k64, v64, keep = prep.q64, prep.k64, prep.v64, prep.keep
    E, Ev = q64.shape[-1], v64.shape[-1]
    uniform = None
    # a sink's logit is in every row: no row is empty then
    empty: Arr = (np.asarray(~allowed.any(axis=-1)) if not prep.extra_keys
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
    if prep.extra_keys:
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

    params: dict[str, Any] = {}
    for _, param in grad_params(vl.opts):
        parts = [getattr(g, param.keyword) for g in grads]
        if param.many:
            params[param.keyword] = tuple(_shared([p[n] for p in parts])
                                          for n in range(len(parts[0])))
        elif param.stacked is not None and param.stacked(vl.opts):
            params[param.keyword] = _Stacked(parts)
        else:
            params[param.keyword] = _shared(parts)
    return AttentionGradients(dq, dk, dv, None, **params)


def _shared(parts: list[Any]) -> Any:
    """A parameter shared by the sequences: the sum of their gradients."""
    return None if not parts or parts[0] is None else summed(parts)


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

