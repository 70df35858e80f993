r"""A derivation as LaTeX (fragment and document), set as a textbook sets it.

* The author's text (titles, notes, the claims' quotations and the checker's notes)
  goes through :func:`.markup._note_tex`: its math typeset from the notes grammar,
  the rest escaped.
* A display may break across pages between its equations, never inside one: the rows
  of one equation (``&= ...`` continuations) are joined by ``\\*`` (the document sets
  ``\allowdisplaybreaks[1]``); each heading keeps room for what it introduces
  (``\needspace``).
* A figure is a ``figure`` float with its ``\caption``: image and caption on one page.
"""

from __future__ import annotations

import re
from typing import Any

from ..._latex import textbook_document
from .markup import _capital, _mark, _markup_tex, _note_tex, _paragraphs, _quantity_text
from .model import Block, ClaimLine, Derivation, Display, Figure, Paragraph, Table
from .numbers import digits_latex

#: At most this many continuation rows are held unbroken to the row above.
HELD_ROWS = 24
#: At most this many lines are kept with a heading (a longer table starts a page).
KEEP_LINES = 40

INTRO = ("Every number below comes from the exact engine; decimals show certified "
         "digits only (\\ldots: more digits follow), grouped in threes and in scientific "
         "notation below $10^{-3}$. The checks closing each example are computed, and "
         "each claim of the text carries the checker's verdict.")


def _render_latex(d: Derivation, *, keep: bool = False, contents: bool = True) -> str:
    """The fragment; ``keep``: with ``\\needspace`` before each heading (the document's
    preamble defines it), so that no heading is left at a page's foot without the
    first lines of what it introduces; ``contents``: each example's ``\\section*``
    entered in the table of contents (a fragment's, for the book that includes it; a
    document's only when it prints one)."""
    out: list[str] = []

    def heading(tex: str, lines: int) -> None:
        if keep:
            out.append(f"\\needspace{{{min(lines, KEEP_LINES)}\\baselineskip}}")
        out.append(tex)

    for ex in d.examples:
        # the title and notes come from the file: their math is typeset by the notes
        # grammar, everything else escaped (never markup: see _note_tex)
        title = _note_tex(ex.title)
        out.append(f"\\section*{{{title}}}")
        if contents:
            out.append(f"\\addcontentsline{{toc}}{{section}}{{{title}}}")
        for para in _paragraphs(ex.notes):
            out.append(_note_tex(para) + "\n")
        for k, step in enumerate(ex.steps, 1):
            heading(f"\\subsection*{{{k}.\\ {_markup_tex(step.title)}}}", _step_lines(step))
            out.append(f"\\emph{{Why this step?}} {_markup_tex(_capital(step.why))}\n")
            for block in step.blocks:
                out.append(_block_tex(block))
        for figure in ex.figures:
            out.append(_block_tex(figure))
        heading("\\subsection*{Checks}", 6)
        out.append("\\begin{itemize}\\raggedright")
        for c in ex.checks:
            mark = _mark(c.ok)[0]
            out.append(f"  \\item[{mark}] \\textbf{{{_note_tex(c.name)}}}: {_markup_tex(c.detail)}")
        out.append("\\end{itemize}\n")
        if ex.claims:
            heading("\\subsection*{The text's claims}", 6)
            out.append("\\begin{itemize}\\raggedright")
            for cl in ex.claims:
                out.append("  \\item[" + _mark(cl.ok)[0] + "] " + _claim_tex(cl))
            out.append("\\end{itemize}\n")
    return "\n".join(out).rstrip() + "\n"


def _claim_tex(cl: ClaimLine) -> str:
    """A claim as a list item: what the text says and the verdict on the first line,
    the exact value and its certified digits below (math may break after ``=``)."""
    name = _markup_tex(cl.label) if cl.label else _note_tex(_quantity_text(cl.quantity))
    head = (f"\\textbf{{{_capital(name)}}}: the text says "
            f"{_note_tex(cl.claimed)}. "
            f"Verdict: \\emph{{{_note_tex(cl.verdict)}}}.")
    lines = [head]
    if cl.exact_digits and "…" not in cl.exact_digits:
        lines.append(f"Exact value: ${_breakable(digits_latex(cl.exact_digits))}$.")
    else:
        value = []
        if cl.exact_latex:
            value.append(_breakable(cl.exact_latex))
        if cl.exact_digits:
            value.append(_breakable(digits_latex(cl.exact_digits)))
        if value:
            lines.append("Exact: $\\displaystyle " + " = ".join(value) + "$ (certified digits).")
    if cl.diagnosis:
        lines.append(f"Diagnosis: {_note_tex(cl.diagnosis)}.")
    if cl.note:
        lines.append(f"{{\\small\\itshape {_note_tex(cl.note)}}}")
    return " \\\\\n    ".join(lines)


def _breakable(math: str) -> str:
    """Let TeX break a tuple after its commas.  An unbreakable ``\\left( ... \\right)``
    would not break, so the outer pair becomes ``\\Bigl( ... \\Bigr)`` when it holds a
    fraction (as tall as a displayed fraction) and plain parentheses otherwise."""
    if math.startswith(r"\left(") and math.endswith(r"\right)"):
        inner = math[len(r"\left("):-len(r"\right)")]
        math = (rf"\Bigl({inner}\Bigr)" if r"\frac" in inner else f"({inner})")
    return math.replace(r",\ ", r",\allowbreak\ ").replace(", ", r",\allowbreak\ ")


def _height(line: str) -> int:
    """A display row's height in text lines, roughly: one per row of its tallest matrix
    (a matrix's rows are separated by ``\\\\``), twice that when it holds fractions."""
    rows = max([1] + [m.count(r"\\") + 1 for m in re.findall(
        r"\\begin\{bmatrix\}(.*?)\\end\{bmatrix\}", line)])
    return rows * (2 if r"\frac" in line else 1) + 1


def _joined_rows(rows: list[str]) -> str:
    """Display rows joined by ``\\\\``, or by ``\\\\*`` (no page break) before a row that
    continues the equation above (``&= ...``, ``&\\quad + ...``): a page may break
    between two equations of a display, never inside one."""
    out = rows[:1]
    held = 0  # rows held to the one above without a break
    for row in rows[1:]:
        # an equation taller than a page (a sum of hundreds of terms) may still break,
        # every HELD_ROWS rows: never a page overflowing its bottom margin
        held = held + 1 if row.lstrip().startswith("&") and held < HELD_ROWS else 0
        out.append((" \\\\*\n" if held else " \\\\\n") + row)
    return "".join(out)


def _block_lines(block: Block) -> int:
    """About how many lines of text a block must have below its heading: all of a table
    (a tabular never breaks), the first equation of a display, two of a paragraph."""
    if isinstance(block, Table):
        return len(block.rows) + (3 if block.total is None else 4) + 2
    if isinstance(block, Display):
        first: list[str] = []
        for row in block.lines:
            if first and not row.lstrip().startswith("&"):
                break
            first.append(row)
        return sum(_height(row) for row in first) + 2
    return 2


def _step_lines(step: Any) -> int:
    """Lines to keep below a step's heading: the heading, its reason (about 90
    characters a line) and the start of its first block."""
    why = len(re.sub(r"\$[^$]*\$", "xxxx", step.why)) // 90 + 1
    return 3 + why + (_block_lines(step.blocks[0]) if step.blocks else 0)


def _block_tex(block: Block) -> str:
    if isinstance(block, Paragraph):
        return _markup_tex(block.text) + "\n"
    if isinstance(block, Display):
        env = "align*" if any("&" in line for line in block.lines) else "gather*"
        # one environment: a page may break between its equations, never inside one
        return f"\\begin{{{env}}}\n{_joined_rows(list(block.lines))}\n\\end{{{env}}}\n"
    if isinstance(block, Table):
        return _table_tex(block)
    assert isinstance(block, Figure)
    return ("\\begin{figure}[htbp]\n"
            "\\centering\n"
            f"\\includegraphics[width=0.85\\linewidth]{{{block.ref}}}\n"
            f"\\caption{{{_markup_tex(block.caption)}}}\n"
            "\\end{figure}\n")


def _table_tex(table: Table) -> str:
    """A booktabs table (top, middle and bottom rules; no vertical rules), centred."""
    def row(cells: tuple[str, ...]) -> str:
        return " & ".join(_markup_tex(c) for c in cells) + r" \\"

    lines = [r"\begin{center}", rf"\begin{{tabular}}{{{table.align}}}", r"\toprule",
             row(table.header), r"\midrule", *[row(r) for r in table.rows]]
    if table.total is not None:
        lines += [r"\midrule", row(table.total)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{center}"]
    return "\n".join(lines) + "\n"


def _render_document(d: Derivation) -> str:
    packages = ["graphicx"] if any(e.figures for e in d.examples) else []
    # the title is the file's (its math by the notes grammar, like an example's title); a
    # document of several examples opens with their contents (\addcontentsline above)
    several = len(d.examples) > 1
    contents = "\\tableofcontents\n\n" if several else ""
    return textbook_document(contents + _render_latex(d, keep=True, contents=several),
                             title=d.title, packages=packages,
                             intro=INTRO, title_tex=_note_tex(d.title))
