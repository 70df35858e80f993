"""Reading numbers as books print them: thousands separators, scale words, units, and
torch/numpy printouts (mha_symbolic.textbook.printouts, .claims).

Expected values and units are written by hand as exact fractions: the last printed digit
sets the unit (2.36M → unit 10^4, -9.1476e-02 → 10^-6, 2. → 1).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from mha_symbolic.errors import ClaimError
from mha_symbolic.textbook.claims import parse_printed
from mha_symbolic.textbook.printouts import MAX_DEPTH, read_printout

F = Fraction


@pytest.mark.parametrize(("text", "value", "unit"), [
    ("2,360,064", F(2360064), F(1)),
    ("2 360 064", F(2360064), F(1)),
    ("2\u2009360\u2009064", F(2360064), F(1)),  # thin spaces
    ("2’360’064", F(2360064), F(1)),
    ("2'360'064", F(2360064), F(1)),
    ("2_360_064", F(2360064), F(1)),
    ("1,234.5", F(12345, 10), F(1, 10)),
    ("-41,943,040", F(-41943040), F(1)),
    ("2.36M", F(2360000), F(10**4)),
    ("2.36 M", F(2360000), F(10**4)),
    ("2.36 million", F(2360000), F(10**4)),
    ("117M", F(117 * 10**6), F(10**6)),
    ("1.2B", F(12 * 10**8), F(10**8)),
    ("1.2 billion", F(12 * 10**8), F(10**8)),
    ("3.5k", F(3500), F(100)),
    ("65 thousand", F(65000), F(1000)),
    ("2.", F(2), F(1)),
    ("1.e-3", F(1, 1000), F(1, 1000)),
    ("-9.1476e-02", F(-91476, 10**6), F(1, 10**6)),
    (".5", F(1, 2), F(1, 10)),
])
def test_numbers_as_printed(text: str, value: Fraction, unit: Fraction) -> None:
    p = parse_printed(text)
    assert (p.kind, p.value, p.unit) == ("decimal", value, unit)


@pytest.mark.parametrize(("text", "value", "word"), [
    ("2359296 parameters", F(2359296), "parameters"),
    ("2,360,064 params", F(2360064), "params"),
    ("≈ 2.36 M parameters", F(2360000), "parameters"),
    ("64 dimensions", F(64), "dimensions"),
])
def test_a_unit_after_the_number_is_noted(text: str, value: Fraction, word: str) -> None:
    p = parse_printed(text)
    assert (p.value, p.unit_word) == (value, word)


@pytest.mark.parametrize("text", ["0,5", "1, 2", "1,23", "12,34,567", "2,360 064"])
def test_a_comma_outside_parentheses_is_only_a_thousands_separator(text: str) -> None:
    with pytest.raises(ClaimError, match="cannot read claimed"):
        parse_printed(text)


def test_inside_parentheses_a_comma_separates_entries() -> None:
    p = parse_printed("(1,234)")
    assert p.kind == "tuple" and [q.value for q in p.parts] == [1, 234]
    p = parse_printed("(2 360 064, 1 024)")  # grouped parts inside a tuple
    assert [q.value for q in p.parts] == [2360064, 1024]


def test_torch_printout_with_grad_fn_and_device() -> None:
    p = parse_printed("tensor([[0.4419, 0.6515]], device='cuda:0', grad_fn=<MmBackward0>)")
    assert (p.kind, p.shape) == ("array", (1, 2))
    assert [(q.value, q.unit) for q in p.parts] == [(F(4419, 10**4), F(1, 10**4)),
                                                   (F(6515, 10**4), F(1, 10**4))]
    assert parse_printed("tensor([1., 0.], requires_grad=True)").parts[0].unit == 1


def test_torch_scalar_reads_as_its_number() -> None:
    p = parse_printed("tensor(0.9544)")
    assert (p.kind, p.value, p.unit) == ("decimal", F(9544, 10**4), F(1, 10**4))


def test_numpy_printouts_with_and_without_commas() -> None:
    p = parse_printed("array([[0.44, 0.65]], dtype=float32)")
    assert (p.kind, p.shape) == ("array", (1, 2))
    p = parse_printed("[[0.44 0.65]\n [0.1  0.2 ]]")
    assert p.shape == (2, 2) and [q.value for q in p.parts] == [F(44, 100), F(65, 100),
                                                                 F(1, 10), F(2, 10)]
    assert p.parts[2].unit == F(1, 10)  # each entry at its own printed precision


def test_torch_scientific_and_masked_entries() -> None:
    p = parse_printed("tensor([[-9.1476e-02, -inf], [nan, 1.0000e+00]])")
    assert [q.kind for q in p.parts] == ["decimal", "special", "special", "decimal"]
    assert p.parts[3].unit == F(1, 10**4)


def test_three_and_four_dimensional_printouts() -> None:
    assert read_printout("tensor([[[1., 2.]], [[3., 4.]]])").shape == (2, 1, 2)
    assert read_printout("[[[[1]]], [[[2]]]]").shape == (2, 1, 1, 1)


@pytest.mark.parametrize(("text", "message"), [
    ("tensor([1.0, ..., 3.0])", "elides entries"),
    ("tensor([1.0, …, 3.0])", "elides entries"),
    ("[[1, 2], [3]]", "ragged"),
    ("[1,, 2]", "two commas"),
    ("[" * (MAX_DEPTH + 1) + "1" + "]" * (MAX_DEPTH + 1), "nested deeper"),
    ("tensor([1], evil=3)", "unknown keyword"),
    ("tensor([1]", "must end with ')'"),
    ("[1 2", "missing ']'"),
    ("[]", "empty list"),
    ("[1, __import__('os')]", "separated"),
])
def test_bad_printouts_are_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ClaimError, match="claimed") as info:
        parse_printed(text)
    assert message in str(info.value)


@pytest.mark.parametrize(("text", "sizes"), [
    ("torch.Size([2, 6, 2])", (2, 6, 2)), ("(2, 4, 100)", (2, 4, 100)), ("[8, 4, 256]", (8, 4, 256)),
    ("2 × 4 × 100", (2, 4, 100)), ("h·d_v × d_model", ("h·d_v", "d_model")),
    ("h*d_v × d_model", ("h·d_v", "d_model")), ("(5,)", None),
])
def test_shapes_as_printed(text: str, sizes: tuple[object, ...] | None) -> None:
    if sizes is None:
        with pytest.raises(ClaimError):
            parse_printed(text, shape=True)
        return
    assert parse_printed(text, shape=True).sizes == sizes


def test_a_whole_matrix_claim_against_the_exact_values() -> None:
    from mha_symbolic.textbook import check_examples, load_examples

    # scores (0, 1) at scale 1: weights 1/(1 + e), e/(1 + e) = 0.26894…, 0.73105… (by hand)
    text = ("[[example]]\nname='M'\nscale=1\nscores=[[0, 1], [1, 0]]\n[[example.claim]]\n"
            "quantity='weight'\nclaimed='tensor([[0.2689, 0.7311], [0.7311, 0.2689]])'\n"
            '[[example.claim]]\nquantity="weight"\nclaimed="[[0.2689 0.7311]\\n [0.7311 0.2690]]"\n')
    good, bad = check_examples(load_examples(text=text)).records
    assert good.verdict == "correctly rounded" and good.ok
    assert bad.verdict == "wrong" and bad.entries[0]["index"] == "[2,2]"
    assert bad.entries[0]["correct"] == "0.2689"
