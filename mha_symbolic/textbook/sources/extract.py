"""Where the math is in an author's file: Markdown, MyST and Quarto (``.md``, ``.qmd``),
reStructuredText (``.rst``), LaTeX (``.tex``) and Jupyter notebooks (``.ipynb``).

Every format becomes a :class:`Document`: the text, its math spans (``$…$``, ``$$…$$``,
``\\(…\\)``, ``\\[…\\]``, equation/align/gather environments, MyST ```` ```{math} ````, reST
``:math:`` and ``.. math::``, a notebook's Markdown cells and the printed outputs of its code
cells), the section each span belongs to (headings), and the ``mha-check`` blocks
(```` ```mha-check ````, ```` ```{mha-check} ````, ``.. mha-check::``,
``\\begin{mhacheck}``, a notebook cell tagged ``mha-check``) holding worked-example TOML.
Code blocks, inline code, comments and verbatim environments are masked first, keeping
every offset, so that each span is reported at its line of the file.

Everything is found by a few linear scans (regular expressions without nested
quantifiers over unbounded text, and line loops); nothing is evaluated.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..._text import echo
from ...errors import ExampleFileError

__all__ = ["FORMATS", "Block", "Document", "Span", "extract", "format_of"]

#: Formats by file suffix.
FORMATS = {".md": "markdown", ".markdown": "markdown", ".myst": "markdown", ".qmd": "markdown",
           ".rmd": "markdown", ".rst": "rst", ".tex": "latex", ".ltx": "latex",
           ".ipynb": "notebook", ".txt": "markdown"}
#: The names --input-format accepts.
FORMAT_NAMES = ("markdown", "myst", "quarto", "rst", "latex", "notebook")
#: Most math spans read from one file.
MAX_SPANS = 20_000
#: Most cells of a notebook.
MAX_CELLS = 10_000


@dataclass(frozen=True)
class Span:
    text: str
    start: int  # offset in Document.text
    section: int
    kind: str = "math"  # "math" | "output" (a notebook's printed output)


@dataclass(frozen=True)
class Block:
    text: str  # the TOML
    start: int  # offset of its first line in Document.text
    section: int


@dataclass
class Document:
    text: str
    spans: list[Span] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    section_titles: list[str] = field(default_factory=lambda: [""])
    line_map: list[int] | None = None  # virtual line → the file's line (notebooks)
    _newlines: list[int] | None = None

    def line_of(self, offset: int) -> int:
        """The line (1-based) of an offset: of the file, or through line_map (notebooks)."""
        if self._newlines is None:
            self._newlines = [m.start() for m in re.finditer("\n", self.text)]
        line = bisect.bisect_left(self._newlines, offset) + 1
        if self.line_map is not None:
            return self.line_map[min(line - 1, len(self.line_map) - 1)] if self.line_map else 1
        return line


def format_of(name: str, override: str | None = None) -> str:
    """The format of a file from its suffix (``override``: --input-format)."""
    if override:
        return {"myst": "markdown", "quarto": "markdown"}.get(override, override)
    lower = name.lower()
    for suffix, fmt in FORMATS.items():
        if lower.endswith(suffix):
            return fmt
    raise ExampleFileError(f"{echo(name)}: unknown format (suffixes: "
                           f"{', '.join(sorted(FORMATS))}; or --input-format)")


def extract(text: str, fmt: str) -> Document:
    """The document of ``text`` in format ``fmt`` (markdown, rst, latex, notebook)."""
    if fmt == "notebook":
        return _notebook(text)
    doc = Document(text)
    if fmt == "markdown":
        _markdown(doc, text, 0)
    elif fmt == "rst":
        _rst(doc, text)
    elif fmt == "latex":
        _latex(doc, text)
    else:
        raise ExampleFileError(f"unknown input format {echo(fmt)}")
    return doc


def _mask(chars: list[str], start: int, end: int) -> None:
    for i in range(start, end):
        if chars[i] != "\n":
            chars[i] = " "


class _Sections:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.starts: list[int] = [0]

    def add(self, offset: int, title: str) -> None:
        self.starts.append(offset)
        self.doc.section_titles.append(" ".join(title.split())[:120])

    def of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1


# -- Markdown, MyST, Quarto --------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*(\{?[\w.-]*\}?)[^\n]*$")
_ATX = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*)$")
_SETEXT = re.compile(r"^[ \t]{0,3}(=+|-+)[ \t]*$")
_INLINE_CODE = re.compile(r"`+")
_COMMENT_OPEN = re.compile(r"<!--")
_BLANK = re.compile(r"\n[ \t]*\n")
_MATH_OPEN = re.compile(
    r"\$\$|\\\[|\\\(|\\begin\{(?P<env>equation|align|alignat|gather|multline|eqnarray|math"
    r"|displaymath|flalign)(?P<star>\*?)\}|\$")
#: Longest display math, and longest inline math (characters).
MAX_DISPLAY = 20_000
MAX_INLINE = 4000


class _Finder:
    """``str.find`` (and a blank-line search) remembered per needle: every scan here asks
    from positions that only increase, so each needle's text is scanned once — linear in
    the text however many openers lack a closer (``\\[`` a million times)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.cache: dict[str, int] = {}

    def find(self, needle: str, start: int) -> int:
        hit = self.cache.get(needle)
        if hit is None or (hit != -1 and hit < start):
            if needle == "<blank>":
                m = _BLANK.search(self.text, start)
                hit = m.start() if m else -1
            else:
                hit = self.text.find(needle, start)
            self.cache[needle] = hit
        return hit


def _regions(text: str, opener: re.Pattern[str], closer: Any, *, limit: int | None = None,
             paragraph: bool = False) -> Iterator[tuple[re.Match[str], int, int]]:
    """(opener match, body end, region end) of every region ``opener … closer(match)``,
    left to right, without overlaps; an opener without its closer (within ``limit``
    characters, or before a blank line when ``paragraph``) is left as text."""
    finder = _Finder(text)
    pos = 0
    while True:
        m = opener.search(text, pos)
        if m is None:
            return
        close = closer(m)
        end = finder.find(close, m.end()) if close else -1
        ok = end != -1 and (limit is None or end - m.end() <= limit)
        if ok and paragraph:
            blank = finder.find("<blank>", m.end())
            ok = blank == -1 or blank > end
        if ok:
            yield m, end, end + len(close)
            pos = end + len(close)
        else:
            pos = m.end()


def _blanked(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with the characters of ``spans`` (but not its newlines) made spaces."""
    if not spans:
        return text
    chars = list(text)
    for a, b in spans:
        _mask(chars, a, b)
    return "".join(chars)


def _markdown(doc: Document, text: str, offset: int) -> None:
    chars = list(text)
    sections = _Sections(doc)
    lines = text.split("\n")
    pos = 0
    i = 0
    if text.startswith("---\n"):  # YAML front matter
        for j in range(1, min(len(lines), 10_000)):
            if lines[j].strip() in ("---", "..."):
                end = sum(len(x) + 1 for x in lines[:j + 1])
                _mask(chars, 0, min(end, len(chars)))
                pos, i = end, j + 1
                break
    prev_text = ""
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            fence, info = m.group(1), m.group(2).strip("{}").lower()
            body_start = pos + len(line) + 1
            j, q = i + 1, body_start
            while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                          and set(lines[j].strip()) <= {fence[0]}):
                q += len(lines[j]) + 1
                j += 1
            body = text[body_start:q] if body_start <= len(text) else ""
            end = min(q + (len(lines[j]) + 1 if j < len(lines) else 0), len(text))
            _mask(chars, pos, end)
            if info == "mha-check":
                doc.blocks.append(Block(body, offset + body_start, sections.of(pos)))
            elif info in ("math", "latex-math"):
                # MyST options (":label: x") precede the math
                skip = 0
                for ln in body.split("\n"):
                    if ln.strip().startswith(":") or not ln.strip():
                        skip += len(ln) + 1
                    else:
                        break
                doc.spans.append(Span(body[skip:], offset + body_start + skip, sections.of(pos)))
            pos, i, prev_text = end, j + 1, ""
            continue
        h = _ATX.match(line)
        if h:
            sections.add(pos, h.group(1))
        elif _SETEXT.match(line) and prev_text.strip() and not line.strip().startswith("--- "):
            sections.add(pos - len(prev_text) - 1, prev_text)
        prev_text = line
        pos += len(line) + 1
        i += 1
    masked = "".join(chars)
    masked = _blanked(masked, [(m.start(), end) for m, _, end in _regions(
        masked, _COMMENT_OPEN, lambda m: "-->")])
    masked = masked.replace("\\$", "  ")
    masked = _blanked(masked, [(m.start(), end) for m, _, end in _regions(
        masked, _INLINE_CODE, lambda m: m.group(), limit=MAX_INLINE, paragraph=True)])
    _find_math(doc, masked, text, offset, sections)


def _find_math(doc: Document, masked: str, text: str, offset: int, sections: _Sections) -> None:
    def closer(m: re.Match[str]) -> str:
        o = m.group()
        if o.startswith("\\begin"):
            return "\\end{" + m.group("env") + m.group("star") + "}"
        return {"$$": "$$", "\\[": "\\]", "\\(": "\\)", "$": "$"}[o]

    for m, end, stop in _regions(masked, _MATH_OPEN, closer, limit=MAX_DISPLAY):
        start = m.end()
        if m.group() == "$" and (end - start > MAX_INLINE or end == start or _BLANK.search(
                masked, start, end) or masked[stop:stop + 1].isdigit()):
            continue  # "$5 and $10": not math
        start, end = _unwrapped(text, start, end)
        doc.spans.append(Span(text[start:end], offset + start, sections.of(m.start())))
        if len(doc.spans) > MAX_SPANS:
            raise ExampleFileError(f"more than {MAX_SPANS} math spans in one file")
    doc.spans.sort(key=lambda s: s.start)


_INNER_ENV = re.compile(r"\s*\\begin\{(?P<env>equation|align|alignat|gather|multline|eqnarray"
                        r"|flalign)(?P<star>\*?)\}(?:\{\d{1,2}\})?")


def _unwrapped(text: str, start: int, end: int) -> tuple[int, int]:
    """The body of an equation/align environment written inside ``$$…$$`` or ``\\[…\\]``
    (``$$\\begin{equation} … \\end{equation}$$``, as Jekyll/MathJax books do), else the span."""
    m = _INNER_ENV.match(text, start, end)
    if not m:
        return start, end
    closing = "\\end{" + m.group("env") + m.group("star") + "}"
    tail = text[m.end():end].rstrip()
    if not tail.endswith(closing):
        return start, end
    return m.end(), m.end() + len(tail) - len(closing)


# -- reStructuredText ---------------------------------------------------------------------------

_RST_ROLE = re.compile(r":math:`(?P<m>[^`]{1,4000})`")
_RST_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\.[ \t]+(?P<name>[\w:-]+)::(?P<arg>[^\n]*)$")
_RST_UNDERLINE = re.compile(r"^([=\-`:'\"~^_*+#<>.])\1{2,}[ \t]*$")


def _rst(doc: Document, text: str) -> None:
    chars = list(text)
    sections = _Sections(doc)
    lines = text.split("\n")
    offsets = []
    pos = 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    i = 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and _RST_UNDERLINE.match(lines[i + 1]) \
                and len(lines[i + 1].strip()) >= len(line.strip()) and not line.startswith(" "):
            sections.add(offsets[i], line)
        d = _RST_DIRECTIVE.match(line)
        literal = line.rstrip().endswith("::") and not d
        if d or literal:
            indent = len(d.group("indent")) if d else len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or
                                      len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            end = offsets[j] if j < len(lines) else len(text)
            body_lines = range(i + 1, j)
            name = d.group("name") if d else ""
            if name == "math":
                arg = d.group("arg").strip() if d else ""
                if arg:
                    doc.spans.append(Span(arg, offsets[i] + line.index(arg), sections.of(offsets[i])))
                for k in body_lines:
                    s = lines[k].strip()
                    if s and not s.startswith(":"):
                        doc.spans.append(Span(lines[k], offsets[k], sections.of(offsets[k])))
            elif name == "mha-check":
                first = next((k for k in body_lines if lines[k].strip()
                              and not lines[k].strip().startswith(":")), None)
                if first is not None:
                    body = "\n".join(lines[k][indent + 1:] if lines[k].strip() else ""
                                     for k in range(first, j))
                    body = _dedent(body)
                    doc.blocks.append(Block(body, offsets[first], sections.of(offsets[i])))
            if name in ("math", "mha-check", "code", "code-block", "sourcecode", "literalinclude",
                        "doctest", "raw") or literal:
                _mask(chars, offsets[i] if d else offsets[i] + len(line), end)
            i = j
            continue
        i += 1
    masked = "".join(chars)
    for m in _RST_ROLE.finditer(masked):
        doc.spans.append(Span(m.group("m"), m.start("m"), sections.of(m.start())))
    _INLINE = re.compile(r"``[^`\n]{1,2000}``")
    masked = _INLINE.sub(lambda m: " " * len(m.group()), masked)
    masked = _RST_ROLE.sub(lambda m: " " * len(m.group()), masked)
    doc.spans.sort(key=lambda s: s.start)
    if len(doc.spans) > MAX_SPANS:
        raise ExampleFileError(f"more than {MAX_SPANS} math spans in one file")


def _dedent(body: str) -> str:
    lines = body.split("\n")
    widths = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
    cut = min(widths, default=0)
    return "\n".join(x[cut:] for x in lines)


# -- LaTeX ----------------------------------------------------------------------------------------

_TEX_COMMENT = re.compile(r"(?<!\\)%[^\n]*")
_TEX_VERBATIM = re.compile(r"\\begin\{(verbatim|lstlisting|minted|comment|Verbatim|mhacheck)(\*?)\}")
_TEX_SECTION = re.compile(r"\\(?:part|chapter|section|subsection|subsubsection)\*?\s*\{([^{}\n]{0,200})")
_TEX_VERB = re.compile(r"\\verb\*?([^\w\s])[^\n]{0,500}?\1")


def _latex(doc: Document, text: str) -> None:
    sections = _Sections(doc)
    blank = lambda m: re.sub(r"[^\n]", " ", m.group())  # noqa: E731 - offsets kept
    masked = _TEX_COMMENT.sub(blank, text)
    hidden: list[tuple[int, int]] = []
    blocks: list[tuple[int, int]] = []
    for m, end, stop in _regions(masked, _TEX_VERBATIM,
                                 lambda m: "\\end{" + m.group(1) + m.group(2) + "}"):
        hidden.append((m.start(), stop))
        if m.group(1) == "mhacheck":
            body = text.find("\n", m.end(), end)  # the TOML starts on the next line
            if body != -1:
                blocks.append((body + 1, end))
    masked = _blanked(masked, hidden)
    masked = _TEX_VERB.sub(blank, masked)
    masked = masked.replace("\\$", "  ")
    for m in _TEX_SECTION.finditer(masked):
        sections.add(m.start(), m.group(1))
    doc.blocks.extend(Block(text[a:b], a, sections.of(a)) for a, b in blocks)
    _find_math(doc, masked, text, 0, sections)


# -- Jupyter notebooks ----------------------------------------------------------------------------

def _notebook(raw: str) -> Document:
    try:
        nb = json.loads(raw)
    except RecursionError:
        raise ExampleFileError("the notebook's JSON is nested too deeply") from None
    except ValueError as exc:
        raise ExampleFileError(f"not a notebook: invalid JSON ({_first_line(exc)})") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ExampleFileError("not a notebook: no list of cells (nbformat 4)")
    if len(cells) > MAX_CELLS:
        raise ExampleFileError(f"a notebook of more than {MAX_CELLS} cells")
    locator = _Locator(raw)
    parts: list[str] = []
    line_map: list[int] = []
    kinds: list[tuple[int, int, str, str]] = []  # (start, end, kind, tagged)
    for n, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise ExampleFileError(f"not a notebook: cell {n} is not an object")
        kind = cell.get("cell_type")
        source = _cell_text(cell.get("source", ""), f"cell {n}'s source")
        meta = cell.get("metadata", {})
        tags = meta.get("tags", []) if isinstance(meta, dict) else []
        tagged = isinstance(tags, list) and "mha-check" in tags
        chunks: list[tuple[str, str]] = []
        if tagged:
            chunks.append(("block", source))
        elif kind == "markdown":
            chunks.append(("markdown", source))
        if kind == "code":
            outputs = cell.get("outputs", [])
            if not isinstance(outputs, list):
                raise ExampleFileError(f"not a notebook: cell {n}'s outputs are not a list")
            for out in outputs:
                if not isinstance(out, dict):
                    continue
                if out.get("output_type") == "stream":
                    chunks.append(("output", _cell_text(out.get("text", ""), f"cell {n}'s output")))
                data = out.get("data")
                if isinstance(data, dict) and "text/plain" in data:
                    chunks.append(("output", _cell_text(data["text/plain"], f"cell {n}'s output")))
        for what, body in chunks:
            start = sum(len(p) for p in parts)
            for ln in body.split("\n"):
                line_map.append(locator.find(ln))
            parts.append(body + "\n\n")
            line_map.append(line_map[-1] if line_map else 1)
            kinds.append((start, start + len(body), what, ""))
    text = "".join(parts)
    doc = Document(text, line_map=line_map)
    sections = _Sections(doc)
    for start, end, what, _ in kinds:
        body = text[start:end]
        if what == "markdown":
            sub = Document(body)
            _markdown(sub, body, start)
            for title_off, title in zip(_heading_offsets(body, start), sub.section_titles[1:],
                                        strict=False):
                sections.add(title_off, title)
            doc.spans.extend(Span(s.text, s.start, sections.of(s.start)) for s in sub.spans)
            doc.blocks.extend(Block(b.text, b.start, sections.of(b.start)) for b in sub.blocks)
        elif what == "block":
            doc.blocks.append(Block(body, start, sections.of(start)))
        else:
            pos = start
            for ln in body.split("\n"):
                if ln.strip():
                    doc.spans.append(Span(ln, pos, sections.of(pos), "output"))
                pos += len(ln) + 1
        if len(doc.spans) > MAX_SPANS:
            raise ExampleFileError(f"more than {MAX_SPANS} math spans in one file")
    return doc


def _heading_offsets(body: str, base: int) -> list[int]:
    out, pos = [], 0
    for line in body.split("\n"):
        if _ATX.match(line):
            out.append(base + pos)
        pos += len(line) + 1
    return out


def _cell_text(value: object, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "".join(value)
    raise ExampleFileError(f"not a notebook: {what} is not text")


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:120]


class _Locator:
    """The line of the notebook's JSON where a cell's line is written (Jupyter writes one
    source line per JSON string), searched forward from the last one found."""

    def __init__(self, raw: str) -> None:
        self.raw = raw
        self.pos = 0
        self.line = 1

    def find(self, text: str) -> int:
        if not text.strip():
            return self.line
        for needle in (json.dumps(text, ensure_ascii=False)[1:-1],
                       json.dumps(text)[1:-1]):
            k = self.raw.find(needle, self.pos)
            if k >= 0:
                self.line += self.raw.count("\n", self.pos, k)
                self.pos = k
                return self.line
        return self.line
