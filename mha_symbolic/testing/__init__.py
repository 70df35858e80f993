"""Testing tools for kernel authors: the rounding-error model (:mod:`.tolerance`),
the bound of attention (:mod:`.attention_bound`), the chunked float64 evaluation it
shares with the bug variants (:mod:`.plain`), the catalogue of known bugs
(:mod:`.bugs`), verdicts and reports (:mod:`.compare`), the pytest plugin
(:mod:`.pytest_plugin`) and hypothesis strategies of adversarial inputs
(:mod:`.strategies`, needs hypothesis); for gradients: the backward error model
(:mod:`.backward_model`), the backward bug catalogue (:mod:`.bugs_backward`) and
verdicts (:mod:`.backward`); for the attention variants the model
(:mod:`.tolerance_variants`), the catalogue (:mod:`.bugs_variants`) and the verdicts
(:mod:`.compare_variants`, varlen included).

Built on the oracle; importing this package loads nothing heavy (the pytest plugin
is registered from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "compare_attention": "forward.compare",
    "assert_attention_close": "forward.compare",
    "compare_mha": "forward.mha",
    "assert_mha_close": "forward.mha",
    "AttentionComparison": "verdict",
    "attention_inputs": "strategies",
    "AttentionCase": "strategies",
    "compare_attention_backward": "backward.compare",
    "assert_attention_backward_close": "backward.compare",
    "BackwardComparison": "backward.compare",
    "check_attention": "check",
    "check_deterministic": "determinism",
    "check_batch_invariance": "determinism",
    "BitwiseCheck": "determinism",
    "AttentionCheck": "check",
    "compare_mha_backward": "backward.mha",
    "assert_mha_backward_close": "backward.mha",
    "compare_attention_varlen": "forward.variants",
    "assert_attention_varlen_close": "forward.variants",
    "compare_kvcache_decode": "forward.kvcache",
})

if TYPE_CHECKING:  # pragma: no cover
    from .backward.compare import (
        BackwardComparison,
        assert_attention_backward_close,
        compare_attention_backward,
    )
    from .backward.mha import assert_mha_backward_close, compare_mha_backward
    from .check import AttentionCheck, check_attention
    from .determinism import BitwiseCheck, check_batch_invariance, check_deterministic
    from .forward.compare import assert_attention_close, compare_attention
    from .forward.kvcache import compare_kvcache_decode
    from .forward.mha import assert_mha_close, compare_mha
    from .forward.variants import assert_attention_varlen_close, compare_attention_varlen
    from .strategies import AttentionCase, attention_inputs
    from .verdict import AttentionComparison
