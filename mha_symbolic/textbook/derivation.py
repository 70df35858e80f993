"""Step-by-step derivations of worked examples, as LaTeX or Markdown.

A derivation walks through one attention computation the way a textbook's
worked example does (the seed page is the model): the scores ``Q_i K_i^T``,
the scaling by ``1/sqrt(d_k)``, the softmax row by row, the weighted sum of
the values, the split into heads, the concatenation and ``W^O``; for shape
questions the shape algebra, for counts the sum of the parts.  Each step shows

* the symbolic form (``w_{rj} = e^{t_{rj}} / Σ_j' e^{t_{rj'}}``),
* the exact value where it is short (printed by SymPy's LaTeX printer, which
  places the parentheses; terminating rationals such as 1/2 print as ``0.5``,
  which is the same exact number),
* the decimal value with its *certified* digits
  (:meth:`~mha_symbolic.exact.certified.CertifiedValue.digits`: every printed digit is
  a digit of the exact value, ``…`` marks that more follow),
* and a one-line reason ("why this step").

Each example ends with its checks, *computed* here (weights positive: certified
signs; rows sum to 1: exact SymPy identity; outputs inside the coordinatewise
hull of the values: certified comparisons; shapes agree: the shape checker),
and, when the example states claims, the checker's verdict beside each claim.

Three formats: ``"tex"`` (a complete document that compiles with pdflatex,
amsmath and amssymb only, plus graphicx when figures are included),
``"fragment"`` (the body, for pasting into a book) and ``"markdown"``
(``$...$`` inline math and fenced ``math`` blocks, which GitHub renders;
``Derivation.markdown(math="dollars")`` writes ``$$...$$`` instead).

>>> from mha_symbolic.exact.engine import exact_attention
>>> att = exact_attention(scores=[[0, 0, 20]], value=[[10], [20], [30]])
>>> d = derive(att, format="markdown")
>>> [c.name for c in d.examples[0].checks]
['weights positive', 'rows sum to 1', 'outputs within the values', 'shapes agree']
>>> d.ok
True
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._latex import latex_escape, standalone_document
from .._text import markdown_text, sanitize
from ..errors import ExampleFileError, MhaSymbolicError, SpecError

__all__ = [
    "Check",
    "ClaimLine",
    "Derivation",
    "Display",
    "ExampleDerivation",
    "Figure",
    "Paragraph",
    "Step",
    "cli_derive",
    "derive",
]

FORMATS: tuple[str, ...] = ("tex", "fragment", "markdown")

#: Certified significant digits shown for a scalar value.
DIGITS = 10
#: Certified significant digits shown for each entry of a decimal matrix.
MATRIX_DIGITS = 6
#: An exact form is shown when its LaTeX is at most this long.
SHORT = 90
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


Block = Paragraph | Display | Figure


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
        return _render_latex(self)

    def document(self) -> str:
        """A complete LaTeX document (amsmath, amssymb; graphicx if there are figures)."""
        intro = ("Every number below comes from the exact engine; decimals show certified "
                 "digits only (\\ldots: more digits follow). The checks closing each example "
                 "are computed, and each claim of the text carries the checker's verdict.\n\n")
        doc = standalone_document(intro + self.latex(), title=self.title)
        if any(e.figures for e in self.examples):
            # standalone_document loads amsmath and amssymb only; figures need graphicx.
            doc = doc.replace("\\begin{document}",
                              "\\usepackage{graphicx}\n\\begin{document}", 1)
        return doc

    def markdown(self, math: str = "github") -> str:
        """Markdown with ``$...$`` inline math.  Displayed math: ``math="github"``
        writes fenced ``math`` blocks (GitHub's robust form), ``math="dollars"``
        writes ``$$...$$`` (Jupyter, pandoc, MkDocs)."""
        if math not in ("github", "dollars"):
            raise SpecError(f"math={math!r} must be 'github' or 'dollars'")
        return _render_markdown(self, math)

    def _repr_latex_(self) -> str:
        """Math-mode LaTeX for Jupyter's MathJax (text in ``\\text{}``)."""
        return _render_mathjax(self)

    def _repr_markdown_(self) -> str:
        return self.markdown(math="dollars")

    def __str__(self) -> str:
        return self.text


# ---------------------------------------------------------------------------
# Number formatting
# ---------------------------------------------------------------------------


def _terminating_places(q: int) -> int | None:
    """Decimal places of 1/q when q = 2^a 5^b, else None."""
    a = b = 0
    while q % 2 == 0:
        q //= 2
        a += 1
    while q % 5 == 0:
        q //= 5
        b += 1
    return max(a, b) if q == 1 else None


_PRINTER: Any = None


def _tex(expr: Any) -> str:
    """LaTeX of an exact value.  Terminating rationals with at most six decimals
    print as decimals (1/2 as 0.5: the same exact number, as a book writes it)."""
    global _PRINTER
    import sympy as sp

    if _PRINTER is None:
        from sympy.printing.latex import LatexPrinter

        class _Printer(LatexPrinter):
            def _as_ordered_terms(self, expr: Any, order: Any = None) -> Any:
                # SymPy orders a sum's terms by evaluating every numeric factor (seconds
                # for a long sum of exponentials); a long sum keeps its canonical order
                if _leaves(expr, ORDERED_LEAVES) > ORDERED_LEAVES:
                    return list(expr.args)
                return super()._as_ordered_terms(expr, order=order)

            def _print_Integer(self, e: Any) -> str:
                return _decimal(int(e.p))  # no 4300-digit limit (python-flint)

            def _print_Rational(self, e: Any) -> str:
                p, q = int(e.p), int(e.q)
                if max(p.bit_length(), q.bit_length()) > 3000:  # beyond str()'s comfort
                    sign = "-" if p < 0 else ""
                    return (sign + _decimal(abs(p)) if q == 1
                            else rf"{sign}\frac{{{_decimal(abs(p))}}}{{{_decimal(q)}}}")
                places = _terminating_places(q)
                if q != 1 and places is not None and places <= 6:
                    sign = "-" if p < 0 else ""
                    scaled = abs(p) * 10**places // q
                    digits = str(scaled).rjust(places + 1, "0")
                    return f"{sign}{digits[:-places]}.{digits[-places:]}"
                return str(super()._print_Rational(e))

        _PRINTER = _Printer()
    if isinstance(expr, int):
        return _decimal(expr)
    return str(_PRINTER.doprint(sp.sympify(expr)))


def _decimal(n: int) -> str:
    """The exact decimal digits of n, also beyond Python's 4300-digit limit on str()."""
    from ..exact.certified import _decimal as digits

    return ("-" + digits(-n)) if n < 0 else digits(n)


@functools.lru_cache(maxsize=8192)
def _certified(expr: Any) -> Any:
    """One CertifiedValue per exact value, so that the enclosures and exact-algebra
    results it caches serve every step and check that prints or tests the value."""
    from ..exact.certified import certify

    return certify(expr)


def _sign(expr: Any) -> int:
    """The sign of an exact value, certified: first from one Arb enclosure (a ball
    that excludes 0 settles it), else by :meth:`CertifiedValue.sign`'s full strategy."""
    from ..exact.certified import to_arb

    if _is_rational(expr):
        return int(bool(expr > 0)) - int(bool(expr < 0))
    try:
        ball = to_arb(expr, 128)
        if ball > 0:
            return 1
        if ball < 0:
            return -1
    except MhaSymbolicError:
        pass
    return int(_certified(expr).sign())


def _has_symbols(expr: Any) -> bool:
    return bool(getattr(expr, "free_symbols", None))


def _digits(expr: Any, significant: int = DIGITS) -> str | None:
    """Certified leading digits as LaTeX (``…`` as ``\\ldots``); None if symbolic.

    A value just below a power of ten (``0.99999999999998733…``) gets digits
    until four past its run of nines, so that the digits say how far from 1 it is."""

    if _has_symbols(expr):
        return None
    try:
        c = _certified(expr)
        text = c.digits(significant)
        n = significant
        while n < 60 and _nines_only(text):
            n += 10
            text = c.digits(n)
        if n > significant:
            text = c.digits(_nines_run(text) + 4)
    except MhaSymbolicError:
        return None
    return _digits_tex(text)


def _nines_only(text: str) -> bool:
    body = text.rstrip("…").lstrip("-").replace(".", "").lstrip("0")
    return "…" in text and bool(body) and set(body) == {"9"}


def _nines_run(text: str) -> int:
    body = text.rstrip("…").lstrip("-").replace(".", "").lstrip("0")
    return len(body) - len(body.lstrip("9"))


def _digits_tex(text: str) -> str:
    text = text.replace("…", r"\ldots")
    return text if not text.startswith("-") else "-" + text[1:]


def _is_rational(expr: Any) -> bool:
    return bool(getattr(expr, "is_Rational", False)) or isinstance(expr, int)


def _leaves(expr: Any, cap: int) -> int:
    """The number of atoms of ``expr``, counted up to ``cap + 1``.  Each atom prints as at
    least one character, so more than ``cap`` atoms means more than ``cap`` characters:
    a cheap test before printing, which for a long numeric sum costs seconds (SymPy's
    printers order the terms by evaluating each of them numerically)."""
    import sympy as sp

    if not isinstance(expr, sp.Basic):
        return 1
    n = 0
    for node in sp.preorder_traversal(expr):
        if not node.args:
            n += 1
            if n > cap:
                break
    return n


def _tex_if_short(expr: Any, limit: int) -> str | None:
    """``_tex(expr)`` when it has at most ``limit`` characters, else None (decided first
    by counting atoms, so that a long expression is never printed)."""
    if _leaves(expr, limit) > limit:
        return None
    text = _tex(expr)
    return text if len(text) <= limit else None


def _tidy(expr: Any) -> Any:
    """The shortest of a few exact rewritings (sum of fractions -> one fraction)."""
    import sympy as sp

    if (not isinstance(expr, sp.Basic) or not expr.is_Add or len(expr.args) > 12
            or _leaves(expr, TIDY_CHARS) > TIDY_CHARS):
        return expr  # rewriting a long sum costs more than it can gain on the page
    best, best_len = expr, len(_tex(expr))
    try:
        # together() only combines fractions; factor()/cancel() would run polynomial gcds,
        # which can hang (or crash under python-flint ground types) on exponentials
        candidates = [sp.together(expr)]
    except Exception:  # SymPy rewriting is best effort; the original stays exact
        return expr
    for cand in candidates:
        n = len(_tex(cand))
        if n < best_len:
            best, best_len = cand, n
    return best


def _matrix_tex(m: Any, limit: int | None = None) -> str | None:
    """An exact matrix: each entry printed by SymPy, in amsmath's bmatrix.

    With ``limit``, None as soon as the LaTeX grows longer than ``limit``."""
    cells: list[list[str]] = []
    used = 0
    for r in range(m.rows):
        row = []
        for c in range(m.cols):
            e = m[r, c]
            if limit is not None and _leaves(e, limit) > limit:
                return None
            text = _tex(_tidy(e))
            used += len(text) + 3
            if limit is not None and used > limit:
                return None
            row.append(text)
        cells.append(row)
    return _bmatrix(cells)


def _operand_tex(m: Any) -> str:
    """A matrix written as a factor of a product: bracketed like every other matrix."""
    import sympy as sp

    if all(_is_rational(e) or e in (sp.oo, -sp.oo) for e in m):
        return _bmatrix([[_tex(m[r, c]) for c in range(m.cols)] for r in range(m.rows)])
    text = _matrix_tex(m)
    assert text is not None  # no limit: always a text
    return text


def _cells(m: Any, digits: int = MATRIX_DIGITS) -> list[list[str]] | None:
    """Each entry as LaTeX: exact when rational or infinite, else certified digits.
    None when an entry is symbolic (it has no digits)."""
    import sympy as sp

    rows = []
    for r in range(m.rows):
        row = []
        for c in range(m.cols):
            e = m[r, c]
            if _is_rational(e) or e in (sp.oo, -sp.oo):
                row.append(_tex(e))
                continue
            d = _digits(e, digits)
            if d is None:
                return None
            row.append(d)
        rows.append(row)
    return rows


def _printed(latex: str) -> int:
    """Rough printed width of a LaTeX line, in characters (a matrix counts its widest row)."""
    rows = latex.split("\\\\")
    return max(len(re.sub(r"\\[a-zA-Z]+|[{}&\\ ]", "", row)) for row in rows)


def _visual(cell: str) -> int:
    """Rough printed width of a cell, in digits."""
    return len(cell.replace(r"\ldots", "...").replace(r"\infty", "oo").replace("\\", ""))


def _column_chunks(cells: list[list[str]]) -> list[tuple[int, int]]:
    """Split the columns into runs that fit the line (MATRIX_WIDTH digits each)."""
    widths = [max(_visual(row[c]) for row in cells) + 2 for c in range(len(cells[0]))]
    chunks: list[tuple[int, int]] = []
    start, used = 0, 0
    for c, wd in enumerate(widths):
        if c > start and used + wd > MATRIX_WIDTH:
            chunks.append((start, c))
            start, used = c, 0
        used += wd
    chunks.append((start, len(widths)))
    return chunks


def _bmatrix(cells: list[list[str]], lo: int = 0, hi: int | None = None) -> str:
    body = r" \\ ".join(" & ".join(row[lo:hi]) for row in cells)
    return r"\begin{bmatrix}" + body + r"\end{bmatrix}"


def _matrix_chain(name: str, m: Any, *, symbolic: str | None = None) -> list[str]:
    """Display rows ``name = symbolic = exact = decimals`` for a matrix.

    Rational (and masked, infinite) entries are exact as printed; other entries
    show their exact form when it is short, then certified digits.  A matrix too
    wide for the line is shown in blocks of columns."""
    import sympy as sp

    rhs: list[str] = []
    if symbolic:
        rhs.append(symbolic)
    cells = _cells(m)
    exact_cells = cells is not None and all(_is_rational(e) or e in (sp.oo, -sp.oo) for e in m)
    if not exact_cells:
        exact = _matrix_tex(m, None if cells is None else SHORT * max(1, m.rows))
        if exact is not None:
            rhs.append(exact)
    if cells is None:
        return _chain(name, rhs)
    chunks = _column_chunks(cells)
    if len(chunks) == 1:
        rhs.append(_bmatrix(cells))
        return _chain(name, rhs)
    rows = _chain(name, rhs) if rhs else []
    for lo, hi in chunks:
        label = rf"{name}\,[\text{{columns }} {lo + 1}\text{{--}}{hi}]"
        rows.append(f"{label} &= {_bmatrix(cells, lo, hi)}")
    return rows


def _chain(lhs: str, rhs: Sequence[str]) -> list[str]:
    """Aligned rows ``lhs &= a``, ``&= b``... one form per row when long."""
    if not rhs:
        return [lhs]
    one_line = f"{lhs} &= " + " = ".join(rhs)
    if len(one_line) <= WIDE // 2 + 20 or len(rhs) == 1:
        return [one_line]
    rows = [f"{lhs} &= {rhs[0]}"]
    rows += [f"&= {r}" for r in rhs[1:]]
    return rows


def _sum_rows(lhs: str, terms: Sequence[str]) -> list[str]:
    """``lhs &= t1 + t2 + …``, broken before a line's LaTeX passes LINE_CHARS."""
    chunks: list[list[str]] = [[]]
    for term in terms:
        if chunks[-1] and len(" + ".join([*chunks[-1], term])) > LINE_CHARS:
            chunks.append([])
        chunks[-1].append(term)
    first = f"{lhs} &= " if lhs else "&= "
    return [first + " + ".join(c) if k == 0 else "&\\quad + " + " + ".join(c)
            for k, c in enumerate(chunks)]


def _exp_tex(t: Any) -> str:
    return f"e^{{{_tex(t)}}}"


def _vec_tex(items: Sequence[str]) -> str:
    return r"\left(" + r",\ ".join(items) + r"\right)"


# ---------------------------------------------------------------------------
# Derivation of an exact attention computation
# ---------------------------------------------------------------------------


def _sub(i: int) -> str:
    return str(i + 1)


def _given_matrices(given: dict[str, Any] | None) -> dict[str, Any]:
    """The example's stated weight matrices (W^Q, W^K, W^V, W^O, biases) as exact matrices."""
    from ..exact.engine import exact_matrix

    out: dict[str, Any] = {}
    for key in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"):
        if given and given.get(key) is not None:
            out[key] = exact_matrix(given[key], key)
    return out


_W_TEX = {"w_q": "W^{Q}", "w_k": "W^{K}", "w_v": "W^{V}", "w_o": "W^{O}",
          "b_q": "b^{Q}", "b_k": "b^{K}", "b_v": "b^{V}", "b_o": "b^{O}"}


def _grouped_matrices(mats: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """``W^{Q} = W^{K} = W^{V} = [...]`` when they are equal, else one row each."""
    rows: list[str] = []
    done: set[str] = set()
    for key in keys:
        if key not in mats or key in done:
            continue
        same = [k for k in keys if k in mats and k not in done and mats[k] == mats[key]]
        done.update(same)
        lhs = " = ".join(_W_TEX[k] for k in same)
        rows += _matrix_chain(lhs, mats[key])
    return rows


def _attention_steps(att: Any, given: dict[str, Any] | None = None) -> list[Step]:
    steps: list[Step] = []
    mats = _given_matrices(given)
    spec = att.spec
    h = len(att.heads)
    first = att.heads[0]
    inputs = att.inputs
    raw_scores = first.q is None

    # -- inputs and projections ------------------------------------------------
    if "x" in inputs:
        cross = inputs["x_kv"] is not inputs["x"] and inputs["x_kv"] != inputs["x"]
        rows: list[str] = _matrix_chain("X", inputs["x"])
        if cross:
            rows += _matrix_chain("X_{kv}", inputs["x_kv"])
        src = "X_{kv}" if cross else "X"
        rows += _grouped_matrices(mats, ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v"))
        blocks: list[Block] = [Display(tuple(rows))]
        rows = []
        bias_q = " + b^{Q}" if "b_q" in mats else ""
        bias_k = " + b^{K}" if "b_k" in mats else ""
        bias_v = " + b^{V}" if "b_v" in mats else ""
        rows += _matrix_chain("Q", inputs["q"], symbolic="X W^{Q}" + bias_q)
        rows += _matrix_chain("K", inputs["k"], symbolic=f"{src} W^{{K}}" + bias_k)
        if "v" in inputs:
            rows += _matrix_chain("V", inputs["v"], symbolic=f"{src} W^{{V}}" + bias_v)
        blocks.append(Display(tuple(rows)))
        steps.append(Step(
            "Project the tokens",
            "each token's vector is mapped to a query (what it asks for), a key (what it "
            "offers) and a value (what it passes on), by $Q = XW^{Q}$, $K = XW^{K}$, $V = XW^{V}$.",
            tuple(blocks)))
    elif not raw_scores:
        rows = _matrix_chain("Q", inputs["q"]) + _matrix_chain("K", inputs["k"])
        if "v" in inputs:
            rows += _matrix_chain("V", inputs["v"])
        steps.append(Step(
            "Queries, keys and values",
            "the inputs, one row per token: row $r$ of $Q$ asks, row $j$ of $K$ answers, "
            "row $j$ of $V$ is what token $j$ passes on.",
            (Display(tuple(rows)),)))

    if h > 1 and not raw_scores:
        d_k = first.q.cols
        rows = []
        for head in att.heads:
            i = _sub(head.index)
            parts = [_matrix_chain(f"Q_{{{i}}}", head.q), _matrix_chain(f"K_{{{i}}}", head.k)]
            if head.v is not None:
                parts.append(_matrix_chain(f"V_{{{i}}}", head.v))
            if all(len(p) == 1 for p in parts) and sum(_printed(p[0]) for p in parts) <= 60:
                # small slices side by side: Q_i = [..], K_i = [..], V_i = [..]
                rows.append(r",\quad ".join(p[0].replace("&=", "=") if k else p[0]
                                            for k, p in enumerate(parts)))
            else:
                rows += [line for p in parts for line in p]
        kv = spec.kv_heads
        share = ("" if kv == h else
                 f" Here {h} query heads share {kv} key/value head"
                 f"{'s' if kv != 1 else ''}: head $i$ uses key/value head "
                 f"$\\lceil i / {h // kv} \\rceil$ (repeat-interleave).")
        steps.append(Step(
            "Split into heads",
            f"each of the $h = {h}$ heads works in its own slice of width $d_k = {d_k}$: "
            f"columns ${d_k}(i-1)+1$ to ${d_k} i$ of $Q$, $K$, $V$ belong to head $i$, so "
            "$h$ heads cost what one full-width head costs." + share,
            (Display(tuple(rows)),)))

    steps += _head_steps(att)

    if att.concat is not None and h > 1:
        joined = r" \mid ".join(rf"\mathrm{{head}}_{{{_sub(k.index)}}}" for k in att.heads)
        d_v = first.output.cols
        steps.append(Step(
            "Concatenate the heads",
            f"the $h = {h}$ outputs of width $d_v = {d_v}$ are placed side by side, "
            f"rebuilding rows of width $h \\cdot d_v = {h * d_v}$.",
            (Display(tuple(_matrix_chain(r"\mathrm{Concat}", att.concat,
                                         symbolic=rf"\left[{joined}\right]"))),)))
    if att.output is not None:
        concat = r"\mathrm{Concat}" if h > 1 else r"\mathrm{head}_{1}"
        rows = _grouped_matrices(mats, ("w_o", "b_o"))
        symbolic = f"{concat}\\, W^{{O}}" + (" + b^{O}" if "b_o" in mats else "")
        rows += _matrix_chain(r"\mathrm{Output}", att.output, symbolic=symbolic)
        steps.append(Step(
            "Apply the output projection $W^{O}$",
            "$W^{O}$ mixes the heads' outputs into the model's space; the identity would "
            "leave the concatenation unchanged.",
            (Display(tuple(rows)),)))
    return steps


def _head_steps(att: Any) -> list[Step]:
    """Scores, scaling, softmax and weighted sum: one step per stage, every head in it."""
    import sympy as sp

    steps: list[Step] = []
    heads = att.heads
    h = len(heads)
    each = " (each head)" if h > 1 else ""
    scale = att.scale
    spec = att.spec

    # -- scores -----------------------------------------------------------------
    if heads[0].q is not None:
        rows = []
        for head in heads:
            i = _sub(head.index)
            product = f"{_operand_tex(head.q)} {_operand_tex(head.k.T)}"
            symbolic = [f"Q_{{{i}}} K_{{{i}}}^{{\\top}}"]
            if len(product) <= WIDE:
                symbolic.append(product)
            rows += _matrix_chain(f"S_{{{i}}}", head.scores, symbolic=" = ".join(symbolic))
        name = "Q_i K_i^{\\top}" if h > 1 else "Q_{1} K_{1}^{\\top}"
        steps.append(Step(
            f"Scores ${name}$" + each,
            "the dot product of query $r$ with key $j$ measures how well they align: "
            "the raw 'how much should $r$ listen to $j$' number, one row per query, "
            "one column per key.",
            (Display(tuple(rows)),)))
    else:
        rows = []
        for head in heads:
            rows += _matrix_chain(f"S_{{{_sub(head.index)}}}", head.scores)
        steps.append(Step(
            "Scores" + each,
            "the scores are given: entry $(r, j)$ says how much query $r$ should listen to "
            "key $j$ (a plain number, possibly negative).",
            (Display(tuple(rows)),)))

    # -- scaling and mask ---------------------------------------------------------
    mask_note = ""
    if spec.mask is not None:
        mask_note = (" The mask $M$ adds $-\\infty$ where a key is masked"
                     + (" (and the stated values elsewhere)" if spec.additive_mask is not None
                        else " and $0$ elsewhere")
                     + ", so a masked key's weight will be exactly $0$"
                     + (" (causal: query $r$ sees keys $j \\le r$"
                        + (", bottom-right aligned" if spec.causal_alignment == "bottom_right"
                           else "") + ")" if spec.mask == "causal" else "") + ".")
    mask_sym = " + M" if spec.mask is not None else ""
    from .derivation_variants import variant_note, variant_rows, variant_symbolic

    mask_note += variant_note(att)
    if att.variants.get("window") is not None and not mask_sym:
        mask_sym = " + M"
    if scale == 1:
        reason = ("no $d_k$ was stated, so the given scores are taken as already scaled "
                  "(scale $1$)" if spec.scale is None else
                  "the example states scale $1$: the scores go into the softmax as they are")
        rows = []
        for head in heads:
            i = _sub(head.index)
            if mask_note:
                rows += variant_rows(att, head)
                rows += _matrix_chain(f"T_{{{i}}}", head.scaled,
                                      symbolic=variant_symbolic(att, i, f"S_{{{i}}}") + mask_sym)
            else:
                rows.append(f"T_{{{i}}} &= S_{{{i}}}")
        steps.append(Step("Scaling", reason + "." + mask_note, (Display(tuple(rows)),)))
    else:
        if spec.scale is None:
            d_k = spec.d_k
            factor = rf"\frac{{1}}{{\sqrt{{d_k}}}} = \frac{{1}}{{\sqrt{{{_tex(d_k)}}}}}"
            why = ("dot products of $d_k$-dimensional vectors grow like $\\sqrt{d_k}$; "
                   "dividing by $\\sqrt{d_k}$ keeps the softmax out of its flat, nearly "
                   "one-hot regions where gradients vanish.")
        else:
            factor = r"\text{scale}"
            why = (f"the stated scale ${_tex(scale)}$ multiplies every score "
                   "(scale $0$ would give uniform weights; scale $1$ leaves them as they are).")
        forms = [factor]
        if getattr(scale, "is_Rational", False) and not scale.is_Integer:
            forms.append(sp.latex(scale))  # 1/8 as a fraction, then as the decimal
        forms.append(_tex(scale))
        d = None if _is_rational(scale) else _digits(scale)
        if d is not None:
            forms.append(d)
        rows = [r"\text{scale} &= " + " = ".join(forms)]
        for head in heads:
            i = _sub(head.index)
            rows += variant_rows(att, head)
            rows += _matrix_chain(f"T_{{{i}}}", head.scaled,
                                  symbolic=variant_symbolic(att, i, rf"\text{{scale}} \cdot "
                                                            rf"S_{{{i}}}") + mask_sym)
        steps.append(Step("Scale the scores", why + mask_note, (Display(tuple(rows)),)))

    # -- softmax --------------------------------------------------------------------
    n_q, n_k = heads[0].weights.shape
    blocks: list[Block] = []
    if n_k == 1:
        blocks.append(Paragraph(
            "With a single key each row has one score and "
            "$\\mathrm{softmax}(s) = e^{s}/e^{s} = 1$: attention is forced to be the identity."))
    rows = []
    for head in heads:
        i = _sub(head.index)
        tag = f"^{{({i})}}" if h > 1 else ""
        if n_q * n_k <= MAX_ENTRY_LINES:
            for r in range(n_q):
                rows += _softmax_row_lines(head.scaled, head.weights, r, tag, n_q, head.sink)
        else:
            blocks.append(Paragraph(
                f"The {n_q} × {n_k} weights of head {i}, each $w_{{rj}} = e^{{t_{{rj}}}} / "
                f"\\sum_{{j'}} e^{{t_{{rj'}}}}$:"))
            blocks.append(Display(tuple(_matrix_chain(f"A_{{{i}}}", head.weights))))
    if rows:
        blocks.append(Display(tuple(rows)))
    steps.append(Step(
        "Softmax, row by row" + each,
        "the softmax turns each row of scores into positive weights that sum to $1$: the "
        "share of its attention query $r$ gives to each key."
        + (" Head $i$'s weights are written $w^{(i)}_{rj}$." if h > 1 else ""),
        tuple(blocks)))

    # -- weighted sum ---------------------------------------------------------------
    if heads[0].output is not None:
        rows = []
        for head in heads:
            i = _sub(head.index)
            tag = f"^{{({i})}}" if h > 1 else ""
            if n_q * n_k <= MAX_ENTRY_LINES:
                for r in range(n_q):
                    rows += _weighted_sum_lines(head.weights, head.v, head.output, r, i, tag)
            else:
                rows += _matrix_chain(rf"\mathrm{{head}}_{{{i}}}", head.output,
                                      symbolic=f"A_{{{i}}} V_{{{i}}}")
        steps.append(Step(
            "Weighted sum of the values" + each,
            "the output of query $r$ is the attention-weighted blend of the value rows "
            "$v_j$: $\\mathrm{head}[r] = \\sum_j w_{rj} v_j$.",
            (Display(tuple(rows)),)))
    return steps


def _softmax_row_lines(t: Any, w: Any, r: int, tag: str, n_q: int,
                       sink: Any = None) -> list[str]:
    import sympy as sp

    n_k = w.cols
    kept = [j for j in range(n_k) if t[r, j] != -sp.oo]
    row = f"{r + 1}" if n_q > 1 else "1"
    if not kept:
        return [rf"w{tag}_{{{row} j}} &= {_tex(w[r, 0])} \quad \text{{for every }} j"
                + (r" \quad (\text{every key masked: the sink keeps all the weight})"
                   if sink is not None else r" \quad (\text{every key masked})")]
    lines: list[str] = []
    exps = [_exp_tex(t[r, j]) for j in kept]
    if sink is not None:  # the sink's e^σ joins the denominator only
        exps.append(_exp_tex(sink))
    denom_inline = " + ".join(exps)
    use_d = len(kept) > 3 or len(denom_inline) > 70
    if use_d:
        lines += _sum_rows(f"D{tag}_{{{row}}}", exps)
        d_sum = sp.Add(*[sp.exp(t[r, j]) for j in kept],
                       *([sp.exp(sink)] if sink is not None else []))
        dd = _digits(d_sum)
        if dd is not None:
            lines.append(f"&= {dd}")
    for j in range(n_k):
        lhs = (f"w{tag}_{{{row}{j + 1}}}" if n_k < 10 and n_q < 10
               else f"w{tag}_{{{row},{j + 1}}}")
        if j not in kept:
            lines.append(rf"{lhs} &= 0 \quad (\text{{masked}})")
            continue
        num = _exp_tex(t[r, j])
        frac = rf"\frac{{{num}}}{{D{tag}_{{{row}}}}}" if use_d else rf"\frac{{{num}}}{{{denom_inline}}}"
        chain = [frac]
        e = w[r, j]
        exact = _tex(e) if _is_rational(e) else _tex_if_short(e, len(frac) - 1)
        if exact is not None:
            chain.append(exact)  # SymPy's own form, when it says more in less space
        if not _is_rational(e):
            d = _digits(e)
            if d is not None:
                chain.append(d)
        lines.append(f"{lhs} &= " + " = ".join(chain))
    return lines


def _weighted_sum_lines(w: Any, v: Any, out: Any, r: int, i: str, tag: str = "") -> list[str]:
    import sympy as sp

    n_k = w.cols
    kept = [j for j in range(n_k) if w[r, j] != 0]
    lhs = rf"\mathrm{{head}}_{{{i}}}[{r + 1}]"
    if not kept or any(w[r, j] is sp.nan for j in range(n_k)):
        row = [_tex(out[r, c]) for c in range(out.cols)]
        return [f"{lhs} &= {_vec_tex(row) if len(row) > 1 else row[0]}"
                r" \quad (\text{every key masked})"]
    vec = [_vec_tex([_tex(v[j, c]) for c in range(v.cols)]) for j in range(v.rows)]
    times = " "
    if v.cols == 1:
        times = r" \cdot "
        vec = [_tex(v[j, 0]) if _is_rational(v[j, 0]) and v[j, 0] >= 0
               else rf"\left({_tex(v[j, 0])}\right)" for j in range(v.rows)]
    symbolic = (" + ".join(f"w{tag}_{{{r + 1}{j + 1}}}{times}{vec[j]}" for j in kept)
                if kept else "0")
    numeric_terms: list[str] = []
    for j in kept:
        d = _tex(w[r, j]) if _is_rational(w[r, j]) else _digits(w[r, j], MATRIX_DIGITS)
        if d is None:
            numeric_terms = []
            break
        sep = times if v.cols == 1 else r"\, "
        numeric_terms.append(f"{d}{sep}{vec[j]}")
    rhs = [symbolic]
    numeric = ""
    if numeric_terms and len(kept) <= 4 and len(kept) > 1:
        numeric = " + ".join(numeric_terms)
        rhs.append(numeric)
    entries = [out[r, c] for c in range(out.cols)]
    tidy = [_tidy(e) for e in entries]
    if all(_is_rational(e) for e in tidy) or sum(_leaves(e, SHORT) for e in tidy) <= SHORT:
        exact = [_tex(e) for e in tidy]
        if all(_is_rational(e) for e in tidy) or sum(len(x) for x in exact) <= SHORT:
            rhs.append(_vec_tex(exact) if len(exact) > 1 else exact[0])
    if not all(_is_rational(e) for e in tidy):
        digits = [_digits(e) for e in tidy]
        if all(d is not None for d in digits):
            rhs.append(_vec_tex([str(d) for d in digits]) if len(digits) > 1 else str(digits[0]))
    rows = [f"{lhs} &= {rhs[0]}"]
    for x in rhs[1:]:
        if x is numeric and len(x) > LINE_CHARS + 20:
            rows += _sum_rows("", numeric_terms)  # the weights written out: break long sums
        else:
            rows.append(f"&= {x}")
    return rows


# -- checks ----------------------------------------------------------------------------


def _over_sum(term: Any) -> tuple[Any, Any] | None:
    """(n, D) when ``term`` is literally n · D^(−1) with D a sum, else None."""
    import sympy as sp

    if term.is_Pow and term.exp == -1 and term.base.is_Add:
        return sp.Integer(1), term.base
    if term.is_Mul:
        inverse = [a for a in term.args if a.is_Pow and a.exp == -1 and a.base.is_Add]
        if len(inverse) == 1:
            rest = [a for a in term.args if a is not inverse[0]]
            return sp.Mul(*rest), inverse[0].base
    return None


def _sums_to_one(total: Any) -> bool:
    """Whether a row of weights provably sums to 1: structurally (every weight is
    nᵢ/D with one shared denominator D, and Σ nᵢ is D itself, as the engine builds a
    softmax row), else by certified evaluation with the exact-identity fallback.  No
    ``together``: it runs ``gcd_terms`` over the whole row, seconds for 13 keys."""
    import sympy as sp

    if total == 1:
        return True
    parts = [_over_sum(t) for t in sp.Add.make_args(total)]
    if all(p is not None for p in parts):
        dens = {d for _, d in parts}  # type: ignore[misc]
        if len(dens) == 1 and sp.Add(*[n for n, _ in parts]) == next(iter(dens)):  # type: ignore[misc]
            return True
    from ..exact.certified import certify

    try:  # an exact identity, proved without polynomial gcds (see certified.py)
        return certify(total - 1).sign() == 0
    except MhaSymbolicError:
        return False


def _backward_steps(grads: Sequence[Any], scale: Any) -> list[Step]:
    """The backward pass of every head against the example's grad_output (Theorem 14)."""
    steps: list[Step] = []
    many = len(grads) > 1
    each = " (each head)" if many else ""
    rows: list[str] = []
    for g in grads:
        i = _sub(g.index)
        rows += _matrix_chain(f"dO_{{{i}}}", g.grad_output)
    steps.append(Step(
        "The gradient of the output" + each,
        "the example states $dO = \\partial L/\\partial O$, how the loss changes with each "
        "entry of the attention output; the backward pass carries it back to the inputs "
        "(Theorem 14 proves each formula below for every size).", (Display(tuple(rows)),)))
    rows = []
    for g in grads:
        i = _sub(g.index)
        rows += _matrix_chain(f"dV_{{{i}}}", g.dv, symbolic=f"A_{{{i}}}^{{\\top}} dO_{{{i}}}")
    steps.append(Step(
        "Values: $dV = A^{\\top} dO$" + each,
        "value $j$ reached output row $r$ with weight $A_{rj}$, so its gradient collects "
        "$A_{rj}\\, dO_r$ from every query row $r$.", (Display(tuple(rows)),)))
    rows = []
    for g in grads:
        i = _sub(g.index)
        rows += _matrix_chain(f"dP_{{{i}}}", g.dp, symbolic=f"dO_{{{i}}} V_{{{i}}}^{{\\top}}")
        rows += _matrix_chain(f"D_{{{i}}}", g.d,
                              symbolic=f"\\operatorname{{rowsum}}(A_{{{i}}} \\circ dP_{{{i}}})")
        rows += _matrix_chain(f"dS_{{{i}}}", g.ds,
                              symbolic=f"A_{{{i}}} \\circ (dP_{{{i}}} - D_{{{i}}})")
    steps.append(Step(
        "Scores: $dS = A \\circ (dP - D)$" + each,
        "$dP_{rj} = dO_r \\cdot v_j$ is how the loss would change if weight $A_{rj}$ alone "
        "moved; the softmax's Jacobian $\\operatorname{diag}(a) - aa^{\\top}$ turns it into the "
        "score gradient $A_{rj}(dP_{rj} - D_r)$ with $D_r = \\sum_j A_{rj} dP_{rj}$, so each "
        "row of $dS$ sums to $0$.", (Display(tuple(rows)),)))
    if grads[0].dq is not None:
        rows = []
        c = _tex(scale)
        for g in grads:
            i = _sub(g.index)
            rows += _matrix_chain(f"dQ_{{{i}}}", g.dq, symbolic=f"{c}\\, dS_{{{i}}} K_{{{i}}}")
            if g.dk is not None:
                rows += _matrix_chain(f"dK_{{{i}}}", g.dk,
                                      symbolic=f"{c}\\, dS_{{{i}}}^{{\\top}} Q_{{{i}}}")
        steps.append(Step(
            "Queries and keys: $dQ = c\\, dS\\, K$, $dK = c\\, dS^{\\top} Q$" + each,
            f"each scaled score is $c\\, q_r \\cdot k_j$ with $c = {c}$, so by the chain rule "
            "query $r$ collects $c\\, dS_{rj} k_j$ and key $j$ collects $c\\, dS_{rj} q_r$.",
            (Display(tuple(rows)),)))
    return steps


def _attention_checks(att: Any) -> list[Check]:
    import sympy as sp

    from ..exact.shapes import Shape

    positive = zeros = undecided = negative = 0
    row_total = row_ok = row_empty = 0
    bad_rows: list[str] = []
    summed: set[tuple[int, int]] = set()  # (head, row) whose weights provably sum to 1
    for head in att.heads:
        w, t = head.weights, head.scaled
        for r in range(w.rows):
            kept = [j for j in range(w.cols) if t[r, j] != -sp.oo]
            for j in range(w.cols):
                e = w[r, j]
                if j not in kept:
                    if e == 0:
                        zeros += 1
                    elif e is not sp.nan:
                        negative += 1
                    continue
                if _has_symbols(e):
                    undecided += 1
                    continue
                sign = _sign(e)
                if sign > 0:
                    positive += 1
                else:
                    negative += 1
            row_total += 1
            if not kept:
                row_empty += 1
                continue
            sink_w = head.sink_weight[r, 0] if head.sink_weight is not None else 0
            if _sums_to_one(sp.Add(*[w[r, j] for j in range(w.cols)], sink_w)):
                row_ok += 1
                summed.add((head.index, r))
            else:
                bad_rows.append(f"head {head.index + 1} row {r + 1}")
    detail = (f"{positive} weights certified $> 0$ (signs decided on Arb enclosures)"
              + (f"; {zeros} masked weights exactly $0$" if zeros else "")
              + (f"; {undecided} symbolic weights left undecided" if undecided else "")
              + (f"; {negative} weights not positive" if negative else "") + ".")
    checks = [Check("weights positive", negative == 0 and undecided == 0, detail)]
    sinks = att.heads[0].sink is not None
    detail = (f"{row_ok} of {row_total - row_empty} rows: $\\sum_j w_{{rj}}"
              + (" + w_{r,\\text{sink}}" if sinks else "")
              + " - 1$ simplifies to exactly $0$ (SymPy)")
    if row_empty:
        detail += (f"; {row_empty} fully masked rows get weights "
                   f"'{att.spec.masked_rows}' by policy")
    if bad_rows:
        detail += "; not proved for " + ", ".join(bad_rows)
    checks.append(Check("rows sum to 1", not bad_rows, detail + "."))

    if att.heads[0].output is not None:
        inside = total = 0
        outside: list[str] = []
        for head in att.heads:
            w, v, out = head.weights, head.v, head.output
            if out.shape != (w.rows, v.cols):
                outside.append(f"head {head.index + 1} (its shape is not "
                               f"${_shape_tex((w.rows, v.cols))}$)")
                continue
            for r in range(out.rows):
                kept = [j for j in range(w.cols) if w[r, j] != 0]
                if (not kept or any(_has_symbols(x) for x in out.row(r))
                        or any(x is sp.nan for x in w.row(r))):
                    continue  # symbolic, or a fully masked row under the 'nan' policy
                for c in range(out.cols):
                    # a sink is a key whose value is 0: it joins the convex combination
                    col = [v[j, c] for j in kept] + ([sp.Integer(0)]
                                                     if head.sink is not None else [])
                    # min/max by float keys: a wrong pick only makes the test stricter
                    lo, hi = min(col, key=_sort_key), max(col, key=_sort_key)
                    total += 1
                    val = out[r, c]
                    if lo == hi and (head.index, r) in summed:
                        # every value is lo, so the output is lo · Σ_j w_rj = lo exactly
                        # (the row sum was proved to be 1 above): no enclosure needed
                        inside += 1
                        continue
                    ge = _sign(val - lo) >= 0
                    le = _sign(hi - val) >= 0
                    if ge and le:
                        inside += 1
                    else:
                        outside.append(f"head {head.index + 1}[{r + 1}, {c + 1}]")
        detail = (f"{inside} of {total} output coordinates certified to lie between the "
                  "smallest and largest value coordinate of the keys they attend to "
                  "(a convex combination cannot leave that range)")
        if outside:
            detail += "; outside: " + ", ".join(outside)
        checks.append(Check("outputs within the values", not outside, detail + "."))

    # shapes: each product's inner sizes agree and the results have the stated shapes
    problems: list[str] = []
    done: list[str] = []
    try:
        for head in att.heads:
            k = _sub(head.index)
            s_shape = Shape(*head.scores.shape)
            if head.q is not None:
                got = Shape(*head.q.shape).matmul(Shape(*head.k.T.shape),
                                                  left=f"Q_{k}", right=f"K_{k}^T")
                if got != s_shape:
                    problems.append(f"S_{k} is {s_shape}, expected {got}")
            if Shape(*head.weights.shape) != s_shape:
                problems.append(f"A_{k} is {Shape(*head.weights.shape)}, expected {s_shape}")
            if head.output is not None:
                got = s_shape.matmul(Shape(*head.v.shape), left=f"A_{k}", right=f"V_{k}")
                if got != Shape(*head.output.shape):
                    problems.append(f"head_{k} is {Shape(*head.output.shape)}, expected {got}")
        first = att.heads[0]
        done.append(f"$S_i$: ${_shape_tex(first.scores.shape)}$")
        if first.output is not None:
            done.append(f"$\\mathrm{{head}}_i$: ${_shape_tex(first.output.shape)}$")
        if att.concat is not None:
            width = sum(hd.output.cols for hd in att.heads)
            if att.concat.shape != (first.output.rows, width):
                problems.append("Concat has the wrong width")
            done.append(f"Concat: ${_shape_tex(att.concat.shape)}$")
        if att.output is not None:
            done.append(f"Output: ${_shape_tex(att.output.shape)}$")
    except MhaSymbolicError as exc:
        problems.append(str(exc))
    detail = ("every product's inner sizes agree (shape checker): " + ", ".join(done))
    if problems:
        detail += "; " + "; ".join(problems)
    checks.append(Check("shapes agree", not problems, detail + "."))
    return checks


def _sort_key(e: Any) -> Any:

    return _certified(e).to_float() if not _is_rational(e) else e


def _shape_tex(shape: tuple[int, int]) -> str:
    return f"{shape[0]} \\times {shape[1]}"


# ---------------------------------------------------------------------------
# Dimension-only examples: shape algebra and parameter counts
# ---------------------------------------------------------------------------


def _shape_steps(spec: Any) -> tuple[list[Step], list[Check]]:
    from ..exact.shapes import Shape, attention_shapes, same_size

    table = attention_shapes(spec)
    sh = {e.name: e.shape for e in table.entries}

    def tex(s: Shape) -> str:
        return s.latex()

    def prod(a: Shape, b: Shape, out: Shape) -> str:
        return rf"\left({tex(a)}\right) \cdot \left({tex(b)}\right) = {tex(out)}"

    cross = spec.is_cross
    src = "X_{kv}" if cross else "X"
    products = [
        ("Q_i = X W^{Q}_i", sh["x"], sh["w_q"], sh["q"]),
        (f"K_i = {src} W^{{K}}_i", sh["x_kv"], sh["w_k"], sh["k"]),
        (f"V_i = {src} W^{{V}}_i", Shape(sh["x_kv"].rows, spec.vdim), sh["w_v"], sh["v"]),
    ]
    rows = [f"{name} &: {prod(a, b, c)}" for name, a, b, c in products]
    steps = [Step(
        "Project",
        ("queries come from the query side (the decoder), keys and values from the other "
         "sequence (the encoder): " if cross else
         "queries, keys and values all come from the same tokens: ")
        + f"$Q_i \\in \\mathbb{{R}}^{{{tex(sh['q'])}}}$, "
        f"$K_i \\in \\mathbb{{R}}^{{{tex(sh['k'])}}}$, $V_i \\in \\mathbb{{R}}^{{{tex(sh['v'])}}}$.",
        (Display(tuple(rows)),))]
    steps.append(Step(
        "Scores $Q_i K_i^{\\top}$",
        "each query row is dotted with each key row: one row per query token, one column "
        "per key token" + (" (not square: the hallmark of cross-attention)." if cross else "."),
        (Display((f"Q_i K_i^{{\\top}} &: {prod(sh['q'], sh['k'].T, sh['scores'])}",)),)))
    steps.append(Step(
        "Softmax over the key axis",
        "each query distributes its attention over the keys; the softmax keeps the shape "
        "and makes each row sum to $1$.",
        (Display((f"A_i = \\mathrm{{softmax}}(Q_i K_i^{{\\top}} / \\sqrt{{d_k}}) &: "
                  f"{tex(sh['weights'])}",)),)))
    steps.append(Step(
        "Times $V_i$",
        "the inner dimension (the number of keys) cancels; the output length follows the "
        "query side.",
        (Display((f"\\mathrm{{head}}_i = A_i V_i &: {prod(sh['weights'], sh['v'], sh['head'])}",)),)))
    h = spec.heads
    steps.append(Step(
        "Concatenate and project",
        "the $h$ heads side by side give width $h \\cdot d_v$; $W^{O}$ maps it back to "
        "$d_{model}$.",
        (Display((
            f"\\mathrm{{Concat}} &: {tex(sh['concat'])} \\quad (h \\cdot d_v = "
            f"{_tex(h)} \\cdot {_tex(spec.d_v)} = {_tex(_simplify(h * spec.d_v))})",
            f"\\mathrm{{Concat}}\\, W^{{O}} &: {prod(sh['concat'], sh['w_o'], sh['output'])}",
        )),)))
    # checks: recompute every product with the checker, independently of the table's order
    detail = []
    ok = True
    for name, a, b, c in [
        *products,
        ("Q_i K_i^T", sh["q"], sh["k"].T, sh["scores"]),
        ("A_i V_i", sh["weights"], sh["v"], sh["head"]),
        ("Concat W^O", sh["concat"], sh["w_o"], sh["output"]),
    ]:
        try:
            got = a.matmul(b)
            good = same_size(got.rows, c.rows) and same_size(got.cols, c.cols)
        except MhaSymbolicError:
            good = False
        ok = ok and good
        detail.append(_CHECK_NAMES.get(name, name.split(" =")[0]))
    checks = [Check(
        "shapes agree", ok,
        "inner sizes agree for " + ", ".join(f"${d}$" for d in detail)
        + " (shape checker: equal numbers or a proved symbolic identity).")]
    back = same_size(h * spec.d_v, spec.d_model)
    checks.append(Check(
        "heads rebuild d_model", bool(back),
        f"$h \\cdot d_v = {_tex(_simplify(h * spec.d_v))}$ "
        + ("equals" if back else "differs from") + f" $d_{{model}} = {_tex(spec.d_model)}$."))
    return steps, checks


_CHECK_NAMES = {"Q_i K_i^T": r"Q_i K_i^{\top}", "A_i V_i": "A_i V_i",
                "Concat W^O": r"\mathrm{Concat}\, W^{O}"}


def _simplify(x: Any) -> Any:
    if isinstance(x, int):
        return x
    import sympy as sp

    x = sp.simplify(x)
    return int(x) if x.is_Integer else x


def _count_steps(spec: Any) -> tuple[list[Step], list[Check]]:
    import sympy as sp

    from ..exact.params import parameter_count

    count = parameter_count(spec)
    h, g = spec.heads, spec.kv_heads
    steps: list[Step] = []
    widths = {"W^Q": (spec.d_model, h, spec.d_k), "W^K": (spec.kdim, g, spec.d_k),
              "W^V": (spec.vdim, g, spec.d_v)}
    rows = []
    proj_total: Any = 0
    for name, _shape_text, c in count.parts:
        if name not in widths:
            continue
        rows_in, n_heads, width = widths[name]
        per_head = _simplify(rows_in * width)
        lhs = _param_tex(name)
        rows.append(
            f"{lhs} &: {n_heads} \\times \\left({_tex(rows_in)} \\times {_tex(width)}\\right) = "
            f"{_tex(n_heads)} \\times {_tex(per_head)} = {_tex(c)}")
        proj_total = proj_total + c
    proj_total = _simplify(proj_total)
    rows.append(f"\\text{{together}} &= {_tex(proj_total)}")
    steps.append(Step(
        "Per-head projections",
        f"each head $i$ has its own $W^{{Q}}_i \\in \\mathbb{{R}}^{{{_tex(spec.d_model)} \\times "
        f"{_tex(spec.d_k)}}}$ (and likewise $W^{{K}}_i$, $W^{{V}}_i$); side by side the heads' "
        "matrices form one stacked projection.",
        (Display(tuple(rows)),)))
    for name, _shape_text, c in count.parts:
        if name == "W^O":
            steps.append(Step(
                "Output projection $W^{O}$",
                "$W^{O}$ maps the concatenated heads back to the model width.",
                (Display((f"W^{{O}} &: {_tex(_simplify(h * spec.d_v))} \\times "
                          f"{_tex(spec.d_model)} = {_tex(c)}",)),)))
    biases = [(n, c) for n, _, c in count.parts if not n.startswith("W")]
    if biases:
        steps.append(Step(
            "Biases",
            "one bias per output unit of each projection"
            + (" (and the learned extra key/value rows)" if spec.add_bias_kv else "") + ".",
            (Display(tuple(f"{_param_tex(n)} &: {_tex(c)}" for n, c in biases)),)))
    terms = [_tex(c) for _, _, c in count.parts]
    total = count.total
    rows = _sum_rows(r"\text{total}", terms)
    rows.append(f"&= {_tex(total)}")
    d = spec.d_model
    steps.append(Step("Total", "the block's learnable numbers are the sum of its parts.",
                      (Display(tuple(rows)),)))
    # checks: an independent integer sum, and the 4 d_model^2 (+ 4 d_model) rule
    independent = sp.Add(*[sp.sympify(c) for _, _, c in count.parts])
    same = sp.simplify(independent - sp.sympify(total)) == 0
    checks = [Check("sum of the parts", bool(same),
                    f"adding the {len(count.parts)} parts again gives ${_tex(sp.expand(independent))}$"
                    f", {'equal to' if same else 'different from'} the total.")]
    if h == g and spec.kdim == d and spec.vdim == d and not spec.add_bias_kv:
        rule = 4 * sp.sympify(d) ** 2 + (4 * sp.sympify(d) if spec.bias else 0)
        holds = sp.simplify(sp.sympify(total) - rule) == 0
        rule_tex = "4 d_{model}^2" + (" + 4 d_{model}" if spec.bias else "")
        numbers = ""
        if isinstance(d, int):
            numbers = f" = 4 \\cdot {d}^2" + (f" + 4 \\cdot {d}" if spec.bias else "")
        value = _tex(sp.expand(rule))
        if isinstance(total, int) and total > 0 and total & (total - 1) == 0:
            value += f" = 2^{{{total.bit_length() - 1}}}"
        checks.append(Check(
            "rule of thumb", bool(holds),
            f"${rule_tex}{numbers} = {value}$, "
            + ("equal to" if holds else "different from") + " the total."))
    return steps, checks


def _param_tex(name: str) -> str:
    table = {"W^Q": "W^{Q}", "W^K": "W^{K}", "W^V": "W^{V}", "W^O": "W^{O}",
             "b^Q": "b^{Q}", "b^K": "b^{K}", "b^V": "b^{V}", "b^O": "b^{O}",
             "bias_k": r"\mathrm{bias}_k", "bias_v": r"\mathrm{bias}_v"}
    return table.get(name, rf"\mathrm{{{latex_escape(name)}}}")


# ---------------------------------------------------------------------------
# Claims (from the textbook checker) and the public entry point
# ---------------------------------------------------------------------------


def _claim_lines(example: Any, records: Sequence[Any]) -> tuple[ClaimLine, ...]:
    """One line per claim, in the example's order, from the checker's records.

    The certified digits and the verdict are the checker's, as it reports them; the
    exact value's LaTeX comes from ``record.exact_expr`` when the record carries it,
    else from the checker's own evaluation of the claim's quantity."""
    out = []
    claims = list(getattr(example, "claims", ()) or ())
    for k, rec in enumerate(records):
        expr = getattr(rec, "exact_expr", None)
        if expr is None and k < len(claims) and len(records) == len(claims):
            expr = _claim_value(example, claims[k])
        exact_latex: str | None = None
        if expr is not None:
            text = _exact_tex(expr)
            if text is not None and len(text) <= SHORT * 2:
                exact_latex = text
        head = int(getattr(rec, "head", 1) or 1)
        quantity = str(getattr(rec, "quantity", "")) + (f" (head {head})" if head != 1 else "")
        verdict = str(getattr(rec, "verdict", ""))
        precision = getattr(rec, "precision", None)
        if precision and verdict not in ("exact",) and precision != "shape":
            verdict += f" ({precision})"
        if not getattr(rec, "ok", False) and getattr(rec, "rounded", None):
            verdict += f"; correct answer {rec.rounded}"
            if getattr(rec, "error_units", None):
                verdict += f", off by {rec.error_units} in the last printed digit"
        out.append(ClaimLine(
            quantity=quantity,
            claimed=str(getattr(rec, "claimed", "")),
            exact_latex=exact_latex,
            exact_digits=str(getattr(rec, "exact", "") or ""),
            verdict=verdict,
            ok=bool(getattr(rec, "ok", False)),
            diagnosis=str(getattr(rec, "diagnosis", "") or ""),
            note=" ".join(str(getattr(rec, "note", "") or "").split()),
        ))
    return tuple(out)


def _claim_value(example: Any, claim: Any) -> Any:
    """The exact value of a claim's quantity, as the checker computes it (None if unknown)."""
    try:
        from .quantities import quantity_value
    except ImportError:  # pragma: no cover - textbook without that helper
        return None
    if getattr(claim, "error", None) is not None:
        return None  # an unreadable claim has no value
    try:
        return quantity_value(example, claim)
    except MhaSymbolicError:
        return None


def _exact_tex(expr: Any) -> str | None:
    import sympy as sp

    from ..exact.shapes import Shape

    if isinstance(expr, Shape):
        return expr.latex()
    if isinstance(expr, (int, sp.Basic)):
        return _tex_if_short(_tidy(expr) if isinstance(expr, sp.Basic) else expr, SHORT * 2)
    if isinstance(expr, (tuple, list)) and all(isinstance(e, (int, sp.Basic)) for e in expr):
        parts = [_tex_if_short(e, SHORT * 2) for e in expr]
        return None if any(p is None for p in parts) else _vec_tex(parts)  # type: ignore[arg-type]
    return None


def _is_example(obj: Any) -> bool:
    return hasattr(obj, "claims") and hasattr(obj, "attention") and hasattr(obj, "name")


def _records_for(example: Any, report: Any) -> list[Any]:
    if report is None:
        if not getattr(example, "claims", None):
            return []
        from .check import check_examples

        report = check_examples([example])
    return [r for r in report.records if _record_example_name(r) == example.name]


def _record_example_name(rec: Any) -> str:
    ex = getattr(rec, "example", None)
    return str(getattr(ex, "name", ex))


def _wants(example: Any, kind: str) -> bool:
    """Whether a dimension-only example asks about shapes or about counts (by its
    claims' quantities: ``shape.*``/``dim.*`` or ``params.*``); both when it has none."""
    quantities = [str(getattr(c, "quantity", "")) for c in getattr(example, "claims", ()) or ()]
    if not quantities:
        return True
    prefixes = ("params.",) if kind == "count" else ("shape.", "dim.")
    return any(q.replace(" ", "").startswith(prefixes) for q in quantities)


def _derive_spec(name: str, title: str, notes: str, spec: Any, example: Any) -> ExampleDerivation:
    steps: list[Step] = []
    checks: list[Check] = []
    shapes = spec.n_q is not None and _wants(example, "shape")
    counts = _wants(example, "count") or not shapes
    if shapes:
        s, c = _shape_steps(spec)
        steps += s
        checks += c
    if counts:
        s, c = _count_steps(spec)
        steps += s
        checks += c
    return ExampleDerivation(name, title, notes, tuple(steps), tuple(checks))


def _derive_one(obj: Any, report: Any) -> ExampleDerivation:
    from ..exact.engine import ExactAttention
    from ..exact.spec import AttentionSpec

    if isinstance(obj, ExactAttention):
        return ExampleDerivation("attention", "Attention", "", tuple(_attention_steps(obj)),
                                 tuple(_attention_checks(obj)))
    if isinstance(obj, AttentionSpec):
        return _derive_spec("spec", "Attention block", "", obj, None)
    if not _is_example(obj):
        raise SpecError(
            f"derive() takes a WorkedExample, an ExactAttention, an AttentionSpec or a list "
            f"of them; got {type(obj).__name__}")
    name = str(obj.name)
    title = f"Example {name}" + (f" — {obj.title}" if getattr(obj, "title", "") else "")
    notes = str(getattr(obj, "notes", "") or "")
    att = obj.attention()
    if att is not None:
        steps = _attention_steps(att, getattr(obj, "inputs", None))
        grads = obj.gradients() if hasattr(obj, "gradients") else None
        if grads is not None:
            steps += _backward_steps(grads, att.scale)
        ex = ExampleDerivation(name, title, notes, tuple(steps), tuple(_attention_checks(att)))
    elif getattr(obj, "spec", None) is not None:
        ex = _derive_spec(name, title, notes, obj.spec, obj)
    else:
        raise ExampleFileError(f"example {name!r} has neither inputs nor sizes to derive from")
    return replace(ex, claims=_claim_lines(obj, _records_for(obj, report)))


def derive(
    example_or_attention: Any,
    *,
    format: str = "tex",
    report: Any = None,
    title: str = DEFAULT_TITLE,
    figures: str | Path | None = None,
    relative_to: str | Path | None = None,
) -> Derivation:
    r"""Derive one or more worked examples (or exact attention computations) step by step.

    ``example_or_attention``: a :class:`~mha_symbolic.textbook.examples.WorkedExample`, an
    :class:`~mha_symbolic.exact.engine.ExactAttention`, an
    :class:`~mha_symbolic.exact.spec.AttentionSpec` (shape algebra and counts), or a
    list of them.  ``report``: a :class:`~mha_symbolic.textbook.reports.CheckReport`
    whose records give the verdicts; when omitted, examples with claims are
    checked here.  ``figures``: a directory to draw figures into (needs
    matplotlib); the document refers to them relative to ``relative_to``
    (default: the current directory).

    >>> from mha_symbolic.exact.engine import exact_attention
    >>> d = derive(exact_attention(scores=[[2, 2, 2]], value=[[10], [20], [30]]),
    ...            format="fragment")
    >>> r"w_{11} &= \frac{e^{2}}{e^{2} + e^{2} + e^{2}} = \frac{1}{3}" in d.text
    True
    """
    if format not in FORMATS:
        raise SpecError(f"format={format!r} must be one of {', '.join(FORMATS)}")
    if isinstance(example_or_attention, (list, tuple)):
        items = list(example_or_attention)
        if not items:
            raise SpecError("derive() got an empty list of examples")
    else:
        items = [example_or_attention]
    derived = [_derive_one(obj, report) for obj in items]
    if figures is not None:
        derived = [_with_figures(ex, obj, Path(figures), relative_to, format)
                   for ex, obj in zip(derived, items, strict=True)]
    return Derivation(tuple(derived), format=format, title=title)


def _with_figures(ex: ExampleDerivation, obj: Any, folder: Path,
                  relative_to: str | Path | None, fmt: str) -> ExampleDerivation:
    from . import figures as fig

    att = obj if not _is_example(obj) else obj.attention()
    if att is None or not hasattr(att, "heads"):
        return ex
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".png" if fmt == "markdown" else ".pdf"
    stem = re.sub(r"[^A-Za-z0-9-]+", "-", ex.name).strip("-") or "example"
    base = Path(relative_to) if relative_to is not None else Path.cwd()
    made: list[Figure] = []
    if att.heads[0].weights.cols > 1:
        path = folder / f"{stem}-weights{suffix}"
        fig.heatmap_figure(att, path, title=f"{ex.name}: attention weights"
                           if not _is_example(obj) else f"Example {ex.name}: attention weights")
        made.append(Figure(str(path), _relative(path, base),
                           "Attention weights (rows: queries, columns: keys), certified values "
                           "rounded to 3 places."))
    collapse = fig.collapse_parameters(att)
    if collapse is not None:
        n, gap = collapse
        path = folder / f"{stem}-collapse{suffix}"
        fig.collapse_figure(path, n_tokens=n, gap=gap)
        made.append(Figure(str(path), _relative(path, base),
                           f"Weight on the dominant token against the score gap ({n} tokens); "
                           f"the dot marks this example's gap ${_tex(gap)}$."))
    return replace(ex, figures=tuple(made))


def _relative(path: Path, base: Path) -> str:
    import os

    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


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


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text


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


def _render_markdown(d: Derivation, math: str = "github") -> str:
    out: list[str] = [f"# {_md_text(d.title)}", ""]
    out.append("Generated by `mha-symbolic derive`. Every number below comes from the exact "
               "engine; decimals show certified digits only (`…`: more digits follow). The "
               "checks closing each example are computed, and each claim of the text carries "
               "the checker's verdict.")
    out.append("")
    for ex in d.examples:
        out.append(f"## {_md_text(ex.title)}")  # file text: plain, never markup
        out.append("")
        for para in _paragraphs(ex.notes):
            out += [_md_text(para), ""]
        for k, step in enumerate(ex.steps, 1):
            out += [f"### {k}. {_markup_md(step.title)}", ""]
            out += [f"*Why this step?* {_markup_md(_capital(step.why))}", ""]
            for block in step.blocks:
                out += _block_md(block, math)
        for figure in ex.figures:
            out += _block_md(figure, math)
        out += ["### Checks", ""]
        for c in ex.checks:
            out.append(f"- {_mark(c.ok)[1]} **{_md_text(c.name)}**: {_markup_md(c.detail)}")
        out.append("")
        if ex.claims:
            out += ["### The text's claims", ""]
            for cl in ex.claims:
                out.append(f"- {_mark(cl.ok)[1]} " + _claim_md(cl))
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _claim_md(cl: ClaimLine) -> str:
    parts = [f"**{_md_text(cl.quantity)}**: the text says "
             f"`{sanitize(cl.claimed).replace('`', '')}`"]
    if cl.exact_digits and "…" not in cl.exact_digits:
        parts.append(f"; exact value `{cl.exact_digits}`")
    else:
        if cl.exact_latex:
            parts.append(f"; exact ${cl.exact_latex}$")
        if cl.exact_digits:
            parts.append(f"; certified digits `{cl.exact_digits}`")
    parts.append(f". Verdict: *{_md_text(cl.verdict)}*")
    if cl.diagnosis:
        parts.append(f". Diagnosis: {_md_text(cl.diagnosis)}")
    text = "".join(parts) + "."
    if cl.note:
        text += f" ({_md_text(cl.note)})"
    return text


def _block_md(block: Block, math: str = "github") -> list[str]:
    """Markdown lines of a block.

    Displayed math goes in a fenced ``math`` block for GitHub, which passes it to
    MathJax untouched (inside ``$$`` GitHub's Markdown pass eats a ``\\\\`` that is
    not at the end of a line, which breaks matrices); ``math="dollars"`` writes
    ``$$ ... $$`` with every ``\\\\`` at a line end, for Jupyter, pandoc and MkDocs.
    """
    if isinstance(block, Paragraph):
        return [_markup_md(block.text), ""]
    if isinstance(block, Display):
        if len(block.lines) == 1 and "&" not in block.lines[0]:
            body = [block.lines[0]]
        else:
            body = ["\\begin{aligned}", " \\\\\n".join(block.lines), "\\end{aligned}"]
        if math == "github":
            return ["```math", *body, "```", ""]
        text = "\n".join(body).replace("\\\\", "\\\\\n").replace("\n\n", "\n")
        return ["$$", text, "$$", ""]
    alt = _md_text(_plain(block.caption))
    return [f"![{alt}]({block.ref})", "", f"*{_markup_md(block.caption)}*", ""]


def _render_mathjax(d: Derivation) -> str:
    rows: list[str] = []
    for ex in d.examples:
        rows.append("&" + rf"\textbf{{{latex_escape(ex.title)}}}")  # file text: plain
        for step in ex.steps:
            rows.append("&" + _markup_math(step.title, r"\textit"))
            for block in step.blocks:
                if isinstance(block, Display):
                    rows += [line if "&" in line else "&" + line for line in block.lines]
        for c in ex.checks:
            mark = r"\checkmark" if c.ok else r"\times"
            rows.append(rf"&{mark}\ \text{{{latex_escape(c.name)}}}")
    return "$$\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}$$"


def _markup_math(markup: str, font: str) -> str:
    """Markup inside math mode: text parts in ``font{...}``, math parts as they are."""
    parts = []
    pos = 0
    for m in _MARKUP.finditer(markup):
        if markup[pos:m.start()]:
            parts.append(f"{font}{{{latex_escape(markup[pos:m.start()])}}}")
        parts.append(m.group(1))
        pos = m.end()
    if markup[pos:]:
        parts.append(f"{font}{{{latex_escape(markup[pos:])}}}")
    return "".join(parts)


def _plain(markup: str) -> str:
    """Markup with its math delimiters dropped (for titles inside ``\\text``)."""
    return _MARKUP.sub(lambda m: re.sub(r"[\\{}^_]", "", m.group(1)), markup)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _select(examples: list[Any], names: Sequence[str] | None) -> list[Any]:
    from .examples import select_examples

    return select_examples(examples, names)


def cli_derive(args: Any) -> int:
    """``mha-symbolic derive FILE [--format F] [-o OUT] [--example NAME] [--pdf] [--figures]``."""
    from .._io import output_path, write_output
    from .check import check_examples, load_examples

    fmt = args.format
    out = output_path(args.output, inputs=[args.file])
    if args.pdf and (out is None or fmt != "tex"):
        raise SpecError("--pdf needs -o OUT and --format tex (the default)")
    if args.figures and out is None:
        raise SpecError("--figures needs -o OUT: the figures are written next to it")
    examples = _select(load_examples(args.file), args.example)
    report = check_examples(examples) if any(getattr(e, "claims", None) for e in examples) else None
    # the figures' folder name goes into \includegraphics: letters, digits, '.', '-' only
    figures_dir = (out.parent / (re.sub(r"[^A-Za-z0-9.-]+", "-", out.stem).strip("-.")
                                 + "-figures") if (args.figures and out) else None)
    derivation = derive(examples, format=fmt, report=report, figures=figures_dir,
                        relative_to=out.parent if out else None,
                        title=f"Derivations: {Path(args.file).name}")
    text = derivation.text
    if out is None:
        print(text, end="")
        return 0
    write_output(out, text)
    if args.pdf:
        from .._latex import compile_tex

        resources = [f.ref for ex in derivation.examples for f in ex.figures]
        pdf = compile_tex(out, resources=resources)
        print(f"wrote {sanitize(str(out))} and {sanitize(str(pdf))}")
    else:
        print(f"wrote {sanitize(str(out))}")
    return 0
