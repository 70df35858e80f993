"""Issue 25: the diagnoses of rounded inputs — outputs computed from inputs rounded as the
text prints them (premature rounding of the inputs), outputs computed from unrounded
inputs the example types rounded (inputs shown rounded) — and of an approximation looser
than the claim's tolerance.  The planted file tests/data/planted-rounded.toml is checked
claim by claim against its notes; every printed number is recomputed here with mpmath
loops (softmax by hand) or Fractions, never with the code under test."""

from __future__ import annotations

from pathlib import Path

import mpmath as mpm
import numpy as np
import pytest

from mha_symbolic.textbook import check_examples, load_examples

ROOT = Path(__file__).resolve().parents[2]
PLANTED = ROOT / "tests" / "data" / "planted-rounded.toml"
UVA = ROOT / "examples" / "books" / "uva-dl-tutorial6.toml"
mpm.mp.dps = 40


def _softmax(row: list) -> list:
    e = [mpm.exp(x) for x in row]
    s = mpm.fsum(e)
    return [x / s for x in e]


def _dot(a: list, b: list) -> mpm.mpf:
    return mpm.fsum(x * y for x, y in zip(a, b, strict=True))


def _rounds_to(x: mpm.mpf, text: str) -> bool:
    places = len(text.split(".")[1]) if "." in text else 0
    return abs(x - mpm.mpf(text)) < mpm.mpf(10) ** -places / 2


@pytest.fixture(scope="module")
def records() -> list:
    return check_examples(PLANTED).records


def test_every_planted_claim_gets_what_its_note_says(records: list) -> None:
    for r in records:
        if r.note == "correct":
            assert r.verdict != "wrong", (r.example, r.claimed)
        elif r.note.startswith("root: "):
            assert r.verdict == "wrong" and (r.diagnosis or "").startswith(r.note[6:]), \
                (r.example, r.claimed, r.diagnosis)
        else:  # a wrong claim no slip explains: no diagnosis may be stated
            assert r.verdict == "wrong" and r.diagnosis is None, (r.example, r.claimed, r.diagnosis)
    assert len(records) == 14
    assert sum(r.note.startswith("root: ") for r in records) == 5


def test_rounded_x_digits_are_what_mpmath_gives_for_the_exact_and_the_printed_x() -> None:
    def head_row1(x: list) -> list:  # W = I, scale 1: Q = K = V = X
        w = _softmax([_dot(x[0], xj) for xj in x])
        return [mpm.fsum(w[j] * x[j][c] for j in range(2)) for c in range(2)]

    exact = head_row1([[mpm.mpf(1) / 3, mpm.mpf(2) / 3], [1, 0]])
    printed = head_row1([[mpm.mpf("0.33"), mpm.mpf("0.67")], [1, 0]])
    assert all(map(_rounds_to, exact, ["0.6298", "0.3702"]))
    assert all(map(_rounds_to, printed, ["0.6270", "0.3730"]))
    assert not _rounds_to(exact[0], "0.6270")


def test_rounded_qk_digits_tell_both_roundings_from_the_query_alone() -> None:
    def weights(q: list, k: list) -> list:
        return _softmax([_dot(q, kj) / mpm.sqrt(2) for kj in k])

    q, k = [mpm.mpf("0.123456"), mpm.mpf("1.234567")], [
        [mpm.mpf("0.987654"), mpm.mpf("-0.456789")], [mpm.mpf("1.111111"), mpm.mpf("0.222222")]]
    qr, kr = [mpm.mpf("0.12"), mpm.mpf("1.23")], [
        [mpm.mpf("0.99"), mpm.mpf("-0.46")], [mpm.mpf("1.11"), mpm.mpf("0.22")]]
    assert all(map(_rounds_to, weights(q, k), ["0.3535", "0.6465"]))
    assert all(map(_rounds_to, weights(qr, kr), ["0.3540", "0.6460"]))
    assert all(map(_rounds_to, weights(qr, k), ["0.3541", "0.6459"]))
    # the key rounded alone gives neither printout: the diagnosis names what fits
    assert not all(map(_rounds_to, weights(q, kr), ["0.3540", "0.6460"]))
    assert not all(map(_rounds_to, weights(q, kr), ["0.3541", "0.6459"]))


def test_unrounded_scores_the_true_scores_round_to_the_typed_ones_and_give_the_printout() -> None:
    true, typed = [mpm.mpf("0.656115"), mpm.mpf("0.609067")], [mpm.mpf("0.6561"), mpm.mpf("0.6091")]
    assert all(abs(t - u) < mpm.mpf("0.00005") for t, u in zip(true, typed, strict=True))
    w_true, w_typed = _softmax(true), _softmax(typed)
    assert all(map(_rounds_to, w_true, ["0.5118", "0.4882"]))
    assert all(map(_rounds_to, w_typed, ["0.5117", "0.4883"]))
    # the far claims: 0.5181 and 0.5120 are more than 2 units from the typed value
    assert abs(w_typed[0] - mpm.mpf("0.5120")) > mpm.mpf("0.0002")


def test_uva_as_exact_is_diagnosed_inputs_shown_rounded_with_the_seeded_draws_as_witness() -> None:
    # independent: the tutorial's float32 draws (the replay cache) lie within half a unit
    # of the typed 4-decimal Q, K, V, and give 0.5698 where the typed digits give 0.5697
    draws = np.load(ROOT / "examples" / "books" / "uva-dl-tutorial6-seed42.npz")
    (ex, *_) = load_examples(UVA)
    typed = {k: [[mpm.mpf(repr(x)) for x in row] for row in ex.inputs[k]]
             for k in ("query", "key", "value")}
    seeded = {k: [[mpm.mpf(float(x)) for x in row] for row in draws[k]]  # float32: exact
              for k in ("query", "key", "value")}

    def out11(d: dict) -> mpm.mpf:
        w = _softmax([_dot(d["query"][0], kj) / mpm.sqrt(2) for kj in d["key"]])
        return mpm.fsum(w[j] * d["value"][j][0] for j in range(3))

    for k in typed:
        for row_t, row_s in zip(typed[k], seeded[k], strict=True):
            assert all(abs(t - s) <= mpm.mpf("0.00005") for t, s in zip(row_t, row_s, strict=True))
    assert _rounds_to(out11(typed), "0.5697") and _rounds_to(out11(seeded), "0.5698")
    (r,) = [r for r in check_examples(UVA).records if r.verdict == "wrong"]
    assert r.example == "uva-sdpa-as-exact"
    assert r.diagnosis.startswith("inputs shown rounded: the typed inputs read as printed to 4 "
                                  "decimals (each within half a unit of its last digit) give "
                                  "the entry the typed digits miss")


def test_a_looser_approximation_is_named_with_its_certified_relative_error() -> None:
    text = '''
[[example]]
name = "approximation"
scale = 1
scores = [[5, 1]]
[[example.claim]]
quantity = "weight[1,1]"
claimed = "≈ 1 − e^(−4)"
[[example.claim]]
quantity = "weight[1,1]"
claimed = "≈ 1 − e^(−1)"
'''
    close, far = check_examples(load_examples(text=text)).records
    w = 1 / (1 + mpm.exp(-4))
    rel = abs(w - (1 - mpm.exp(-4))) / w
    assert mpm.mpf("3.35e-4") < rel < mpm.mpf("3.45e-4")  # 0.00034 to two digits, < 1e-3
    assert close.verdict == "wrong"
    assert close.diagnosis == (
        "a looser approximation than the claim's tolerance: the formula is within a relative "
        "0.00034 of the value, past rtol = 1e-06 (it holds as an approximation with rtol = 1e-03)")
    # 1 − e^(−1) is 36 % off: not an approximation of this value, no diagnosis
    assert abs(w - (1 - mpm.exp(-1))) / w > mpm.mpf("0.01")
    assert far.verdict == "wrong" and far.diagnosis is None


def test_inputs_already_at_the_printed_digits_are_not_a_premature_rounding() -> None:
    # x typed with 2 decimals and printed with 2: rounding changes nothing, so a wrong
    # output (a typo) gets no "premature rounding of the inputs"
    text = '''
[[example]]
name = "typed"
scale = 1
x = [[0.33, 0.67], [1, 0]]
w_q = [[1, 0], [0, 1]]
w_k = [[1, 0], [0, 1]]
w_v = [[1, 0], [0, 1]]
[[example.claim]]
quantity = "x"
claimed = "[[0.33, 0.67], [1.00, 0.00]]"
[[example.claim]]
quantity = "head_output[1]"
claimed = "(0.6298, 0.3702)"
'''
    r = check_examples(load_examples(text=text)).records[1]
    assert r.verdict == "wrong"
    assert not (r.diagnosis or "").startswith("premature rounding of the inputs")
