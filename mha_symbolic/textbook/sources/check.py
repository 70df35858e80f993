"""``mha-symbolic check`` on an author's own file: every closed statement of its math judged
where it is written, and its ``mha-check`` blocks checked as worked examples.

>>> from mha_symbolic.textbook.sources import check_source
>>> report = check_source(text="Let $d_k = 64$. Then $\\\\sqrt{d_k} = 8$ and "
...                            "$\\\\frac{1}{2} \\\\approx 0.707$.",
...                       fmt="markdown", name="page.md")
>>> [(r.line, r.verdict) for r in report.records]
[(1, 'not judged'), (1, 'exact'), (1, 'wrong')]
>>> report.exit_status
1
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._text import sanitize
from ...errors import ExampleFileError, MhaSymbolicError
from .extract import Document, extract, format_of
from .statements import HOLDS, Relation, Section, judge_statement, printed, split_statements

__all__ = ["SourceRecord", "SourceReport", "check_source"]

#: Largest author's file read (bytes): a chapter is ~100 kB; a notebook with images more.
MAX_SOURCE_BYTES = 4_000_000
#: Most statements judged in one file (the rest are reported as not judged).
MAX_STATEMENTS = 5000
SCHEMA = "mha-symbolic-source-check/1"
# an align environment's "&" before a relation (w_1 &= …), dropped from the text shown
_ALIGN_MARK = re.compile(r"&(?=\s*(?:=|\\approx|<|>|\\le|\\ge))")


@dataclass(frozen=True)
class SourceRecord:
    """The verdict on one statement of the text, or on one claim of an mha-check block."""

    file: str
    line: int
    text: str  # the statement as written (or "quantity: claimed" for a block's claim)
    verdict: str  # statements.HOLDS, "wrong", "undecided", "ambiguous", "not judged", "unreadable"
    ok: bool
    relations: tuple[Relation, ...] = ()
    reason: str | None = None  # why not judged
    kind: str = "statement"  # "statement" | "claim"
    claim: Any = None  # the ClaimRecord of a block's claim
    section: str = ""
    names: tuple[str, ...] = ()  # names a statement binds or starts with
    label: str | None = None
    printed: str | None = None  # its last printed member, as a TOML claim reads it

    @property
    def diagnosis(self) -> str | None:
        if self.claim is not None:
            return self.claim.diagnosis
        return next((r.diagnosis for r in self.relations if r.diagnosis), None)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "kind": self.kind,
                               "text": self.text, "verdict": self.verdict, "ok": self.ok,
                               "reason": self.reason, "diagnosis": self.diagnosis,
                               "section": self.section}
        if self.relations:
            out["relations"] = [{"left": r.left, "relation": r.relation, "right": r.right,
                                 "verdict": r.verdict, "ok": r.ok, "exact": r.exact,
                                 "rounded": r.rounded, "detail": r.detail,
                                 "diagnosis": r.diagnosis} for r in self.relations if r.relation]
        if self.claim is not None:
            out["claim"] = self.claim.as_dict()
        return out


@dataclass(frozen=True)
class SourceReport:
    file: str
    records: tuple[SourceRecord, ...]
    format: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def exit_status(self) -> int:
        """0 nothing wrong; 1 a statement or claim is wrong; 4 none wrong, some undecided
        or ambiguous (readings disagree: never counted as wrong); 2 an mha-check claim
        could not be read (as for a TOML file)."""
        verdicts = {r.verdict for r in self.records}
        if "unreadable" in verdicts:
            return 2
        if "wrong" in verdicts:
            return 1
        return 4 if verdicts & {"undecided", "ambiguous"} else 0

    def summary(self) -> dict[str, int]:
        st = [r for r in self.records if r.kind == "statement"]
        cl = [r for r in self.records if r.kind == "claim"]
        return {"statements": len(st), "judged": sum(r.verdict != "not judged" for r in st),
                "hold": sum(r.verdict in HOLDS for r in st),
                "wrong": sum(r.verdict == "wrong" for r in st),
                "undecided": sum(r.verdict == "undecided" for r in st),
                "not_judged": sum(r.verdict == "not judged" for r in st),
                "diagnosed": sum(r.verdict == "wrong" and r.diagnosis is not None for r in st),
                "claims": len(cl), "claims_hold": sum(r.ok for r in cl),
                "claims_wrong": sum(r.verdict == "wrong" for r in cl)}

    def summary_line(self) -> str:
        s = self.summary()
        text = (f"{s['statements']} statements: {s['hold']} hold, {s['wrong']} wrong "
                f"({s['diagnosed']} diagnosed), {s['undecided']} undecided, "
                f"{s['not_judged']} not judged")
        if s["claims"]:
            text += (f"; {s['claims']} mha-check claims: {s['claims_hold']} hold, "
                     f"{s['claims_wrong']} wrong")
        return text + "."

    def text(self, *, quiet: bool = False, not_judged: bool = False) -> str:
        out: list[str] = []
        for r in self.records:
            if quiet and (r.ok or r.verdict == "not judged"):
                continue
            if r.verdict == "not judged" and not not_judged:
                continue
            out.extend(_text_record(r))
        out.append(sanitize(self.file) + ": " + self.summary_line())
        out.append("Verdicts are certified (exact rational arithmetic or Arb enclosures); "
                   "'not judged' is never counted as wrong.")
        return "\n".join(out)

    def json(self, *, quiet: bool = False) -> str:
        records = [r for r in self.records if not (quiet and r.ok)]
        from ..reports import json_text

        return json_text({"schema": SCHEMA, "file": self.file, "format": self.format,
                          "summary": self.summary(), "records": [r.as_dict() for r in records],
                          "exit_status": self.exit_status})

    def markdown(self, *, quiet: bool = False, not_judged: bool = False) -> str:
        from ..._text import markdown_code

        out = [f"**{_md(self.file)}**: {_md(self.summary_line())}", "",
               "| line | statement | verdict | detail |", "|---|---|---|---|"]
        for r in self.records:
            if (quiet and r.ok) or (r.verdict == "not judged" and not not_judged):
                continue
            detail = r.reason or r.diagnosis or _first_detail(r) or ""
            out.append(f"| {r.line} | {markdown_code(_one(r.text, 70))} | {_md(r.verdict)} | "
                       f"{_md(_one(detail, 160))} |")
        return "\n".join(out)


def _first_detail(r: SourceRecord) -> str | None:
    if r.claim is not None:
        return r.claim.detail
    return next((x.detail for x in r.relations if x.detail), None)


def _md(text: str) -> str:
    from ..._text import markdown_text

    return markdown_text(sanitize(text))


def _one(text: str, width: int) -> str:
    t = " ".join(sanitize(text).split())
    return t if len(t) <= width else t[:width - 1] + "…"


_MARKS = {"wrong": "✗", "undecided": "?", "ambiguous": "?", "not judged": "·",
          "unreadable": "!"}


def _text_record(r: SourceRecord) -> list[str]:
    mark = _MARKS.get(r.verdict, "✓")
    head = f"{sanitize(r.file)}:{r.line}: {mark} {_one(r.text, 90)}"
    lines = [head]
    if r.verdict == "not judged":
        lines[0] += f"  — not judged: {_one(r.reason or '', 120)}"
        return lines
    if r.claim is not None:
        c = r.claim
        lines.append(f"    {c.verdict} ({c.precision})" if c.precision else f"    {c.verdict}")
        if c.exact:
            lines.append(f"    exact: {_one(c.exact, 100)}")
        if c.verdict == "wrong" and c.rounded:
            lines.append(f"    correct answer: {_one(c.rounded, 100)}")
        if c.diagnosis:
            lines.append(f"    diagnosis: {_one(c.diagnosis, 300)}")
        if c.detail:
            lines.append(f"    note: {_one(c.detail, 200)}")
        if c.error:
            lines.append(f"    error: {_one(c.error, 300)}")
        return lines
    for x in r.relations:
        if not x.relation:
            lines.append(f"    (part not judged: {_one(x.detail or '', 120)})")
            continue
        lines.append(f"    {_one(x.left, 50)} {x.relation} {_one(x.right, 50)}: {x.verdict}"
                     + (f" (exact {_one(x.exact, 40)})" if x.exact else ""))
        if x.verdict == "wrong" and x.rounded:
            lines.append(f"      correct rounding: {_one(x.rounded, 60)}")
        if x.detail:
            lines.append(f"      {_one(x.detail, 240)}")
        if x.diagnosis:
            lines.append(f"      diagnosis: {_one(x.diagnosis, 300)}")
    return lines


def _verdict(relations: list[Relation]) -> tuple[str, bool]:
    judged = [r for r in relations if r.relation]
    if any(r.verdict == "wrong" for r in judged):
        return "wrong", False
    if any(r.verdict == "undecided" for r in judged):
        return "undecided", False
    order = list(HOLDS)
    worst = max((r.verdict for r in judged), key=lambda v: (v in order, order.index(v)
                                                              if v in order else -1))
    return worst, True


def _read(path: str) -> str:
    from ..._io import STDIN, read_bounded

    data = read_bounded(path, MAX_SOURCE_BYTES)
    shown = "<stdin>" if path == STDIN else sanitize(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ExampleFileError(f"{shown}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                               ) from None


def check_source(path: str | Path | None = None, *, text: str | None = None,
                 fmt: str | None = None, name: str | None = None) -> SourceReport:
    """Judge every closed statement of an author's file (Markdown/MyST/Quarto, reST, LaTeX,
    a notebook) and check its mha-check blocks; the format from the suffix unless given."""
    if (path is None) == (text is None):
        raise ExampleFileError("give a path or text, not both or neither")
    shown = name or (sanitize(str(path)) if path is not None else "<text>")
    if path is not None:
        text = _read(str(path))
    assert text is not None
    if len(text) > MAX_SOURCE_BYTES:
        raise ExampleFileError(f"{shown}: larger than {MAX_SOURCE_BYTES} characters")
    fmt = format_of(str(name or path or ""), fmt)
    doc = extract(text, fmt)
    records = _statements(doc, shown)
    if doc.blocks:
        from .blocks import check_blocks

        records = check_blocks(doc, shown, records, base_dir=Path(path).parent
                               if path is not None and str(path) != "-" else None)
    return SourceReport(shown, tuple(records), fmt)


def _statements(doc: Document, shown: str) -> list[SourceRecord]:
    records: list[SourceRecord] = []
    section_index = -1
    m = _INPUTS_DIRECTIVE.search(doc.text)
    inputs = m.group(1) if m else "printed"
    section = Section(inputs=inputs)
    count = 0
    for span in doc.spans:
        if span.section != section_index:
            section_index, section = span.section, Section(inputs=inputs)
        try:
            statements = split_statements(span.text, span.start)
        except MhaSymbolicError as exc:
            records.append(SourceRecord(shown, doc.line_of(span.start), span.text[:200],
                                        "not judged", True, reason=str(exc)))
            continue
        scale = _scale_after(doc.text, span.start + len(span.text))
        for st in statements[-1:]:
            st.scale = scale
            st.unit = _unit_after(doc.text, span.start + len(span.text))
        for st in statements:
            count += 1
            line = doc.line_of(st.start)
            written = _ALIGN_MARK.sub("", " ".join(doc.text[st.start:st.end].split()))
            title = doc.section_titles[span.section] if span.section < len(
                doc.section_titles) else ""
            if count > MAX_STATEMENTS:
                records.append(SourceRecord(shown, line, written[:200], "not judged", True,
                                            reason=f"more than {MAX_STATEMENTS} statements in "
                                            "one file", section=title))
                continue
            names, last = _names_and_printed(st)
            try:
                relations, reason = judge_statement(st, doc.text, section)
            except MhaSymbolicError as exc:  # a bound reached inside the exact core
                relations, reason = [], " ".join(str(exc).split())[:200]
            if not relations:
                records.append(SourceRecord(shown, line, written, "not judged", True,
                                            reason=reason, section=title, names=names,
                                            label=st.label, printed=last))
                continue
            verdict, ok = _verdict(relations)
            records.append(SourceRecord(shown, line, written, verdict, ok, tuple(relations),
                                        section=title, names=names, label=st.label,
                                        printed=last))
    return records


#: ``mha-check: inputs = exact`` anywhere in the file (a comment: ``<!-- … -->``, ``% …``,
#: ``.. …``): decimal inputs of formulas are exact, never read as printed intervals.
_INPUTS_DIRECTIVE = re.compile(r"mha-check:[ \t]*inputs[ \t]*=[ \t]*\"?(exact|printed)\b")
_SCALE_AFTER = re.compile(r"\$*[ \t]*([A-Za-z]+)")


def _scale_after(text: str, end: int) -> str:
    """A scale word right after a math span ("$\\approx 85$ million"), else ""."""
    from ..claims import SCALES

    m = _SCALE_AFTER.match(text, end, min(end + 40, len(text)))
    word = m.group(1) if m else ""
    return word if word in SCALES and len(word) > 1 else ""


#: A unit with an SI or binary prefix right after a math span ("$1/8000=0.125$ ms"): the
#: printed number is in those units, the formula in others, so the last pair is not judged.
_UNIT_AFTER = re.compile(r"\$*[ \t]*(?:\\,|~)?[ \t]*((?:[pnuµμm]s|(?:[kKMGTPE]i?|[kKMGTPE])(?:B|b|"
                         r"bit|bits|bytes?|Hz|W|m|FLOPs?|FLOP/s|FLOPS|ops?|s)|[mck]m|[mkMG]W|"
                         r"[mµμnp]W))(?![A-Za-z])")


def _unit_after(text: str, end: int) -> str:
    m = _UNIT_AFTER.match(text, end, min(end + 40, len(text)))
    return m.group(1) if m else ""


def _names_and_printed(st: Any) -> tuple[tuple[str, ...], str | None]:
    """The names at the head of a statement, and its last printed member as a TOML claim
    (``≈ 0.6698``) — what an mha-check claim's ``statement = …`` points at."""
    from .latex_math import NotJudged, parse_member

    names: list[str] = []
    members = st.members[1:] if st.leading else st.members
    nodes = []
    for m in members:
        try:
            nodes.append(parse_member(m))
        except NotJudged:
            nodes.append(None)
    for node in nodes:
        if node is not None and node[0] == "sym":
            names.append(node[1])
        else:
            break
    last = None
    if nodes and nodes[-1] is not None:
        p = printed(nodes[-1])
        if p is not None:
            rel = st.relations[-1]
            last = ("≈ " if rel == "≈" else "") + p[0]
    return tuple(names), last


def normalized_name(text: str) -> str | None:
    """The name a block's ``statement = "w_{11}"`` means, read as the text's names are."""
    from .latex_math import NotJudged, parse_member, tokenize

    try:
        node = parse_member(tokenize(text))
    except NotJudged:
        return None
    return node[1] if node[0] == "sym" else None


def cli_check_source(args: Any) -> int:
    """``mha-symbolic check FILE`` for an author's file (see :func:`check_source`)."""
    fmt = getattr(args, "input_format", None)
    path = args.file
    if path == "-" and not fmt:
        raise ExampleFileError("standard input needs --input-format (markdown, myst, quarto, "
                               "rst, latex, notebook)")
    report = check_source(path, fmt=fmt, name="<stdin>" if path == "-" else None)
    quiet = bool(getattr(args, "quiet", False))
    show = bool(getattr(args, "not_judged", False))
    if args.format == "json":
        print(report.json(quiet=quiet))
    elif args.format == "markdown":
        print(report.markdown(quiet=quiet, not_judged=show))
    else:
        print(report.text(quiet=quiet, not_judged=show))
    return report.exit_status


def is_author_source(path: str, fmt: str | None) -> bool:
    """Whether ``check`` reads FILE as an author's source (not worked-example TOML)."""
    if fmt:
        return fmt != "toml"
    lower = path.lower()
    return not lower.endswith(".toml") and bool(re.search(
        r"\.(md|markdown|myst|qmd|rmd|rst|tex|ltx|ipynb|txt)$", lower))



