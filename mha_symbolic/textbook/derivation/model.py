"""The document model of a derivation: format-neutral blocks (paragraphs, displays,
figures), steps, checks and claims, rendered at the end by :mod:`.render_latex` and
:mod:`.render_markdown`."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import SpecError

__all__ = ["Check", "ClaimLine", "Derivation", "Display", "ExampleDerivation", "Figure",
           "Paragraph", "Step", "Table"]

FORMATS: tuple[str, ...] = ("tex", "fragment", "markdown")

#: Certified significant digits shown for a scalar value.
DIGITS = 10
#: Certified significant digits shown for each entry of a decimal matrix.
MATRIX_DIGITS = 6
#: An exact form is shown when its LaTeX is at most this long.
SHORT = 90
#: A matrix without certified digits (symbolic entries, or values too small or too close
#: to a boundary to certify) shows its exact form up to this many LaTeX characters:
#: printing walks every entry's expression tree, shared denominators included.
EXACT_MATRIX_CHARS = 20_000
#: Longest LaTeX (characters) for a matrix product written out in one line.
WIDE = 160
#: At most this many weights per head are derived one by one; beyond, the matrix.
MAX_ENTRY_LINES = 24
#: A long sum is broken over lines of at most this many LaTeX characters.
LINE_CHARS = 72
#: A matrix wider than this many printed digits is shown in blocks of columns.
MATRIX_WIDTH = 64
#: Sums longer than this (as text) are not rewritten into one fraction.
TIDY_CHARS = 400
#: A sum with more atoms than this is printed in SymPy's canonical order of its terms,
#: not in the printing order, which SymPy finds by evaluating every term numerically.
ORDERED_LEAVES = 16

DEFAULT_TITLE = "Multi-head attention: derivations"


# ---------------------------------------------------------------------------
# The document model: format-neutral blocks, rendered at the end.
#
# Text ("markup") is plain text with inline math between single dollars:
# "scale by $1/\sqrt{d_k}$".  Plain parts are escaped for the target format;
# math parts are LaTeX and pass through.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Paragraph:
    """A paragraph of markup (plain text with ``$...$`` inline math)."""

    text: str


@dataclass(frozen=True)
class Display:
    """Displayed math: one aligned row per entry (``&`` marks the alignment point)."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class Figure:
    """A figure file: ``ref`` is the path as the document refers to it."""

    path: str
    ref: str
    caption: str


@dataclass(frozen=True)
class Table:
    """A table set with booktabs rules: ``header`` and ``rows`` of markup cells
    (``$...$`` math), ``align`` one of ``l``/``c``/``r`` per column, ``total`` a last
    row set off by a rule."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: str
    total: tuple[str, ...] | None = None


Block = Paragraph | Display | Figure | Table


@dataclass(frozen=True)
class Step:
    """One step of a derivation: a title, the reason for it, and its content."""

    title: str
    why: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Check:
    """A property verified by computation; ``detail`` says what was computed."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class ClaimLine:
    """A claim of the text with the checker's verdict (from the textbook records)."""

    quantity: str
    claimed: str
    exact_latex: str | None
    exact_digits: str
    verdict: str
    ok: bool
    diagnosis: str
    note: str = ""
    #: the quantity in words and math (markup, from .labels); "" when it has none
    label: str = ""


@dataclass(frozen=True)
class ExampleDerivation:
    """The derivation of one worked example."""

    name: str
    title: str
    notes: str
    steps: tuple[Step, ...]
    checks: tuple[Check, ...]
    claims: tuple[ClaimLine, ...] = ()
    figures: tuple[Figure, ...] = ()

    @property
    def ok(self) -> bool:
        """All checks hold and every claim was judged correct."""
        return all(c.ok for c in self.checks) and all(c.ok for c in self.claims)


@dataclass(frozen=True)
class Derivation:
    """Derivations of one or more examples, renderable as LaTeX or Markdown.

    ``text`` is the derivation in its ``format``; :meth:`latex` is always the
    LaTeX fragment, :meth:`document` the standalone document and
    :meth:`markdown` the Markdown.
    """

    examples: tuple[ExampleDerivation, ...]
    format: str = "tex"
    title: str = DEFAULT_TITLE

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.examples)

    @property
    def text(self) -> str:
        if self.format == "markdown":
            return self.markdown()
        if self.format == "fragment":
            return self.latex()
        return self.document()

    def latex(self) -> str:
        """The LaTeX fragment (no preamble): sections, aligned math, lists."""
        from .render_latex import _render_latex

        return _render_latex(self)

    def document(self) -> str:
        """A complete LaTeX document (amsmath, booktabs; graphicx if there are figures)."""
        from .render_latex import _render_document

        return _render_document(self)

    def markdown(self, math: str = "github") -> str:
        """Markdown with ``$...$`` inline math.  Displayed math: ``math="github"``
        writes fenced ``math`` blocks (GitHub's robust form), ``math="dollars"``
        writes ``$$...$$`` (Jupyter, pandoc, MkDocs)."""
        if math not in ("github", "dollars"):
            raise SpecError(f"math={math!r} must be 'github' or 'dollars'")
        from .render_markdown import _render_markdown

        return _render_markdown(self, math)

    def _repr_latex_(self) -> str:
        """Math-mode LaTeX for Jupyter's MathJax (text in ``\\text{}``)."""
        from .render_markdown import _render_mathjax

        return _render_mathjax(self)

    def _repr_markdown_(self) -> str:
        return self.markdown(math="dollars")

    def __str__(self) -> str:
        return self.text

