"""Reports of a check: one :class:`ClaimRecord` per claim, and the
:class:`CheckReport` rendered as text, JSON, Markdown or HTML."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._text import has_control, sanitize
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
    detail: str | None = None  # a word on the verdict (why an undecided claim is undecided)

    def as_dict(self) -> dict[str, Any]:
        return {
            "example": self.example, "quantity": self.quantity, "head": self.head,
            "claimed": self.claimed, "exact": self.exact, "exact_form": self.exact_form,
            "rounded": self.rounded, "precision": self.precision, "verdict": self.verdict,
            "ok": self.ok, "error_units": self.error_units, "diagnosis": self.diagnosis,
            "detail": self.detail,
        }


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
        be decided (certified arithmetic reached its precision cap); 2 some claim could
        not be read."""
        verdicts = {r.verdict for r in self.records}
        if "unreadable" in verdicts:
            return 2
        if "wrong" in verdicts or (not self.ok and UNDECIDED not in verdicts):
            return 1
        return 4 if UNDECIDED in verdicts else 0

    def summary(self) -> dict[str, int]:
        counts = {"claims": len(self.records), "hold": sum(r.ok for r in self.records),
                  "wrong": sum(r.verdict == "wrong" for r in self.records)}
        for verdict in ("exact", "correctly rounded", "approximation", "wrong", UNDECIDED):
            counts[verdict] = sum(r.verdict == verdict for r in self.records)
        counts["diagnosed"] = sum(r.diagnosis is not None for r in self.records
                                  if r.verdict == "wrong")
        return counts

    def by_example(self) -> list[tuple[WorkedExample, list[ClaimRecord]]]:
        return [(ex, [r for r in self.records if r.example == ex.name]) for ex in self.examples]

    # -- renderings ------------------------------------------------------------------
    def text(self) -> str:
        self = self.sanitized()  # render the terminal-safe copy
        out: list[str] = []
        for ex, records in self.by_example():
            out.append(f"Example {ex.name}" + (f" — {ex.title}" if ex.title else ""))
            if not records:
                out.append("  (no claims)")
            qw = max((len(_label(r)) for r in records), default=8)
            cw = max((len(r.claimed) for r in records), default=8)
            for r in records:
                mark = "✓" if r.ok else "?" if r.verdict == UNDECIDED else "✗"
                line = f"  {mark} {_label(r).ljust(qw)}  {r.claimed.ljust(cw)}  {r.verdict}"
                if r.verdict in ("correctly rounded", "wrong") and r.precision:
                    line += f" ({r.precision})"
                out.append(line)
                out.append(f"      exact: {r.exact}" + (f" = {r.exact_form}" if r.exact_form
                                                          and r.exact_form != r.exact else ""))
                if r.detail:
                    out.append(f"      note: {r.detail}")
                if not r.ok:
                    if r.rounded is not None:
                        out.append(f"      correct answer: {r.rounded}"
                                   + (f"; off by {r.error_units} in the last printed digit"
                                      if r.error_units else ""))
                    if r.diagnosis:
                        out.append(f"      diagnosis: {r.diagnosis}")
            out.append("")
        s = self.summary()
        out.append(f"{s['claims']} claims: {s['hold']} hold ({s['exact']} exact, "
                   f"{s['correctly rounded']} correctly rounded, {s['approximation']} "
                   f"approximations), {s['wrong']} wrong ({s['diagnosed']} diagnosed)"
                   + (f", {s[UNDECIDED]} undecided (not counted as holding)" if s[UNDECIDED]
                      else "") + ".")
        out.append("Digits shown as exact are certified (exact rational arithmetic or Arb "
                   "enclosures); '…' means the expansion continues.")
        return "\n".join(out)

    def json(self) -> str:
        return json_text({"claims": [r.as_dict() for r in self.records],
                          "summary": {**self.summary(), "ok": self.ok}})

    def markdown(self) -> str:
        self = self.sanitized()  # render the terminal-safe copy
        out: list[str] = []
        for ex, records in self.by_example():
            out.append(f"### Example {ex.name}" + (f" — {ex.title}" if ex.title else ""))
            out.append("")
            out.append("| | quantity | claimed | exact (certified digits) | verdict | diagnosis |")
            out.append("|---|---|---|---|---|---|")
            for r in records:
                verdict = r.verdict + (f" ({r.precision})" if r.verdict != "exact" else "")
                if not r.ok and r.rounded is not None:
                    verdict += f"; correct: {r.rounded}"
                cells = ["✓" if r.ok else "✗", f"`{_label(r)}`", _md(r.claimed), _md(r.exact),
                         _md(verdict), _md(r.diagnosis or "")]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        s = self.summary()
        out.append(f"**{s['claims']} claims: {s['hold']} hold, {s['wrong']} wrong "
                   f"({s['diagnosed']} diagnosed)"
                   + (f", {s[UNDECIDED]} undecided" if s[UNDECIDED] else "") + ".**")
        return "\n".join(out)

    def sanitized(self) -> CheckReport:
        """A copy whose every text read from a file (names, titles, claims, notes, and
        diagnoses quoting them) has its control characters made visible: what the text
        and Markdown renderings print can neither move a terminal's cursor nor reorder
        or hide what is shown (see :func:`mha_symbolic._text.sanitize`)."""
        examples = tuple(dataclasses.replace(ex, name=sanitize(ex.name),
                                             title=sanitize(ex.title or ""))
                         if has_control(ex.name) or has_control(ex.title or "") else ex
                         for ex in self.examples)
        records = tuple(_sanitized_record(r) for r in self.records)
        return CheckReport(examples, records)

    def _repr_html_(self) -> str:
        self = self.sanitized()  # render the terminal-safe copy
        rows = []
        for r in self.records:
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                "✓" if r.ok else "✗", r.example, _label(r), r.claimed, r.exact, r.verdict,
                r.diagnosis or "")) + "</tr>")
        head = "".join(f"<th>{h}</th>" for h in ("", "example", "quantity", "claimed", "exact",
                                                  "verdict", "diagnosis"))
        return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _label(r: ClaimRecord) -> str:
    return r.quantity + (f" (head {r.head})" if r.head != 1 else "")


def _md(s: str) -> str:
    return s.replace("|", "\\|")


def _sanitized_record(r: ClaimRecord) -> ClaimRecord:
    changes: dict[str, Any] = {f.name: sanitize(getattr(r, f.name)) for f in dataclasses.fields(r)
               if isinstance(getattr(r, f.name), str) and has_control(getattr(r, f.name))}
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
