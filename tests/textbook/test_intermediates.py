"""Names for intermediates books print (issue 25), each recomputed here with mpmath and
Fractions from the example's inputs, independently of mha_symbolic."""

from __future__ import annotations

import mpmath as mp
import pytest

from mha_symbolic.textbook import check_examples

# x: 3 tokens of width 2; W^Q = W^K = I, W^V = [[1, 0], [0, 2]]; causal; d_k = 2
EXAMPLE = """
[[example]]
name = "c"
x = [[1, 0], [0, 1], [1, 1]]
w_q = [[1, 0], [0, 1]]
w_k = [[1, 0], [0, 1]]
w_v = [[1, 0], [0, 2]]
mask = "causal"
"""


def claim(quantity: str, claimed: str, **extra: str) -> str:
    more = "".join(f'{k} = "{v}"\n' for k, v in extra.items())
    return f'[[example.claim]]\nquantity = "{quantity}"\nclaimed = "{claimed}"\n{more}'


def truth():
    """Scores S = X Xᵀ, the unmasked softmax of S/√2, V = X W^V."""
    x = [[1, 0], [0, 1], [1, 1]]
    s = [[sum(a * b for a, b in zip(x[i], x[j], strict=True)) for j in range(3)] for i in range(3)]
    v = [[r[0], 2 * r[1]] for r in x]
    free = []
    for i in range(3):
        e = [mp.e ** (mp.mpf(s[i][j]) / mp.sqrt(2)) for j in range(3)]
        free.append([t / sum(e) for t in e])
    causal = []
    for i in range(3):
        e = [mp.e ** (mp.mpf(s[i][j]) / mp.sqrt(2)) for j in range(i + 1)]
        causal.append([t / sum(e) for t in e] + [0] * (2 - i))
    return s, v, free, causal


def fmt(xs, places=4):
    return "[" + ", ".join(f"{float(t):.{places}f}" for t in xs) + "]"


@pytest.fixture(scope="module")
def records():
    with mp.workdps(30):
        _, v, free, causal = truth()
        masked_free = [[free[i][j] if j <= i else 0 for j in range(3)] for i in range(3)]
        w32 = causal[2][1]
        claims = [
            claim("x", "tensor([[1., 0.], [0., 1.], [1., 1.]])"),
            claim("mask", "tensor([[1., 0., 0.], [1., 1., 0.], [1., 1., 1.]])"),
            claim("mask_out", "[[0, 1, 1], [0, 0, 1], [0, 0, 0]]"),
            claim("masked_score", "tensor([[1., -inf, -inf], [0., 1., -inf], [1., 1., 2.]])"),
            claim("weight_masked[2]", fmt(masked_free[1])),
            claim("weight_masked[2]", fmt(causal[1])),         # renormalised: wrong here
            claim("k_t", "tensor([[1., 0., 1.], [0., 1., 1.]])"),
            claim("weighted_value[3,2]", fmt([w32 * v[1][0], w32 * v[1][1]])),
            claim("weight_sum", "tensor([1., 1., 1.])"),
        ]
    report = check_examples(EXAMPLE + "".join(claims))
    return report.records


def test_every_intermediate_is_read_and_judged(records) -> None:
    verdicts = [r.verdict for r in records]
    assert verdicts == ["exact", "exact", "exact", "exact", "correctly rounded", "wrong",
                        "exact", "correctly rounded", "exact"], [(r.quantity, r.verdict, r.error)
                                                                for r in records]


def test_renormalised_weights_claimed_as_simple_masked_are_wrong(records) -> None:
    # the check is not vacuous: the two rows differ at 4 decimals
    with mp.workdps(30):
        _, _, free, causal = truth()
    assert round(float(free[1][0]), 4) != round(float(causal[1][0]), 4)
    assert records[5].verdict == "wrong"


def test_weighted_value_needs_two_indices() -> None:
    rec = check_examples(EXAMPLE + claim("weighted_value[1]", "(1, 0)")).records[0]
    assert rec.verdict == "unreadable" and "[i,j]" in (rec.error or "")


def test_numpy_trailing_zero_stripping() -> None:
    # softmax(0, 0) = (1/2, 1/2) exactly; softmax(ln 3, 0) = (3/4, 1/4).  numpy prints
    # [0.5 0.5] and [0.75 0.25]: with printer = "numpy" each entry states 8 decimals.
    base = "[[example]]\nscale = 1\nscores = [[0, 0], [0.0001, 0]]\n"
    rec = check_examples(base + claim("weight[1]", "[0.5 0.5]", printer="numpy")).records[0]
    assert rec.verdict == "exact"
    # softmax(0.0001, 0)[0] = 0.500024999…: "0.5" holds at 1 decimal but not at numpy's 8
    with mp.workdps(30):
        w = mp.e ** mp.mpf("0.0001") / (mp.e ** mp.mpf("0.0001") + 1)
    assert round(float(w), 1) == 0.5 and round(float(w), 8) != 0.5
    plain = check_examples(base + claim("weight[2,1]", "0.5")).records[0]
    numpy = check_examples(base + claim("weight[2,1]", "0.5", printer="numpy")).records[0]
    assert plain.ok and numpy.verdict == "wrong"
    four = check_examples(base + claim("weight[2,1]", "0.5", printer="numpy:4")).records[0]
    assert four.ok   # 0.50002… is 0.5000 at 4 decimals
    bad = check_examples(base + claim("weight[2,1]", "0.5", printer="torch")).records[0]
    assert bad.verdict == "unreadable"


def test_weight_masked_refuses_an_additive_mask() -> None:
    # an additive mask of finite numbers is not "the softmax minus the mask"
    text = ('[[example]]\nscale = 1\nscores = [[1, 2]]\nmask = [[0, -1]]\n'
            + claim("weight_masked[1]", "(0.2689, 0.7311)"))
    rec = check_examples(text).records[0]
    assert rec.verdict == "unreadable" and "causal and boolean" in (rec.error or "")
