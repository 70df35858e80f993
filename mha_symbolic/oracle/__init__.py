"""The oracle: certified references for floating-point attention.

Files name the method: :mod:`.inputs` (numpy/torch/jax/lists to exact dyadics),
:mod:`.formats` (fp64 … bf16: exact values, correct rounding), :mod:`.conventions`
(scale, masks, causal alignment, masked rows), :mod:`.constants` (of the error
analysis), :mod:`.fast` (proved float64 bounds), :mod:`.arb` (the ball-arithmetic
fallback), :mod:`.enclosure` (rounding and ties), :mod:`.forward`
(:func:`reference_attention`), :mod:`.mha` (:func:`reference_mha`); the backward
pass: :mod:`.backward` (:func:`reference_attention_backward`) with its fast path
(:mod:`.backward_fast`), Arb fallback (:mod:`.backward_arb`) and exact ties
(:mod:`.backward_exact`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "reference_attention": "forward",
    "reference_mha": "mha",
    "Enclosure": "enclosure",
    "reference_attention_backward": "backward",
    "AttentionGradients": "backward",
    "reference_mha_backward": "backward_mha",
    "MhaGradients": "backward_mha",
})

if TYPE_CHECKING:  # pragma: no cover
    from .backward import AttentionGradients, reference_attention_backward
    from .backward_mha import MhaGradients, reference_mha_backward
    from .enclosure import Enclosure
    from .forward import reference_attention
    from .mha import reference_mha
