"""The textbook verifier: planted mistakes, file errors, the CLI and its output formats.

Expected values are derived here with mpmath (60 digits) and exact fractions, never
through mha_symbolic's engine or certify.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import mpmath
import pytest

from mha_symbolic.errors import ClaimError, ExampleFileError, MhaSymbolicError
from mha_symbolic.textbook import CheckReport, check_examples, load_examples

DATA = Path(__file__).resolve().parents[1] / "data"
PLANTED = DATA / "planted.toml"
SEED = Path(__file__).resolve().parents[2] / "examples" / "seed.toml"
mp = mpmath.mp
mp.dps = 60
exp = mpmath.exp


def rounds(x: Any, places: int) -> Fraction:
    """x (an mpf) correctly rounded to ``places`` decimals, as an exact Fraction."""
    n = mpmath.nint(x * mpmath.mpf(10) ** places)
    return Fraction(int(n), 10**places)


def truncates(x: Any, places: int) -> Fraction:
    n = int(mpmath.floor(abs(x) * mpmath.mpf(10) ** places))
    return Fraction(n if x >= 0 else -n, 10**places)


# --------------------------------------------------------------------------- planted
# (example, quantity, head, claimed, verdict, diagnosis substring or None)
PLANTED_EXPECTED: list[tuple[str, str, int, str, str, str | None]] = [
    ("truncation", "weight[1,2]", 1, "0.245", "correctly rounded", None),
    ("truncation", "weight[1,2]", 1, "0.244", "wrong", "truncated"),
    ("truncation", "weight[1,1]", 1, "0.090030", "wrong", "truncated"),
    ("truncation", "output[1,1]", 1, "25.8", "correctly rounded", None),
    ("truncation", "output[1,1]", 1, "25.7", "wrong", "truncated"),
    ("wrong-direction", "weight[1,2]", 1, "0.2448", "wrong", "wrong direction"),
    ("wrong-direction", "output[1,1]", 1, "25.76", "wrong", "wrong direction"),
    ("wrong-direction", "output[1,1]", 1, "25.75", "correctly rounded", None),
    ("negative", "output[1,1]", 1, "-25.75", "correctly rounded", None),
    ("negative", "output[1,1]", 1, "−25.76", "wrong", "wrong direction"),
    ("negative", "output[1,1]", 1, "-25.7", "wrong", "truncated"),
    ("negative", "output[1,1]", 1, "≈ -2.575 × 10^1", "correctly rounded", None),
    ("premature-output", "weight[1]", 1, "(0.09, 0.24, 0.67)", "correctly rounded", None),
    ("premature-output", "output[1,1]", 1, "25.80", "wrong", "premature rounding"),
    ("premature-output", "output[1,1]", 1, "25.75", "correctly rounded", None),
    ("premature-complement", "weight[1,1]", 1, "0.0900", "correctly rounded", None),
    ("premature-complement", "weight[1,2]", 1, "0.2447", "correctly rounded", None),
    ("premature-complement", "weight[1,3]", 1, "0.6653", "wrong", "premature rounding"),
    ("premature-sum", "weight[1]", 1, "(0.0900, 0.2447, 0.6652)", "correctly rounded", None),
    ("premature-sum", "weight_sum[1]", 1, "0.9999", "wrong", "premature rounding"),
    ("premature-sum", "weight_sum[1]", 1, "1", "exact", None),
    ("scale", "scaled_score[1,1]", 1, "2", "exact", None),
    ("scale", "scaled_score[2,1]", 1, "0.25", "wrong", "1/d_k = 1/4"),
    ("scale", "weight[1,1]", 1, "≈ 0.8808", "correctly rounded", None),
    ("scale", "weight[1,1]", 1, "≈ 0.7311", "wrong", "1/d_k = 1/4"),
    ("scale", "weight[1,1]", 1, "≈ 0.9820", "wrong", "not scaled"),
    ("scale", "weight[1,1]", 1, "≈ 0.9997", "wrong", "multiplied by sqrt(d_k)"),
    ("scale", "head_output[1]", 1, "(0.7311, 0.2689)", "wrong", "1/d_k = 1/4"),
    ("scale", "head_output[1]", 1, "(0.8808, 0.1192)", "correctly rounded", None),
    ("axis", "weight[1,1]", 1, "0.2447", "correctly rounded", None),
    ("axis", "weight[1,1]", 1, "0.7311", "wrong", "query axis"),
    ("axis", "weight[1]", 1, "(0.7311, 0.5000, 0.8808)", "wrong", "query axis"),
    ("axis", "weight[2]", 1, "(1/3, 1/3, 1/3)", "exact", None),
    ("multi-head", "weight[1,1]", 1, "0.8044", "correctly rounded", None),
    ("multi-head", "weight[1,1]", 2, "0.6698", "correctly rounded", None),
    ("multi-head", "weight[1,1]", 2, "0.6225", "wrong", "1/d_k = 1/2"),
    ("multi-head", "weight[1,1]", 1, "0.8808", "wrong", "not scaled"),
    ("approximation", "weight[1,1]", 1, "≈ 1 − e^(−4)", "wrong", "a looser approximation"),
    ("approximation", "weight[1,1]", 1, "≈ 1 − e^(−4)", "approximation", None),
    ("approximation", "weight[1,1]", 1, "e^5/(e^5 + e)", "exact", None),
    # e^4/(e^4 + e) = 1/(1 + e^-3): the softmax of scores (4, 1), or of (5, 2), one entry of
    # the shown (5, 1) off by one; both fit (softmax depends on the difference only)
    ("approximation", "weight[1,1]", 1, "e^4/(e^4 + e)", "wrong",
     "scores with entry [1,1] off by one in its last digit (4 for 5); or scores with entry "
     "[1,2] off by one in its last digit (2 for 1)"),
    ("shapes", "shape.scores", 1, "5 × 3", "wrong", "transposed"),
    ("shapes", "shape.q", 1, "64 × 3", "wrong", "transposed"),
    ("shapes", "shape.k", 1, "5 × 64", "exact", None),
    ("shapes", "shape.weights", 1, "3 x 5", "exact", None),
    # 512 is d_model (= 8 heads · 64): the values before the projection to one head
    ("shapes", "shape.v", 1, "5 × 512", "wrong", "the columns are 512 = d_model = h·d_k = h·d_v"),
    ("counts", "params.total", 1, "1048576", "exact", None),
    ("counts", "params.total", 1, "1050624", "wrong", "counts the biases"),
    ("counts", "params.total", 1, "786432", "wrong", "W^O out"),
    ("counts", "params.total", 1, "360448", "wrong", "one head"),
    ("counts", "params.total", 1, "≈ 1.05 × 10^6", "correctly rounded", None),
    ("counts-bias", "params.total", 1, "1050624", "exact", None),
    ("counts-bias", "params.total", 1, "4 × 512^2", "wrong", "leaves the biases out"),
    ("counts-bias", "params.biases", 1, "2048", "exact", None),
]


@pytest.fixture(scope="module")
def planted() -> CheckReport:
    return check_examples(load_examples(PLANTED))


def test_planted_values_are_what_the_slips_produce() -> None:
    """The data file is honest: each planted number is the slip's result, not the truth."""
    w = [exp(j) / (1 + exp(1) + exp(2)) for j in range(3)]  # softmax of (0, 1, 2)
    out = 10 * w[0] + 20 * w[1] + 30 * w[2]
    # truncation vs rounding
    assert truncates(w[1], 3) == Fraction("0.244") != rounds(w[1], 3) == Fraction("0.245")
    assert truncates(w[0], 6) == Fraction("0.090030") != rounds(w[0], 6)
    assert truncates(out, 1) == Fraction("25.7") != rounds(out, 1) == Fraction("25.8")
    assert truncates(-out, 1) == Fraction("-25.7") and rounds(-out, 1) == Fraction("-25.8")
    # rounding the wrong way: the other neighbour of the correct rounding
    assert rounds(w[1], 4) == Fraction("0.2447") and rounds(out, 2) == Fraction("25.75")
    # premature rounding
    assert Fraction("0.09") * 10 + Fraction("0.24") * 20 + Fraction("0.67") * 30 == Fraction("25.80")
    assert [rounds(x, 2) for x in w] == [Fraction(s) for s in ("0.09", "0.24", "0.67")]
    assert 1 - Fraction("0.0900") - Fraction("0.2447") == Fraction("0.6653") != rounds(w[2], 4)
    assert Fraction("0.0900") + Fraction("0.2447") + Fraction("0.6652") == Fraction("0.9999")
    # scale: scores (4, 0) with d_k = 4
    sig = lambda s: 1 / (1 + exp(-s))  # noqa: E731 - the 2-key softmax weight of (s, 0)
    assert rounds(sig(2), 4) == Fraction("0.8808")  # 1/sqrt(d_k)
    assert rounds(sig(1), 4) == Fraction("0.7311")  # 1/d_k
    assert rounds(sig(4), 4) == Fraction("0.9820")  # unscaled
    assert rounds(sig(8), 4) == Fraction("0.9997")  # times sqrt(d_k)
    assert Fraction(1, 4) == Fraction("0.25") != Fraction(1, 2)  # score 1 over d_k, not sqrt
    assert rounds(1 - sig(1), 4) == Fraction("0.2689")
    assert rounds(1 - sig(2), 4) == Fraction("0.1192")
    # axis: column softmax of [[1, 0, 2], [0, 0, 0]]
    assert rounds(exp(1) / (1 + exp(1) + exp(2)), 4) == Fraction("0.2447")
    assert [rounds(sig(s), 4) for s in (1, 0, 2)] == [Fraction("0.7311"), Fraction("0.5"),
                                                      Fraction("0.8808")]
    # multi-head: head 1 scaled (sqrt 2, 0), head 2 (1/sqrt 2, 0)
    assert rounds(sig(mpmath.sqrt(2)), 4) == Fraction("0.8044")
    assert rounds(sig(1 / mpmath.sqrt(2)), 4) == Fraction("0.6698")
    assert rounds(sig(mpmath.mpf(1) / 2), 4) == Fraction("0.6225")
    assert rounds(sig(2), 4) == Fraction("0.8808")
    # approximation: 1 - e^-4 vs 1/(1 + e^-4)
    rel = abs(1 - exp(-4) - sig(4)) / sig(4)
    assert mpmath.mpf("1e-6") < rel < mpmath.mpf("1e-3")
    assert abs(exp(4) / (exp(4) + exp(1)) - sig(4)) > mpmath.mpf("1e-3")
    # counts (torch.nn.MultiheadAttention: 4E^2 + 4E with bias, 4E^2 without)
    e_ = 512
    assert 4 * e_**2 == 1048576 and 4 * e_**2 + 4 * e_ == 1050624
    assert 3 * e_**2 == 786432 and 3 * e_ * 64 + e_**2 == 360448
    assert round(Fraction(1048576), -4) == 1050000


def test_planted_mistakes_are_caught_and_diagnosed(planted: CheckReport) -> None:
    got = [(r.example, r.quantity, r.head, r.claimed) for r in planted.records]
    assert got == [e[:4] for e in PLANTED_EXPECTED]
    for r, (ex, q, head, claimed, verdict, diag) in zip(planted.records, PLANTED_EXPECTED,
                                                             strict=True):
        where = (ex, q, head, claimed)
        assert r.verdict == verdict, (where, r.verdict)
        assert r.ok is (verdict != "wrong"), where
        if diag is None:
            assert r.diagnosis is None, (where, r.diagnosis)
        else:
            assert r.diagnosis is not None and diag in r.diagnosis, (where, r.diagnosis)


def test_planted_correct_answers_offered(planted: CheckReport) -> None:
    by = {(r.example, r.claimed): r for r in planted.records}
    assert by[("truncation", "0.244")].rounded == "0.245"
    assert by[("truncation", "0.090030")].rounded == "0.090031"
    assert by[("negative", "-25.7")].rounded == "-25.8"
    assert by[("premature-output", "25.80")].rounded == "25.75"
    assert by[("scale", "≈ 0.7311")].rounded == "0.8808"
    assert by[("axis", "(0.7311, 0.5000, 0.8808)")].rounded == "(0.2447, 0.0900, 0.6652)"
    assert by[("shapes", "5 × 3")].rounded == "3 × 5"
    assert by[("counts", "786432")].rounded == "1048576"
    assert "exactly" in (by[("premature-output", "25.80")].diagnosis or "")
    # the weights are quoted as printed, trailing zeros kept
    assert "(0.0900, 0.2447, 0.6652)" in (by[("premature-sum", "0.9999")].diagnosis or "")


def test_planted_summary(planted: CheckReport) -> None:
    s = planted.summary()
    n_wrong = sum(e[4] == "wrong" for e in PLANTED_EXPECTED)
    n_diag = sum(e[4] == "wrong" and e[5] is not None for e in PLANTED_EXPECTED)
    assert s["claims"] == len(PLANTED_EXPECTED)
    assert s["wrong"] == n_wrong and s["diagnosed"] == n_diag
    assert s["exact"] + s["correctly rounded"] + s["approximation"] + s["wrong"] == s["claims"]


# --------------------------------------------------------------------------- API
ONE = '''
[[example]]
name = "X"
scale = 1
scores = [[0, 0]]
value = [[1], [2]]
[[example.claim]]
quantity = "output[1,1]"
claimed = "1.5"
'''


def test_load_text_and_check_holds() -> None:
    report = check_examples(load_examples(text=ONE))
    (r,) = report.records
    assert (r.verdict, r.ok, r.exact) == ("exact", True, "1.5")  # (1 + 2)/2
    assert report.ok


def test_exact_tie_accepts_both_neighbours() -> None:
    # 1.5 at unit 1: 2 is half-even, 1 is the other neighbour of an exact tie
    for claimed, verdict in (("2", "correctly rounded"), ("1", "correctly rounded"),
                             ("3", "wrong")):
        text = ONE.replace('"1.5"', f'"{claimed}"')
        (r,) = check_examples(load_examples(text=text)).records
        assert r.verdict == verdict, claimed


def test_only_selects_examples_and_unknown_name_is_an_error() -> None:
    exs = load_examples(SEED)
    report = check_examples(exs, only=["C"])
    assert {r.example for r in report.records} == {"C"}
    with pytest.raises(ExampleFileError, match="no example named 'Z'"):
        check_examples(exs, only=["Z"])


def test_load_needs_exactly_one_source() -> None:
    with pytest.raises(ExampleFileError):
        load_examples()
    with pytest.raises(ExampleFileError):
        load_examples(SEED, text=ONE)


# (file text, substring of the one-line error)
BAD_FILES: list[tuple[str, str]] = [
    ("", "no [[example]]"),
    ("this is = not toml [", "not valid TOML"),
    ("x = 1\n", "unknown top-level key"),
    ("[[example]]\nname = 'A'\nfoo = 1\n", "unknown key(s) foo"),
    ("[[example]]\nname = 3\n", "name must be a non-empty string"),
    ("[[example]]\nname = 'A'\n[[example]]\nname = 'A'\n", "duplicate example name"),
    ("example = 3\n", "no [[example]]"),
    ("[[example]]\nname='A'\nscores = [[1, true]]\n", "not a number"),
    ("[[example]]\nname='A'\nscores = [[1, 2], [3]]\n",
     "scores must be rectangular: row 2 has 1 entry, the first has 2"),
    ("[[example]]\nname='A'\nscores = []\n", "empty"),
    ("[[example]]\nname='A'\nscores = 5\n", "vector or matrix"),
    ("[[example]]\nname='A'\nscores = [[[[[1]]]]]\n", "vector or matrix"),
    ("[[example]]\nname='A'\nscores = [[1, nan]]\n", "not a finite number"),
    ("[[example]]\nname='A'\nscores = [[1, inf]]\n", "not a finite number"),
    ("[[example]]\nname='A'\nheads = 0\nscores=[[1]]\n", "heads=0"),
    ("[[example]]\nname='A'\nheads = true\nscores=[[1]]\n", "heads=True"),
    ("[[example]]\nname='A'\nmask = 'anti'\nscores=[[1]]\n", "mask='anti'"),
    ("[[example]]\nname='A'\nd_model = 10\nheads = 4\n", "not divisible"),
    ("[[example]]\nname='A'\nquery=[[1, 0]]\nkey=[[1, 0, 0]]\n", "key has 3 columns"),
    ("[[example]]\nname='A'\nscores=[[1, 2]]\nvalue=[[1]]\n", "value has n_k=1 rows"),
    ("[[example]]\nname='A'\nscores=[[1]]\nquery=[[1]]\nkey=[[1]]\n", "not both"),
    ("[[example]]\nname='A'\nscores=[[1]]\nclaim = 3\n", "array of tables"),
]

# claims that cannot be read: each becomes a record with the verdict "unreadable" (the rest
# of the file is still checked); (file text, substring of the record's error)
UNREADABLE_CLAIMS: list[tuple[str, str]] = [
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'\n",
     "claimed must be"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'\n"
     "claimed=1\n", 'write claimed = "1"'),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='frobnicate'\n"
     "claimed='1'\n", "unknown quantity='frobnicate'"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight[0,1]'\n"
     "claimed='1'\n", "1-based"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight'\n"
     "claimed='1'\n", "1 × 1 entries but claimed='1' is one number"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='shape.nope'\n"
     "claimed='1 × 1'\n", "shape.NAME"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='expr'\n"
     "claimed='1'\n", "needs expr"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'\n"
     "claimed='1'\nhead=0\n", "head=0"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'\n"
     "claimed='1'\nrtol=2\n", "rtol=2"),
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'\n"
     "claimed='1'\nwhat=2\n", "unknown key(s) what"),
]

# claims that load but cannot be judged: unreadable records at check time
BAD_CLAIMS: list[tuple[str, str, str]] = [
    ("weight[3,1]", "1", "row 3 is out of range 1..1"),
    ("weight[1,2]", "1", "column 2 is out of range 1..1"),
    ("weight[1]", "(1, 2)", "has 1 entries but claimed"),
    ("weight[1,1]", "(1, 2)", "is one number but"),
    ("weight[1,1]", "__import__('os')", "cannot read claimed"),
    ("weight[1,1]", "1; import os", "cannot read"),
    ("weight[1,1]", "lambda: 1", "cannot read claimed"),
    ("weight[1,1]", "x" * 600, "longer than"),
    ("weight[1,1]", "tensor([1, ..., 3])", "elides entries"),
    ("weight", "tensor([[1, 2]])", "of shape 1 × 1 but"),
    ("weight[1,1]", "10^10^10", "10^10^10"),
    ("weight[1,1]", "≈", "holds no answer"),
    ("head_output[1,1]", "1", "gives no `value`"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_malformed_file_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ExampleFileError) as info:
        check_examples(load_examples(text=text))
    assert message in str(info.value)
    assert "\n" not in str(info.value).strip() or "TOML" in str(info.value)


@pytest.mark.parametrize(("text", "message"), UNREADABLE_CLAIMS)
def test_unreadable_claim_is_a_record_and_the_rest_is_checked(text: str, message: str) -> None:
    good = "[[example.claim]]\nquantity='weight[1,1]'\nclaimed='1'\n"
    report = check_examples(load_examples(text=text + good, source="f.toml"))
    bad, ok = report.records
    assert bad.verdict == "unreadable" and not bad.ok, bad
    assert message in (bad.error or ""), bad.error
    assert (bad.error or "").startswith("f.toml:"), bad.error  # FILE:line
    assert ok.verdict == "exact" and ok.ok  # checked although the claim above is unreadable
    assert report.exit_status == 2


@pytest.mark.parametrize(("quantity", "claimed", "message"), BAD_CLAIMS)
def test_unjudgeable_claim_is_an_unreadable_record(quantity: str, claimed: str,
                                                   message: str) -> None:
    text = ("[[example]]\nname='A'\nscale=1\nscores=[[1]]\n[[example.claim]]\n"
            f"quantity={json.dumps(quantity)}\nclaimed={json.dumps(claimed)}\n")
    (r,) = check_examples(load_examples(text=text, source="t.toml")).records
    assert r.verdict == "unreadable", r
    assert message in (r.error or ""), r.error
    assert "example 'A'" in (r.error or "")
    assert (r.error or "").startswith("t.toml:"), r.error
    with pytest.raises(MhaSymbolicError) as info:  # strict mode raises instead
        check_examples(load_examples(text=text), strict=True)
    assert isinstance(info.value, (ClaimError, ExampleFileError))
    assert message in str(info.value), str(info.value)


# --------------------------------------------------------------------------- CLI
def assert_one_line_error(proc: Any, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mha-symbolic check: error:"), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_cli_seed_text_exit_1(cli: Any) -> None:
    proc = cli("check", str(SEED))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert "Example A — Single head" in out
    assert "✗ head_output[1]" in out and "premature rounding" in out
    assert "correct answer: (1.3395, 1.3210)" in out
    assert "71 claims: 68 hold" in out and "3 wrong (3 diagnosed)" in out


def test_cli_all_hold_exit_0(cli: Any) -> None:
    proc = cli("check", str(SEED), "--only", "C", "--only", "I")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Example C" in proc.stdout and "Example I" in proc.stdout
    assert "Example A" not in proc.stdout


def test_cli_json_schema(cli: Any) -> None:
    proc = cli("check", str(SEED), "--format", "json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert set(doc) >= {"claims", "summary"}
    required = {"example", "quantity", "claimed", "exact", "verdict", "ok", "diagnosis"}
    for c in doc["claims"]:
        assert required <= set(c), set(c)
        assert c["verdict"] in ("exact", "correctly rounded", "approximation", "wrong")
        assert isinstance(c["ok"], bool) and c["ok"] == (c["verdict"] != "wrong")
        assert c["diagnosis"] is None or isinstance(c["diagnosis"], str)
        assert isinstance(c["exact"], str) and isinstance(c["claimed"], str)
    summary = doc["summary"]
    assert len(doc["claims"]) == summary["claims"] == 71
    assert summary["wrong"] == 3 and summary["hold"] == 68 and summary["ok"] is False
    assert summary["exact"] + summary["correctly rounded"] + summary["approximation"] == 68
    a = [c for c in doc["claims"] if c["example"] == "A" and c["quantity"] == "head_output[1]"]
    assert a[0]["claimed"] == "(1.3396, 1.3208)" and a[0]["ok"] is False
    assert a[0]["rounded"] == "(1.3395, 1.3210)"


def test_cli_markdown_renders(cli: Any) -> None:
    proc = cli("check", str(PLANTED), "--format", "markdown")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "### Example truncation" in lines
    header = "| | quantity | claimed | exact (certified digits) | verdict | diagnosis |"
    assert lines.count(header) == len({e[0] for e in PLANTED_EXPECTED})
    rows = [ln for ln in lines if ln.startswith("| ✓") or ln.startswith("| ✗")]
    assert len(rows) == len(PLANTED_EXPECTED)
    for row in rows:  # every table row has the header's 6 cells (pipes in text escaped)
        cells = row.replace("\\|", "").strip("|").split("|")
        assert len(cells) == 6, row
    assert any("`weight[1,3]`" in r and "premature rounding" in r for r in rows)


def test_cli_missing_file(cli: Any, tmp_path: Path) -> None:
    assert_one_line_error(cli("check", str(tmp_path / "nope.toml")), "no such file")


def test_cli_directory_and_binary(cli: Any, tmp_path: Path) -> None:
    assert_one_line_error(cli("check", str(tmp_path)))
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe\x00\x01garbage\x80")
    assert_one_line_error(cli("check", str(p)), "not UTF-8")


def test_cli_unknown_example(cli: Any) -> None:
    assert_one_line_error(cli("check", str(SEED), "--only", "Z"), "no example named 'Z'")


def test_cli_bad_format_is_usage_error(cli: Any) -> None:
    proc = cli("check", str(SEED), "--format", "yaml")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("this is = not toml [", "not valid TOML"),
    ("[[example]]\nname='A'\nbogus=1\n", "unknown key(s) bogus"),
    ("[[example]]\nname='A'\nquery=[[1, 0]]\nkey=[[1, 0, 0]]\n", "key has 3 columns"),
    ("[[example]]\nname='A\\nB'\nscores=[[1, 'e^(']]\n", "example 'A\\\\nB'"),
    ("[[example]]\nname='A'\nscale=1\nscores=[['10^10^10']]\n", "10^10^10"),
    ("[[example]]\nname='A'\nheads=2\nquery=[[-8, 4, 'ln(2)', 2], [2, -2, -1, -9]]\n"
     "key=[[3, -3, 1e308, 3], [-4, 0, 8, -6]]\n", "too large"),
    ("[[example]]\nname='A'\nscale=1\nscores=[[" + ", ".join(["1"] * 4097) + "]]\n",
     "exceeds 4096"),
], ids=lambda x: x[:40] if isinstance(x, str) else None)
def test_cli_bad_input_one_line_exit_2(cli: Any, tmp_path: Path, text: str,
                                       message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text, encoding="utf-8")
    proc = cli("check", str(p), timeout=60)
    assert_one_line_error(proc, message)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


CLI_UNREADABLE: list[tuple[str, str]] = [
    ("[[example]]\nname='A'\nscores=[[1]]\n[[example.claim]]\nquantity='frobnicate'\n"
     "claimed='1'\n", "unknown quantity"),
    ("[[example]]\nname='A'\nscale=1\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'"
     "\nclaimed=\"__import__('pathlib').Path('PWNED').touch()\"\n", "cannot read claimed"),
    ("[[example]]\nname='A'\nscale=1\nscores=[[1]]\n[[example.claim]]\nquantity='weight[1,1]'"
     "\nclaimed='1\\n2\\r\\n3'\n", "weight[1,1]"),
]


@pytest.mark.parametrize(("text", "message"), CLI_UNREADABLE, ids=lambda x: x[:40])
def test_cli_unreadable_claim_reported_exit_2(cli: Any, tmp_path: Path, text: str,
                                              message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text, encoding="utf-8")
    proc = cli("check", str(p), timeout=60)
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr[-500:])
    assert "Traceback" not in proc.stderr
    assert "unreadable" in proc.stdout  # the report is still printed
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mha-symbolic check: error: {p}:"), lines
    assert message in lines[0]
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()
    proc = cli("check", str(p), "--format", "json", timeout=60)
    data = json.loads(proc.stdout)  # JSON is still emitted
    assert proc.returncode == 2 and data["summary"]["unreadable"] == 1
    assert data["claims"][0]["verdict"] == "unreadable" and data["claims"][0]["line"] >= 1


def test_cli_giant_matrix_refused_quickly(cli: Any, tmp_path: Path) -> None:
    # 65 × 65 scores = 4225 entries > the engine's 4096 limit; ~900 kB of TOML
    row = "[" + ", ".join(["1"] * 65) + "]"
    p = tmp_path / "giant.toml"
    p.write_text("[[example]]\nname='G'\nscale=1\nscores=[" + ", ".join([row] * 65) + "]\n")
    assert_one_line_error(cli("check", str(p), timeout=60), "4096")
    big = tmp_path / "huge.toml"
    big.write_text("# " + "x" * 1_100_000 + "\n")
    assert_one_line_error(cli("check", str(big), timeout=60), "larger than")


# --------------------------------------------------------------------------- regressions
# Each reproduces a bug found while writing these tests (e-notation and parenthesised
# answers read as exact claims, float overflow on long answers, masked entries, huge
# exponents and scores that hung or crashed); all are fixed, these keep them fixed.
def _check_text(scores: str, quantity: str, claimed: str) -> CheckReport:
    text = (f"[[example]]\nname='X'\nscale=1\nscores=[[{scores}]]\nvalue=[[1],[2]]\n"
            f"[[example.claim]]\nquantity={json.dumps(quantity)}\nclaimed={json.dumps(claimed)}\n")
    return check_examples(load_examples(text=text))


def test_e_notation_claim_is_a_rounded_decimal() -> None:
    # 1/(1 + e^4) = 0.0179862...: "1.8e-2" states 2 significant digits, like "1.8 × 10^-2"
    w1 = 1 / (1 + exp(4))
    assert rounds(w1, 3) == Fraction("0.018")
    (r,) = _check_text("-3, 1", "weight[1,1]", "1.8 × 10^-2").records
    assert r.verdict == "correctly rounded"
    (r,) = _check_text("-3, 1", "weight[1,1]", "1.8e-2").records
    assert r.verdict == "correctly rounded", "e-notation read as an exact claim"


def test_parenthesised_single_decimal_is_rounded_decimal() -> None:
    (r,) = _check_text("0, 1", "output[1]", "(1.7311)").records
    # 1·w1 + 2·w2 with w2 = e/(1 + e) = 0.7310585...: output = 1.7310585... -> 1.7311
    assert rounds(1 + exp(1) / (1 + exp(1)), 4) == Fraction("1.7311")
    assert r.verdict == "correctly rounded", "'(1.7311)' read as an exact claim"


def test_long_decimal_claim_is_judged_not_crashed() -> None:
    (r,) = _check_text("0, 0", "weight[1,1]", "0." + "0" * 400 + "1").records
    assert r.verdict == "wrong"


def test_claims_about_masked_scores() -> None:
    # causal mask: query 1 does not see key 2, so its scaled score is -inf and its weight 0
    text = ("[[example]]\nname='M'\nscale=1\nmask='causal'\nscores=[[1, 2], [3, 4]]\n"
            "value=[[10], [20]]\n")
    for q, c in (("scaled_score[1,2]", "0"), ("scaled_score[1,2]", "-inf"),
                 ("scaled_score[1]", "(1, −∞)"), ("weight[1,2]", "0"), ("weight[1]", "(1, 0)"),
                 ("output[1,1]", "10"), ("weight[2,1]", "0.2689")):
        text += f"[[example.claim]]\nquantity='{q}'\nclaimed='{c}'\n"
    records = check_examples(load_examples(text=text)).records
    # weight[2,1] = e^3/(e^3 + e^4) = 1/(1 + e) = 0.26894...
    assert rounds(1 / (1 + exp(1)), 4) == Fraction("0.2689")
    assert [r.verdict for r in records] == ["wrong", "exact", "exact", "exact", "exact",
                                            "exact", "correctly rounded"]
    assert "masked" in (records[0].diagnosis or "")


@pytest.mark.parametrize("claimed", ["5 × 10^-999999999", "0.5 × 10^999999", "≈ 10^999999"])
def test_huge_exponent_claim_refused_quickly(cli: Any, tmp_path: Path, claimed: str) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[[example]]\nname='X'\nscale=1\nscores=[[0, 0]]\n[[example.claim]]\n"
                 f"quantity='weight[1,1]'\nclaimed={json.dumps(claimed)}\n", encoding="utf-8")
    proc = cli("check", str(p), timeout=15)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr


@pytest.mark.parametrize("score", ['"e^(10^9)"', '"e^(e^20)"', '"10^(10^4)"', "1e308",
                                   '"e^(1000)"', '"e^(10^4)"'])
def test_huge_score_refused_quickly(cli: Any, tmp_path: Path, score: str) -> None:
    p = tmp_path / "s.toml"
    p.write_text(f"[[example]]\nname='X'\nscale=1\nscores=[[{score}, 0]]\n[[example.claim]]\n"
                 "quantity='weight[1,1]'\nclaimed='1'\n", encoding="utf-8")
    proc = cli("check", str(p), timeout=15)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr[-600:]
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("claimed", ["e^(e^(e^(10)))", "1" * 450])
def test_hostile_claim_no_traceback(cli: Any, tmp_path: Path, claimed: str) -> None:
    p = tmp_path / "h.toml"
    p.write_text("[[example]]\nname='X'\nscale=1\nscores=[[0, 0]]\n[[example.claim]]\n"
                 f"quantity='weight[1,1]'\nclaimed={json.dumps(claimed)}\n", encoding="utf-8")
    proc = cli("check", str(p), timeout=15)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr[-600:]


def test_bad_matrix_entry_names_the_key() -> None:
    with pytest.raises(ExampleFileError, match="scores"):
        load_examples(text="[[example]]\nname='A'\nscores = [[1, 'x']]\n")


def test_params_without_d_model_is_a_claim_error() -> None:
    text = ("[[example]]\nname='A'\nscale=1\nscores=[[1]]\n[[example.claim]]\n"
            "quantity='params.total'\nclaimed='1'\n")
    with pytest.raises(MhaSymbolicError, match="d_model"):
        check_examples(load_examples(text=text), strict=True)
    (r,) = check_examples(load_examples(text=text)).records
    assert r.verdict == "unreadable" and "d_model" in (r.error or "")
