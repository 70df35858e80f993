"""The command line for the foundation subcommands (shapes, params) and its error
contract: exit 2, one line on stderr, never a traceback."""

from __future__ import annotations

import json
import subprocess

import pytest

from mha_symbolic import cli as cli_module


def test_params_512_8_no_bias_prints_1048576(cli) -> None:
    r = cli("params", "--d-model", "512", "--heads", "8", "--no-bias")
    assert r.returncode == 0, r.stderr
    assert "1048576" in r.stdout
    assert r.stderr == ""


def test_params_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_module.main(["params", "--d-model", "512", "--heads", "8", "--no-bias",
                   "--format", "json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"]["total"] == 1048576


def test_params_with_bias_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_module.main(["params", "--d-model", "2", "--heads", "1", "--no-bias", "--n-q", "2",
                   "--format", "json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flops"]["total"] == 110  # hand count, see test_params.py
    rc = cli_module.main(["params", "--d-model", "8", "--heads", "2", "--format", "json"])
    assert json.loads(capsys.readouterr().out)["parameters"]["total"] == 4 * 64 + 4 * 8


def test_params_symbolic(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["params", "--no-bias"]) == 0
    out = capsys.readouterr().out
    assert "total                           4·d_model²\n" in out  # as a book writes it


def test_shapes_symbolic(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["shapes"]) == 0
    out = capsys.readouterr().out
    assert "scores" in out and "n_q × n_q" in out


def test_shapes_numeric_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["shapes", "--n-q", "3", "--n-k", "5", "--d-model", "512", "--heads", "8",
                     "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scores"]["shape"] == ["3", "5"]
    assert data["output"]["shape"] == ["3", "512"]


def test_shapes_numeric_head_width(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["shapes", "--n-q", "3", "--n-k", "5", "--d-model", "512", "--heads", "8",
                     "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["head"]["shape"] == ["3", "64"]


def test_shapes_latex(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["shapes", "--format", "latex"]) == 0
    assert capsys.readouterr().out.startswith("\\begin{array}")


def _assert_one_line_error(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.mark.parametrize(("argv", "fragments"), [
    (["shapes", "--heads", "0"], ["heads=0"]),
    (["params", "--d-model", "10", "--heads", "4"], ["d_model=10", "heads=4"]),
    (["params", "--d-model", "512", "--heads", "8", "--kv-heads", "3"], ["kv_heads=3"]),
    (["shapes", "--d-model", "abc-def"], ["d_model='abc-def'"]),
    (["shapes", "--n-q", "-3"], ["n_q"]),
    (["shapes", "--d-model", "1e3"], ["d_model"]),
    (["params", "--d-model", "99999999999999999999"], ["d_model", "limit"]),
    (["frobnicate"], ["frobnicate"]),
    (["params", "--format", "yaml"], ["yaml"]),
    (["params", "--no-such-option"], ["--no-such-option"]),
])
def test_bad_input_exits_2_with_one_line(cli, argv: list[str], fragments: list[str]) -> None:
    _assert_one_line_error(cli(*argv), *fragments)


def test_giant_size_exits_2_with_one_line(cli) -> None:
    _assert_one_line_error(cli("params", "--d-model", "9" * 5000), "d_model")


def test_no_subcommand_prints_help_and_exits_2(cli) -> None:
    r = cli()
    assert r.returncode == 2
    assert "usage:" in r.stdout


def test_help_and_version(cli) -> None:
    r = cli("--help")
    assert r.returncode == 0 and "usage: mha-symbolic" in r.stdout
    for sub in ("check", "derive", "plot", "shapes", "params", "prove"):
        assert sub in r.stdout
    r = cli("--version")
    assert r.returncode == 0
    from mha_symbolic import __version__

    assert r.stdout.strip() == f"mha-symbolic {__version__}"


@pytest.mark.parametrize("sub", ["shapes", "params"])
def test_subcommand_help(sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_module.main([sub, "--help"])
    assert info.value.code == 0
    assert "--d-model" in capsys.readouterr().out
