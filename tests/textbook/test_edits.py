"""Issue 25, third session: the diagnosis "the printed values are what X′ gives" for small
edits X′ of the shown input, on printouts read transposed and over the heads or batch
axis, and "a size of another axis".  The planted file tests/data/planted-edits.toml is
checked claim by claim against its notes, and every printed number in it is recomputed
here with mpmath loops (softmax by hand), never with the code under test."""

from __future__ import annotations

from pathlib import Path

import mpmath as mpm
import pytest

from mha_symbolic.textbook import check_examples, load_examples
from mha_symbolic.textbook.alternatives import MAX_EDITS, file_allowance, other_input_diagnosis
from mha_symbolic.textbook.claims import parse_printed
from mha_symbolic.textbook.edits import MAX_ENTRIES, is_typed, small_edits
from mha_symbolic.textbook.examples import Claim

PLANTED = Path(__file__).resolve().parents[2] / "tests" / "data" / "planted-edits.toml"
mpm.mp.dps = 40


def _softmax(row: list[mpm.mpf]) -> list[mpm.mpf]:
    e = [mpm.exp(x) for x in row]
    s = mpm.fsum(e)
    return [x / s for x in e]


def _dot(a: list[mpm.mpf], b: list[mpm.mpf]) -> mpm.mpf:
    return mpm.fsum(x * y for x, y in zip(a, b, strict=True))


def _rounds_to(x: mpm.mpf, text: str) -> bool:
    places = len(text.split(".")[1]) if "." in text else 0
    return abs(x - mpm.mpf(text)) <= mpm.mpf(10) ** -places / 2


def _q(s: str) -> mpm.mpf:
    return mpm.mpf(s)


@pytest.fixture(scope="module")
def records() -> dict[tuple[str, str], object]:
    report = check_examples(PLANTED)
    return {(r.example, r.claimed): r for r in report.records}


def test_every_planted_claim_gets_what_its_note_says(records: dict) -> None:
    seen = 0
    for (name, claimed), r in records.items():
        note = r.note
        if note == "correct":
            assert r.verdict != "wrong", (name, claimed)
        elif note.startswith("root: "):
            assert r.verdict == "wrong" and (r.diagnosis or "").startswith(note[6:]), \
                (name, claimed, r.diagnosis)
        else:  # a wrong claim no slip explains: no diagnosis may be stated
            assert r.verdict == "wrong" and r.diagnosis is None, (name, claimed, r.diagnosis)
        seen += 1
    assert seen == 19


def test_the_planted_digits_are_what_mpmath_gives_for_the_shown_and_edited_inputs() -> None:
    r2 = mpm.sqrt(2)
    # edit-sign: q = (1, 2) · K rows / √2; the slip q = (1, −2)
    keys = [[2, 1], [1, 3], [0, 1]]
    shown = _softmax([_dot([1, 2], k) / r2 for k in keys])
    slip = _softmax([_dot([1, -2], k) / r2 for k in keys])
    assert all(map(_rounds_to, shown, ["0.1043", "0.8703", "0.0254"]))
    assert all(map(_rounds_to, slip, ["0.7860", "0.0229", "0.1911"]))
    # edit-entries: weights softmax(0, 1), V = [[1, 2], [3, 5]] and the swapped [[1, 2], [5, 3]]
    w = _softmax([0, 1])
    assert all(map(_rounds_to, [w[0] * 1 + w[1] * 3, w[0] * 2 + w[1] * 5], ["2.4621", "4.1932"]))
    assert all(map(_rounds_to, [w[0] * 1 + w[1] * 5, w[0] * 2 + w[1] * 3], ["3.9242", "2.7311"]))
    # edit-digit-dropped: (0.25, 1.8) and (0.5, 1.8)
    assert all(map(_rounds_to, _softmax([_q("0.25"), _q("1.8")]), ["0.1751", "0.8249"]))
    assert all(map(_rounds_to, _softmax([_q("0.5"), _q("1.8")]), ["0.2142", "0.7858"]))
    # edit-digits-swapped: (0.34, 1.2); the shown (0.43, 1.2) does not round so
    assert all(map(_rounds_to, _softmax([_q("0.34"), _q("1.2")]), ["0.2973", "0.7027"]))
    assert not _rounds_to(_softmax([_q("0.43"), _q("1.2")])[0], "0.2973")
    # edit-transposed-printout: rows of [[1, 2], [0, 3]] and of [[1, 2], [0, 4]], printed .T
    a, b = _softmax([1, 2]), _softmax([0, 3])
    assert all(map(_rounds_to, [a[0], b[0], a[1], b[1]], ["0.2689", "0.0474", "0.7311", "0.9526"]))
    c = _softmax([0, 4])
    assert all(map(_rounds_to, [a[0], c[0], a[1], c[1]], ["0.2689", "0.0180", "0.7311", "0.9820"]))
    # transposed-not-scaled: Q Kᵀ = [[1, 0], [2, 2]] unscaled, printed .T
    u, v = _softmax([1, 0]), _softmax([2, 2])
    assert all(map(_rounds_to, [u[0], v[0], u[1], v[1]], ["0.7311", "0.5000", "0.2689", "0.5000"]))
    # edit-heads-printout: head h's q = k = column h of X (W = I, d_k = 1, scale 1)
    def head_weights(col: list[int]) -> list[list[mpm.mpf]]:
        return [_softmax([mpm.mpf(qi * kj) for kj in col]) for qi in col]

    printed = [[["0.1192", "0.8808"], ["0.0025", "0.9975"]], [["0.8808", "0.1192"], ["0.7311", "0.2689"]]]
    for h, col in enumerate(([1, 3], [2, 1])):
        for r, row in enumerate(head_weights(col)):
            assert all(map(_rounds_to, row, printed[h][r]))
    for col in ([1, -3], [-1, 3]):  # the two edits that fit: the same scores
        rows = head_weights(col)
        assert all(map(_rounds_to, rows[0], ["0.9820", "0.0180"]))
        assert all(map(_rounds_to, rows[1], ["0.0000", "1.0000"]))
    # edit-batch-printout: softmax(1, 3) shown, softmax(−1, 3) printed
    assert all(map(_rounds_to, _softmax([1, 3]), ["0.1192", "0.8808"]))
    assert all(map(_rounds_to, _softmax([-1, 3]), ["0.0180", "0.9820"]))
    # edit-none-fits: the shown input's digits are (0.1070, 0.8930), not the printed 0.8903
    shown2 = _softmax([_dot([1, 2], k) / r2 for k in [[2, 1], [1, 3]]])
    assert all(map(_rounds_to, shown2, ["0.1070", "0.8930"]))
    e = mpm.e
    assert _rounds_to((e + 2 * e**2 + 4 * e**3) / (e + e**2 + e**3), "3.2405")


def test_no_small_edit_of_the_none_fits_inputs_gives_the_printed_digits() -> None:
    # every edit the search can make, recomputed here with mpmath: none rounds to the printout
    r2 = mpm.sqrt(2)
    for key_or_query in ("query", "key"):
        q, k = [[1, 2]], [[2, 1], [1, 3]]
        shown = q if key_or_query == "query" else k
        for _, m in small_edits(shown):
            qq, kk = (m, k) if key_or_query == "query" else (q, m)
            w = _softmax([_dot([_q(str(x)) for x in qq[0]], [_q(str(y)) for y in row]) / r2
                          for row in kk])
            assert not (_rounds_to(w[0], "0.1097") and _rounds_to(w[1], "0.8903"))


def test_the_small_edits_are_the_five_kinds_and_skip_what_is_no_change() -> None:
    edits = dict(small_edits([[0.43, 0.5]]))
    assert edits["entry [1,1] negated (-0.43 for 0.43)"] == [[-0.43, 0.5]]
    assert edits["entries [1,1] and [1,2] swapped"] == [[0.5, 0.43]]
    assert edits["entry [1,1] a digit dropped (0.3 for 0.43)"] == [[0.3, 0.5]]
    assert edits["entry [1,1] two digits swapped (0.34 for 0.43)"] == [[0.34, 0.5]]
    assert edits["entry [1,2] off by one in its last digit (0.4 for 0.5)"] == [[0.43, 0.4]]
    # dropping the leading 0 of 0.43 gives .43, the same number: not an edit
    assert all(m != [[0.43, 0.5]] for m in edits.values())
    # replayed draws (fractions) and large matrices are not typed: no edits
    from fractions import Fraction

    assert small_edits([[Fraction(5648727, 16777216)]]) == []
    assert not is_typed([[1] * (MAX_ENTRIES + 1)])


def test_the_edit_search_is_bounded_per_claim_and_per_run() -> None:
    ex = load_examples(text="[[example]]\nname='t'\nscores=[[5, 1]]\nscale=1\n")[0]
    p = parse_printed("e^4/(e^4 + e)")  # softmax(4, 1): the shown 5 off by one
    claim = Claim("weight[1,1]", p.text)
    with file_allowance():
        assert "(4 for 5)" in (other_input_diagnosis(ex, claim, p) or "")
    with file_allowance(6, 0):  # no edit computations allowed: none stated
        assert other_input_diagnosis(ex, claim, p) is None
    assert MAX_EDITS == 24
    # a printout of fewer than 5 significant digits is never matched by an edit
    short = parse_printed("(0.27, 0.73)")  # softmax(0, 1) = softmax(4, 5): 5 → 4 … 1 → 0
    with file_allowance():
        assert other_input_diagnosis(ex, Claim("weight[1]", short.text), short) is None
