"""Certified numbers: digits, roundings and floats checked against mpmath at 200 digits
(computed with mpmath's own functions, not through certify) and exact Fractions."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import pytest
import sympy as sp

from mha_symbolic.errors import MhaSymbolicError, ParseError, PrecisionError, SpecError
from mha_symbolic.exact.certified import CertifiedValue, certify, to_arb

# text for certify -> the same number computed by mpmath at 200 digits
_MP = mpmath.mp.clone()
_MP.dps = 200

REFERENCE = {
    "1 - e^(-32)": lambda m: 1 - m.exp(-32),
    "e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)": lambda m: m.exp(m.sqrt(2) / 2) / (m.exp(m.sqrt(2) / 2) + 1),
    "pi": lambda m: +m.pi,
    "sqrt(2)": lambda m: m.sqrt(2),
    "ln(2)": lambda m: m.log(2),
    "exp(-3)": lambda m: m.exp(-3),
    "-e^3": lambda m: -m.exp(3),
    "1000 pi": lambda m: 1000 * m.pi,
    "0.001 pi": lambda m: m.pi / 1000,
    "1/3": lambda m: m.mpf(1) / 3,
    "-22/7": lambda m: m.mpf(-22) / 7,
    "e^(-1000)": lambda m: m.exp(-1000),
    "2^(1/3)": lambda m: m.cbrt(2),
    "ln(10)/ln(2)": lambda m: m.log(10) / m.log(2),
}


def _ref(text: str) -> mpmath.mpf:
    return REFERENCE[text](_MP)


def _truncated_digits(x: mpmath.mpf, significant: int) -> str:
    """The leading digits of x by mpmath, cut toward zero, followed by '…'."""
    sign = "-" if x < 0 else ""
    ax = abs(x)
    k = int(_MP.floor(_MP.log10(ax)))
    places = max(significant - 1 - k, 0)
    n = int(_MP.floor(ax * _MP.mpf(10) ** places))
    digits = str(n).rjust(places + 1, "0")
    text = digits if places == 0 else f"{digits[:-places]}.{digits[-places:]}"
    return sign + text + "…"


@pytest.mark.parametrize("text", sorted(REFERENCE))
@pytest.mark.parametrize("significant", [1, 5, 20, 60])
def test_digits_agree_with_mpmath_at_200_digits(text: str, significant: int) -> None:
    assert certify(text).digits(significant) == _truncated_digits(_ref(text), significant)


def test_book_value_of_example_a() -> None:
    value = certify("e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)")
    assert value.round_places(4) == Fraction(6698, 10000)
    assert certify("1 - e^(-32)").digits(20) == "0.99999999999998733583…"


@pytest.mark.parametrize("text", sorted(REFERENCE))
@pytest.mark.parametrize("places", [0, 2, 4, 10])
def test_round_places_agrees_with_mpmath(text: str, places: int) -> None:
    x = _ref(text)
    scaled = x * _MP.mpf(10) ** places
    expected = Fraction(int(_MP.nint(scaled)), 10**places)  # no ties among these values
    assert certify(text).round_places(places) == expected


@pytest.mark.parametrize("text", sorted(REFERENCE))
def test_to_float_is_correctly_rounded(text: str) -> None:
    x = _ref(text)
    f = certify(text).to_float()
    err = abs(x - _MP.mpf(f))
    # closer (or as close) than both neighbouring doubles
    for neighbour in (math.nextafter(f, math.inf), math.nextafter(f, -math.inf)):
        assert err <= abs(x - _MP.mpf(neighbour))
    assert float(certify(text)) == f


@pytest.mark.parametrize("fraction", [
    Fraction(1, 3), Fraction(2, 3), Fraction(-1, 10), Fraction(10**30 + 1, 10**30),
    Fraction(1, 2**1074), Fraction(3, 2**1075), Fraction(2**53 + 1, 1),
])
def test_to_float_of_rationals_matches_python_fraction(fraction: Fraction) -> None:
    assert certify(fraction).to_float() == float(fraction)


def test_to_float_of_a_tiny_value_underflows_to_zero() -> None:
    assert certify("e^(-1000)").to_float() == 0.0
    assert certify("1e-400").to_float() == 0.0


def test_to_float_beyond_the_float_range_is_inf_or_a_library_error() -> None:
    for text in ("10^400", "e^1000"):
        try:
            f = certify(text).to_float()
        except MhaSymbolicError:
            continue
        assert f == math.inf  # IEEE round-to-nearest overflows to inf


# -- ties and exact rationals ------------------------------------------------------------

@pytest.mark.parametrize(("value", "places", "expected"), [
    ("1/8", 2, Fraction(12, 100)),  # 0.125: tie, to even -> 0.12
    ("3/8", 2, Fraction(38, 100)),  # 0.375: tie, to even -> 0.38
    ("5/8", 2, Fraction(62, 100)),
    ("-1/8", 2, Fraction(-12, 100)),
    ("0.5", 0, Fraction(0)),
    ("1.5", 0, Fraction(2)),
    ("2.5", 0, Fraction(2)),
    ("0.135", 2, Fraction(14, 100)),  # tie, 3 is odd -> up
    ("1/3", 2, Fraction(33, 100)),
])
def test_round_places_is_half_even_on_exact_ties(value: str, places: int,
                                                expected: Fraction) -> None:
    assert certify(value).round_places(places) == expected


def test_is_tie() -> None:
    assert certify("1/8").is_tie(2)
    assert certify("0.125").is_tie(2)
    assert not certify("0.125").is_tie(3)
    assert not certify("1/3").is_tie(2)
    assert not certify("pi").is_tie(2)


def test_round_significant_and_truncate() -> None:
    assert certify("0.0012345").round_significant(3) == Fraction(123, 100000)
    assert certify("0.00125").round_significant(2) == Fraction(12, 10000)  # tie -> even
    assert certify("1 - e^(-32)").round_significant(3) == Fraction(1)
    assert certify("-1/3").truncate_places(2) == Fraction(-33, 100)
    assert certify("-pi").truncate_places(2) == Fraction(-314, 100)
    assert certify("1234.5").round_places(-1) == Fraction(1230)


def test_terminating_decimals_print_in_full() -> None:
    assert certify("0.5").digits(20) == "0.5"
    assert certify("-0.125").digits(2) == "-0.125"
    assert certify("1/1024").digits(2) == "0.0009765625"
    assert certify(20).digits() == "20"
    assert certify(0).digits() == "0"


def test_exponent10_and_compare() -> None:
    assert certify("0.001").exponent10() == -3
    assert certify("1 - e^(-40)").exponent10() == -1
    assert certify("1000 pi").exponent10() == 3
    assert certify("pi").compare(Fraction(3)) == 1
    assert certify("pi").compare(Fraction(22, 7)) == -1
    assert certify("1/2").compare(Fraction(1, 2)) == 0
    with pytest.raises(PrecisionError):
        certify(0).exponent10()


# -- zero in disguise and the PrecisionError path -------------------------------------

@pytest.mark.parametrize("expr", [
    sp.log(6) - sp.log(2) - sp.log(3),
    sp.Mul(sp.sqrt(2) + 1, sp.sqrt(2) - 1, evaluate=False) - 1,
    sp.exp(sp.log(2), evaluate=False) - 2,
    "ln(6) - ln(2) - ln(3)",
    "(sqrt(2)+1)*(sqrt(2)-1) - 1",
])
def test_sign_of_an_exact_zero_in_disguise_is_zero(expr: object) -> None:
    assert certify(expr).sign() == 0


def test_rounding_a_disguised_rational_tie_is_right_or_refused() -> None:
    # (sqrt2+1)(sqrt2-1)/8 is exactly 1/8: a tie at 2 places. A guess would be wrong
    # half the time; the only acceptable answers are half-even 0.12 or PrecisionError.
    value = certify("(sqrt(2)+1)*(sqrt(2)-1)/8")
    try:
        rounded = value.round_places(2)
    except PrecisionError:
        return
    assert rounded == Fraction(12, 100)


def test_a_tie_in_disguise_is_decided_exactly() -> None:
    # 1/8 + (ln 6 - ln 2 - ln 3) is exactly 1/8: no precision separates it from 0.125,
    # so the identity is proved, and the tie goes to the even neighbour
    value = certify("1/8 + ln(6) - ln(2) - ln(3)")
    assert value.round_places(2) == Fraction(12, 100)
    assert value.is_tie(2)


def test_an_unprovable_tie_raises_precision_error() -> None:
    # the same identity spread over 300 distinct logarithms is too large to attempt
    import sympy as sp

    zero = sp.Add(*[sp.log(6 * k) - sp.log(2 * k) - sp.log(3) for k in range(1, 301)])
    value = certify(sp.Rational(1, 8) + zero)
    with pytest.raises(PrecisionError, match="could not decide"):
        value.round_places(2)


def test_astronomical_magnitudes_are_refused_not_expanded() -> None:
    import sympy as sp

    from mha_symbolic.errors import ParseError

    with pytest.raises(PrecisionError):  # built directly: the grammar refuses it earlier
        certify(sp.exp(sp.Integer(10) ** 10)).digits(5)
    with pytest.raises(ParseError, match="beyond"):
        certify("exp(10^10)")


def test_digits_of_a_large_value_are_certified_or_refused() -> None:
    try:
        text = certify("e^(10^4)").digits(5)
    except MhaSymbolicError:
        return
    # e^10000 = 8.8068...e4342
    assert text.startswith("88068")


# -- inputs -------------------------------------------------------------------------

def test_inputs_of_every_exact_kind() -> None:
    assert certify(Fraction(1, 3)).exact == Fraction(1, 3)
    assert certify(sp.Rational(1, 3)).exact == Fraction(1, 3)
    assert certify(7).exact == Fraction(7)
    assert certify("sqrt(2)").exact is None
    assert isinstance(certify("1/3"), CertifiedValue)


def test_sympy_float_is_refused() -> None:
    # SymPy evaluates functions of a Float to 15 digits (exp(Float(0.1)) is itself a
    # Float), so a Float inside a value cannot be trusted to be exact: refuse it.
    with pytest.raises(SpecError, match="Float"):
        certify(sp.Float(0.1))
    with pytest.raises(SpecError, match="Float"):
        certify(sp.exp(sp.Float("0.1")) + 1)


def test_python_float_is_refused_with_a_hint() -> None:
    with pytest.raises(SpecError, match="float"):
        certify(0.1)


@pytest.mark.parametrize("value", [sp.Symbol("x"), sp.I, sp.oo, sp.zoo, sp.nan, sp.sin(1)])
def test_values_outside_certified_arithmetic_are_refused(value: object) -> None:
    with pytest.raises(SpecError):
        certify(value).digits()


def test_bad_string_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        certify("abc")


@pytest.mark.parametrize("value", [None, [1], object()])
def test_non_numbers_are_refused_with_a_library_error(value: object) -> None:
    with pytest.raises(MhaSymbolicError):
        certify(value)


def _endpoint(x: object) -> mpmath.mpf:
    man, exp = x.man_exp()  # type: ignore[attr-defined]
    return _MP.mpf(int(man)) * _MP.mpf(2) ** int(exp)


@pytest.mark.parametrize("text", ["pi", "e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)", "ln(10)/ln(2)"])
def test_to_arb_encloses_the_value(text: str) -> None:
    import flint

    from mha_symbolic.exact.grammar import parse_number

    ball = to_arb(parse_number(text), 128)
    old = flint.ctx.prec
    flint.ctx.prec = 256  # lower()/upper() round outward to the context precision
    try:
        lo, hi = _endpoint(ball.lower()), _endpoint(ball.upper())
    finally:
        flint.ctx.prec = old
    x = _ref(text)
    assert lo <= x <= hi
    assert hi - lo < _MP.mpf(2) ** -100


def test_identity_search_never_runs_polynomial_gcds() -> None:
    # Found by the fuzzer: sympy.cancel() on this sum (weights of a 3-key row with
    # sqrt(2) scales) crashed the process with SIGFPE under python-flint ground types
    # and hangs under Python ones. The rational-in-disguise search must only expand.
    import sympy as sp

    R, s2, L2 = sp.Rational, sp.sqrt(2), sp.log(2)
    a = sp.exp(-1 - R(17, 50) * s2)
    b = sp.exp(-R(8295343, 2000000) * s2)
    c = sp.exp(-1 + s2 / 2 * (L2 / 1000 + R(9193023, 1000000)))
    expr = (-R(973, 1000) * a / (sp.exp(-R(7073, 500) * s2) + a)
            - R(1, 2) * b / (sp.exp(R(1, 2) - R(17287993, 125000) * s2) + b)
            - R(42, 125) * c / (sp.exp(s2 / 2 * (-R(8538327, 62500) - 50 * L2) - 1) + c))
    value = certify(expr)
    assert value.rational() is None
    assert value.sign() == -1


# -- issue 15: no unbounded SymPy question, ever --------------------------------------------


def _forbid_minimal_polynomial(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make SymPy's exponential fallback fail loudly if anything reaches it."""
    import importlib

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("minimal_polynomial was called")

    for name in ("sympy.polys.numberfields", "sympy.polys.numberfields.minpoly"):
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "minimal_polynomial", boom)
    monkeypatch.setattr(sp, "minimal_polynomial", boom)


def test_sign_of_a_zero_in_disguise_uses_no_sympy_assumption(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_minimal_polynomial(monkeypatch)
    a = sp.Mul(*[1 + sp.sqrt(p) for p in (2, 3, 5)], evaluate=False)
    b = sp.Add(*[sp.sqrt(k) for k in (1, 2, 3, 5, 6, 10, 15, 30)])
    zero = a - b  # (1+√2)(1+√3)(1+√5) expanded by hand: the 8 square roots
    assert certify(zero).sign() == 0
    assert certify(zero + sp.Rational(1, 10**40)).sign() == 1
    assert certify(zero - sp.Rational(1, 10**40)).sign() == -1


def test_expansion_terms_bounds_what_expand_produces() -> None:
    from mha_symbolic.exact.certified import expansion_terms

    x = sp.Mul(*[1 + sp.sqrt(p) for p in (2, 3, 5, 7)], evaluate=False)
    cases = [x, x**2, (1 + sp.sqrt(2) + sp.exp(3)) ** 3, sp.exp(x) * (2 + sp.sqrt(3))]
    for e in cases:
        # independent: the terms SymPy's expand really produces
        assert len(sp.Add.make_args(sp.expand(e))) <= expansion_terms(e)
    assert expansion_terms(x) == 16
    assert expansion_terms(sp.Pow(sp.Add(*[sp.sqrt(p) for p in (2, 3, 5)]), 10 ** 6,
                                  evaluate=False)) == 10**9  # capped, not computed


def test_an_identity_too_large_to_expand_is_undecided_not_guessed() -> None:
    from mha_symbolic.errors import PrecisionError

    binomials = [1 + sp.sqrt(p) for p in (5, 7, 11, 13, 17)]
    a = sp.Mul(*binomials, (1 + sp.sqrt(2)) * (1 + sp.sqrt(3)), evaluate=False)
    b = sp.Mul(*binomials, 1 + sp.sqrt(2) + sp.sqrt(3) + sp.sqrt(6), evaluate=False)
    z2 = sp.Pow(a - b, 2, evaluate=False) + sp.Rational(1, 2)  # exactly 1/2
    with pytest.raises(PrecisionError, match="could not decide"):
        certify(z2).compare(Fraction(1, 2))


@pytest.mark.parametrize("text", ["e^(sqrt(2)/2)/(1 + e^(sqrt(2)/2))", "1 - e^(-32)", "pi/4",
                                  "ln(2)^3", "sqrt(2)*1e-30", "-e^40"])
def test_digits_in_one_decision_agree_with_mpmath(text: str) -> None:
    import mpmath

    from mha_symbolic.exact.grammar import parse_number

    value = certify(text).digits(25)
    mpmath.mp.dps = 80
    # independent: mpmath at 80 digits, cut (not rounded) after 25 significant digits
    x = mpmath.mpf(sp.N(parse_number(text), 80))
    k = int(mpmath.floor(mpmath.log10(abs(x))))
    cut = mpmath.floor(abs(x) / mpmath.mpf(10) ** (k - 24))
    digits = mpmath.nstr(cut, 30).split(".")[0]
    assert value.rstrip("…").lstrip("-").replace(".", "").lstrip("0") == digits
    assert value.endswith("…") and value.startswith("-") == (x < 0)
