"""Diagnoses that find the root (issue 25), on tests/data/planted-roots.toml.

Every planted number is recomputed here without mha_symbolic (Fractions for the
blends, mpmath at 50 digits for the softmaxes, numpy float32 for the round-off), so the
file cannot hold a number the slip does not produce; then the checker must name the slip."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import mpmath as mp
import numpy as np
import pytest

from mha_symbolic.textbook import check_examples, load_examples

PLANTED = Path(__file__).resolve().parents[1] / "data" / "planted-roots.toml"


@pytest.fixture(autouse=True)
def _digits():
    with mp.workdps(50):  # never change the precision other test files run at
        yield


def softmax(xs):
    e = [mp.e ** mp.mpf(x) for x in xs]
    return [v / sum(e) for v in e]


def r(x, places):
    return round(float(x), places)


@pytest.fixture(scope="module")
def records():
    report = check_examples(load_examples(str(PLANTED)))
    return {(rec.example, rec.quantity): rec for rec in report.records}


def test_the_planted_numbers_are_what_the_slips_give() -> None:
    w = softmax([2, 0])
    assert (r(w[0], 1), r(w[1], 1)) == (0.9, 0.1)                    # printed weights hold
    assert (Fraction(9, 10) * 10, Fraction(1, 10) * 10) == (9, 1)     # blend of rounded weights
    assert (r(w[0] * 10, 4), r(w[1] * 10, 4)) == (8.808, 1.192)       # the truth differs
    after = softmax([1, 2])                                           # mask after softmax
    assert r(after[0], 4) == 0.2689 and Fraction(2689, 10000) * 10 == Fraction(2689, 1000)
    right, slip = softmax([mp.mpf(1) / 2, 0]), softmax([1 / mp.sqrt(8), 0])
    assert r(right[0], 4) == 0.6225 and (r(slip[0], 4), r(slip[1], 4)) == (0.5875, 0.4125)
    assert Fraction(5875, 10000) * 10 == Fraction(5875, 1000)
    assert r(softmax([1, 0])[0], 4) == 0.7311 and r(softmax([mp.mpf(1) / 2, 0])[0], 4) == 0.6225
    assert 4 * 512**2 + 512 == 1049088 and 4 * 512**2 + 4 * 512 == 1050624


def test_the_float32_case_is_a_real_boundary_case() -> None:
    q = [[Fraction(7, 100), Fraction(4, 10)], [Fraction(-17, 100), Fraction(-69, 100)]]
    k = [[Fraction(-63, 100), Fraction(6, 100)], [Fraction(-56, 100), Fraction(-13, 100)]]
    v = [[Fraction(57, 100), Fraction(-61, 100)], [Fraction(-1), Fraction(57, 100)]]
    s = [sum(mp.mpf(q[1][t].numerator) / q[1][t].denominator
             * mp.mpf(k[j][t].numerator) / k[j][t].denominator for t in range(2)) / mp.sqrt(2)
         for j in range(2)]
    w = softmax(s)
    exact = sum(w[j] * mp.mpf(v[j][1].numerator) / v[j][1].denominator for j in range(2))
    assert abs(exact - mp.mpf("0.00484999273")) < 1e-11
    assert exact < mp.mpf("0.00485")                                   # rounds to 0.0048
    f = np.float32
    q32 = np.array([[0.07, 0.4], [-0.17, -0.69]], f)
    k32 = np.array([[-0.63, 0.06], [-0.56, -0.13]], f)
    v32 = np.array([[0.57, -0.61], [-1.0, 0.57]], f)
    t = (q32 @ k32.T).astype(f) * f(1 / np.sqrt(2))
    e = np.exp(t - t.max(axis=1, keepdims=True))
    w32 = e / e.sum(axis=1, keepdims=True, dtype=f)
    assert round(float((w32 @ v32)[1, 1]), 4) == 0.0049                 # float32 prints 0.0049


@pytest.mark.parametrize(("example", "quantity", "root"), [
    ("rounded-tensor", "head_output[1]", "premature rounding"),
    ("rounded-tensor", "head_output", "premature rounding"),
    ("mask-after-softmax", "weight[1]", "mask applied after the softmax"),
    ("sqrt-d-model", "weight[1]", "scaled by 1/√8 (√d_model) instead of 1/√4 (√d_k)"),
    ("heads-order", "concat[1]", "heads concatenated out of order"),
    ("heads-order", "output[1]", "heads concatenated out of order"),
    ("bias-once", "params.total", "a bias counted once"),
    ("float32", "head_output[2,2]", "float32 round-off"),
])
def test_the_root_is_named(records, example: str, quantity: str, root: str) -> None:
    rec = records[(example, quantity)]
    assert rec.verdict == "wrong"
    assert rec.diagnosis is not None and rec.diagnosis.startswith(root), rec.diagnosis


@pytest.mark.parametrize(("example", "quantity", "upstream"), [
    ("mask-after-softmax", "head_output[1]", "mask applied after the softmax"),
    ("sqrt-d-model", "head_output[1,1]", "scaled by 1/√8"),
])
def test_downstream_of_wrong_weights_the_upstream_slip_is_named(records, example, quantity,
                                                                upstream) -> None:
    d = records[(example, quantity)].diagnosis or ""
    assert not d.startswith("premature rounding"), d      # the misleading diagnosis
    assert d.startswith("follows from wrong printed weights") and upstream in d
    assert "weight[1] at line" in d


def test_indistinguishable_slips_are_reported_together(records) -> None:
    d = records[("indistinguishable", "weight[1,1]")].diagnosis or ""
    assert d.startswith("indistinguishable here")
    assert "1/d_k = 1/4" in d and "1/√16 (√d_model)" in d


def test_float32_does_not_fire_off_the_boundary() -> None:
    # 0.5 at scale 1 of softmax(0, 0): exactly 0.5; "0.5001" is one unit off but no
    # float32 computation gives it (float32 gives exactly 0.5)
    rec = check_examples('[[example]]\nscale = 1\nscores = [[0, 0]]\n'
                         '[[example.claim]]\nquantity = "weight[1,1]"\nclaimed = "0.5001"\n'
                         ).records[0]
    assert rec.verdict == "wrong" and not (rec.diagnosis or "").startswith("float32")
