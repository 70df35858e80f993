"""The seed page's nine worked examples (examples/seed.toml), claim by claim.

Every expected verdict is derived here, independently of the code under test:
the exact values are written by hand as closed forms and evaluated with mpmath at
60 significant digits (never through ``mha_symbolic.exact.certified`` or the engine), and the
printed answers are read with :mod:`decimal`.  A printed decimal is "correctly
rounded" when the 60-digit value rounds to it at the printed unit (we also check that
the value is nowhere near a rounding tie, so 60 digits settle it); an exact claim
holds when both sides agree to 50 digits and are equal by the hand derivation; an
approximation formula holds when its relative error is below its rtol.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest

from mha_symbolic.textbook import CheckReport, ClaimRecord, check_examples, load_examples

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed.toml"
mp = mpmath.mp
mp.dps = 60


@pytest.fixture(scope="module")
def report() -> CheckReport:
    return check_examples(load_examples(SEED))


def records(report: CheckReport, name: str) -> list[ClaimRecord]:
    return [r for r in report.records if r.example == name]


# --------------------------------------------------------------------------- reading
_SCI = re.compile(r"^([+-]?\d+(?:\.\d+)?)\s*×\s*10\^(-?\d+)$")


def printed(text: str) -> tuple[Fraction, Fraction]:
    """(value, unit) of a printed decimal, read independently of mha_symbolic.textbook.claims."""
    s = text.replace("≈", "").replace("−", "-").strip()
    if s.endswith("%"):
        v, u = printed(s[:-1])
        return v / 100, u / 100
    if m := _SCI.match(s):
        d = Decimal(m.group(1))
        k = int(m.group(2))
        exp = d.as_tuple().exponent
        assert isinstance(exp, int)
        return Fraction(d) * Fraction(10) ** k, Fraction(10) ** (exp + k)
    if s.startswith("10^"):
        k = int(s[3:])
        return Fraction(10) ** k, Fraction(10) ** k
    d = Decimal(s)
    exp = d.as_tuple().exponent
    assert isinstance(exp, int)
    return Fraction(d), Fraction(10) ** exp


def mpf_of(x: Fraction) -> mpmath.mpf:
    return mpmath.mpf(x.numerator) / x.denominator


def rounds_to(x: mpmath.mpf, text: str) -> bool:
    """Whether the (60-digit) value x rounds to the printed decimal ``text``."""
    value, unit = printed(text)
    q = x / mpf_of(unit)
    n = mpmath.nint(q)
    assert abs(abs(q - mpmath.floor(q)) - mpmath.mpf("0.5")) > mpmath.mpf(10) ** -40, \
        "too close to a rounding tie for a 60-digit check"
    return Fraction(int(n)) * unit == value


def verdict_decimal(x: mpmath.mpf | Fraction, text: str) -> str:
    value, _ = printed(text)
    if isinstance(x, Fraction):
        if x == value:
            return "exact"
        x = mpf_of(x)
    return "correctly rounded" if rounds_to(x, text) else "wrong"


def same(a: mpmath.mpf, b: mpmath.mpf) -> bool:
    """Agreement to 50 significant digits (the hand derivation says they are equal)."""
    return bool(abs(a - b) <= mpmath.mpf(10) ** -50 * max(1, abs(a)))


Row = tuple[str, int, str, str, "str | None"]


def assert_records(got: list[ClaimRecord], expected: Sequence[Row]) -> None:
    """expected rows: (quantity, head, claimed, verdict, diagnosis substring or None)."""
    assert [(r.quantity, r.head, r.claimed) for r in got] == [e[:3] for e in expected]
    for r, (q, _, claimed, verdict, diag) in zip(got, expected, strict=True):
        assert r.verdict == verdict, (q, claimed, r.verdict, verdict)
        assert r.ok == (verdict != "wrong"), (q, claimed)
        if diag is None:
            assert r.ok or r.diagnosis is None, (q, claimed, r.diagnosis)
        else:
            assert r.diagnosis is not None and diag in r.diagnosis, (q, claimed, r.diagnosis)


E = mpmath.e
exp = mpmath.exp


# --------------------------------------------------------------------------- A
def test_example_a_single_head(report: CheckReport) -> None:
    # S = [[1,0],[0,1]], d_k = 2: scaled scores 1/sqrt(2) on the diagonal, 0 off it.
    s = 1 / mpmath.sqrt(2)
    w11 = 1 / (1 + exp(-s))  # e^s / (e^s + e^0)
    w12 = 1 - w11
    assert mpmath.nstr(w11, 12) == "0.669761549327"
    out1 = (2 * w11, 4 * w12)  # w11 (2, 0) + w12 (0, 4)
    out2 = (2 * w12, 4 * w11)
    # the page's formula e^0.707/(e^0.707 + 1) uses the score rounded to 3 decimals
    formula = exp(mpmath.mpf("0.707")) / (exp(mpmath.mpf("0.707")) + 1)
    rel = abs(formula - w11) / w11
    assert 0 < rel < mpmath.mpf("1e-3")  # so the claim (rtol = 1e-3) is an approximation
    # the printed head outputs are exactly the rounded weights times the values:
    assert Fraction("0.6698") * 2 == Fraction("1.3396")
    assert Fraction("0.3302") * 4 == Fraction("1.3208")
    assert Fraction("0.3302") * 2 == Fraction("0.6604")
    assert Fraction("0.6698") * 4 == Fraction("2.6792")
    # ... and not the correct roundings of the exact outputs
    assert not rounds_to(out1[0], "1.3396") and not rounds_to(out1[1], "1.3208")
    assert rounds_to(out1[0], "1.3395") and rounds_to(out1[1], "1.3210")
    assert not rounds_to(out2[0], "0.6604") and not rounds_to(out2[1], "2.6792")
    # 1/2 is the score divided by d_k, not by sqrt(d_k)
    assert not same(s, mpmath.mpf(1) / 2)

    def tup(xs: tuple[mpmath.mpf, ...], text: str) -> str:
        parts = text.strip("()").split(", ")
        vs = [verdict_decimal(x, p) for x, p in zip(xs, parts, strict=True)]
        return "wrong" if "wrong" in vs else "correctly rounded"

    expected = [
        ("score[1]", 1, "(1, 0)", "exact", None),
        ("score[2]", 1, "(0, 1)", "exact", None),
        ("dim.d_k", 1, "2", "exact", None),
        ("scaled_score[1,1]", 1, "1/2", "wrong", "1/d_k"),
        ("scaled_score[1,1]", 1, "≈ 0.707", verdict_decimal(s, "0.707"), None),
        ("scaled_score[1,2]", 1, "0", "exact", None),
        ("weight[1,1]", 1, "≈ e^(0.707)/(e^(0.707) + e^0)", "approximation", None),
        ("weight[1,1]", 1, "≈ 0.6698", verdict_decimal(w11, "0.6698"), None),
        ("weight[1,2]", 1, "≈ 0.3302", verdict_decimal(w12, "0.3302"), None),
        ("weight[2]", 1, "(0.3302, 0.6698)", tup((w12, w11), "(0.3302, 0.6698)"), None),
        ("head_output[1]", 1, "(1.3396, 1.3208)", tup(out1, "(1.3396, 1.3208)"),
         "premature rounding"),
        ("head_output[2]", 1, "(0.6604, 2.6792)", tup(out2, "(0.6604, 2.6792)"),
         "premature rounding"),
    ]
    got = records(report, "A")
    assert_records(got, expected)
    # the correct answers the tool offers are the roundings of the exact outputs
    assert got[10].rounded == "(1.3395, 1.3210)"
    assert got[11].rounded == "(0.6605, 2.6790)"
    assert "exactly" in (got[10].diagnosis or "")  # 0.6698·2 and 0.3302·4 exactly
    assert got[3].exact.startswith("0.70710678118654752440")  # 1/sqrt(2), certified digits


# --------------------------------------------------------------------------- B
def test_example_b_two_heads_single_token(report: CheckReport) -> None:
    # One token: each head's softmax is e^s/e^s = 1, so head i outputs its value slice;
    # x = (1, 2, 3, 4) with identity projections: v = x, head 1 = (1, 2), head 2 = (3, 4);
    # concat = (1, 2, 3, 4); W^O = I leaves it unchanged; h·d_v = 2·2 = 4 = d_model.
    x = [1, 2, 3, 4]
    heads = 2
    d_v = len(x) // heads
    head1, head2 = tuple(x[:d_v]), tuple(x[d_v:])
    assert (head1, head2) == ((1, 2), (3, 4))
    assert heads * d_v == 4
    expected = [
        ("weight[1,1]", 1, "1", "exact", None),
        ("weight[1,1]", 2, "1", "exact", None),
        ("head_output[1]", 1, "(1, 2)", "exact", None),
        ("head_output[1]", 2, "(3, 4)", "exact", None),
        ("concat[1]", 1, "(1, 2, 3, 4)", "exact", None),
        ("output[1]", 1, "(1, 2, 3, 4)", "exact", None),
        ("dim.concat_width", 1, "4", "exact", None),
        ("dim.d_model", 1, "4", "exact", None),
    ]
    assert_records(records(report, "B"), expected)


# --------------------------------------------------------------------------- C
def test_example_c_equal_scores(report: CheckReport) -> None:
    # three equal scores: w_j = e^2/(3 e^2) = 1/3 exactly; output (10+20+30)/3 = 20
    w = Fraction(1, 3)
    assert w * 10 + w * 20 + w * 30 == 20 and 3 * w == 1
    assert same(exp(2) / (3 * exp(2)), mpf_of(w))
    expected = [
        ("weight[1,1]", 1, "e^2/(3 e^2)", "exact", None),
        ("weight[1]", 1, "(1/3, 1/3, 1/3)", "exact", None),
        ("output[1,1]", 1, "20", verdict_decimal(Fraction(20), "20"), None),
        ("weight_sum[1]", 1, "1", verdict_decimal(3 * w, "1"), None),
    ]
    got = records(report, "C")
    assert_records(got, expected)
    assert got[1].exact_form == "(1/3, 1/3, 1/3)"


# --------------------------------------------------------------------------- D
def test_example_d_one_huge_score(report: CheckReport) -> None:
    # scores (0, 0, 20), scale 1: w3 = e^20/(2 + e^20), w1 = w2 = 1/(2 + e^20)
    w3 = exp(20) / (2 + exp(20))
    w1 = 1 / (2 + exp(20))
    out = 10 * w1 + 20 * w1 + 30 * w3  # = 30 - 30 w1 = 29.99999993816...
    assert same(out, 30 - 30 * w1)
    assert mpmath.nstr(out, 12) == "29.9999999382"
    expected = [
        ("expr", 1, "≈ 4.85 × 10^8", verdict_decimal(exp(20), "4.85 × 10^8"), None),
        ("weight[1,3]", 1, "e^20/(2 + e^20)", "exact", None),
        ("weight[1,3]", 1, "≈ 0.99999999588", verdict_decimal(w3, "0.99999999588"), None),
        ("weight[1,1]", 1, "≈ 0.0000000021", verdict_decimal(w1, "0.0000000021"), None),
        ("weight[1,2]", 1, "≈ 0.0000000021", verdict_decimal(w1, "0.0000000021"), None),
        ("output[1,1]", 1, "≈ 30.000000", verdict_decimal(out, "30.000000"), None),
        ("output[1,1]", 1, "29.99999994", verdict_decimal(out, "29.99999994"), None),
        ("output[1,1]", 1, "30", verdict_decimal(out, "30"), None),
        ("gap[1]", 1, "20", "exact", None),
    ]
    assert [e[3] for e in expected].count("correctly rounded") == 7
    assert_records(records(report, "D"), expected)


# --------------------------------------------------------------------------- E
def test_example_e_negative_score(report: CheckReport) -> None:
    # scores (-3, 1): w1 = e^-3/(e^-3 + e^1) = 1/(1 + e^4); output 100 w1 + 200 w2
    w1 = 1 / (1 + exp(4))
    w2 = 1 - w1
    out = 100 * w1 + 200 * w2
    assert same(exp(-3) / (exp(-3) + E), w1)
    expected = [
        ("expr", 1, "≈ 0.0498", verdict_decimal(exp(-3), "0.0498"), None),
        ("weight[1,1]", 1, "e^(−3)/(e^(−3) + e^1)", "exact", None),
        ("weight[1,1]", 1, "≈ 0.01799", verdict_decimal(w1, "0.01799"), None),
        ("weight[1,2]", 1, "≈ 0.98201", verdict_decimal(w2, "0.98201"), None),
        ("output[1,1]", 1, "198.20", verdict_decimal(out, "198.20"), None),
    ]
    assert all(e[3] != "wrong" for e in expected)
    assert_records(records(report, "E"), expected)


# --------------------------------------------------------------------------- F
def test_example_f_unscaled(report: CheckReport) -> None:
    # scores (40, 8), scale 1: w1 = e^40/(e^40 + e^8) = 1/(1 + e^-32)
    w1 = 1 / (1 + exp(-32))
    w2 = 1 - w1
    approx = 1 - exp(-32)
    rel = abs(approx - w1) / w1  # = e^-64/(1 + e^-32)... far below the default rtol 1e-6
    assert 0 < rel < mpmath.mpf("1e-6")
    expected = [
        ("gap[1]", 1, "32", "exact", None),
        ("weight[1,1]", 1, "e^40/(e^40 + e^8)", "exact", None),
        ("weight[1,1]", 1, "≈ 1 − e^(−32)", "approximation", None),
        ("weight[1,1]", 1, "≈ 0.99999999999999", verdict_decimal(w1, "0.99999999999999"),
         None),
        ("weight[1,2]", 1, "≈ 0", verdict_decimal(w2, "0"), None),
    ]
    got = records(report, "F-unscaled")
    assert_records(got, expected)
    # 1 − e^(−32) and the exact weight agree to about 28 digits: the certified digits shown
    # must be those of the exact weight, 0.99999999999998733583...
    truncated = "0." + str(int(mpmath.floor(w1 * mpmath.mpf(10) ** 20)))
    assert got[2].exact == truncated + "…"
    assert truncated == "0.99999999999998733583"


def test_example_f_scaled(report: CheckReport) -> None:
    # d_k = 64: scale 1/8, scaled scores (5, 1), w1 = e^5/(e^5 + e^1) = 1/(1 + e^-4)
    w1 = 1 / (1 + exp(-4))
    w2 = 1 - w1
    expected = [
        ("scale", 1, "1/8", "exact", None),
        ("scaled_score[1]", 1, "(5, 1)", "exact", None),
        ("gap[1]", 1, "4", "exact", None),
        ("weight[1,1]", 1, "e^5/(e^5 + e^1)", "exact", None),
        ("weight[1,1]", 1, "≈ 0.9820", verdict_decimal(w1, "0.9820"), None),
        ("weight[1,1]", 1, "≈ 0.982", verdict_decimal(w1, "0.982"), None),
        ("weight[1,2]", 1, "0.018", verdict_decimal(w2, "0.018"), None),
    ]
    assert Fraction(40, 8) == 5 and Fraction(8, 8) == 1
    assert_records(records(report, "F-scaled"), expected)


# --------------------------------------------------------------------------- G
def test_example_g_coreference(report: CheckReport) -> None:
    scores = [mpmath.mpf(s) for s in ("3.0", "0.5", "0.2", "1.0", "0.3", "0.6")]
    denom = mpmath.fsum(exp(s) for s in scores)
    w_cat = exp(scores[0]) / denom
    assert mpmath.nstr(w_cat, 8) == "0.69630425"
    expected = [
        ("weight[1,1]", 1, "e^3.0/(e^3.0 + e^0.5 + e^0.2 + e^1.0 + e^0.3 + e^0.6)", "exact",
         None),
        ("weight[1,1]", 1, "≈ 0.6963", verdict_decimal(w_cat, "0.6963"), None),
        ("weight[1,1]", 1, "≈ 70%", verdict_decimal(w_cat, "70%"), None),
        ("weight_sum[1]", 1, "1", "exact", None),
    ]
    assert_records(records(report, "G"), expected)


# --------------------------------------------------------------------------- H
def test_example_h_cross_attention_shapes(report: CheckReport) -> None:
    n_q, n_k, d_model, h = 3, 5, 512, 8
    d_k = d_model // h  # 64
    shapes = {"q": f"{n_q} × {d_k}", "k": f"{n_k} × {d_k}", "v": f"{n_k} × {d_k}",
              "scores": f"{n_q} × {n_k}", "weights": f"{n_q} × {n_k}",
              "head": f"{n_q} × {d_k}"}
    expected: list[tuple[str, int, str, str, str | None]] = [
        (f"shape.{k}", 1, v, "exact", None) for k, v in shapes.items()]
    expected += [("dim.concat_width", 1, str(h * d_k), "exact", None),
                 ("dim.d_model", 1, "512", "exact", None)]
    got = records(report, "H")
    assert_records(got, expected)
    assert [r.exact for r in got[:6]] == list(shapes.values())


# --------------------------------------------------------------------------- I
def test_example_i_parameter_count(report: CheckReport) -> None:
    d, h = 512, 8
    d_k = d // h
    per_head = d * d_k  # 32768
    qkv = 3 * h * per_head  # 786432
    w_o = d * d  # 262144
    total = qkv + w_o  # no biases
    assert total == 4 * 512**2 == 2**20 == 1048576
    expected = [
        ("params.total", 1, "≈ 10^6", verdict_decimal(Fraction(total), "10^6"), None),
        ("shape.w_q", 1, f"{d} × {d_k}", "exact", None),
        ("params.w_q_head", 1, str(per_head), "exact", None),
        ("params.qkv", 1, str(qkv), "exact", None),
        ("dim.concat_width", 1, str(h * d_k), "exact", None),
        ("params.w_o", 1, str(w_o), "exact", None),
        ("params.total", 1, str(total), "exact", None),
        ("params.total", 1, "4 × 512^2", "exact", None),
        ("params.total", 1, "2^20", "exact", None),
    ]
    assert expected[0][3] == "correctly rounded"  # 1048576 rounds to 1 × 10^6
    assert_records(records(report, "I"), expected)


def test_seed_summary(report: CheckReport) -> None:
    # the page is right everywhere except the three claims diagnosed above
    wrong = [(r.example, r.quantity) for r in report.records if not r.ok]
    assert wrong == [("A", "scaled_score[1,1]"), ("A", "head_output[1]"),
                     ("A", "head_output[2]")]
    s = report.summary()
    assert s["claims"] == len(report.records) == 71
    assert s["wrong"] == 3 and s["diagnosed"] == 3
    assert not report.ok
