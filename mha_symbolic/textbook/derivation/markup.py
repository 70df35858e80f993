"""Markup (plain text with ``$...$`` inline math) escaped for LaTeX and Markdown."""

from __future__ import annotations

import re

from ..._latex import latex_escape
from ..._text import markdown_text

# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------

_MARKUP = re.compile(r"(?<!\\)\$(.+?)(?<!\\)\$")

# Unicode that pdflatex (T1, utf8) does not typeset in text mode, with replacements.
_TEXT_UNICODE: dict[str, str] = {
    "—": "---", "–": "--", "‘": "`", "’": "'", "“": "``", "”": "''", "…": r"\ldots{}",
    "×": r"$\times$", "·": r"$\cdot$", "⋅": r"$\cdot$", "≈": r"$\approx$", "−": "-",
    "→": r"$\to$", "←": r"$\leftarrow$", "≤": r"$\le$", "≥": r"$\ge$", "≠": r"$\neq$",
    "√": r"$\surd$", "π": r"$\pi$", "∞": r"$\infty$", "✓": r"$\checkmark$",
    "✗": r"$\times$", "∈": r"$\in$", "²": r"$^2$", "³": r"$^3$", "⊤": r"$\top$",
    "ᵀ": r"$^{\top}$", "∑": r"$\sum$", "Σ": r"$\Sigma$", "\u00a0": "~", "\u2009": r"\,",
}
_MATH_UNICODE: dict[str, str] = {
    "−": "-", "×": r"\times ", "·": r"\cdot ", "⋅": r"\cdot ", "≈": r"\approx ",
    "…": r"\ldots ", "⊤": r"\top ", "→": r"\to ", "≤": r"\le ", "≥": r"\ge ",
    "≠": r"\neq ", "∞": r"\infty ", "π": r"\pi ", "√": r"\surd ", "∈": r"\in ",
    "∑": r"\sum ", "Σ": r"\Sigma ", "ᵀ": r"^{\top}", "²": "^2", "³": "^3",
}


def _tex_text(text: str) -> str:
    """Plain text for pdflatex: specials escaped, known Unicode mapped, others named."""
    out = []
    for ch in latex_escape(text):
        if ord(ch) < 128 or ch in "àáâäçèéêëìíîïñòóôöùúûüÀÁÂÄÇÈÉÊËÌÍÎÏÑÒÓÔÖÙÚÛÜß":
            out.append(ch)
        elif ch in _TEXT_UNICODE:
            out.append(_TEXT_UNICODE[ch])
        else:
            out.append(rf"\texttt{{[U+{ord(ch):04X}]}}")
    return "".join(out)


def _tex_math(math: str) -> str:
    out = []
    for ch in math:
        if ord(ch) < 128:
            out.append(ch)
        elif ch in _MATH_UNICODE:
            out.append(_MATH_UNICODE[ch])
        else:
            out.append(rf"\text{{[U+{ord(ch):04X}]}}")
    return "".join(out)


def _markup_tex(text: str) -> str:
    parts = []
    pos = 0
    for m in _MARKUP.finditer(text):
        parts.append(_tex_text(text[pos:m.start()]))
        parts.append(f"${_tex_math(m.group(1))}$")
        pos = m.end()
    parts.append(_tex_text(text[pos:]))
    return "".join(parts)


#: Plain text for Markdown: control characters made visible, every character that
#: Markdown (or GitHub's math, ``$``) would interpret escaped.
_md_text = markdown_text


def _markup_md(text: str) -> str:
    parts = []
    pos = 0
    for m in _MARKUP.finditer(text):
        parts.append(_md_text(text[pos:m.start()]))
        parts.append(f"${m.group(1).strip()}$")
        pos = m.end()
    parts.append(_md_text(text[pos:]))
    return "".join(parts)


def _paragraphs(notes: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", notes.strip()) if p.strip()]


def _mark(ok: bool) -> tuple[str, str]:
    """(LaTeX, Markdown) mark for a check or verdict."""
    return (r"$\checkmark$", "✓") if ok else (r"$\times$", "✗")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text
