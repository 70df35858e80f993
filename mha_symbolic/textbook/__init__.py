"""The textbook side: answers as printed (:mod:`.claims`), worked-example files
(:mod:`.examples`), the quantities a claim names (:mod:`.quantities`), verdicts
(:mod:`.verdicts`), diagnoses of slips (:mod:`.slips`), reports (:mod:`.reports`),
the check itself and its command (:mod:`.check`), the author's own sources checked as
written (:mod:`.sources`), step-by-step derivations
(:mod:`.derivation`) and figures (:mod:`.figures`).

It builds on the exact core and never imports the oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "load_examples": "examples",
    "select_examples": "examples",
    "WorkedExample": "examples",
    "Claim": "examples",
    "check_examples": "check",
    "check_source": "sources.check",
    "CheckReport": "reports",
    "ClaimRecord": "reports",
    "derive": "derivation",
    "parse_printed": "claims",
})

if TYPE_CHECKING:  # pragma: no cover
    from .check import check_examples
    from .claims import parse_printed
    from .derivation import derive
    from .examples import Claim, WorkedExample, load_examples, select_examples
    from .reports import CheckReport, ClaimRecord
    from .sources.check import check_source
