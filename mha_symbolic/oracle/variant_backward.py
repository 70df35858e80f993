"""Certified gradients of attention with variants: sliding window, FlexAttention's
mask_mod / BlockMask, ALiBi and bias tables, attention sinks.

Every such call is plain attention of other exact inputs (:mod:`.variant_forward`,
"lowering"), so its gradients are those of the plain problem
(:func:`.backward.reference_attention_backward`), with one care for sinks: the sink
is an extra key with k = 0 and v = 0 whose score is σ, so the plain problem's dk and
dv have one more row, the sink key's, which is not a gradient of the user's inputs
and is dropped (dq needs nothing: the sink key contributes c·dS_{i,sink}·0 to it).

Not available (each refused with a message): a softcap (its scores are transcendental
and its backward needs sech² in every tier), FP8 descale factors (gradients of fp8
inputs times a non-power-of-two factor would need their own rounding), biases that are
not exact doubles, and the gradient of the mask or of the sink logits.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from .variant_forward import lowered, prepare, require_lowerable
from .variants import VariantOptions
from .views import DropLast

__all__ = ["variant_attention_backward"]


def variant_attention_backward(
    query: Any, key: Any, value: Any, grad_output: Any, opts: VariantOptions, *,
    attn_mask: Any, is_causal: bool, scale: Any, enable_gqa: bool, causal_alignment: str,
    masked_rows: str,
) -> Any:
    """reference_attention_backward with variants (options validated by the caller)."""
    from .backward import AttentionGradients, reference_attention_backward

    if opts.has_cap:
        raise SpecError("the backward of softcapped attention (softcap= or a softcap "
                        "score_mod) is not available: its certified forward is "
                        "(reference_attention)")
    if any(d is not None for d in (opts.q_descale, opts.k_descale, opts.v_descale)):
        raise SpecError("the backward with FP8 descale factors is not available "
                        "(FlashAttention-3's FP8 path is forward-only): pass the descaled "
                        "inputs instead")
    prep = prepare(query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
                   scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                   masked_rows=masked_rows)
    require_lowerable(prep)
    k64, v64, mask = lowered(prep)
    g = reference_attention_backward(prep.q64, k64, v64, grad_output, attn_mask=mask,
                                     scale=scale, enable_gqa=prep.group > 1,
                                     masked_rows=masked_rows)
    dk: Any = g.dk
    dv: Any = g.dv
    if prep.sinks is not None:  # the views offer the Enclosure API without the sink key
        dk, dv = DropLast(dk, axis=-2), DropLast(dv, axis=-2)
    return AttentionGradients(g.dq, dk, dv, None)
