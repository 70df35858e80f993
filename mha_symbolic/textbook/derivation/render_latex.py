"""A derivation as LaTeX (fragment and document)."""

from __future__ import annotations

from ..._latex import standalone_document
from .markup import _capital, _mark, _markup_tex, _paragraphs, _tex_math, _tex_text
from .model import Block, ClaimLine, Derivation, Display, Paragraph


def _render_latex(d: Derivation) -> str:
    out: list[str] = []
    for ex in d.examples:
        # the title and notes come from the file: plain text, never markup (see _tex_text)
        out.append(f"\\section*{{{_tex_text(ex.title)}}}")
        out.append(f"\\addcontentsline{{toc}}{{section}}{{{_tex_text(ex.title)}}}")
        for para in _paragraphs(ex.notes):
            out.append(_tex_text(para) + "\n")
        for k, step in enumerate(ex.steps, 1):
            out.append(f"\\subsection*{{{k}.\\ {_markup_tex(step.title)}}}")
            out.append(f"\\emph{{Why this step?}} {_markup_tex(_capital(step.why))}\n")
            for block in step.blocks:
                out.append(_block_tex(block))
        for figure in ex.figures:
            out.append(_block_tex(figure))
        out.append("\\subsection*{Checks}")
        out.append("\\begin{itemize}\\sloppy")
        for c in ex.checks:
            mark = _mark(c.ok)[0]
            out.append(f"  \\item[{mark}] \\textbf{{{_tex_text(c.name)}}}: {_markup_tex(c.detail)}")
        out.append("\\end{itemize}\n")
        if ex.claims:
            out.append("\\subsection*{The text's claims}")
            out.append("\\begin{itemize}\\sloppy")
            for cl in ex.claims:
                out.append("  \\item[" + _mark(cl.ok)[0] + "] " + _claim_tex(cl))
            out.append("\\end{itemize}\n")
    return "\n".join(out).rstrip() + "\n"


def _claim_tex(cl: ClaimLine) -> str:
    """A claim as a list item: what the text says and the verdict on the first line,
    the exact value and its certified digits below (math may break after ``=``)."""
    head = (f"\\textbf{{{_tex_text(cl.quantity)}}}: the text says "
            f"\\texttt{{{_tex_text(cl.claimed)}}}. "
            f"Verdict: \\emph{{{_tex_text(cl.verdict)}}}.")
    lines = [head]
    if cl.exact_digits and "…" not in cl.exact_digits:
        lines.append(f"Exact value: ${_breakable(_tex_math_digits(cl.exact_digits))}$.")
    else:
        value = []
        if cl.exact_latex:
            value.append(_breakable(cl.exact_latex))
        if cl.exact_digits:
            value.append(_breakable(_tex_math_digits(cl.exact_digits)))
        if value:
            lines.append("Exact: $\\displaystyle " + " = ".join(value) + "$ (certified digits).")
    if cl.diagnosis:
        lines.append(f"Diagnosis: {_tex_text(cl.diagnosis)}.")
    if cl.note:
        lines.append(f"{{\\small\\itshape {_tex_text(cl.note)}}}")
    return " \\\\\n    ".join(lines)


def _breakable(math: str) -> str:
    """Let TeX break a tuple after its commas (an unbreakable \\left( ... \\right) would not)."""
    if math.startswith(r"\left(") and math.endswith(r"\right)"):
        math = "(" + math[len(r"\left("):-len(r"\right)")] + ")"
    return math.replace(r",\ ", r",\allowbreak\ ").replace(", ", r",\allowbreak\ ")


def _tex_math_digits(text: str) -> str:
    return _tex_math(text.replace("…", r"\ldots")).replace("×", r"\times ")


def _block_tex(block: Block) -> str:
    if isinstance(block, Paragraph):
        return _markup_tex(block.text) + "\n"
    if isinstance(block, Display):
        body = " \\\\\n".join(block.lines)
        if not any("&" in line for line in block.lines):
            return f"\\begin{{gather*}}\n{body}\n\\end{{gather*}}\n"
        return f"\\begin{{align*}}\n{body}\n\\end{{align*}}\n"
    return ("\\begin{center}\n"
            f"\\includegraphics[width=0.85\\linewidth]{{{block.ref}}}\\\\\n"
            f"\\small {_markup_tex(block.caption)}\n"
            "\\end{center}\n")



def _render_document(d: Derivation) -> str:
    intro = ("Every number below comes from the exact engine; decimals show certified "
             "digits only (\\ldots: more digits follow). The checks closing each example "
             "are computed, and each claim of the text carries the checker's verdict.\n\n")
    doc = standalone_document(intro + _render_latex(d), title=d.title)
    if any(e.figures for e in d.examples):
        # standalone_document loads amsmath and amssymb only; figures need graphicx.
        doc = doc.replace("\\begin{document}",
                          "\\usepackage{graphicx}\n\\begin{document}", 1)
    return doc
