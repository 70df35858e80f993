"""Coverage-guided fuzzing of the number grammar and the printed-answer reader (atheris).

    python -m tests.fuzz.atheris_parsers -runs=200000 -timeout=5 -rss_limit_mb=4096 \\
        -max_len=400 [CORPUS_DIR]

libFuzzer mutates the input bytes toward new branches of ``exact/grammar.py`` and
``textbook/claims.py`` (both instrumented); each input is read as text and given to
``parse_number`` and ``parse_printed`` (plain and as a shape).  Any exception that is
not a ``MhaSymbolicError``, an error message on several lines or holding a control
character, a run over ``-timeout`` seconds or over ``-rss_limit_mb`` is a crash: libFuzzer
stops and writes the input to ``crash-*``/``timeout-*``.  Seeded with the book notations
and hostile snippets of :mod:`.generators` when no corpus folder is given.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["mha_symbolic"]):
    from mha_symbolic._text import has_control
    from mha_symbolic.errors import MhaSymbolicError
    from mha_symbolic.exact.grammar import parse_number
    from mha_symbolic.textbook.claims import parse_printed


def _check(exc: MhaSymbolicError) -> None:
    msg = str(exc)
    if "\n" in msg or has_control(msg) or len(msg) > 1500:
        raise AssertionError(f"bad message: {msg[:300]!r}")


def test_one_input(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
    for parse in (parse_number, parse_printed, lambda t: parse_printed(t, shape=True)):
        try:
            parse(text)
        except MhaSymbolicError as exc:
            _check(exc)


def main() -> None:
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):
        from .generators import BOOK_NUMBERS, HOSTILE_NUMBERS

        seeds = Path(tempfile.mkdtemp(prefix="mha-atheris-"))
        for k, text in enumerate(BOOK_NUMBERS + HOSTILE_NUMBERS):
            (seeds / f"seed-{k}").write_bytes(text.encode("utf-8", "surrogatepass"))
        argv.append(str(seeds))
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
