"""mpmath in and out: CertifiedValue.mpf/.mpi (exact/certified.py), Enclosure.mpf/.mpi
(oracle/mp.py), mpmath numbers and matrices as inputs of the oracle (oracle/inputs.py)
and of the exact engine (exact/engine.py).

Expected values come from mpmath itself at far higher precision (an evaluation
independent of python-flint's Arb and of SymPy), from exact Fractions, and from
numbers written by hand.  mpmath's own rounding to a precision (``+x`` inside
``workprec``) is round-to-nearest-even, the rounding the project promises.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp

from mha_symbolic import (
    InputValueError,
    SpecError,
    certify,
    exact_attention,
    reference_attention,
)
from mha_symbolic.exact.engine import exact_number
from mha_symbolic.oracle.inputs import as_exact_array

# (text for certify, the same value evaluated by mpmath in the current context)
VALUES = [
    ("1 - e^(-32)", lambda: 1 - mpmath.exp(-32)),
    ("e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)",
     lambda: mpmath.exp(mpmath.sqrt(2) / 2) / (mpmath.exp(mpmath.sqrt(2) / 2) + 1)),
    ("1/3", lambda: mpmath.mpf(1) / 3),
    ("ln(3)", lambda: mpmath.log(3)),
    ("-e^(-700)", lambda: -mpmath.exp(-700)),
    ("pi", lambda: +mpmath.pi),
]


def _rounded(f, dps: int) -> mpmath.mpf:
    """mpmath's value at dps + 80 digits, rounded to nearest at dps_to_prec(dps) bits."""
    with mpmath.workdps(dps + 80):
        x = f()
    with mpmath.workprec(mpmath.libmp.dps_to_prec(dps)):
        return +x


@pytest.mark.parametrize("dps", [5, 15, 30, 50])
@pytest.mark.parametrize(("text", "f"), VALUES, ids=[t for t, _ in VALUES])
def test_mpf_is_mpmaths_value_correctly_rounded(text, f, dps) -> None:
    got = certify(text).mpf(dps)
    assert isinstance(got, mpmath.mpf)
    assert got == _rounded(f, dps)
    assert got._mpf_[3] <= mpmath.libmp.dps_to_prec(dps)   # no more bits than asked


def test_mpf_of_1_minus_e_minus_32_at_50_digits_by_hand() -> None:
    # 1 - e^-32 = 0.999999999999987335834450905824276879095844034903617864166205…
    # (mpmath at 60 digits printed this): to 50 significant digits, rounded up
    got = certify("1 - e^(-32)").mpf(50)
    assert mpmath.nstr(got, 50) == "0.99999999999998733583445090582427687909584403490362"


def test_mpf_settles_exact_ties_to_even() -> None:
    # 1 + 2^-53 is half-way between 1 and 1 + 2^-52: to even, 1
    assert certify(Fraction(2**53 + 1, 2**53)).mpf(15) == 1
    # 1 + 3·2^-53 is half-way between 1 + 2^-52 and 1 + 2^-51: to even, 1 + 2^-51
    assert certify(Fraction(2**53 + 3, 2**53)).mpf(15) == mpmath.mpf(1) + mpmath.mpf(2) ** -51


def test_mpf_follows_mpmaths_precision_by_default() -> None:
    with mpmath.workdps(40):
        got = certify("1/3").mpf()
    assert got._mpf_[3] == mpmath.libmp.dps_to_prec(40)


@pytest.mark.parametrize("dps", [0, -3, 1.5, True, "15"])
def test_mpf_refuses_a_bad_dps(dps) -> None:
    with pytest.raises(SpecError, match=r"dps=.* must be an integer from 1 to 100000"):
        certify("1/3").mpf(dps)


@pytest.mark.parametrize(("text", "f"), VALUES, ids=[t for t, _ in VALUES])
def test_mpi_contains_the_value_and_is_a_few_ulps_wide(text, f) -> None:
    iv = certify(text).mpi()
    with mpmath.workdps(120):
        x = f()
    assert x in iv
    # endpoints rounded outward to iv.prec (53) bits from a tight ball: at most 2 ulps
    assert iv.b - iv.a <= 2 * mpmath.mpf(2) ** (mpmath.floor(mpmath.log(abs(x), 2)) - 52)


def test_mpi_of_an_exact_value_is_its_outward_rounding() -> None:
    lo, hi = (_fraction(e) for e in certify("1/3").mpi()._mpi_)
    # 1/3 lies strictly between two adjacent doubles: the interval is those two
    assert lo == Fraction(1 / 3) < Fraction(1, 3) < hi
    assert hi == Fraction(float(np.nextafter(1 / 3, 1.0)))
    assert certify("3/4").mpi() == mpmath.mpi(0.75, 0.75)


def _fraction(raw: tuple) -> Fraction:
    sign, man, exp, _ = raw
    x = Fraction(int(man)) * Fraction(2) ** int(exp)
    return -x if sign else x


# ---------------------------------------------------------------------------------
# The oracle's enclosures in mpmath, cross-checked against mpmath and the exact engine

Q = np.array([[[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]]])
K = np.array([[[1.0, 0.5], [-0.5, 2.0], [0.25, -1.0]]])


def _mp_softmax(q: np.ndarray, k: np.ndarray) -> list[list[mpmath.mpf]]:
    """softmax(q kᵀ / sqrt(d)) in mpmath, at the current precision."""
    d = q.shape[-1]
    rows = []
    for i in range(q.shape[0]):
        s = [mpmath.fsum(mpmath.mpf(float(q[i, t])) * mpmath.mpf(float(k[j, t]))
                         for t in range(d)) / mpmath.sqrt(d) for j in range(k.shape[0])]
        e = [mpmath.exp(x) for x in s]
        z = mpmath.fsum(e)
        rows.append([x / z for x in e])
    return rows


def test_enclosure_mpf_matches_mpmath_and_the_exact_engine_at_50_digits() -> None:
    # the output with V = I is the weights themselves
    v = np.eye(3)[None]
    enc = reference_attention(Q, K, v)
    got = enc.mpf(50)
    assert got.shape == enc.shape and got.dtype == object
    with mpmath.workdps(130):
        want = _mp_softmax(Q[0], K[0])
    exact = exact_attention(query=Q[0].tolist(), key=K[0].tolist(), value=np.eye(3).tolist())
    for i in range(3):
        for j in range(3):
            with mpmath.workprec(mpmath.libmp.dps_to_prec(50)):
                assert got[0, i, j] == +want[i][j]
            # the exact engine's certified digits agree with the mpf, digit for digit
            digits = certify(exact.weights()[i, j]).digits(40).rstrip("…")
            assert mpmath.nstr(want[i][j], 60).startswith(digits)
            assert enc.lower[0, i, j] <= got[0, i, j] <= enc.upper[0, i, j]


def test_enclosure_mpi_contains_mpmaths_value() -> None:
    enc = reference_attention(Q, K, np.eye(3)[None])
    ivs = enc.mpi()
    with mpmath.workdps(100):
        want = _mp_softmax(Q[0], K[0])
    for i in range(3):
        for j in range(3):
            assert want[i][j] in ivs[0, i, j]


def test_enclosure_mpf_of_exact_rows_and_nan_rows() -> None:
    q = np.zeros((1, 2, 2))
    mask = np.array([[True, True], [False, False]])
    enc = reference_attention(q, q, np.array([[[1.0, 2.0], [3.0, 4.0]]]), attn_mask=mask,
                              masked_rows="nan")
    got = enc.mpf(20)
    # row 0: uniform weights, exactly (1 + 3)/2 = 2 and (2 + 4)/2 = 3
    assert got[0, 0, 0] == 2 and got[0, 0, 1] == 3
    assert mpmath.isnan(got[0, 1, 0]) and mpmath.isnan(got[0, 1, 1])


# ---------------------------------------------------------------------------------
# mpmath numbers as the oracle's inputs


def test_oracle_reads_mpf_lists_and_matrices_exactly() -> None:
    as_floats = reference_attention(Q[0], K[0], K[0])
    mq = mpmath.matrix(Q[0].tolist())
    mk = [[mpmath.mpf(float(x)) for x in row] for row in K[0]]
    via_mp = reference_attention(mq, mk, np.array(mk, dtype=object))
    assert np.array_equal(via_mp.lower, as_floats.lower)
    assert np.array_equal(via_mp.upper, as_floats.upper)


def test_oracle_refuses_an_mpf_that_is_not_a_float64() -> None:
    with mpmath.workdps(30):
        third = mpmath.mpf(1) / 3
    with pytest.raises(InputValueError) as info:
        as_exact_array([[1.0, third]], "query")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("query[0, 1] = 0.33333333333333333333 (an mpf of ")
    assert "is not exactly a float64" in text


@pytest.mark.parametrize(("x", "want"), [
    (mpmath.mpi(1, 2), "query is an mpmath interval (ivmpf)"),
    ([[mpmath.mpf(1), mpmath.mpi(1, 2)]], "query[0, 1] is an mpmath interval (ivmpf)"),
    ([[mpmath.mpc(1, 1)]], "query[0, 0] is an mpmath mpc (complex)"),
])
def test_oracle_refuses_mpmath_intervals_and_complex_numbers(x, want) -> None:
    with pytest.raises(SpecError) as info:
        as_exact_array(x, "query")
    assert str(info.value).startswith(want) and "\n" not in str(info.value)


def test_oracle_still_refuses_fractions_in_one_line() -> None:
    with pytest.raises(SpecError, match=re.escape("query must hold numbers, got an array of "
                                                  "dtype=object")):
        as_exact_array([[Fraction(1, 3)]], "query")


# ---------------------------------------------------------------------------------
# mpmath numbers as the exact engine's inputs


def test_engine_reads_an_mpf_as_the_binary_value_it_holds() -> None:
    # a 53-bit mpf 1/3 is the double 1/3: Fraction(1/3) is its exact value
    with mpmath.workprec(53):
        third = mpmath.mpf(1) / 3
    assert exact_number(third) == sp.Rational(Fraction(1 / 3))
    with mpmath.workprec(200):
        third = mpmath.mpf(1) / 3
    # at 200 bits: the nearest multiple of 2^-201 (1/3 = 0.0101…₂, 200 bits from 2^-2)
    assert exact_number(third) == sp.Rational(round(Fraction(1, 3) * 2**201), 2**201)
    assert exact_number(mpmath.mpf("0.5")) == sp.Rational(1, 2)
    assert exact_number(-mpmath.mpf(2) ** -1100) == -sp.Rational(1, 2**1100)
    # unlike a Python float, not the decimal it prints as
    with mpmath.workprec(53):
        tenth = mpmath.mpf(0.1)
    assert exact_number(tenth) == sp.Rational(Fraction(0.1)) != sp.Rational(1, 10)


def test_engine_takes_mpmath_matrices() -> None:
    via_mp = exact_attention(query=mpmath.matrix([[1, 0], [0, 1]]),
                             key=mpmath.matrix([[1, 0], [0, 1]]),
                             value=mpmath.matrix([[2, 0], [0, 4]]))
    plain = exact_attention(query=[[1, 0], [0, 1]], key=[[1, 0], [0, 1]],
                            value=[[2, 0], [0, 4]])
    assert via_mp.weights() == plain.weights()
    assert via_mp.final() == plain.final()


@pytest.mark.parametrize(("x", "error", "want"), [
    (mpmath.mpc(1, 2), InputValueError, "q[0][0] is an mpmath mpc (complex)"),
    (mpmath.mpi(1, 2), SpecError, "q[0][0] is an mpmath ivmpf: expected one exact number"),
    (mpmath.mpf("inf"), InputValueError, "q[0][0]=+inf is not a finite number"),
    (mpmath.mpf("nan"), InputValueError, "q[0][0]=nan is not a finite number"),
])
def test_engine_refuses_complex_intervals_and_non_finite_mpmath_numbers(x, error, want) -> None:
    with pytest.raises(error) as info:
        exact_number(x, "q[0][0]")
    assert str(info.value).startswith(want)


def test_the_readme_shows_what_the_code_prints() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    with mpmath.workdps(30):
        v = certify("1 - e^(-32)")
        lines = [f"v                      # {v!r}",
                 f"v.mpf()                # {v.mpf()!r}  certified, correctly rounded",
                 f"1 - mpmath.exp(-32)    # {1 - mpmath.exp(-32)!r}  mpmath's own evaluation",
                 f"v.mpi()                # {v.mpi()}  an mpmath interval"]
    for line in lines:
        assert line in readme


def test_every_kind_of_enclosure_has_mpf_and_mpi_inside_its_bounds() -> None:
    from mha_symbolic import reference_attention_backward, reference_attention_varlen, reference_mha

    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 2, 3, 4)) for _ in range(4))
    x = rng.standard_normal((3, 1, 4))
    w = np.eye(4)
    xs = rng.standard_normal((3, 2, 4))
    encs = [reference_attention_backward(q, k, v, do).dq,
            reference_mha(x, x, x, num_heads=2, in_proj_weight=np.concatenate([w, w, w]),
                          out_proj_weight=w),
            reference_attention(q, k, v, sinks=np.zeros(2)),
            reference_attention_varlen(xs, xs, xs, [0, 1, 3], [0, 1, 3])]
    for enc in encs:
        got, ivs = enc.mpf(20), enc.mpi()
        lo, hi = np.asarray(enc.lower), np.asarray(enc.upper)
        assert got.shape == ivs.shape == lo.shape
        for idx in np.ndindex(*lo.shape):
            assert lo[idx] <= got[idx] <= hi[idx]
            assert got[idx] in ivs[idx]


def test_a_hostile_type_name_is_not_echoed_raw() -> None:
    bad = type("\x1b[31mEvil", (), {})()
    with pytest.raises(SpecError) as info:
        as_exact_array([[mpmath.mpf(1), bad]], "query")
    assert "\x1b" not in str(info.value)


def test_doctests_of_the_mpmath_module() -> None:
    import doctest

    from mha_symbolic.oracle import mp

    result = doctest.testmod(mp)
    assert result.failed == 0 and result.attempted > 0
