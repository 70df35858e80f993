"""The test items of an author's source (``pytest --mha-check-sources``): one per judged
statement or mha-check claim, at the statement's line.

Built on pytest's own ``File``/``Item`` rather than Sybil: Sybil's regions are code blocks
and doctests that it runs as Python, with lexers for Markdown, MyST and reST only; the
statements here are math spans of five formats (notebooks and LaTeX included) whose names
are bound from one span to the next within a section, read by the library's own grammar
and judged by its verifier — one call of :func:`~mha_symbolic.textbook.sources.check_source`
per file does all of it, and Sybil would add a dependency and nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["SourceCheckError", "SourceFile", "SourceItem"]


class SourceCheckError(AssertionError):
    """A statement of an author's source is wrong (pytest shows it as a failure)."""


class SourceFile(pytest.File):
    def collect(self) -> Any:
        from ..errors import MhaSymbolicError
        from ..textbook.sources import check_source

        try:
            report = check_source(self.path, name=str(self.path.name))
        except (MhaSymbolicError, OSError) as exc:
            yield SourceItem.from_parent(self, name="(file)", record=None,
                                         error=" ".join(str(exc).split()))
            return
        show = self.config.getoption("mha_check_not_judged")
        seen: dict[str, int] = {}
        for r in report.records:
            if r.verdict == "not judged" and not show:
                continue
            base = f"line {r.line}"  # node ids stay stable and free of the text's dots
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base} [{seen[base]}]"
            yield SourceItem.from_parent(self, name=name, record=r, error=None)


class SourceItem(pytest.Item):
    def __init__(self, *, record: Any, error: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record
        self.error = error

    def runtest(self) -> None:
        if self.error is not None:
            raise SourceCheckError(self.error)
        r = self.record
        if r.verdict == "not judged":
            pytest.skip(f"not judged: {r.reason}")
        if r.verdict == "undecided":
            pytest.skip("undecided: certified arithmetic could not decide it (never a pass)")
        if r.verdict == "ambiguous":
            pytest.skip("ambiguous: the printed shape's readings disagree (never a pass)")
        if not r.ok:
            from ..textbook.sources.check import _text_record

            raise SourceCheckError("\n".join(_text_record(r)))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, SourceCheckError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> Any:
        if self.record is None:
            return self.path, 0, self.name
        return self.path, self.record.line - 1, f"{self.name}: {_short(self.record.text)}"


def _short(text: str, width: int = 60) -> str:
    from .._text import sanitize

    t = " ".join(sanitize(text).split())
    return t if len(t) <= width else t[:width - 1] + "…"
