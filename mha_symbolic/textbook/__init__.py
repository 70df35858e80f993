"""The textbook side: answers as printed (:mod:`.claims`), worked-example files,
verdicts, diagnoses and reports (:mod:`.check`), step-by-step derivations
(:mod:`.derivation`) and figures (:mod:`.figures`).

It builds on the exact core and never imports the oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "load_examples": "check",
    "check_examples": "check",
    "select_examples": "check",
    "WorkedExample": "check",
    "CheckReport": "check",
    "ClaimRecord": "check",
    "derive": "derivation",
    "parse_printed": "claims",
})

if TYPE_CHECKING:  # pragma: no cover
    from .check import CheckReport, ClaimRecord, WorkedExample, check_examples, load_examples, select_examples
    from .claims import parse_printed
    from .derivation import derive
