"""The library takes what users pass (a path, a Path, TOML text) and print(report) is
the readable report; the notebook display keeps the summary and the correct answer."""

from __future__ import annotations

from pathlib import Path

import pytest

import mha_symbolic as ms
from mha_symbolic.errors import ExampleFileError

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed.toml"


@pytest.mark.parametrize("given", [str(SEED), SEED, SEED.read_text(encoding="utf-8")],
                         ids=["str path", "Path", "TOML text"])
def test_check_examples_takes_a_path_or_text(given: object) -> None:
    report = ms.check_examples(given, only=["A"])
    assert [ex.name for ex in report.examples] == ["A"] and report.exit_status == 1


def test_check_examples_of_something_else_is_one_clear_error() -> None:
    with pytest.raises(ExampleFileError, match="expected worked examples, a path or TOML text"):
        ms.check_examples([1, 2])
    with pytest.raises(ExampleFileError, match="no such file"):
        ms.check_examples("no-such-file.toml")


def test_print_report_is_the_readable_report() -> None:
    report = ms.check_examples(SEED, only=["A"])
    assert str(report) == report.text()
    assert len(repr(report)) < 200 and "12 claims: 9 hold" in repr(report)
    assert repr(report).startswith("<CheckReport: 1 example, ")


def test_the_notebook_display_keeps_the_summary_and_the_correct_answer() -> None:
    report = ms.check_examples(SEED, only=["A"])
    page = report._repr_html_()
    assert "12 claims: 9 hold" in page
    assert "<th>correct answer</th>" in page and "(1.3395, 1.3210)" in page


def test_a_shape_error_is_reported_at_its_key_not_at_line_1() -> None:
    text = ('[[example]]\nname = "x"\nheads = 1\nd_k = 2\nquery = [[1, 0], [0, 1]]\n'
            'key = [[1, 0, 3], [0, 1, 3]]\nvalue = [[2, 0], [0, 4]]\n')
    with pytest.raises(ExampleFileError, match=r"^mine\.toml:6: example 'x': key has 3 columns"):
        ms.load_examples(text=text, source="mine.toml")
