"""pytest --mha-check-sources (issue 26): authors' files collected, one item per judged
statement, failures at FILE:LINE; nothing collected without the option."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

import mha_symbolic

pytest_plugins = ["pytester"]

_ROOT = str(Path(mha_symbolic.__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def _package_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", _ROOT if not old else _ROOT + os.pathsep + old)


def _plugin_args() -> list[str]:
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.value == "mha_symbolic.testing.pytest_plugin" for ep in eps):
        return []
    return ["-p", "mha_symbolic.testing.pytest_plugin"]


PAGE = "# A\n\n$d_k = 4$ and $\\sqrt{d_k} = 2$.\n\nThen $\\frac{1}{2} \\approx 0.707$ and $x = y$.\n"


def test_sources_are_collected_only_when_asked(pytester: pytest.Pytester) -> None:
    pytester.makefile(".md", page=PAGE)
    result = pytester.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes()  # nothing collected: existing suites are not affected
    result = pytester.runpytest_subprocess(*_plugin_args(), "--mha-check-sources", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*page.md::line 3 PASSED*",
                                 "*page.md:5: ✗ *frac{1}{2} *approx 0.707*"])


def test_not_judged_statements_are_skipped_when_asked(pytester: pytest.Pytester) -> None:
    pytester.makefile(".md", page=PAGE)
    result = pytester.runpytest_subprocess(*_plugin_args(), "--mha-check-sources",
                                           "--mha-check-not-judged")
    result.assert_outcomes(passed=1, failed=1, skipped=2)


def test_ini_option_and_unreadable_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmha_check_sources = true\n")
    pytester.makefile(".ipynb", nb="{not json")
    pytester.makefile(".tex", doc="\\[ 2^{10} = 1024 \\]\n")
    result = pytester.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*not a notebook: invalid JSON*"])
