"""Reading printed answers (mha_symbolic.textbook.claims): the semantics table, row by row.

Expected values and units are written by hand as exact fractions: the printed digits
define the unit of the last digit (0.6698 -> 1/10000, 4.85 × 10^8 -> 10^6, 70% -> 1/100).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from mha_symbolic.errors import ClaimError, MhaSymbolicError
from mha_symbolic.textbook.claims import MAX_CLAIM_LENGTH, PrintedAnswer, parse_printed

F = Fraction


# (printed, value, unit, approx)
DECIMALS: list[tuple[str, Fraction, Fraction, bool]] = [
    ("0.6698", F(6698, 10000), F(1, 10000), False),
    ("≈ 0.6698", F(6698, 10000), F(1, 10000), True),
    ("~0.5", F(1, 2), F(1, 10), True),
    ("about 2", F(2), F(1), True),
    ("approximately 0.25", F(1, 4), F(1, 100), True),
    ("approx 0.5", F(1, 2), F(1, 10), True),
    ("approx. 0.5", F(1, 2), F(1, 10), True),
    ("= 20", F(20), F(1), False),
    ("30", F(30), F(1), False),
    ("29.99999994", F(2999999994, 10**8), F(1, 10**8), False),
    ("≈ 198.20", F(19820, 100), F(1, 100), True),
    ("0.0000000021", F(21, 10**10), F(1, 10**10), False),
    ("-25.75", F(-2575, 100), F(1, 100), False),
    ("−25.75", F(-2575, 100), F(1, 100), False),  # unicode minus
    ("+0.5", F(1, 2), F(1, 10), False),
    ("0.50", F(1, 2), F(1, 100), False),
    ("4.85 × 10^8", F(485 * 10**6), F(10**6), False),
    ("≈ 4.85 × 10^8", F(485 * 10**6), F(10**6), True),
    ("1.80 × 10^-2", F(18, 1000), F(1, 10**4), False),
    ("1.80 × 10^(−2)", F(18, 1000), F(1, 10**4), False),
    ("-2.575 × 10^1", F(-2575, 100), F(1, 100), False),
    ("5 x 10^3", F(5000), F(1000), False),
    ("≈ 10^6", F(10**6), F(10**6), True),
    ("≈ 10^-2", F(1, 100), F(1, 100), True),
    ("70%", F(70, 100), F(1, 100), False),
    ("≈ 70%", F(70, 100), F(1, 100), True),
    ("1.799%", F(1799, 100000), F(1, 100000), False),
    ("50 %", F(1, 2), F(1, 100), False),
]


@pytest.mark.parametrize(("text", "value", "unit", "approx"), DECIMALS)
def test_decimal_reading(text: str, value: Fraction, unit: Fraction, approx: bool) -> None:
    p = parse_printed(text)
    assert (p.kind, p.value, p.unit, p.approx) == ("decimal", value, unit, approx)
    assert p.text == text


def test_plain_power_of_ten_without_approx_is_exact() -> None:
    # "10^6" with no ≈ is the exact number 10^6, not a rounded one
    p = parse_printed("10^6")
    assert p.kind == "expression" and p.expr == 10**6 and not p.approx


@pytest.mark.parametrize(("text", "value"), [
    ("1/3", F(1, 3)), ("2^20", F(2**20)), ("4 × 512^2", F(4 * 512**2)), ("e^0", F(1)),
    ("1/2", F(1, 2)), ("3 × 1/3", F(1)), ("(1/3)", F(1, 3)),
])
def test_exact_expressions(text: str, value: Fraction) -> None:
    p = parse_printed(text)
    assert p.kind == "expression" and not p.approx
    assert p.expr.is_Rational and F(int(p.expr.p), int(p.expr.q)) == value


def test_approximation_formula_keeps_its_symbolic_form() -> None:
    import sympy as sp

    p = parse_printed("≈ 1 − e^(−32)")
    assert p.kind == "expression" and p.approx
    assert sp.simplify(p.expr - (1 - sp.exp(-32))) == 0
    assert p.describe_precision() == "approximation formula"
    assert parse_printed("e^2/(3 e^2)").describe_precision() == "exact claim"


def test_tuples_read_each_part() -> None:
    p = parse_printed("(1.3396, 1.3208)")
    assert p.kind == "tuple" and len(p.parts) == 2
    assert [q.value for q in p.parts] == [F(13396, 10000), F(13208, 10000)]
    assert all(q.unit == F(1, 10000) for q in p.parts)
    mixed = parse_printed("(1/3, 0.5, -3)")
    assert [q.kind for q in mixed.parts] == ["expression", "decimal", "decimal"]
    semi = parse_printed("(−3; 1)")
    assert [q.value for q in semi.parts] == [F(-3), F(1)]
    nested = parse_printed("((-3), (1))")  # a parenthesised part is read like a bare one
    assert [(q.kind, q.value) for q in nested.parts] == [("decimal", F(-3)), ("decimal", F(1))]


@pytest.mark.parametrize(("text", "sizes"), [
    ("3 × 5", (3, 5)), ("3 x 5", (3, 5)), ("(3 × 64)", (3, 64)), ("512×64", (512, 64)),
    ("n × d_k", ("n", "d_k")), ("3 * 5", (3, 5)),
])
def test_shapes(text: str, sizes: tuple[object, ...]) -> None:
    p = parse_printed(text, shape=True)
    assert p.kind == "shape" and p.sizes == sizes


def test_significant_digits_and_precision_text() -> None:
    assert parse_printed("0.6698").significant_digits == 4
    assert parse_printed("0.0000000021").significant_digits == 2
    assert parse_printed("4.85 × 10^8").significant_digits == 3
    assert parse_printed("0").significant_digits == 1
    assert parse_printed("0.6698").describe_precision() == "4 decimal places"
    assert parse_printed("0.5").describe_precision() == "1 decimal place"
    assert parse_printed("30").describe_precision() == "units"
    assert parse_printed("≈ 10^6").describe_precision() == "multiples of 1000000"


@pytest.mark.parametrize(("text", "message"), [
    ("", "holds no answer"),
    ("≈", "holds no answer"),
    ("= ", "holds no answer"),
    ("x" * (MAX_CLAIM_LENGTH + 1), "longer than"),
    ("__import__('os')", "cannot read claimed"),
    ("0,5", "cannot read claimed"),
    ("lambda: 1", "cannot read claimed"),
    ("1 +", "cannot read claimed"),
    ("10^10^10", "cannot read claimed"),
    ("sqrt(-1)", "cannot read claimed"),
])
def test_unreadable_claims_are_claim_errors(text: str, message: str) -> None:
    with pytest.raises(ClaimError, match="claimed") as info:
        parse_printed(text)
    assert message in str(info.value)
    assert isinstance(info.value, MhaSymbolicError) and isinstance(info.value, ValueError)


def test_non_string_claim_refused() -> None:
    with pytest.raises(ClaimError, match="must be a string"):
        parse_printed(0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["4 × 5 × 6 × 7 × 8", "3", "3 by 5", "", "(2, -4)"])
def test_bad_shapes(text: str) -> None:
    with pytest.raises(ClaimError):
        parse_printed(text, shape=True)


def test_printed_answer_is_frozen() -> None:
    p = parse_printed("0.5")
    assert isinstance(p, PrintedAnswer)
    with pytest.raises(AttributeError):
        p.value = F(1)  # type: ignore[misc]


# ---- regressions: e-notation, parenthesised answers, huge exponents (once misread or hung) --
@pytest.mark.parametrize(("text", "value", "unit"), [
    ("1.8e-2", F(18, 1000), F(1, 1000)),
    ("1.8E-2", F(18, 1000), F(1, 1000)),
    ("1.05e6", F(1050000), F(10000)),
])
def test_e_notation_is_a_rounded_decimal(text: str, value: Fraction, unit: Fraction) -> None:
    p = parse_printed(text)
    assert (p.kind, p.value, p.unit) == ("decimal", value, unit)


def test_parenthesised_decimal_is_a_decimal() -> None:
    p = parse_printed("(17.311)")
    assert (p.kind, p.value, p.unit) == ("decimal", F(17311, 1000), F(1, 1000))


@pytest.mark.parametrize("text", ["5 × 10^-999999999", "0.5 × 10^999999", "≈ 10^999999"])
def test_huge_exponent_refused(text: str) -> None:
    import signal

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(text)

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        with pytest.raises(ClaimError):
            p = parse_printed(text)
            if p.kind == "decimal":  # accepted: then its precision must be describable fast
                p.describe_precision()
                raise ClaimError("accepted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
