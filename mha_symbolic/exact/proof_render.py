r"""How the proofs are printed: the book's LaTeX conventions, the cross-check tables,
and the text, Markdown and HTML tables of results.

Conventions (those of a mathematics textbook, applied to everything SymPy renders):

* a multi-letter subscript or name is upright: ``d_model`` prints as
  :math:`d_{\mathrm{model}}`, ``kdim`` as :math:`\operatorname{kdim}` (spaced from its
  neighbours like ``\sin``, with ``{}`` after it so that a following ``+`` stays binary);
* an exponent that holds a fraction or a sum is written with ``\exp``:
  :math:`\exp\left(\frac{x}{2}\right)` rather than a tiny ``e^{\frac{x}{2}}``;
* integers of five digits or more are grouped by thin spaces, as siunitx does
  (``1\,048\,576``); very small or very large numbers are written in scientific
  notation (``1.27 \times 10^{-14}``), never as long decimals.

The cross-checks of one theorem are printed as one ``booktabs`` table: one row per
*claim* (the statement checked), with how many cases were checked, the range of the
parameters over those cases, and the result (the largest certified difference for an
agreement, ``skipped`` with its reason for a check that could not run).

>>> book_latex_number(1048576)
'1\\,048\\,576'
>>> plain_text(r"$|w_i - \tfrac1n| \le \beta$")
'|w_i - 1/n| ≤ β'
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .prove import CheckRecord, ProofResult

__all__ = ["CheckGroup", "book_latex", "book_latex_number", "check_groups", "plain_text",
           "results_html", "results_markdown", "results_text"]


# ---------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------


def _group(digits: str, sep: str) -> str:
    """``1048576`` -> ``1 048 576`` (groups of three from the right, five digits or more)."""
    if len(digits) < 5:
        return digits
    head = len(digits) % 3 or 3
    return sep.join([digits[:head]] + [digits[k:k + 3] for k in range(head, len(digits), 3)])


def book_latex_number(value: int, *, sep: str = r"\,") -> str:
    r"""An integer in LaTeX with siunitx-style digit grouping (five digits or more).

    >>> book_latex_number(-12345), book_latex_number(1234)
    ('-12\\,345', '1234')
    """
    sign = "-" if value < 0 else ""
    return sign + _group(str(abs(value)), sep)


def _rational_latex(value: Any) -> str:
    """An exact rational (int, fmpq, fmpz, Fraction) in LaTeX, slashed: ``-757/16``."""
    text = str(value)
    if "/" in text:
        num, den = text.split("/")
        return f"{book_latex_number(int(num))}/{book_latex_number(int(den))}"
    try:
        return book_latex_number(int(text))
    except ValueError:
        return text


_SCI = re.compile(r"^([+-]?\d+(?:\.\d+)?)e([+-]?\d+)$")


def sci_latex(text: str) -> str:
    r"""A decimal string ``1.2664e-14`` as ``1.2664 \times 10^{-14}`` (unchanged if it has
    no exponent; exponents between -3 and 4 are written out as plain decimals by Arb).

    >>> sci_latex("1.27e-14")
    '1.27 \\times 10^{-14}'
    """
    m = _SCI.match(text.strip())
    if not m:
        return text
    return rf"{m.group(1)} \times 10^{{{int(m.group(2))}}}"


# ---------------------------------------------------------------------------
# SymPy -> LaTeX, the book's way
# ---------------------------------------------------------------------------


def _tall(tex: str) -> bool:
    """An exponent that would be set too small and too high: a fraction, a sum, a root."""
    return any(cmd in tex for cmd in (r"\frac", r"\sum", r"\sqrt", r"\prod", r"\left"))


# Names of several letters set upright as a whole (SymPy reads other names such as
# "shat" as a letter with a modifier, \hat{s}, so no general rule is safe here).
_UPRIGHT_NAMES = frozenset({"kdim", "vdim"})


@lru_cache(maxsize=1)
def _printer_class() -> Any:
    from sympy.printing.latex import LatexPrinter, greek_letters_set

    class BookPrinter(LatexPrinter):
        """sympy.latex with upright multi-letter names, ``\\exp`` for tall exponents and
        grouped digits."""

        def _print_Symbol(self, expr: Any, style: str = "plain") -> str:
            name = expr.name
            m = re.fullmatch(r"([A-Za-z])_([a-z]{2,})", name)
            if m and m.group(2) in ("max", "min"):
                return rf"{m.group(1)}_{{\{m.group(2)}}}"
            if m and m.group(2) not in greek_letters_set:
                return rf"{m.group(1)}_{{\mathrm{{{m.group(2)}}}}}"
            if name in _UPRIGHT_NAMES:  # spaced like \sin: "d_k \operatorname{kdim}"
                return rf"\operatorname{{{name}}}{{}}"  # {}: a "+" after it stays binary
            return str(super()._print_Symbol(expr, style))

        def _print_ExpBase(self, expr: Any, exp: Any = None) -> str:
            arg = self._print(expr.args[0])
            tex = rf"\exp\left({arg}\right)" if _tall(arg) else f"e^{{{arg}}}"
            return str(self._do_exponent(tex, exp))

        def _print_Transpose(self, expr: Any) -> str:
            return str(super()._print_Transpose(expr)).replace("^{T}", r"^{\top}")

        def _print_Integer(self, expr: Any) -> str:
            return book_latex_number(int(expr))

    return BookPrinter


def book_latex(expr: Any) -> str:
    r"""``sympy.latex(expr)`` with the book's conventions (see the module's docstring);
    a string is taken as LaTeX already and returned unchanged.

    >>> import sympy
    >>> book_latex(sympy.Symbol("d_model") * sympy.exp(sympy.Symbol("x") / 2))
    'd_{\\mathrm{model}} \\exp\\left(\\frac{x}{2}\\right)'
    """
    if isinstance(expr, str):
        return expr
    import sympy

    return str(_printer_class()(settings={}).doprint(sympy.sympify(expr)))


# ---------------------------------------------------------------------------
# the library's own LaTeX markup as plain text (terminal, docstrings, messages)
# ---------------------------------------------------------------------------

_PLAIN_COMMANDS: dict[str, str] = {
    r"\alpha": "α", r"\beta": "β", r"\gamma": "γ", r"\delta": "δ", r"\sigma": "σ",
    r"\pi": "π", r"\mu": "μ", r"\Lambda": "Λ", r"\infty": "∞", r"\le": "≤", r"\ge": "≥",
    r"\ne": "≠", r"\to": "→", r"\cdot": "·", r"\times": "×", r"\circ": "∘", r"\in": "∈",
    r"\top": "T", r"\sum": "Σ", r"\dots": "…", r"\ldots": "…", r"\mid": "|",
    r"\partial": "∂", r"\approx": "≈", r"\pm": "±", r"\,": " ", r"\;": " ", r"\ ": " ",
    r"\quad": " ", r"\left": "", r"\right": "", r"\bigl": "", r"\bigr": "",
    r"\Bigl": "", r"\Bigr": "", r"\max": "max", r"\min": "min", r"\exp": "exp",
    r"\operatorname": "", r"\mathrm": "", r"\mathbf": "", r"\mathbb": "", r"\text": "",
    r"\texttt": "", r"\sqrt": "√", r"\lim": "lim",
}
_PLAIN_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_PLAIN_FRAC_SHORT = re.compile(r"\\[dt]?frac(\w)(\w)")
_PLAIN_CMD = re.compile(r"\\(?:[A-Za-z]+|[,; ])")


def _plain_script(m: re.Match[str]) -> str:
    body = m.group(2).strip()
    return f"{m.group(1)}{body}" if re.fullmatch(r"-?\w+", body) else f"{m.group(1)}({body})"


def plain_text(tex: str) -> str:
    r"""The library's own markup (text with ``$...$`` math) as readable plain text:
    ``$\beta \le 1$`` -> ``β ≤ 1``.  For the terminal; never for input text (that goes
    through :func:`mha_symbolic._text.sanitize`).

    >>> plain_text(r"$d_{\mathrm{model}} \times h d_k$")
    'd_model × h d_k'
    """
    text = tex.replace("$", "")
    for _ in range(3):  # nested fractions, innermost first
        text = _PLAIN_FRAC.sub(r"\1/\2", text)
    text = _PLAIN_FRAC_SHORT.sub(r"\1/\2", text)
    text = _PLAIN_CMD.sub(lambda m: _PLAIN_COMMANDS.get(m.group(0), m.group(0)[1:]), text)
    text = re.sub(r"([_^])\{([^{}]*)\}", _plain_script, text)
    text = text.replace("{", "").replace("}", "")
    return " ".join(text.split())


# ---------------------------------------------------------------------------
# cross-check tables
# ---------------------------------------------------------------------------


class CheckGroup:
    """The records of one claim: how many cases, the range of each parameter, the result."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.records: list[CheckRecord] = []

    @property
    def status(self) -> str:
        """``FAILED`` if any record failed, else ``skipped`` if any was skipped, else
        ``note`` for a printed number, else ``ok``."""
        states = {r.status for r in self.records}
        for s in ("FAILED", "skipped", "note"):
            if s in states:
                return s
        return "ok"

    def ranges(self) -> list[tuple[str, str]]:
        """``[(parameter, range), ...]``: ``min–max`` of numeric values (exact rationals),
        else the distinct values; a parameter with one value shows it alone."""
        order: list[str] = []
        values: dict[str, list[Any]] = {}
        for r in self.records:
            for key, val in r.case:
                if key not in values:
                    order.append(key)
                    values[key] = []
                if val not in values[key]:
                    values[key].append(val)
        out = []
        for key in order:
            vals = values[key]
            nums = _as_rationals(vals)
            if nums is not None and len(vals) > 1:
                lo, hi = min(nums), max(nums)
                out.append((key, f"{_fraction_text(lo)}..{_fraction_text(hi)}"))
            elif nums is not None:
                out.append((key, _fraction_text(nums[0])))
            elif len(vals) <= 4:
                out.append((key, ", ".join(str(v) for v in vals)))
            else:
                out.append((key, f"{', '.join(str(v) for v in vals[:3])}, ... ({len(vals)})"))
        return out

    def bound_exponent(self) -> int | None:
        """The largest ``k`` of the records' certified ``|difference| < 10^k`` (None if
        no record has one: exact agreements and predicates)."""
        exps = [r.bound_exp for r in self.records if r.bound_exp is not None]
        return max(exps) if exps else None

    def result_text(self) -> str:
        last = self.records[-1]
        if self.status == "FAILED":
            bad = next(r for r in self.records if r.status == "FAILED")
            return f"FAILED: {bad.detail}"
        if self.status == "skipped":
            return f"skipped: {last.detail}"
        if self.status == "note":
            return last.detail
        k = self.bound_exponent()
        if k is not None:
            return f"holds, |difference| < 10^{k}"
        exact = all(r.detail.endswith("(exact)") for r in self.records)
        return "holds exactly" if exact else "holds"


def _as_rationals(vals: Sequence[Any]) -> list[Any] | None:
    from fractions import Fraction

    out = []
    for v in vals:
        if isinstance(v, bool):
            return None
        try:
            out.append(Fraction(str(v)))
        except (ValueError, ZeroDivisionError):
            return None
    return out


def _fraction_text(x: Any) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def check_groups(records: Sequence[CheckRecord]) -> list[CheckGroup]:
    """The records grouped by claim, in the order the claims were first checked."""
    groups: dict[str, CheckGroup] = {}
    for r in records:
        groups.setdefault(r.what, CheckGroup(r.what)).records.append(r)
    return list(groups.values())


def _is_word(key: str) -> bool:
    return re.fullmatch(r"[A-Z][a-z]+.*", key) is not None


def _range_text(key: str, value: str) -> str:
    """``("n", "3..18")`` -> ``3 ≤ n ≤ 18``; ``("n", "5")`` -> ``n = 5``; a word key
    (``Example``) -> ``Example D``."""
    name = plain_text(key)
    if _is_word(key):
        return f"{name} {value}" if key == "Example" else f"{name}: {value}"
    if ".." in value:
        lo, hi = value.split("..")
        return f"{lo} ≤ {name} ≤ {hi}"
    return f"{name} = {value}"


def range_latex(key: str, value: str) -> str:
    """The LaTeX of one parameter's range (see :func:`_range_text`)."""
    from .._latex import latex_escape

    if _is_word(key):
        sep = " " if key == "Example" else ": "
        return f"{latex_escape(key)}{sep}{latex_escape(value)}"
    if ".." in value and re.fullmatch(r"-?\d+(/\d+)?\.\.-?\d+(/\d+)?", value):
        lo, hi = value.split("..")
        return f"${_rational_latex(lo)} \\le {key} \\le {_rational_latex(hi)}$"
    if re.fullmatch(r"-?\d+(/\d+)?", value):
        return f"${key} = {_rational_latex(value)}$"
    return f"${key}$: {latex_escape(value)}"


def _result_latex(group: CheckGroup) -> str:
    from .._latex import latex_escape

    status = group.status
    last = group.records[-1]
    if status == "FAILED":
        bad = next(r for r in group.records if r.status == "FAILED")
        return rf"\textbf{{FAILED}}: {latex_escape(bad.detail)}"
    if status == "skipped":
        return rf"\textit{{skipped}}: {latex_escape(last.detail)}"
    if status == "note":
        return rf"${last.detail_latex}$" if last.detail_latex else latex_escape(last.detail)
    k = group.bound_exponent()
    if k is not None:
        return rf"holds, $|\Delta| < 10^{{{k}}}$"
    return group.result_text()


def checks_latex(records: Sequence[CheckRecord], caption: str = "") -> str:
    """The cross-checks of one theorem as a booktabs table; ``caption`` (LaTeX) is set
    as the table's first row, so that it never stays behind at the foot of a page."""
    from .._latex import latex_text

    rows = []
    for g in check_groups(records):
        ranges = "; ".join(range_latex(k, v) for k, v in g.ranges())
        rows.append(f"{latex_text(g.what)} & {book_latex_number(len(g.records))} & "
                    f"{ranges or '--'} & {_result_latex(g)} \\\\")
    head = (r"\begin{tabular}{@{}>{\raggedright\arraybackslash}p{0.40\linewidth} r "
            r">{\raggedright\arraybackslash}p{0.25\linewidth} "
            r">{\raggedright\arraybackslash}p{0.21\linewidth}@{}}")
    top = ([rf"\multicolumn{{4}}{{@{{}}p{{0.9\linewidth}}}}{{\normalsize {caption}}} \\[0.5ex]"]
           if caption else [])
    return "\n".join([
        r"\begin{center}\small", head, *top, r"\toprule",
        r"claim checked & cases & range & result \\", r"\midrule", *rows,
        r"\bottomrule", r"\end{tabular}\end{center}"])


# ---------------------------------------------------------------------------
# summaries of several results: text, Markdown, HTML
# ---------------------------------------------------------------------------

SUMMARY_HEADER = ("#", "theorem", "status", "time", "stated", "method")


def summary_row(r: ProofResult) -> tuple[str, ...]:
    """One result's row of the summary table (plain text)."""
    skipped = sum(1 for c in r.checks if c.status == "skipped")
    method = r.method + (f" ({skipped} check skipped)" if skipped == 1 else
                         f" ({skipped} checks skipped)" if skipped else "")
    return (str(r.number), r.name, r.status, f"{r.seconds:.2f} s", str(r.facts), method)


def format_row(row: Sequence[str], widths: Sequence[int]) -> str:
    """A row of the text table, every column but the last padded to its width."""
    return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()


def column_widths(names: Sequence[str]) -> list[int]:
    """Widths of the text columns, known before any theorem has run (so rows can be
    printed as they finish)."""
    # numbers come from the file names tNN_<name>.py: two digits at most
    return [2, max([len("theorem"), *(len(n) for n in names)]), len("FAILED"),
            len("000.00 s"), len("stated"), 0]


def results_text(results: Sequence[ProofResult]) -> str:
    """The summary table as plain text (what ``mha-symbolic prove`` prints)."""
    from .._text import sanitize

    widths = column_widths([r.name for r in results])
    lines = [format_row(SUMMARY_HEADER, widths),
             format_row(["-" * max(w, len(h)) for w, h in zip(widths, SUMMARY_HEADER,
                                                                strict=True)], widths)]
    lines += [format_row([sanitize(c) for c in summary_row(r)], widths) for r in results]
    lines.append(held_phrase(sum(r.ok for r in results), len(results)).capitalize()
                 + proved_and_stated(results))
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return html.escape(text, quote=False).replace("|", r"\|").replace("\n", " ")


def results_markdown(results: Sequence[ProofResult]) -> str:
    """The summary table in Markdown, every cell escaped."""
    lines = ["| " + " | ".join(SUMMARY_HEADER) + " |",
             "|" + "|".join(["---:"] + ["---"] * (len(SUMMARY_HEADER) - 1)) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in summary_row(r)) + " |" for r in results]
    lines.append("")
    lines.append(held_phrase(sum(r.ok for r in results), len(results)).capitalize() + ".")
    return "\n".join(lines)


def results_html(results: Sequence[ProofResult]) -> str:
    """The summary table in HTML, every cell escaped."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in SUMMARY_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in summary_row(r))
                   + "</tr>" for r in results)
    held = sum(r.ok for r in results)
    return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>{held_phrase(held, len(results)).capitalize()}.</p>")


def checks_text(records: Sequence[CheckRecord]) -> list[tuple[str, str, str, str]]:
    """The cross-check table of one result as rows of plain text."""
    out = []
    for g in check_groups(records):
        ranges = "; ".join(_range_text(k, v) for k, v in g.ranges())
        out.append((plain_text(g.what), str(len(g.records)), ranges or "-", g.result_text()))
    return out


def proved_and_stated(results: Sequence[Any]) -> str:
    """What is proved and what is stated, after "14 of 14 theorems hold": how many
    proofs have every step machine-checked, and how many also rest on elementary facts
    that are stated (the steps marked [stated]), not machine-checked.

    >>> from types import SimpleNamespace as R
    >>> print(proved_and_stated([R(ok=True, facts=0), R(ok=True, facts=3),
    ...                          R(ok=True, facts=1)]))  # doctest: +NORMALIZE_WHITESPACE
    : 1 fully machine-checked, 2 also resting on 4 elementary facts stated, not
    machine-checked (the steps marked [stated])
    >>> proved_and_stated([R(ok=True, facts=0)])
    ': every step machine-checked'
    """
    held = [r for r in results if r.ok]
    resting = [r for r in held if r.facts]
    if not held:
        return ""
    if not resting:
        return ": every step machine-checked"
    full = len(held) - len(resting)
    facts = sum(r.facts for r in resting)
    stated = (f"{facts} elementary fact{'s' if facts != 1 else ''} stated, not machine-checked "
              "(the steps marked [stated])")
    if not full:
        return f", resting on {stated}"
    return f": {full} fully machine-checked, {len(resting)} also resting on {stated}"


def held_phrase(held: int, total: int) -> str:
    """``3 of 14 theorems hold``; for one theorem ``the theorem holds`` / ``does not hold``.

    >>> held_phrase(1, 1), held_phrase(13, 14)
    ('the theorem holds', '13 of 14 theorems hold')
    """
    if total == 1:
        return "the theorem holds" if held else "the theorem does not hold"
    return f"{held} of {total} theorems hold"


# ---------------------------------------------------------------------------
# one result: text, Markdown, HTML, LaTeX
# ---------------------------------------------------------------------------

_CHECK_HEADER = ("claim checked", "cases", "range", "result")


def _text_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    widths = [max(len(header[c]), *(len(r[c]) for r in rows)) if rows else len(header[c])
              for c in range(len(header))]
    lines = [format_row(header, widths), format_row(["-" * w for w in widths], widths)]
    lines += [format_row(r, widths) for r in rows]
    return lines


def _tally(r: ProofResult) -> str:
    return f"{len(r.steps)} steps ({r.facts} stated facts); {r.seconds:.2f} s"


def result_text(r: ProofResult) -> str:
    """One result as plain text: title, statement, status, steps, the check table."""
    from .._text import sanitize

    lines = [f"Theorem {r.number} ({r.name}): {plain_text(r.title)}",
             f"  {plain_text(r.statement_latex)}",
             f"  status: {r.status}; method: {r.method}; {_tally(r)}"]
    if r.message:
        lines.append(f"  {sanitize(r.message)}")
    if r.checks:
        lines.append("")
        lines += ["  " + x for x in _text_table(
            [tuple(sanitize(c) for c in row) for row in checks_text(r.checks)], _CHECK_HEADER)]
    return "\n".join(lines)


def result_markdown(r: ProofResult) -> str:
    """One result as Markdown: statement (its math for MathJax), status, check table."""
    out = [f"**Theorem {r.number}** ({_md_cell(r.name)}): {_md_cell(r.title)}", "",
           _md_cell(r.statement_latex), "",
           f"*status:* **{_md_cell(r.status)}**; *method:* {_md_cell(r.method)}; {_tally(r)}"]
    if r.message:
        out += ["", _md_cell(r.message)]
    if r.checks:
        out += ["", "| " + " | ".join(_CHECK_HEADER) + " |", "|---|---:|---|---|"]
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |"
                for row in checks_text(r.checks)]
    return "\n".join(out)


def result_html(r: ProofResult) -> str:
    """One result as HTML, every text escaped."""
    esc = html.escape
    parts = [f"<p><b>Theorem {r.number}</b> ({esc(r.name)}): {esc(r.title)}</p>",
             f"<p>{esc(r.statement_latex)}</p>",
             f"<p><i>status:</i> <b>{esc(r.status)}</b>; <i>method:</i> {esc(r.method)}; "
             f"{esc(_tally(r))}</p>"]
    if r.message:
        parts.append(f"<pre>{esc(r.message)}</pre>")
    if r.checks:
        head = "".join(f"<th>{esc(h)}</th>" for h in _CHECK_HEADER)
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                       for row in checks_text(r.checks))
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "".join(parts)


def _steps_latex(steps: Sequence[Any]) -> str:
    """The steps in an ``align*``; stated facts are ``\\intertext`` lines inside it, but
    those before the first or after the last equation are set as paragraphs outside
    (an ``align*`` that starts or ends with ``\\intertext`` leaves an empty row)."""
    lines = [s.latex() for s in steps]
    first = next((k for k, s in enumerate(steps) if s.kind != "fact"), len(steps))
    last = max((k for k, s in enumerate(steps) if s.kind != "fact"), default=-1)

    def paragraph(line: str) -> str:  # \intertext{...} -> {... \par}
        return line[len("\\intertext"):-1] + "\\par}"

    out = [paragraph(x) for x in lines[:first]]
    middle = lines[first:last + 1]
    if middle:
        # no line break is needed (nor allowed) right before an \intertext
        body = "".join(
            line + ("" if k + 1 == len(middle) or middle[k + 1].startswith("\\intertext")
                    or line.startswith("\\intertext") else " \\\\") + "\n"
            for k, line in enumerate(middle))
        out += [r"\begin{align*}", body.rstrip("\n"), r"\end{align*}"]
    out += [paragraph(x) for x in lines[last + 1:]] if middle else []
    return "\n".join(out)


def result_latex(r: ProofResult) -> str:
    """One proof as a LaTeX fragment: a ``\\section``, the statement, the aligned steps
    (each justification a tag at the right margin), the conclusion, the check table."""
    from .._latex import latex_escape, latex_text

    out = [f"\\section{{{latex_text(r.title)}}}\\label{{thm:{r.name}}}",
           f"\\textbf{{Theorem {r.number}.}} {r.statement_latex}", "",
           f"\\textit{{Method:}} {latex_escape(r.method)}. "
           f"\\textit{{Status:}} {latex_escape(r.status)}.", ""]
    if r.steps:
        out.append(r"\textit{Proof.}")
        out.append(_steps_latex(r.steps))
    if r.conclusion:
        out.append(f"Hence {r.conclusion} \\hfill$\\square$")
        out.append("")
    if r.checks:
        skipped = sum(1 for c in r.checks if c.status == "skipped")
        note = (f" ({skipped} skipped: {'it' if skipped == 1 else 'they'} could not run "
                "here and count as neither passed nor failed)" if skipped else "")
        out.append(checks_latex(r.checks, f"\\textit{{Numerical cross-check}} "
                                          f"({latex_escape(_kind_of(r.method))}){note}."))
    if r.message:
        out.append(f"\\textbf{{{latex_escape(r.status)}:}} {latex_escape(r.message)}")
    return "\n".join(out) + "\n"


def _kind_of(method: str) -> str:
    return method.split(" + ", 1)[1] if " + " in method else method


# Notation used by every theorem (defined once, here; the theorems use it).
NOTATION: tuple[tuple[str, str], ...] = (
    # -- one row of scores --
    (r"$n$", r"number of keys (the length of a row of scores), $n \ge 1$"),
    (r"$s_1, \dots, s_n$", r"the scores of one query row (real numbers)"),
    (r"$w_i = e^{s_i} / \sum_{l=1}^{n} e^{s_l}$", r"the softmax weights of that row"),
    (r"$v_1, \dots, v_n$", r"the values (one coordinate of each value row, unless "
     r"stated otherwise)"),
    (r"$o = \sum_{j=1}^{n} w_j v_j$", r"the output of the row"),
    (r"$g_j = s_1 - s_j$", r"the gap of key $j$ below the largest score $s_1$ "
     r"(keys relabelled so that key $1$ has it)"),
    (r"$\gamma = \min_{j \ge 2} g_j$", r"the smallest gap"),
    (r"$s_{\max} = \max_j s_j$", r"the largest score (when several keys share it)"),
    (r"$\beta \ge 0$", r"a factor multiplying every score (an inverse temperature; "
     r"$1/\sqrt{d_k}$ is one)"),
    (r"$c$", r"a real constant: the common score (Theorem 1), the shift of every score "
     r"(Theorem 3)"),
    (r"$r$", r"the number of keys tied at the largest score"),
    (r"$u$", r"the number of keys a mask leaves visible"),
    # -- multi-head attention --
    (r"$n_q, n_k$", r"query and key lengths (cross-attention; $n_k = n$)"),
    (r"$d_{\mathrm{model}}, h$", r"model width and number of heads"),
    (r"$d_k, d_v$", r"query/key and value widths of one head"),
    (r"$X,\ X_{\mathrm{kv}}$", r"the query-side tokens, and the key/value-side tokens "
     r"(cross-attention; $X_{\mathrm{kv}} = X$ for self-attention)"),
    (r"$W^Q_i, W^K_i, W^V_i,\ W^O$", r"the projections of head $i$, the output projection"),
    (r"$Q, K, V,\ P,\ O$", r"queries, keys, values, the weight matrix "
     r"$P = \mathrm{softmax}(\beta\,QK^{\top})$ and the output $O = PV$ of one head"),
    (r"$\delta_{ik}$", r"Kronecker's delta"),
)


_NOTATION_SPLIT = 12  # rows of NOTATION about one row of scores; the rest: attention


def _notation_table(rows: Sequence[tuple[str, str]], heading: str) -> list[str]:
    return [r"\begin{center}\small",
            r"\begin{tabular}{@{}p{0.3\linewidth}>{\raggedright\arraybackslash}"
            r"p{0.6\linewidth}@{}}",
            r"\toprule", rf"\multicolumn{{2}}{{@{{}}l}}{{\textit{{{heading}}}}} \\",
            r"\midrule", *(f"{sym} & {meaning} \\\\" for sym, meaning in rows),
            r"\bottomrule", r"\end{tabular}\end{center}"]


def notation_latex() -> str:
    """The notation section: two booktabs tables, defined once for every theorem."""
    return "\n".join([
        r"\section*{Notation}",
        "Every theorem below uses this notation; a symbol used by one proof only is "
        "defined in that proof.",
        *_notation_table(NOTATION[:_NOTATION_SPLIT], "Softmax of one row of scores"),
        *_notation_table(NOTATION[_NOTATION_SPLIT:], "Multi-head attention")])


def proofs_document(results: Sequence[ProofResult]) -> str:
    """The complete document: introduction, notation, summary table, every proof."""
    from .._latex import latex_escape, standalone_document

    held = sum(r.ok for r in results)
    intro = (
        "Each step below is either decided by SymPy (an identity whose difference "
        "simplifies to $0$, a sign decided from the assumptions, the limit of an "
        "elementary exponential), marked \\textbf{[SymPy]}, or an elementary fact, "
        "marked \\textbf{[stated]}. Indexed sums run to a symbolic $n$, so an identity "
        "holds for every size. The numerical cross-checks use Arb balls or exact "
        "rationals at random points; each theorem's table gives, for every claim "
        "checked, the number of cases, the range of their parameters and the result: "
        "for an agreement of two computations, a bound on their difference $|\\Delta|$ "
        "that Arb certifies for every case; a check that could not run is marked "
        "\\textit{skipped} and counts as neither passed nor failed. "
        f"{latex_escape(held_phrase(held, len(results)).capitalize())}."
    )
    table = [r"\begin{center}\small",
             r"\begin{tabular}{@{}rlll@{}}", r"\toprule",
             r"\# & theorem & method & status \\", r"\midrule"]
    for r in results:
        table.append(f"{r.number} & \\texttt{{{latex_escape(r.name)}}} & "
                     f"{latex_escape(r.method)} & "
                     f"{latex_escape(r.status)} \\\\")
    table += [r"\bottomrule", r"\end{tabular}\end{center}"]
    body = "\n".join([intro, "", notation_latex(), "", *table, ""]
                     + [r.latex() for r in results])
    return standalone_document(body, title="mha-symbolic: proofs of the closed forms of "
                               "attention", packages=("booktabs", "array"))
