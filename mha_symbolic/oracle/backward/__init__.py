"""The backward pass of attention, certified: gradients of the exact inputs.

Files name the method (docs/gradients.md): :mod:`.attention`
(:func:`reference_attention_backward`: inputs, GQA/broadcast sums, policies, the
:class:`~..enclosure.Problem` behind the Enclosures), :mod:`.fast` (tier 1:
float64 with a proved elementwise bound), :mod:`.dd` (tier 2: double-double with
a proved bound of about 2**-80, for the rows and key columns tier 1 leaves
undecided), :mod:`.arb` (tier 3: Arb balls at rising precision, rows and key
columns), :mod:`.exact` (exact ties: Lindemann–Weierstrass on exponential
polynomials), :mod:`.mha` (:func:`reference_mha_backward`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "AttentionGradients": "attention",
    "reference_mha_backward": "mha",
    "MhaGradients": "mha",
})

if TYPE_CHECKING:  # pragma: no cover
    from .attention import AttentionGradients
    from .mha import MhaGradients, reference_mha_backward
