"""Testing tools for kernel authors, by pass: :mod:`.forward` (the verdicts of
``compare_attention`` and its MHA, varlen and KV-cache doors, the error model and the
bug catalogues) and :mod:`.backward` (the same for gradients); the one verdict engine
(:mod:`.verdict`), the reports (:mod:`.report`), the options (:mod:`.options`),
``check_attention`` (:mod:`.check`), determinism and batch invariance
(:mod:`.determinism`), the pytest plugin (:mod:`.pytest_plugin`) and hypothesis
strategies of adversarial inputs (:mod:`.strategies`, needs hypothesis).
docs/architecture.md draws the layout.

Built on the oracle; importing this package loads nothing heavy (the pytest plugin
is registered from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _EXPORTS
from .._lazy import lazy_exports

# One export table for the package (mha_symbolic._EXPORTS): every public name it maps
# to a module of this package is also a name of this package; the result types below
# are this package's own.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    **{name: module.removeprefix("testing.") for name, module in _EXPORTS.items()
       if module.startswith("testing.")},
    "AttentionComparison": "verdict",
    "AttentionCase": "strategies",
    "BackwardComparison": "backward.compare",
    "AttentionCheck": "check",
})

if TYPE_CHECKING:  # pragma: no cover
    from .. import (  # the package's names above, for type checkers
        BitwiseCheck,
        assert_attention_backward_close,
        assert_attention_close,
        assert_attention_varlen_close,
        assert_mha_backward_close,
        assert_mha_close,
        attention_inputs,
        check_attention,
        check_batch_invariance,
        check_deterministic,
        compare_attention,
        compare_attention_backward,
        compare_attention_varlen,
        compare_kvcache_decode,
        compare_mha,
        compare_mha_backward,
    )
    from .backward.compare import BackwardComparison
    from .check import AttentionCheck
    from .strategies import AttentionCase
    from .verdict import AttentionComparison
