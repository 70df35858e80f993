"""The quick fuzz run, part of the normal test suite (a few thousand inputs, seconds).

The same generators and properties as the long run (``python -m tests.fuzz.long``),
driven by hypothesis so that a failure shrinks to a small input.  Each input has a
wall-clock deadline (SIGALRM), generous because the machine may be shared: the long
run enforces the 5 CPU-second limit.  The harness is tested too: each property
fails on a planted fault.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import generators as g
from . import properties as prop

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGALRM")

FUZZ: dict[str, Any] = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                            suppress_health_check=list(HealthCheck))
DEADLINE_S = 30


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: float = DEADLINE_S) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _no_problems(problems: list[tuple[str, str]]) -> None:
    assert problems == [], problems


@settings(max_examples=500, **FUZZ)
@given(st.data())
def test_fuzz_numbers(data: Any) -> None:
    text = g.number_text(g.DataSource(data))
    with deadline():
        _no_problems(prop.run_number(text))


@settings(max_examples=500, **FUZZ)
@given(st.data())
def test_fuzz_printed_claims(data: Any) -> None:
    src = g.DataSource(data)
    text, value = g.printed_text(src), src.choice(g.BOOK_NUMBERS[:20])
    with deadline():
        _no_problems(prop.run_claim(text, value))


@settings(max_examples=80, **FUZZ)
@given(st.data())
def test_fuzz_documents_and_reports(data: Any) -> None:
    text = g.document_text(g.DataSource(data))
    with deadline():
        _no_problems(prop.run_document(text))


@settings(max_examples=150, **FUZZ)
@given(st.data())
def test_fuzz_authors_sources(data: Any) -> None:
    text, fmt = g.source_text(g.DataSource(data))
    with deadline():
        _no_problems(prop.run_source(text, fmt))


@settings(max_examples=15, **FUZZ)
@given(st.data())
def test_fuzz_derivations_hold_no_tex_from_the_file(data: Any) -> None:
    src = g.DataSource(data)
    text, fmt = g.document_text(src), src.choice(["tex", "fragment", "markdown"])
    with deadline():
        _no_problems(prop.run_derivation(text, fmt))


@settings(max_examples=20, **FUZZ)
@given(st.data())
def test_fuzz_command_line_in_process(data: Any) -> None:
    call = g.cli_call(g.DataSource(data))
    with deadline(60):
        _no_problems(prop.run_cli_inprocess(call))


@settings(max_examples=2, **FUZZ)
@given(st.data())
def test_fuzz_command_line_in_a_subprocess(data: Any) -> None:
    call = g.cli_call(g.DataSource(data))
    problems, _cpu = prop.run_cli_subprocess(call)
    _no_problems(problems)


def test_long_run_driver_counts_and_checkpoints(tmp_path: Path) -> None:
    """The long run's driver on a few hundred inputs: every input counted, none failing."""
    import json

    from . import long

    ckpt = tmp_path / "ckpt.json"
    rc = long.main(["--inputs", "300", "--workers", "1", "--checkpoint", str(ckpt),
                    "--crashes", str(tmp_path / "crashes"), "--hang", "120"])
    data = json.loads(ckpt.read_text())
    assert data["inputs"] == 300 and data["finished"]
    assert sum(v for k, v in data["counts"].items() if k.startswith("kind:")) == 300
    assert rc == 0, data["problems"]


def test_inputs_are_reproducible_from_their_index() -> None:
    from . import long

    assert long.make_input(15, 12345) == long.make_input(15, 12345)
    kinds = {long.kind_of(15, i) for i in range(2000)}
    assert kinds == {k for k, _ in long.KINDS}


# -- the harness detects what it counts --------------------------------------------------------


def test_harness_counts_a_foreign_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.exact.grammar as grammar

    def broken(text: str) -> Any:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(grammar, "parse_number", broken)
    assert [c for c, _ in prop.run_number("1")] == ["foreign-exception"]


def test_harness_counts_a_bad_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.exact.grammar as grammar
    from mha_symbolic.errors import ParseError

    def shouts(text: str) -> Any:
        raise ParseError("two\nlines \x1b[31m")

    monkeypatch.setattr(grammar, "parse_number", shouts)
    assert [c for c, _ in prop.run_number("1")] == ["bad-message"]


def test_harness_counts_control_characters_in_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from mha_symbolic.textbook.reports import CheckReport

    monkeypatch.setattr(CheckReport, "sanitized", lambda self: self)
    doc = '[[example]]\nname = "red\\u001b[31m"\nscores = [[1, 0]]\n[[example.claim]]\n' \
          'quantity = "weight[1,1]"\nclaimed = "0.7311"\n'
    assert "control-in-report" in [c for c, _ in prop.run_document(doc)]


def test_harness_counts_tex_from_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.textbook.derivation.markup as derivation

    monkeypatch.setattr(derivation, "_tex_text", lambda text: text)
    doc = '[[example]]\ntitle = "\\\\input{/etc/passwd}"\nscores = [[1, 0]]\n'
    assert "tex-injection" in [c for c, _ in prop.run_derivation(doc, "tex")]


def test_harness_counts_files_written_outside_the_output_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.textbook.check as check

    real = check.cli_check

    def leaky(args: Any) -> int:
        Path("in/leaked.txt").write_text("x")
        return real(args)

    monkeypatch.setattr(check, "cli_check", leaky)
    call = g.CliCall(["check", "in/in.toml"], {"in.toml": '[[example]]\nscores = [[1, 0]]\n'})
    assert "file-outside" in [c for c, _ in prop.run_cli_inprocess(call)]


def test_harness_counts_an_internal_error_of_the_command_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.textbook.check as check

    def crash(args: Any) -> int:
        raise AttributeError("'NoneType' object has no attribute 'cols'")

    monkeypatch.setattr(check, "cli_check", crash)
    call = g.CliCall(["check", "in/in.toml"], {"in.toml": "x"})
    assert [c for c, _ in prop.run_cli_inprocess(call)] == ["foreign-exception"]


def test_harness_counts_faults_in_authors_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.textbook.sources as sources
    import mha_symbolic.textbook.sources.check as check

    def broken(**kwargs: Any) -> Any:
        raise IndexError("list index out of range")

    monkeypatch.setattr(sources, "check_source", broken)
    assert [c for c, _ in prop.run_source("$1 = 1$", "markdown")] == ["foreign-exception"]
    monkeypatch.undo()
    monkeypatch.setattr(check, "sanitize", lambda text, **kw: text)  # escaping removed
    problems = prop.run_source("$\\text{\x1b[31m} = 1 + 1 = 3$", "markdown")
    assert "control-in-report" in [c for c, _ in problems]


@pytest.mark.parametrize("i", range(60))
def test_public_functions_take_hostile_arguments(i: int) -> None:
    from . import ring2

    assert ring2.run_api(ring2.api_call(g.RandomSource((30, i, "api")))) == []


def test_public_functions_take_every_hostile_argument() -> None:
    """Every (function, option, value, input scale) the API generator can draw: 6,460
    calls, a few CPU seconds.  The long run found ``scale=1e200`` with values of 1e150
    raising OverflowError from ``math.ldexp`` inside the forward model."""
    from . import ring2

    problems = [(fn, opt, repr(ring2.SCALARS[vi])[:40], which, p)
                for fn, opts in sorted(ring2._OPTIONS.items()) for opt in opts
                for vi in range(len(ring2.SCALARS)) for which in range(5)
                for p in ring2.run_api((fn, opt, vi, which))]
    assert problems == []


@pytest.mark.parametrize("i", range(60))
def test_hostile_array_files_are_one_line(i: int) -> None:
    from . import ring2

    assert ring2.run_array(ring2.array_file(g.RandomSource((30, i, "arrays")))) == []


def test_harness_counts_a_leaked_runtime_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import mha_symbolic as ms

    from . import ring2

    def leaky(*args: Any, **kwargs: Any) -> Any:
        warnings.warn("overflow encountered in multiply", RuntimeWarning, stacklevel=1)

    monkeypatch.setattr(ms, "reference_attention", leaky)
    problems = ring2.run_api(("reference_attention", "scale", 0, 0))
    assert [c for c, _ in problems] == ["foreign-exception"]
