"""One meaning of --example in check, derive and plot (a bundled set, optionally
SET:EXAMPLE); --only NAME picks examples of a file; examples --copy makes its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mha_symbolic.cli import main
from mha_symbolic.errors import SpecError
from mha_symbolic.textbook.selection import resolve, split_spec

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed.toml"


def _names(capsys: pytest.CaptureFixture[str]) -> list[str]:
    data = json.loads(capsys.readouterr().out)
    return list(dict.fromkeys(r["example"] for r in data["claims"]))


def test_check_one_example_of_a_bundled_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--example", "seed:C", "--format", "json"]) == 0
    assert _names(capsys) == ["C"]


def test_check_only_picks_examples_of_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(SEED), "--only", "C", "--only", "H", "--format", "json"]) == 0
    assert _names(capsys) == ["C", "H"]


def test_check_only_applies_to_a_bundled_set_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--example", "seed", "--only", "C", "--format", "json"]) == 0
    assert _names(capsys) == ["C"]


def test_example_with_a_file_is_an_error_that_points_to_only(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(SEED), "--example", "A"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names a bundled set" in err and "use --only A" in err


def test_derive_takes_a_bundled_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["derive", "--example", "seed:D", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "Example D" in out and "Example C" not in out


def test_derive_of_a_set_of_several_files_says_to_pick_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["derive", "--example", "books", "--format", "markdown"]) == 2
    assert "derive works on one file" in capsys.readouterr().err


def test_plot_takes_a_bundled_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is an optional extra (mha-symbolic[plot])")
    out = tmp_path / "g.svg"
    assert main(["plot", "heatmap", "--example", "seed:G", "-o", str(out)]) == 0
    assert out.stat().st_size > 0
    assert main(["plot", "heatmap", "--file", str(SEED), "--example", "G", "-o", str(out)]) == 2


def test_split_spec_and_resolve() -> None:
    assert split_spec("books/vaswani-2017:vaswani-base") == ("books/vaswani-2017", "vaswani-base")
    with pytest.raises(SpecError, match="nothing after ':'"):
        split_spec("seed:")
    (sel,) = resolve(None, ["seed:D"], ["H"])
    assert sel.bundled and sel.only == ("D", "H") and sel.files[0].endswith("seed.toml")


def test_examples_copy_creates_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "my" / "book"
    assert main(["examples", "--copy", "seed", "-o", str(out)]) == 0
    copy = (out / "seed.toml").read_text(encoding="utf-8")
    assert f"mha-symbolic check {out.as_posix()}/seed.toml" in copy
    assert "shared/seed" not in copy and "examples/seed.toml" not in copy


def test_examples_copy_onto_a_file_is_one_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["examples", "--copy", "seed", "-o", str(f)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_an_example_name_given_as_a_set_says_how_to_name_one_example(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--example", "seed", "--example", "A"]) == 2
    assert "one example of a set is SET:EXAMPLE, e.g. seed:A" in capsys.readouterr().err
