"""The oracle: certified references for floating-point attention.

Files name the method: :mod:`.inputs` (numpy/torch/jax/lists to exact dyadics),
:mod:`.formats` (fp64 … bf16: exact values, correct rounding), :mod:`.conventions`
(scale, masks, causal alignment, masked rows), :mod:`.constants` (of the error
analysis), :mod:`.fast` (proved float64 bounds), :mod:`.arb` (the ball-arithmetic
fallback), :mod:`.enclosure` (rounding and ties), :mod:`.forward`
(:func:`reference_attention`), :mod:`.mha` (:func:`reference_mha`); the backward
pass is the subpackage :mod:`.backward` (:func:`reference_attention_backward`,
:func:`reference_mha_backward`; its files name the tiers); the variants:
:mod:`.variants` (their exact semantics), :mod:`.score_mods` (the certified score_mod
menu), :mod:`.variant_forward` (lowering, varlen), :mod:`.variant_backward` (their
gradients, varlen's), :mod:`.transformed` (softcapped scores),
:mod:`.transformed_backward` (their gradients' hooks), :mod:`.views` (assembled
enclosures).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "reference_attention": "api",
    "reference_attention_varlen": "api",
    "reference_attention_varlen_backward": "api",
    "reference_mha": "api",
    "Enclosure": "api",
    "reference_attention_backward": "api",
    "AttentionGradients": "api",
    "reference_mha_backward": "api",
    "MhaGradients": "api",
    "softcap_score_mod": "variants.score_mods",
    "alibi_score_mod": "variants.score_mods",
    "relative_bias_score_mod": "variants.score_mods",
})

if TYPE_CHECKING:  # pragma: no cover
    from .api import (
        AttentionGradients,
        Enclosure,
        MhaGradients,
        reference_attention,
        reference_attention_backward,
        reference_attention_varlen,
        reference_attention_varlen_backward,
        reference_mha,
        reference_mha_backward,
    )
    from .variants.score_mods import alibi_score_mod, relative_bias_score_mod, softcap_score_mod
