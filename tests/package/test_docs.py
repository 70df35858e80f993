"""The docs' ``>>>`` examples run, so that what they say a function returns cannot drift
from what it returns (the README and every page of docs/)."""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
               if ">>> " in p.read_text(encoding="utf-8"))
#: pages whose examples need an optional part (they skip without it)
NEEDS = {"gradients.md": "torch", "testing.md": "torch"}


def test_the_pages_with_examples_are_found() -> None:
    assert {"testing.md", "worked-example-format.md", "oracle.md"} <= {p.name for p in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_examples_of_a_page_run(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need = NEEDS.get(page.name)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"{page.name}'s examples need {need}, an optional extra")
    monkeypatch.chdir(ROOT)  # the pages name files as seen from the repository's root
    # a fence closing a block ends its expected output (doctest would read it as output)
    text = re.sub(r"(?m)^\s*```.*$", "", page.read_text(encoding="utf-8"))
    test = doctest.DocTestParser().get_doctest(text, {}, page.name, str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("module", ["textbook.selection", "textbook.bundled", "textbook.verdicts",
                                    "testing.report", "exact.proof_render"])
def test_the_doctests_of_the_modules_this_page_set_describes(module: str) -> None:
    mod = importlib.import_module(f"mha_symbolic.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
