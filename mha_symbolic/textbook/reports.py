"""Reports of a check: one :class:`ClaimRecord` per claim, and the
:class:`CheckReport` rendered as text, JSON, Markdown or HTML.

The JSON rendering is a stable, documented schema (``"schema": "mha-symbolic-check/2"``,
docs/worked-example-format.md#json-output): every record carries its file and line,
numbers are JSON numbers (counts and exact integers as ints, errors as floats), and a
claim that could not be read is a record with the verdict ``"unreadable"`` and its
``error``."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._text import has_control, markdown_code, markdown_text, plural, sanitize
from .quantities import MAX_QUANTITY_LENGTH
from .verdicts import UNDECIDED

if TYPE_CHECKING:
    from .examples import WorkedExample

__all__ = ["CheckReport", "ClaimRecord"]


@dataclass(frozen=True)
class ClaimRecord:
    """The verdict on one claim."""

    example: str
    quantity: str
    head: int
    claimed: str
    exact: str  # certified digits (or the exact integer / shape)
    exact_form: str  # the exact value, symbolically, where it is short
    rounded: str | None  # the correct answer at the claim's precision
    precision: str
    verdict: str  # "exact" | "correctly rounded" | "approximation" | "wrong"
    ok: bool
    error_units: str | None  # signed error in units of the last printed digit
    diagnosis: str | None
    note: str = ""
    exact_expr: Any = field(default=None, compare=False, repr=False)  # SymPy value / tuple / Shape
    file: str = ""
    line: int = 0
    batch: int = 1
    detail: str | None = None  # a word on the verdict (magnitude analysis, printed inputs)
    error: str | None = None  # why an unreadable claim could not be judged
    error_value: float | None = None  # error_units of a single number, as a number
    entries: tuple[dict[str, Any], ...] = ()  # the wrong entries of a tuple or tensor claim

    def as_dict(self) -> dict[str, Any]:
        """The JSON record (schema mha-symbolic-check/2)."""
        return {
            "file": self.file, "line": self.line or None,
            "example": self.example, "quantity": self.quantity, "head": self.head,
            "batch": self.batch, "claimed": self.claimed, "verdict": self.verdict, "ok": self.ok,
            "exact": self.exact, "exact_form": self.exact_form,
            "exact_value": _exact_value(self.exact_expr),
            "rounded": self.rounded, "precision": self.precision,
            "error_units": self.error_value if self.error_value is not None else
            ([e["error_units"] for e in self.entries] if self.entries else None),
            "error_text": self.error_units, "diagnosis": self.diagnosis, "detail": self.detail,
            "note": self.note or None, "error": self.error,
            "entries": list(self.entries),
        }


def _exact_value(value: Any) -> Any:
    """An exact integer (a count, a size) or a numeric shape as JSON numbers; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if getattr(value, "is_Integer", False):
        return int(value)
    rows, cols = getattr(value, "rows", None), getattr(value, "cols", None)
    if isinstance(rows, int) and isinstance(cols, int):
        return [rows, cols]
    return None


@dataclass(frozen=True)
class CheckReport:
    """Verdicts on every claim of a set of worked examples."""

    examples: tuple[WorkedExample, ...]
    records: tuple[ClaimRecord, ...]

    @property
    def ok(self) -> bool:
        """Every claim holds (an undecided claim does not)."""
        return all(r.ok for r in self.records)

    @property
    def exit_status(self) -> int:
        """0 every claim holds; 1 some claim is wrong; 4 none is wrong but some could not
        be decided (certified arithmetic reached its precision cap) or are ambiguous (a
        shape whose readings disagree); 2 some claim could not be read."""
        verdicts = {r.verdict for r in self.records}
        if "unreadable" in verdicts:
            return 2
        open_ = verdicts & {UNDECIDED, AMBIGUOUS}
        if "wrong" in verdicts or (not self.ok and not open_):
            return 1
        return 4 if open_ else 0

    def summary(self) -> dict[str, int]:
        counts = {"claims": len(self.records), "hold": sum(r.ok for r in self.records),
                  "wrong": sum(r.verdict == "wrong" for r in self.records)}
        for verdict in ("exact", "correctly rounded", "approximation", CONSISTENT, "unreadable",
                        UNDECIDED, AMBIGUOUS):
            counts[verdict] = sum(r.verdict == verdict for r in self.records)
        counts["diagnosed"] = sum(r.diagnosis is not None for r in self.records
                                  if r.verdict == "wrong")
        return counts

    def by_example(self) -> list[tuple[WorkedExample, list[ClaimRecord]]]:
        return [(ex, [r for r in self.records if r.example == ex.name]) for ex in self.examples]

    # -- renderings ------------------------------------------------------------------
    def __str__(self) -> str:
        """``print(report)`` prints the readable report (:meth:`text`)."""
        return self.text()

    def __repr__(self) -> str:
        s = self.summary()
        return (f"<CheckReport: {plural(len(self.examples), 'example')}, {self.summary_line().rstrip('.')}; "
                f"exit status {self.exit_status}; print() it for the report>"
                if s["claims"] else f"<CheckReport: {plural(len(self.examples), 'example')}, "
                "no claims>")

    def summary_line(self) -> str:
        """The closing line of the text report ("71 claims: 68 hold (…), 3 wrong (3 diagnosed).")."""
        s = self.summary()
        line = (f"{plural(s['claims'], 'claim')}: {_hold(s['hold'])} ({s['exact']} exact, "
                f"{s['correctly rounded']} correctly rounded, "
                f"{plural(s['approximation'], 'approximation')}"
                + (f", {s[CONSISTENT]} consistent with printed inputs" if s[CONSISTENT] else "")
                + f"), {s['wrong']} wrong ({s['diagnosed']} diagnosed)")
        if s["unreadable"]:
            line += f", {s['unreadable']} unreadable"
        if s[UNDECIDED]:
            line += f", {s[UNDECIDED]} undecided (not counted as holding)"
        if s[AMBIGUOUS]:
            line += f", {s[AMBIGUOUS]} ambiguous (readings disagree; not counted as wrong)"
        return line + "."

    def text(self, *, quiet: bool = False) -> str:
        """The report as text; ``quiet``: only the claims that fail, and the summary."""
        self = self.sanitized()  # render the terminal-safe copy
        out: list[str] = []
        for ex, records in self.by_example():
            shown = [r for r in records if not r.ok] if quiet else records
            if quiet and not shown:
                continue
            out.append(f"Example {ex.name}" + (f" — {ex.title}" if ex.title else ""))
            if not shown:
                out.append("  (no claims)")
            qw = max((len(_label(r)) for r in shown), default=8)
            cw = min(max((len(_one_line(r.claimed)) for r in shown), default=8), 40)
            for r in shown:
                line = (f"  {_mark(r)} {_label(r).ljust(qw)}  "
                        f"{_one_line(r.claimed, 40).ljust(cw)}  {r.verdict}")
                if r.verdict in ("correctly rounded", "wrong", CONSISTENT) and r.precision:
                    line += f" ({r.precision})"
                out.append(line)
                if r.verdict == "unreadable":
                    out.append(f"      error: {r.error}")
                    continue
                # the exact form is shown when it is shorter than a line: beside the digits
                # when both fit, else on a line of its own (the JSON keeps it always)
                form = r.exact_form if r.exact_form != r.exact else ""
                beside = form and len(f"      exact: {r.exact} = {form}") <= LINE_WIDTH
                out.extend(_block("exact: ", r.exact + (f" = {form}" if beside else "")))
                if form and not beside and len(form) <= FORM_WIDTH:
                    out.append(f"             = {form}")
                if r.detail:
                    out.append(f"      note: {r.detail}")
                if not r.ok:
                    if r.rounded is not None and r.error_units and not r.entries:
                        out.append(f"      correct answer: {r.rounded}; off by {r.error_units} "
                                   "in the last printed digit")
                    elif r.rounded is not None:
                        out.extend(_block("correct answer: ", r.rounded))
                    if r.entries and r.error_units:
                        out.append(f"      wrong entries: {r.error_units}")
                    elif r.error_units and r.rounded is None:
                        out.append(f"      off by {r.error_units}")
                    if r.diagnosis:
                        out.append(f"      diagnosis: {r.diagnosis}")
            out.append("")
        out.append(self.summary_line())
        out.append("Digits shown as exact are certified (exact rational arithmetic or Arb "
                   "enclosures); '…' means the expansion continues.")
        return "\n".join(out)

    def json(self, *, quiet: bool = False) -> str:
        """The report as JSON (schema mha-symbolic-check/2); ``quiet``: failing records only."""
        records = [r for r in self.records if not r.ok] if quiet else self.records
        return json_text({"schema": SCHEMA, "claims": [r.as_dict() for r in records],
                          "summary": {**self.summary(), "ok": self.ok,
                                      "exit_status": self.exit_status}})

    def markdown(self, *, quiet: bool = False) -> str:
        self = self.sanitized()  # render the terminal-safe copy
        out: list[str] = []
        for ex, records in self.by_example():
            if quiet:
                records = [r for r in records if not r.ok]
                if not records:
                    continue
            out.append(f"### Example {_md(ex.name)}" + (f" — {_md(ex.title)}" if ex.title
                                                         else ""))
            out.append("")
            out.append("| | quantity | claimed | exact (certified digits) | verdict | diagnosis |")
            out.append("|---|---|---|---|---|---|")
            for r in records:
                verdict = r.verdict + (f" ({r.precision})" if r.verdict != "exact"
                                       and r.precision else "")
                if not r.ok and r.rounded is not None:
                    verdict += f"; correct: {r.rounded}"
                cells = [_mark(r),
                         markdown_code(_label(r)),
                         # an unreadable claim may be any length: cut like the text report's
                         _md(_one_line(r.claimed, 80 if r.verdict == "unreadable" else 0)),
                         _md(r.exact),
                         _md(verdict), _md(r.diagnosis or r.error or r.detail or "")]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        s = self.summary()
        out.append(f"**{plural(s['claims'], 'claim')}: {_hold(s['hold'])}, {s['wrong']} wrong "
                   f"({s['diagnosed']} diagnosed)"
                   + (f", {s['unreadable']} unreadable" if s["unreadable"] else "")
                   + (f", {s[UNDECIDED]} undecided" if s[UNDECIDED] else "")
                   + (f", {s[AMBIGUOUS]} ambiguous" if s[AMBIGUOUS] else "") + ".**")
        return "\n".join(out)

    def sanitized(self) -> CheckReport:
        """A copy whose every text read from a file (names, titles, claims, notes, and
        diagnoses quoting them) has its control characters made visible: what the text
        and Markdown renderings print can neither move a terminal's cursor nor reorder
        or hide what is shown (see :func:`mha_symbolic._text.sanitize`)."""
        examples = tuple(dataclasses.replace(ex, name=_one_line_safe(ex.name),
                                             title=_one_line_safe(ex.title or ""))
                         if has_control(ex.name) or has_control(ex.title or "") else ex
                         for ex in self.examples)
        records = tuple(_sanitized_record(r) for r in self.records)
        return CheckReport(examples, records)

    def _repr_html_(self) -> str:
        self = self.sanitized()  # render the terminal-safe copy
        rows = []
        for r in self.records:
            verdict = r.verdict + (f" ({r.precision})" if r.verdict != "exact" and r.precision
                                   else "")
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                _mark(r), r.example, _label(r), r.claimed, r.exact, verdict,
                r.rounded if not r.ok and r.rounded is not None else "",
                r.diagnosis or r.error or "")) + "</tr>")
        head = "".join(f"<th>{h}</th>" for h in ("", "example", "quantity", "claimed", "exact",
                                                  "verdict", "correct answer", "diagnosis"))
        return (f"<table><tr>{head}</tr>{''.join(rows)}</table>"
                f"<p><b>{html.escape(self.summary_line())}</b></p>")


#: The longest line of the text report that an exact form may make.
LINE_WIDTH = 100
#: The longest exact form shown on a line of its own.
FORM_WIDTH = 72

#: The verdict of a shape claim whose readings disagree (never wrong, never holding).
AMBIGUOUS = "ambiguous"
#: The verdict of a claim that holds for inputs inside their printed intervals.
CONSISTENT = "consistent with the inputs as printed"
SCHEMA = "mha-symbolic-check/2"


def _hold(n: int) -> str:
    """'1 holds', '3 hold': the verb agrees with the count."""
    return f"{n} {'holds' if n == 1 else 'hold'}"


def _mark(r: ClaimRecord) -> str:
    """✓ holds, ✗ wrong, ? neither decided nor read (unreadable, undecided)."""
    return "✓" if r.ok else "?" if r.verdict in ("unreadable", UNDECIDED, AMBIGUOUS) else "✗"


def _label(r: ClaimRecord) -> str:
    extra = [f"head {r.head}"] if r.head != 1 else []
    extra += [f"batch {r.batch}"] if r.batch != 1 else []
    # a quantity that could not be read may be any length: cut it like a claim
    return _one_line(r.quantity, MAX_QUANTITY_LENGTH) + (f" ({', '.join(extra)})" if extra
                                                          else "")


def _one_line(text: str, width: int = 0) -> str:
    flat = " ".join(text.split())
    return flat if not width or len(flat) <= width else flat[:width - 1] + "…"


def _block(label: str, text: str) -> list[str]:
    """'      label text', wrapping a long matrix at its rows."""
    if len(text) <= 100 or not text.startswith("[["):
        return [f"      {label}{text}"]
    rows = text[1:-1].split("], [")
    rows = [("[" if i else "[[") + r.strip("[]") + ("]" if i < len(rows) - 1 else "]]")
            for i, r in enumerate(rows)]
    pad = " " * (6 + len(label) + 1)
    return [f"      {label}{rows[0]}"] + [pad + r for r in rows[1:]]


def _md(s: str) -> str:
    """A table cell's text: nothing from a file may become a link, raw HTML, emphasis,
    math or a cell break (see :func:`mha_symbolic._text.markdown_text`)."""
    return markdown_text(s)


def _one_line_safe(text: str) -> str:
    """A field shown on one line: line breaks and tabs become spaces (a printout's rows),
    every other control character a visible escape."""
    return sanitize(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
                    .replace("\t", " "))


def _sanitized_record(r: ClaimRecord) -> ClaimRecord:
    changes: dict[str, Any] = {f.name: _one_line_safe(getattr(r, f.name))
                               for f in dataclasses.fields(r)
                               if isinstance(getattr(r, f.name), str)
                               and has_control(getattr(r, f.name))}
    return dataclasses.replace(r, **changes) if changes else r


#: Characters JSON allows raw inside strings that a terminal would still obey (C1
#: controls, DEL, bidirectional overrides and isolates, line separators).
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                          "\u2066-\u2069]")


def json_text(data: Any) -> str:
    """``json.dumps`` with non-ASCII text kept readable (✓, ≈, −) but every character a
    terminal would obey escaped as ``\\uXXXX``: C0 controls (as JSON requires) and also
    C1 controls, DEL and bidirectional overrides, which JSON would allow raw.  Such
    characters only occur inside JSON strings, so escaping them keeps the JSON valid
    and its decoded values unchanged."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)
