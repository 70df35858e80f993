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

from ..._text import echo
from ...errors import ExampleFileError
from .check import SourceRecord, normalized_name
from .extract import Document

__all__ = ["check_blocks"]

_STATEMENT_KEY = re.compile(r"^(?P<indent>[ \t]*)statement[ \t]*=[ \t]*(?P<value>.*?)[ \t]*$")


def _toml_string(raw: str, where: str) -> str:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    try:
        value = tomllib.loads(f"v = {raw[:2000]}").get("v")
    except (tomllib.TOMLDecodeError, ValueError, RecursionError):
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
            verdict = r.verdict if r.verdict in ("wrong", "undecided", "unreadable") else (
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
    tables: list[list[int]] = []
    current: list[int] | None = None
    for i, line in enumerate(lines):
        if _CLAIM_HEADER.match(line):
            current = []
            tables.append(current)
        elif _TABLE_HEADER.match(line):
            current = None  # another table: its lines belong to no claim
        elif current is not None:
            current.append(first + i)
    if len(tables) != count:
        return [None] * count
    return [next((pointed[k] for k in rows if k in pointed), None) for rows in tables]


def _real(doc: Document, virtual_line: int) -> int:
    if doc.line_map is None:
        return virtual_line
    return doc.line_map[min(max(virtual_line - 1, 0), len(doc.line_map) - 1)]



