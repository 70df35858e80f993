"""The checker's errors and output (issue 14 item 6): FILE:line everywhere, unreadable
claims as records, the JSON schema (mha-symbolic-check/2), -q, standard input, the
bundled examples and --copy; and the diagnoses "did you mean", 0-based indices and
missing inputs.  Expected line numbers are counted by hand in the texts below."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mha_symbolic.textbook import check_examples, load_examples
from mha_symbolic.textbook.locations import locate

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed.toml"


def run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mha_symbolic", *args], input=stdin, text=True,
                          capture_output=True, env=env, cwd=cwd or ROOT, timeout=120)


TEXT = '''title = "t"
notes = """a note with a fake header inside:
[[example]]
name = 'not an example'
"""

[[example]]
name = "A"
scale = 1
scores = [[0, 0],
          [0, 1]]

[[example.claim]]
quantity = "weight[1,1]"
claimed = "1/2"

[[example.claim]]
quantity = "wieght[1,1]"
claimed = "1/2"
'''


def test_locations_are_found_by_a_bounded_scan() -> None:
    loc = locate(TEXT)
    assert loc.example(0) == 7  # the [[example]] inside the multi-line string is skipped
    assert loc.key(0, "scores") == 10 and loc.key(0, "scale") == 9
    assert loc.claim(0, 0) == 13 and loc.claim_key(0, 1, "quantity") == 18
    assert loc.key(0, "nokey") == 7  # an unknown key falls back to its table's header


def test_unreadable_claim_names_file_line_and_suggests() -> None:
    report = check_examples(load_examples(text=TEXT, source="f.toml"))
    good, bad = report.records
    assert good.verdict == "exact" and (good.file, good.line) == ("f.toml", 15)
    assert bad.verdict == "unreadable" and bad.line == 18
    assert bad.error is not None and bad.error.startswith("f.toml:18: ")
    assert "did you mean 'weight[1,1]'" in bad.error
    assert report.exit_status == 2


def test_unknown_example_key_suggests_the_near_one() -> None:
    from mha_symbolic.errors import ExampleFileError

    with pytest.raises(ExampleFileError) as info:
        load_examples(text="[[example]]\nname='A'\nscale=1\nscroes=[[1]]\n", source="g.toml")
    assert str(info.value).startswith("g.toml:4: ") and "did you mean 'scores'" in str(info.value)


def test_a_zero_based_index_is_diagnosed() -> None:
    # row 2 of the scores is (0, 1, 2) at scale 1: weights (1, e, e^2)/(1 + e + e^2)
    # = (0.0900…, 0.2447…, 0.6652…); a text counting from 0 calls its third weight
    # "weight[1,2]" (1-based: weight[2,3])
    text = ("[[example]]\nname='Z'\nscale=1\nscores=[[5, 5, 5], [0, 1, 2]]\n[[example.claim]]\n"
            "quantity='weight[1,2]'\nclaimed='0.6652'\n")
    (r,) = check_examples(load_examples(text=text)).records
    assert r.verdict == "wrong" and (r.diagnosis or "").startswith("matches weight[2,3]: 0-based?")
    (r,) = check_examples(load_examples(text=text.replace("weight[1,2]", "weight[0,2]"))).records
    assert r.verdict == "unreadable" and "did you mean weight[1,3]" in (r.error or "")


def test_a_missing_input_names_its_key() -> None:
    text = ("[[example]]\nname='N'\nscale=1\nscores=[[0, 1]]\n[[example.claim]]\n"
            "quantity='head_output[1,1]'\nclaimed='1'\n")
    (r,) = check_examples(load_examples(text=text)).records
    assert r.verdict == "unreadable" and "`value`" in (r.error or "")


def test_json_schema_numbers_and_locations() -> None:
    proc = run("check", str(SEED), "--format", "json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["schema"] == "mha-symbolic-check/2"
    s = data["summary"]
    assert all(isinstance(s[k], int) for k in ("claims", "hold", "wrong", "unreadable"))
    assert s["exit_status"] == 1 and s["claims"] == 71
    for rec in data["claims"]:
        assert rec["file"] == str(SEED) and isinstance(rec["line"], int) and rec["line"] > 0
        assert isinstance(rec["head"], int) and isinstance(rec["batch"], int)
        assert rec["error_units"] is None or isinstance(rec["error_units"], (int, float, list))
    counts = [r for r in data["claims"] if r["quantity"] == "params.total" and r["verdict"] == "exact"]
    assert counts and all(r["exact_value"] == 1048576 for r in counts)
    wrong = next(r for r in data["claims"] if r["quantity"] == "scaled_score[1,1]")
    assert wrong["verdict"] == "wrong" and wrong["error_units"] is None  # an exact claim
    tup = next(r for r in data["claims"] if r["quantity"] == "head_output[1]")
    assert tup["error_text"] == "+0.77, -1.5"


def test_quiet_shows_only_failures() -> None:
    proc = run("check", str(SEED), "-q")
    assert proc.returncode == 1
    assert proc.stdout.count("✗") == 3 and "✓" not in proc.stdout
    assert "71 claims: 68 hold" in proc.stdout
    data = json.loads(run("check", str(SEED), "--format", "json", "--quiet").stdout)
    assert len(data["claims"]) == 3 and data["summary"]["claims"] == 71


def test_standard_input() -> None:
    proc = run("check", "-", "--format", "json", stdin=SEED.read_text(encoding="utf-8"))
    assert proc.returncode == 1 and json.loads(proc.stdout)["claims"][0]["file"] == "<stdin>"
    proc = run("check", "-", stdin="not = toml [")
    assert proc.returncode == 2 and proc.stderr.startswith("mha-symbolic check: error: <stdin>")


def test_unreadable_claims_exit_2_with_json_still_emitted(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text(TEXT, encoding="utf-8")
    proc = run("check", str(f), "--format", "json")
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    assert [r["verdict"] for r in data["claims"]] == ["exact", "unreadable"]
    assert proc.stderr.strip().startswith(f"mha-symbolic check: error: {f}:18:")


def test_bundled_examples_list_check_and_copy(tmp_path: Path) -> None:
    proc = run("examples")
    assert proc.returncode == 0 and "seed" in proc.stdout and "books/raschka-llm-from-scratch" in proc.stdout
    proc = run("check", "--example", "seed", "-q")
    assert proc.returncode == 1 and "71 claims: 68 hold" in proc.stdout
    proc = run("check", "--example", "sed")
    assert proc.returncode == 2 and "did you mean 'seed'" in proc.stderr
    proc = run("examples", "--copy", "seed", "-o", str(tmp_path))
    copy = (tmp_path / "seed.toml").read_text(encoding="utf-8")
    assert proc.returncode == 0
    assert f"# Check it:   mha-symbolic check {tmp_path.as_posix()}/seed.toml" in copy
    assert copy.replace(f"check {tmp_path.as_posix()}/seed.toml", "check --example seed") == \
        SEED.read_text(encoding="utf-8")  # nothing else changed
    proc = run("examples", "--copy", "seed", "-o", str(tmp_path))
    assert proc.returncode == 2 and "not overwritten" in proc.stderr
    proc = run("examples", "--copy", "books/uva-dl-tutorial6", "-o", str(tmp_path))
    assert proc.returncode == 0 and (tmp_path / "uva-dl-tutorial6-seed42.npz").is_file()
    proc = run("check", str(tmp_path / "uva-dl-tutorial6.toml"), "-q")
    assert proc.returncode == 1, proc.stderr  # the copy checks on its own (its .npz came along)


def test_check_without_file_or_example_is_a_usage_error() -> None:
    proc = run("check")
    assert proc.returncode == 2 and "--example SET" in proc.stderr


def _seed_records() -> list[Any]:
    return list(check_examples(load_examples(SEED)).records)


def test_seed_records_keep_their_claim_lines() -> None:
    text = SEED.read_text(encoding="utf-8").splitlines()
    for r in _seed_records():
        assert text[r.line - 1].lstrip().startswith("claimed"), (r.line, text[r.line - 1])
