"""Tests of the CLI's habits (issue 16): every --format says its choices' meaning and its
default, every command's --help ends with usage examples that run, counts agree with
their nouns ("1 claim", not "1 claims"), and Euler's number is written e, never SymPy's E.

Expected strings are written by hand."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from mha_symbolic._text import expr_text, plural
from mha_symbolic.cli import build_parser, main
from mha_symbolic.textbook.check import check_examples
from mha_symbolic.textbook.examples import load_examples

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed.toml"
#: The subcommands whose help this part of the CLI owns (prove's is the proofs').
COMMANDS = ["check", "examples", "derive", "plot", "shapes", "params"]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_format_option_explains_itself_and_shows_its_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    subs = _subparsers()
    seen = []
    for name in COMMANDS:
        for action in subs[name]._actions:
            if "--format" in action.option_strings:
                seen.append(name)
                assert action.help, name
                with pytest.raises(SystemExit):
                    main([name, "--help"])
                text = " ".join(capsys.readouterr().out.split())
                shown = "from the suffix of OUT" if action.default is None else action.default
                assert f"(default: {shown})" in text, name
    assert seen == ["check", "derive", "plot", "shapes", "params"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_ends_with_usage_examples(command: str | None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"] if command else ["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "\nexamples:\n  mha-symbolic " in out
    # the examples keep their layout: one command a line, none wrapped
    block = out.split("\nexamples:\n", 1)[1].split("\n\n")[0]
    for line in block.splitlines():
        assert line.startswith("  mha-symbolic ") or line.startswith("  cat "), line


def _example_commands() -> list[str]:
    subs = _subparsers()
    lines = []
    for name in COMMANDS:
        epilog = subs[name].epilog or ""
        lines += [ln.split("#")[0].strip() for ln in epilog.splitlines()[1:]]
    # those that need a file of the reader's, pdflatex, or write a whole set
    return [ln for ln in lines if "book.toml" not in ln and "--pdf" not in ln
            and "--copy" not in ln]


@pytest.mark.parametrize("line", _example_commands())
def test_the_help_examples_run(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    if " plot " in line or "--figures" in line:
        pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "seed.toml").write_bytes(SEED.read_bytes())
    (tmp_path / "examples" / "seed-page.md").write_bytes(
        (SEED.parent / "seed-page.md").read_bytes())  # the seed page as written: 1 slip
    argv = shlex.split(line)[1:]
    status = main(argv)
    capsys.readouterr()
    assert status == (1 if argv[:1] == ["check"] else 0), line  # the seed page has 3 slips


def test_plural_agrees_with_the_count() -> None:
    assert [plural(n, "claim") for n in (0, 1, 2)] == ["0 claims", "1 claim", "2 claims"]
    assert plural(1, "entry", "entries") == "1 entry"
    assert plural(12, "entry", "entries") == "12 entries"


ONE_CLAIM = """
[[example]]
name = "One"
scores = [[0, 1]]
[[example.claim]]
quantity = "weight[1,2]"
claimed = "0.731"
"""


def test_a_report_of_one_claim_says_claim(tmp_path: Path) -> None:
    path = tmp_path / "one.toml"
    path.write_text(ONE_CLAIM)
    report = check_examples(load_examples(str(path)))
    # e/(1 + e) = 0.7310585...: holds, correctly rounded
    last = report.text().splitlines()[-2]
    assert last == ("1 claim: 1 holds (0 exact, 1 correctly rounded, 0 approximations), "
                    "0 wrong (0 diagnosed).")
    assert report.markdown().splitlines()[-1] == "**1 claim: 1 holds, 0 wrong (0 diagnosed).**"
    seed = check_examples(load_examples(str(SEED))).text().splitlines()[-2]
    assert seed.startswith("71 claims: 68 hold (43 exact, 23 correctly rounded, "
                           "2 approximations)")


def test_eulers_number_is_written_e_in_every_report(tmp_path: Path) -> None:
    import sympy as sp

    assert expr_text(sp.E / (1 + sp.E)) == "e/(1 + e)"
    assert expr_text(sp.exp(-3) / (sp.exp(-3) + sp.E)) == "exp(-3)/(exp(-3) + e)"
    report = check_examples([e for e in load_examples(str(SEED)) if e.name in ("E", "F")])
    text, md, html = report.text(), report.markdown(), report._repr_html_()
    # Example E's rows hold e = exp(1) (scores 1 and -3); its exact forms are printed
    # simplified, exp(-3)/(exp(-3) + e) as 1/(1 + exp(4)), and none writes e as E
    assert "= 1/(1 + exp(4))" in text
    for rendering in (text, md, html):
        # the letter E alone is SymPy's name for e; only the example's name may be E
        rest = rendering.replace("Example E", "").replace("<td>E</td>", "")
        rest = rest.replace("### Example E", "")
        assert not re.search(r"(?<![A-Za-z_])E(?![A-Za-z_])", rest), \
            re.search(r".{30}(?<![A-Za-z_])E(?![A-Za-z_]).{30}", rest)
