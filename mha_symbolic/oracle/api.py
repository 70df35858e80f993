"""The oracle's public doors: read a call once, route it.

:func:`reference_attention` and :func:`reference_attention_backward` take SDPA's
arguments and the registered variants' keywords (:mod:`.variants.registry`); a call
without a variant goes to the plain tiers (:mod:`.forward.attention`,
:mod:`.backward.attention`), one with variants to their lowering
(:mod:`.variants.forward`, :mod:`.variants.backward`).  The varlen doors live with
their layout (:mod:`.variants.forward`, :mod:`.variants.backward`) and are re-exported
here, as are the multi-head blocks.
"""

from __future__ import annotations

import functools
from typing import Any

from .._validate import door
from ..errors import SpecError
from .backward.attention import AttentionGradients, plain_attention_backward
from .backward.mha import MhaGradients, reference_mha_backward
from .enclosure import Enclosure
from .forward.attention import plain_attention
from .forward.mha import reference_mha
from .layout import Transposed, check_layout, swap_layout
from .lse import check_lse_options, reference_lse
from .shifted import exact_shift, shift_of, shifted
from .variants.backward import reference_attention_varlen_backward, variant_attention_backward
from .variants.forward import lse_problem, reference_attention_varlen, variant_attention
from .variants.registry import (
    sdpa_variant_options,
    split_variant_keywords,
    variant_options,
    with_variant_keywords,
)

__all__ = ["AttentionGradients", "Enclosure", "MhaGradients", "reference_attention",
           "reference_attention_backward", "reference_attention_varlen",
           "reference_attention_varlen_backward", "reference_mha", "reference_mha_backward"]

@with_variant_keywords
@functools.partial(door, quiet=True)
def reference_attention(
    query: Any, key: Any, value: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", return_weights: bool = False,
    dropout_p: float = 0.0, dropout_mask: Any = None, progress: bool | None = None,
    layout: str = "bhsd", return_lse: bool = False, lse_base: Any = "e",
    lse_masked: str = "-inf", **variants: Any,
) -> Enclosure:
    """Certified scaled dot-product attention of the exact input values.

    Named and shaped like ``torch.nn.functional.scaled_dot_product_attention``:
    query (..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, E_v);
    leading dimensions broadcast.  ``attn_mask``: bool (True = takes part) or float
    (added to the scores; -inf = weight exactly 0), broadcastable to
    (..., H_q, L, S); integer masks are refused.  Combined with ``is_causal``
    (top_left: key j <= i, bottom_right: j <= i + S - L).  ``scale=None`` is exactly
    1/sqrt(E); a float scale is its exact value (0 means zero).  ``enable_gqa``:
    query head g uses key/value head g // (H_q/H_kv).  ``masked_rows``: "zero" |
    "nan" | "error" | "uniform" (JAX: uniform weights over all keys) for rows where
    every key is masked.  Dropout: ``dropout_p`` with an explicit ``dropout_mask``
    (bool, True = kept, broadcastable to the scores): the output is
    ((softmax ∘ keep)/(1 - p))·V exactly; ``dropout_p=0`` without a mask is plain
    attention.  ``progress``: None shows a bar on a terminal for long calls, False
    never, True whenever stderr is a terminal.

    >>> import numpy as np
    >>> r = reference_attention(np.ones((1, 2, 4)), np.ones((1, 3, 4)),
    ...                         np.arange(6.0).reshape(1, 3, 2), scale=0.0)
    >>> r.rounded("float32").tolist()
    [[[2.0, 3.0], [2.0, 3.0]]]

    Variants (docs/variants.md; exact semantics in :mod:`.variants`): ``window=(left,
    right)`` (FlashAttention's window_size, -1 = unbounded, aligned by
    ``causal_alignment``), ``softcap=C`` (s -> C·tanh(s/C) after the scale, before the
    masks), ``alibi_slopes`` (H,) or (B, H) (-slope·|j - (i + off)| added),
    ``sinks`` (H,) (a logit in the denominator only), ``mask_mod(b, h, q_idx,
    kv_idx) -> bool`` or a torch BlockMask, ``score_mod`` from the certified menu
    (``softcap_score_mod``, ``alibi_score_mod``, ``relative_bias_score_mod``), FP8
    ``q_descale``/``k_descale``/``v_descale`` (batch, H_kv) as FlashAttention-3.

    >>> r = reference_attention(np.ones((1, 3, 2)), np.ones((1, 3, 2)),
    ...                         np.arange(6.0).reshape(1, 3, 2), window=(0, 0))
    >>> r.rounded("float32").tolist()   # each query sees its own key only
    [[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]]

    ``layout="bshd"``: query (…, L, H_q, E), key and value (…, S, H_kv, ·) and the
    output (…, L, H_q, E_v), FlashAttention's layout (:mod:`.layout`; masks keep
    (…, H_q, L, S)).

    ``return_lse=True``: the result's ``.lse`` is the certified log-sum-exp of every
    row, (…, H_q, L) in both layouts (:mod:`.lse`: ``lse_base`` "e" or 2,
    ``lse_masked`` "-inf" or "+inf" for rows with no key; ``.lse.rounded("float32")``
    correctly rounded), with the variants that lower to plain attention too (the
    sinks' e^σ in the sum; a softcap is refused).

    >>> r = reference_attention(np.zeros((1, 2, 4)), np.zeros((1, 4, 4)),
    ...                         np.ones((1, 4, 2)), return_lse=True, lse_base=2)
    >>> r.lse.rounded("float32").tolist()    # log2(4 keys of score 0)
    [[2.0, 2.0]]
    """
    split_variant_keywords(variants, door=reference_attention)
    if return_lse:
        check_lse_options(lse_base, lse_masked)
        if masked_rows == "uniform":
            raise SpecError("return_lse=True with masked_rows='uniform' is not supported")
        out = reference_attention(
            query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa, causal_alignment=causal_alignment,
            masked_rows=masked_rows, return_weights=return_weights, dropout_p=dropout_p,
            dropout_mask=dropout_mask, progress=progress, layout=layout, **variants)
        base_q, base_k, base_v = (swap_layout(x, layout, n) for x, n in (
            (query, "query"), (key, "key"), (value, "value")))
        opts = variant_options(**variants)
        if opts is None:
            lse = reference_lse(base_q, base_k, attn_mask=attn_mask, is_causal=is_causal,
                                scale=scale, enable_gqa=enable_gqa,
                                causal_alignment=causal_alignment, base=lse_base,
                                masked=lse_masked)
        else:   # the plain problem the variants lower to (variants/forward.py)
            lq, lk, lmask, gqa = lse_problem(
                base_q, base_k, base_v, opts, attn_mask=attn_mask, is_causal=is_causal,
                scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment)
            lse = reference_lse(lq, lk, attn_mask=lmask, scale=scale, enable_gqa=gqa,
                                base=lse_base, masked=lse_masked)
        target: Any = out.base if isinstance(out, Transposed) else out
        target.lse = lse
        return out
    if check_layout(layout) == "bshd":
        return Transposed(reference_attention(  # type: ignore[return-value]
            swap_layout(query, layout, "query"), swap_layout(key, layout, "key"),
            swap_layout(value, layout, "value"), attn_mask=attn_mask, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
            masked_rows=masked_rows, return_weights=return_weights, dropout_p=dropout_p,
            dropout_mask=dropout_mask, progress=progress, **variants))
    opts = sdpa_variant_options(dropout_p, dropout_mask, **variants)
    if opts is not None:
        return variant_attention(
            query, key, value, opts, attn_mask=attn_mask, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
            masked_rows=masked_rows, return_weights=return_weights)
    return plain_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, causal_alignment=causal_alignment, masked_rows=masked_rows,
        return_weights=return_weights, dropout_p=dropout_p, dropout_mask=dropout_mask,
        progress=progress)


@with_variant_keywords
@functools.partial(door, quiet=True)
def reference_attention_backward(
    query: Any, key: Any, value: Any, grad_output: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", dropout_p: float = 0.0, dropout_mask: Any = None,
    progress: bool | None = None,
    **variants: Any,
) -> AttentionGradients:
    """Certified gradients of scaled dot-product attention of the exact inputs.

    The gradients of Σ grad_output ∘ attention(query, key, value) — what
    ``torch.autograd.grad(out, (q, k, v), grad_output)`` computes — with the
    options of :func:`mha_symbolic.reference_attention` (``attn_mask``,
    ``is_causal``, ``scale``, ``enable_gqa``, ``causal_alignment``, ``progress``),
    and:

    * ``grad_output``: shaped like the output (..., H_q, L, E_v);
    * ``masked_rows``: rows with every key masked — "zero" (their output is 0 and
      its gradient 0), "nan" (NaN in dq for the row, and in dk, dv and the mask
      gradient of everything the row touches, as autograd propagates a NaN
      softmax), "error" (InputValueError), "uniform" (JAX: weights 1/S, output the
      mean of the values; dq 0, dv gets grad_output/S);
    * ``dropout_p``, ``dropout_mask``: output ((softmax ∘ keep)/(1 − p))·V with the
      bool keep-mask the kernel used (True = kept); the factor 1/(1 − p) is exact.

    Returns :class:`AttentionGradients` with ``dq``, ``dk``, ``dv`` shaped like
    query, key, value (summed over broadcast dimensions and, with GQA, over the
    query heads of each key/value head), and ``d_attn_mask`` for a float mask.

    >>> import numpy as np
    >>> q = np.array([[1.0, 0.0], [0.0, 1.0]]); k = q.copy()
    >>> v = np.array([[1.0, 2.0], [3.0, 4.0]]); do = np.ones((2, 2))
    >>> g = reference_attention_backward(q, k, v, do, scale=0.0)
    >>> g.dv.rounded("float32").tolist()   # each key gets 1/2 of every row's dO
    [[1.0, 1.0], [1.0, 1.0]]
    >>> g.dq.rounded("float32").tolist()   # scale 0: scores do not depend on q
    [[0.0, 0.0], [0.0, 0.0]]

    Variants (docs/variants.md, "Gradients"; :mod:`..variant_backward`): ``window``,
    ``softcap``, ``alibi_slopes``, ``sinks``, ``mask_mod`` (or a BlockMask), ``score_mod``
    items, FP8 ``q_descale``/``k_descale``/``v_descale`` (the gradients with respect to
    the fp8 inputs); the result then also has ``d_sinks``, ``d_alibi_slopes`` and
    ``d_score_mod``.
    """
    split_variant_keywords(variants, door=reference_attention_backward)
    opts = sdpa_variant_options(dropout_p, dropout_mask, **variants)
    if opts is not None:
        return variant_attention_backward(
            query, key, value, grad_output, opts, attn_mask=attn_mask,
            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
            causal_alignment=causal_alignment, masked_rows=masked_rows, progress=progress)
    # values or dO beyond 2^400: the tiers run in exact power-of-two units (:mod:`.shifted`)
    a = b = 0
    v_in, do_in = as_float64_or_none(value), as_float64_or_none(grad_output)
    if v_in is not None and do_in is not None:
        a, b = shift_of(v_in), shift_of(do_in)
        v2 = exact_shift(v_in, a) if a else v_in
        do2 = exact_shift(do_in, b) if b else do_in
        if (a or b) and v2 is not None and do2 is not None:
            value, grad_output = v2, do2
        else:
            a = b = 0
    g = plain_attention_backward(
        query, key, value, grad_output, attn_mask=attn_mask, is_causal=is_causal,
        scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
        masked_rows=masked_rows, dropout_p=dropout_p, dropout_mask=dropout_mask,
        progress=progress)
    if a or b:
        g = AttentionGradients(shifted(g.dq, a + b), shifted(g.dk, a + b), shifted(g.dv, b),
                               None if g.d_attn_mask is None
                               else shifted(g.d_attn_mask, a + b))
    return g


def as_float64_or_none(x: Any) -> Any:
    """A float64 numpy array of ``x`` if it is one already (numpy, or a CPU torch
    tensor), else None: only float64 inputs reach 2^400, and anything else is left to
    the tiers' own checks."""
    import numpy as np

    dt = str(getattr(x, "dtype", ""))
    if "float64" not in dt:
        return None
    try:
        arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    except Exception:
        return None
    return arr if arr.dtype == np.float64 and np.all(np.isfinite(arr)) else None
