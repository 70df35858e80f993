"""The exact core: numbers as books write them (:mod:`.grammar`), certified values
(:mod:`.certified`), the attention specification (:mod:`.spec`), shape algebra
(:mod:`.shapes`), parameter and FLOP counts (:mod:`.params`), the SymPy engine
(:mod:`.engine`) and the runner of the proofs in ``proofs/`` (:mod:`.prove`).

It never imports the oracle or the textbook side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "AttentionSpec": "spec",
    "attention_shapes": "shapes",
    "Shape": "shapes",
    "parameter_count": "params",
    "flop_count": "params",
    "exact_attention": "engine",
    "ExactAttention": "engine",
    "parse_number": "grammar",
    "certify": "certified",
    "CertifiedValue": "certified",
    "run_proofs": "prove",
    "iter_proofs": "prove",
})

if TYPE_CHECKING:  # pragma: no cover
    from .certified import CertifiedValue, certify
    from .engine import ExactAttention, exact_attention
    from .grammar import parse_number
    from .params import flop_count, parameter_count
    from .prove import iter_proofs, run_proofs
    from .shapes import Shape, attention_shapes
    from .spec import AttentionSpec
