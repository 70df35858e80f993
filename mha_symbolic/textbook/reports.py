"""Reports of a check: one :class:`ClaimRecord` per claim, and the
:class:`CheckReport` rendered as text, JSON, Markdown or HTML."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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

    def as_dict(self) -> dict[str, Any]:
        return {
            "example": self.example, "quantity": self.quantity, "head": self.head,
            "claimed": self.claimed, "exact": self.exact, "exact_form": self.exact_form,
            "rounded": self.rounded, "precision": self.precision, "verdict": self.verdict,
            "ok": self.ok, "error_units": self.error_units, "diagnosis": self.diagnosis,
        }


@dataclass(frozen=True)
class CheckReport:
    """Verdicts on every claim of a set of worked examples."""

    examples: tuple[WorkedExample, ...]
    records: tuple[ClaimRecord, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records)

    def summary(self) -> dict[str, int]:
        counts = {"claims": len(self.records), "hold": sum(r.ok for r in self.records),
                  "wrong": sum(not r.ok for r in self.records)}
        for verdict in ("exact", "correctly rounded", "approximation", "wrong"):
            counts[verdict] = sum(r.verdict == verdict for r in self.records)
        counts["diagnosed"] = sum(r.diagnosis is not None for r in self.records if not r.ok)
        return counts

    def by_example(self) -> list[tuple[WorkedExample, list[ClaimRecord]]]:
        return [(ex, [r for r in self.records if r.example == ex.name]) for ex in self.examples]

    # -- renderings ------------------------------------------------------------------
    def text(self) -> str:
        out: list[str] = []
        for ex, records in self.by_example():
            out.append(f"Example {ex.name}" + (f" — {ex.title}" if ex.title else ""))
            if not records:
                out.append("  (no claims)")
            qw = max((len(_label(r)) for r in records), default=8)
            cw = max((len(r.claimed) for r in records), default=8)
            for r in records:
                mark = "✓" if r.ok else "✗"
                line = f"  {mark} {_label(r).ljust(qw)}  {r.claimed.ljust(cw)}  {r.verdict}"
                if r.verdict in ("correctly rounded", "wrong") and r.precision:
                    line += f" ({r.precision})"
                out.append(line)
                out.append(f"      exact: {r.exact}" + (f" = {r.exact_form}" if r.exact_form
                                                          and r.exact_form != r.exact else ""))
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
                   f"approximations), {s['wrong']} wrong ({s['diagnosed']} diagnosed).")
        out.append("Digits shown as exact are certified (exact rational arithmetic or Arb "
                   "enclosures); '…' means the expansion continues.")
        return "\n".join(out)

    def json(self) -> str:
        return json.dumps({"claims": [r.as_dict() for r in self.records],
                           "summary": {**self.summary(), "ok": self.ok}},
                          indent=2, ensure_ascii=False)

    def markdown(self) -> str:
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
                   f"({s['diagnosed']} diagnosed).**")
        return "\n".join(out)

    def _repr_html_(self) -> str:
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
