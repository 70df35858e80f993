"""The author's own sources: the math of Markdown/MyST/Quarto, reStructuredText, LaTeX and
notebooks judged where it is written (:mod:`.check`), read by a bounded LaTeX-math grammar
(:mod:`.latex_math`), found by :mod:`.extract`, judged by :mod:`.statements` (rounded inputs
as intervals: :mod:`.boxes`), with ``mha-check`` blocks of worked-example TOML
(:mod:`.blocks`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "check_source": "check",
    "SourceReport": "check",
    "SourceRecord": "check",
})

if TYPE_CHECKING:  # pragma: no cover
    from .check import SourceRecord, SourceReport, check_source
