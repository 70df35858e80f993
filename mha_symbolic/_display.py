"""Notebook displays: HTML and Markdown tables, every cell escaped.

IPython and Jupyter show an object through ``_repr_html_``, ``_repr_markdown_``,
``_repr_latex_`` and ``_repr_pretty_`` when it has them; :class:`ReportDisplay` gives a
result with ``summary()``, ``report()`` and ``table()`` all of them: the one-line
summary as heading, the table, and the full text report folded below.  Every piece of
text is escaped here (``html.escape`` after :func:`mha_symbolic._text.sanitize`;
:func:`mha_symbolic._text.markdown_text` for Markdown), so a title, option or value
that came from a file cannot become markup.  Standard library only.

>>> print(html_table(("part", "count"), [("W^Q", "4"), ("<b>", "1")]))
<table><thead><tr><th>part</th><th>count</th></tr></thead><tbody><tr><td>W^Q</td><td>4</td></tr><tr><td>&lt;b&gt;</td><td>1</td></tr></tbody></table>
>>> print(markdown_table(("part", "count"), [("W^Q", "4")]))
| part | count |
| --- | --- |
| W^Q | 4 |
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ._text import markdown_text, sanitize

__all__ = ["ReportDisplay", "html_table", "html_text", "markdown_table", "thin_grouped"]

Rows = Sequence[Sequence[Any]]


def html_text(text: Any) -> str:
    """Text for HTML: control characters made visible, ``<>&"'`` escaped."""
    return html.escape(sanitize(str(text)), quote=True)


def html_table(header: Sequence[str], rows: Rows, *, numeric: Sequence[int] = ()) -> str:
    """An HTML table (columns in ``numeric`` right-aligned), every cell escaped."""
    def cell(tag: str, j: int, x: Any) -> str:
        style = ' style="text-align:right"' if j in numeric else ""
        return f"<{tag}{style}>{html_text(x)}</{tag}>"

    head = "".join(cell("th", j, h) for j, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", j, x) for j, x in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(header: Sequence[str], rows: Rows) -> str:
    """A GitHub-flavoured Markdown table, every cell escaped (``|`` included)."""
    lines = ["| " + " | ".join(markdown_text(str(h)) for h in header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(markdown_text(str(x)) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def thin_grouped(n: int) -> str:
    """An integer with its digits in groups of three, separated by a narrow no-break
    space (U+202F, the SI's thin space): 1048576 → ``1 048 576``; 4-digit numbers kept
    whole, as SI style does."""
    text = str(abs(n))
    if len(text) > 4:
        text = "\u202f".join(text[max(i - 3, 0):i] for i in range(len(text), 0, -3)[::-1])
    return ("-" if n < 0 else "") + text


class ReportDisplay:
    """Displays for a result with ``summary()`` (one line), ``report()`` (text) and
    ``table()`` ((header, rows)): ``repr`` is ``<Class: summary>``, ``str`` the report,
    IPython's pretty printer the report, HTML/Markdown the summary, the table and the
    report."""

    def summary(self) -> str:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def report(self) -> str:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def table(self) -> tuple[Sequence[str], Rows]:  # pragma: no cover
        raise NotImplementedError

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {sanitize(self.summary())}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(sanitize(self.report(), keep_newlines=True))

    def _repr_html_(self) -> str:
        header, rows = self.table()
        return (f"<div><p><strong>{html_text(self.summary())}</strong></p>"
                f"{html_table(header, rows)}"
                "<details><summary>report</summary>"
                f"<pre>{html.escape(sanitize(self.report(), keep_newlines=True))}</pre>"
                "</details></div>")

    def _repr_markdown_(self) -> str:
        header, rows = self.table()
        return f"**{markdown_text(self.summary())}**\n\n{markdown_table(header, rows)}\n"
