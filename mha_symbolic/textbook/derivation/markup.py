"""Markup (plain text with ``$...$`` inline math) escaped for LaTeX and Markdown."""

from __future__ import annotations

import re

from ..._latex import latex_escape, smart_quotes
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
    "ᵀ": r"$^{\top}$", "§": r"\S{}", "¶": r"\P{}", "∑": r"$\sum$", "Σ": r"$\Sigma$",
    "\u00a0": "~", "\u2009": r"\,",
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
    """Markup for LaTeX: the text between math runs escaped, its quotes typographic (a
    quote right after a math run closes); the math runs (the library's own) as they are."""
    parts = []
    pos = 0
    for m in _MARKUP.finditer(text):
        parts.append(_tex_text(smart_quotes(text[pos:m.start()], "x" if pos else "")))
        parts.append(f"${_tex_math(m.group(1))}$")
        pos = m.end()
    parts.append(_tex_text(smart_quotes(text[pos:], "x" if pos else "")))
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


#: A decimal number standing alone in text (not part of a longer run of digits).
_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?![\d])")


def _grouped_number(number: str, sep: str) -> str:
    """``number`` with each side of five or more digits grouped in threes by ``sep``."""
    from .numbers import group_digits

    whole, dot, frac = number.partition(".")
    text = group_digits(whole) + dot + group_digits(frac, from_left=True)
    return text.replace(r"\,", sep)


def _text_tex(text: str) -> str:
    """Plain text for LaTeX, its numbers grouped in threes (1\\,048\\,576)."""
    parts, pos = [], 0
    for m in _NUMBER.finditer(text):
        parts += [_tex_text(text[pos:m.start()]), _grouped_number(m.group(0), r"\,")]
        pos = m.end()
    return "".join([*parts, _tex_text(text[pos:])])


def _text_md(text: str) -> str:
    """Plain text for Markdown, its numbers grouped by thin spaces (U+2009)."""
    return _md_text(_NUMBER.sub(lambda m: _grouped_number(m.group(0), "\u2009"), text))


def _note_tex(text: str) -> str:
    """The author's text (a title, notes, a quotation) for LaTeX: its math runs typeset
    from the notes grammar (:mod:`.notes`, which builds every command itself), the rest
    escaped as plain text, its quotes typographic (:func:`smart_quotes`: ``'it'`` is
    set ‘it’, not ’it’); numbers grouped in threes on both sides."""
    from .notes import pieces

    return "".join(f"${piece}$" if is_math else _text_tex(piece)
                   for is_math, piece in pieces(smart_quotes(text)))


def _note_md(text: str) -> str:
    """The author's text for Markdown: math runs as ``$...$``, the rest escaped."""
    from .notes import pieces

    return "".join(f"${piece}$" if is_math else _text_md(piece)
                   for is_math, piece in pieces(text))


def _quantity_text(quantity: str) -> str:
    """A claim's quantity as words: ``scaled_score[1,1]`` -> ``scaled score[1,1]``,
    ``params.w_q_head`` -> ``params.w_q head``: an underscore becomes a space unless it
    joins a one-letter name to a one-character subscript (``w_q``, ``d_k``) or is
    ``d_model`` (those the notes grammar typesets)."""
    keep = {m.start() + 1 for m in re.finditer(
        r"(?<![A-Za-z0-9])[A-Za-z]_(?:[A-Za-z0-9]|model)(?![A-Za-z0-9])", quantity)}
    return "".join(" " if ch == "_" and k not in keep else ch
                   for k, ch in enumerate(quantity))
