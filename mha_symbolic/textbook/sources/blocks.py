"""``mha-check`` blocks: worked-example TOML inside the author's file, whose claims may point
at the printed statements of the text around them.

A claim's ``statement = "w_{11}"`` names the statement (in the block's section first,
then anywhere in the file) whose chain starts with that name (``w_{11} = … \\approx 0.6698``)
or carries that ``\\label``; its last printed member becomes the claim's ``claimed``
(``≈ 0.6698``), and the verdict is reported at the statement's line.  The TOML is then
read and checked by the worked-example verifier itself (:func:`~mha_symbolic.textbook.
load_examples`, :func:`~mha_symbolic.textbook.check_examples`), so every diagnosis
(premature rounding, truncation, 1/d_k, …) works on the page as written.

The block is handed over with as many empty lines before it as precede it in the file,
and the ``statement`` line is replaced by a ``claimed`` line in place: every line number
the verifier reports (also in its errors) is a line of the author's file.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..._text import echo
from ...errors import ExampleFileError, MhaSymbolicError
from .check import SourceRecord, normalized_name
from .extract import Document

__all__ = ["check_blocks"]

_STATEMENT_KEY = re.compile(r"^(?P<indent>[ \t]*)statement[ \t]*=[ \t]*(?P<value>.*?)[ \t]*$")


def _toml_string(raw: str, where: str) -> str:
    from ..toml_reader import parse_toml

    try:
        value = parse_toml(f"v = {raw[:2000]}", where).get("v")
    except (MhaSymbolicError, ValueError, RecursionError):
        value = None
    if not isinstance(value, str) or not value.strip():
        raise ExampleFileError(f"{where}: statement = must be a string naming a printed "
                               "statement of the text (such as \"w_{11}\")")
    return value


def _basic_string(text: str) -> str:
    """``text`` as a TOML basic string (quotes, backslashes and controls escaped)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _find(records: list[SourceRecord], name: str, section: str) -> SourceRecord | None:
    key = normalized_name(name)
    candidates = [r for r in records if r.kind == "statement" and r.printed is not None and (
        (key is not None and key in r.names) or r.label == name.strip())]
    same = [r for r in candidates if r.section == section]
    pool = same or candidates
    return pool[0] if pool else None


def check_blocks(doc: Document, shown: str, records: list[SourceRecord], *,
                 base_dir: Path | None = None) -> list[SourceRecord]:
    """The records with each block's claims added (at their statements' lines)."""
    from ..check import check_examples
    from ..examples import load_examples

    out = list(records)
    for block in doc.blocks:
        first = doc.line_of(block.start) if doc.line_map is None else \
            doc.text.count("\n", 0, block.start) + 1
        section = doc.section_titles[block.section] if block.section < len(
            doc.section_titles) else ""
        lines = block.text.split("\n")
        pointed: dict[int, SourceRecord] = {}  # TOML line (virtual) → statement
        for i, line in enumerate(lines):
            m = _STATEMENT_KEY.match(line)
            if not m:
                continue
            where = f"{shown}:{_real(doc, first + i)}"
            name = _toml_string(m.group("value"), where)
            target = _find(records, name, section)
            if target is None:
                raise ExampleFileError(f"{where}: statement = {echo(name, 40)} names no printed "
                                       "statement of the text (a chain starting with that name "
                                       "and ending in a printed number, or a \\label)")
            assert target.printed is not None
            lines[i] = f"{m.group('indent')}claimed = {_basic_string(target.printed)}"
            pointed[first + i] = target
        pointed.update(_by_quantity(lines, first, records, section,
                                    lambda i, base=first: f"{shown}:{_real(doc, base + i)}"))
        toml = "\n" * (first - 1) + "\n".join(lines)
        try:
            examples = load_examples(text=toml, source=shown, base_dir=base_dir)
        except ExampleFileError as exc:
            if doc.line_map is None:
                raise
            raise ExampleFileError(f"{exc} (in the notebook's mha-check cell at line "
                                   f"{_real(doc, first)})") from None
        report = check_examples(examples)
        targets = _claim_targets(lines, first, pointed, len(report.records))
        for r, target in zip(report.records, targets, strict=True):
            claim_line = target.line if target is not None else _real(doc, r.line or first)
            text = f"{r.example}: {r.quantity} {r.claimed}"
            if target is not None:
                text = f"{r.example}: {r.quantity} = {target.text}"
            verdict = r.verdict if r.verdict in ("wrong", "undecided", "unreadable",
                                                 "ambiguous") else (
                r.verdict if r.ok else "wrong")
            out.append(SourceRecord(shown, claim_line, text, verdict, r.ok, kind="claim",
                                    claim=replace(r, file=shown, line=claim_line), section=section))
    out.sort(key=lambda r: (r.line, r.kind == "claim"))
    return out


_CLAIM_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*example[ \t]*\.[ \t]*claim[ \t]*\]\][ \t]*(#.*)?$")
_TABLE_HEADER = re.compile(r"^[ \t]*\[\[?[ \t]*[A-Za-z_][\w.\t \"'-]*\]\]?[ \t]*(#.*)?$")


def _claim_targets(lines: list[str], first: int, pointed: dict[int, SourceRecord],
                   count: int) -> list[SourceRecord | None]:
    """The statement each claim points at, in the verifier's order (examples, then their
    claims, as written): a claim's table runs from its ``[[example.claim]]`` header to the
    next table header.  Claims not written as such tables (inline arrays) are matched by
    nothing but the exact line of their rewritten ``statement`` key."""
    tables = [[first + i for i in rows] for rows in _claim_tables(lines)]
    if len(tables) != count:
        return [None] * count
    return [next((pointed[k] for k in rows if k in pointed), None) for rows in tables]


#: How a text spells a claim's quantity (``{i}``, ``{j}``: its 1-based indices; ``{h}``: its
#: head): ``weight[1,2]`` is the statement ``w_{12} \\approx 0.3302`` (or ``w_{1,2}``,
#: ``\\alpha_{12}``, …), ``head_output[1]`` of head 1 is ``head_{1}[1] = …``.
SPELLINGS = {
    "weight": ("w_{{{i}{j}}}", "w_{{{i},{j}}}", "weight_{{{i}{j}}}", "weight_{{{i},{j}}}",
               "\\alpha_{{{i}{j}}}", "\\alpha_{{{i},{j}}}", "a_{{{i}{j}}}", "a_{{{i},{j}}}",
               "p_{{{i}{j}}}", "p_{{{i},{j}}}"),
    "score": ("s_{{{i}{j}}}", "s_{{{i},{j}}}", "score_{{{i}{j}}}", "score_{{{i},{j}}}"),
    "head_output": ("head_{{{h}}}[{i}]", "head_{{{h}}}[{i}, {j}]", "o_{{{i}{j}}}"),
    "output": ("y_{{{i}}}", "output_{{{i}}}", "y_{{{i}{j}}}", "output_{{{i}{j}}}"),
}


def spellings(quantity: str, head: int = 1) -> list[str]:
    """The names a text may give to a claim's quantity (none for one without a spelling).

    >>> spellings("weight[1,2]")[:3]
    ['w_{12}', 'w_{1,2}', 'weight_{12}']
    >>> spellings("head_output[2]", head=1)
    ['head_{1}[2]']
    """
    from ..quantities import parse_quantity

    try:
        name, sub, idx = parse_quantity(quantity)
    except MhaSymbolicError:
        return []
    if sub is not None or not idx or len(idx) > 2:
        return []
    out = []
    for pattern in SPELLINGS.get(name, ()):
        wants = pattern.count("{i}") + pattern.count("{j}")
        if wants != len(idx) or (len(idx) == 2 and "{i}{j}" in pattern and max(idx) > 9):
            continue  # w_{1112} would be ambiguous: concatenated indices only below 10
        out.append(pattern.format(i=idx[0], j=idx[-1], h=head))
    return out


def _by_quantity(lines: list[str], first: int, records: list[SourceRecord], section: str,
                 where: Any) -> dict[int, SourceRecord]:
    """Claims with neither ``claimed`` nor ``statement``: each points at the printed
    statement of the block's section that names its quantity (:data:`SPELLINGS`).  The
    ``claimed`` line is written into a blank line at the end of the claim's table (or after
    the block's last line), so no line of the block moves.  Returns {virtual line: statement}.
    A block that is not TOML is left to the verifier, which reports it."""
    from ..toml_reader import parse_toml  # bounded cost (tomllib is quadratic on a.a.a…)

    try:
        data = parse_toml("\n".join(lines), "block")
    except (MhaSymbolicError, ValueError, RecursionError):
        return {}
    claims = [c for ex in _tables(data.get("example")) for c in _tables(ex.get("claim"))]
    tables = _claim_tables(lines)
    if len(tables) != len(claims):
        return {}
    out: dict[int, SourceRecord] = {}
    for n, (rows, claim) in enumerate(zip(tables, claims, strict=True)):
        quantity = claim.get("quantity")
        if "claimed" in claim or "statement" in claim or not isinstance(quantity, str):
            continue
        head = claim.get("head", 1)
        names = spellings(quantity, head if isinstance(head, int) else 1)
        key_row = next((i for i in rows if re.match(r"[ \t]*quantity[ \t]*=", lines[i])),
                       rows[0] if rows else 0)
        target = _find_named(records, names, section)
        if target is None:
            shown = ", ".join(names[:4]) or "none: give claimed = or statement ="
            raise ExampleFileError(f"{where(key_row)}: the claim of {echo(quantity, 40)} has "
                                   "no claimed and names no printed statement of this section "
                                   f"(spelled {shown})")
        assert target.printed is not None
        # the table's last line if blank (never a blank line inside a multi-line string)
        slot = rows[-1] if rows and not lines[rows[-1]].strip() else None
        if slot is None and n == len(tables) - 1:
            lines.append("")
            slot = len(lines) - 1
        if slot is None:
            raise ExampleFileError(f"{where(key_row)}: a claim that points at its statement by "
                                   "its quantity needs a blank line after it, before the next "
                                   "table (or give statement = …)")
        lines[slot] = f"claimed = {_basic_string(target.printed)}"
        out[first + slot] = target
    return out


def _tables(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _claim_tables(lines: list[str]) -> list[list[int]]:
    """The line indices of each ``[[example.claim]]`` table (header excluded), in order."""
    tables: list[list[int]] = []
    current: list[int] | None = None
    for i, line in enumerate(lines):
        if _CLAIM_HEADER.match(line):
            current = []
            tables.append(current)
        elif _TABLE_HEADER.match(line):
            current = None
        elif current is not None:
            current.append(i)
    return tables


def _find_named(records: list[SourceRecord], names: list[str],
                section: str) -> SourceRecord | None:
    keys = {k for k in (normalized_name(n) for n in names) if k is not None}
    return next((r for r in records if r.kind == "statement" and r.printed is not None
                 and r.section == section and keys.intersection(r.names)), None)


def _real(doc: Document, virtual_line: int) -> int:
    if doc.line_map is None:
        return virtual_line
    return doc.line_map[min(max(virtual_line - 1, 0), len(doc.line_map) - 1)]



