"""The rounding-error model's building blocks (mha_symbolic/testing/tolerance.py).

Expected values come from independent methods: closed forms evaluated with mpmath
at 50 digits or exact Fractions, numpy's own ``spacing`` for ulps, brute-force
counts, and an exact attention computed here (Fraction scores, mpmath exp) against
which simulated kernels with explicit rounding errors of size u (random, or chosen
adversarially) are measured.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import mpmath
import numpy as np
import pytest

from mha_symbolic.errors import SpecError
from mha_symbolic.testing.tolerance import (
    FORMATS,
    KERNELS,
    error_model,
    format_of,
    gamma,
    gamma_tilde,
    hoeffding_bound,
    lambda_for,
    linear_error_bound,
    ulp,
    underflow_eta,
    unit_roundoff,
)

U = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
mpmath.mp.dps = 50


@pytest.mark.parametrize("name", list(U))
def test_unit_roundoff_is_half_an_ulp_of_one(name: str) -> None:
    assert unit_roundoff(FORMATS[name]) == U[name]


@pytest.mark.parametrize(("name", "eta"), [("float64", 2.0**-1075), ("float32", 2.0**-150),
                                          ("float16", 2.0**-25), ("bfloat16", 2.0**-134)])
def test_underflow_eta_is_half_the_smallest_subnormal(name: str, eta: float) -> None:
    assert underflow_eta(FORMATS[name]) == eta


def test_formats_are_the_oracles_formats() -> None:
    from mha_symbolic.oracle.arith import formats

    for name in ("float64", "float32", "float16", "bfloat16"):
        f, o = format_of(name), formats.FORMATS[name]
        assert isinstance(f, formats.FloatFormat)
        assert (f.name, f.p, f.emin, f.emax) == (o.name, o.p, o.emin, o.emax)
        assert formats.get_format(f) is f                 # accepted by the oracle as is
    assert format_of("bf16").u == 2.0**-8 and format_of(np.float16).eta == 2.0**-25
    assert format_of(ml_dtypes.bfloat16).p == 8
    with pytest.raises(SpecError, match="int32"):
        format_of(np.int32)


# ---------------------------------------------------------------------------------
# Building blocks against closed forms (mpmath, 50 digits)


@pytest.mark.parametrize(("n", "name"), [(1, "float32"), (64, "float32"), (128, "float16"),
                                         (300, "bfloat16"), (4096, "bfloat16")])
def test_gamma_is_the_exact_worst_case_of_n_roundings(n: int, name: str) -> None:
    u = mpmath.mpf(U[name])
    expected = (1 - u) ** (-n) - 1                        # max |Π(1+δ)^±1 − 1|
    assert float(gamma(n, U[name])) == pytest.approx(float(expected), rel=1e-12)
    if n * U[name] < 1:                                    # below Higham's γ_n
        assert float(gamma(n, U[name])) <= float(n * u / (1 - n * u))


def test_gamma_stays_finite_where_higham_gamma_is_infinite() -> None:
    # n u = 16 for bf16 with 4096 terms: nu/(1 − nu) is meaningless (negative/inf)
    g = float(gamma(4096, 2.0**-8))
    assert math.isfinite(g)
    assert g == pytest.approx(float((1 - mpmath.mpf(2) ** -8) ** -4096 - 1), rel=1e-12)
    assert math.isfinite(float(gamma(10**9, 2.0**-8)))   # saturates, never inf


@pytest.mark.parametrize(("n", "u", "lam"), [(128, 2.0**-24, 8.0), (4096, 2.0**-8, 9.0),
                                             (10, 2.0**-11, 6.5)])
def test_gamma_tilde_is_higham_and_marys_formula(n: int, u: float, lam: float) -> None:
    uu = mpmath.mpf(u)
    expected = mpmath.exp(lam * mpmath.sqrt(n) * uu + n * uu**2 / (1 - uu)) - 1
    assert float(gamma_tilde(n, u, lam)) == pytest.approx(float(expected), rel=1e-12)


@pytest.mark.parametrize(("p", "events", "u"), [(1e-9, 1e6, 0.0), (5e-10, 3e11, 2.0**-8)])
def test_lambda_for_inverts_the_union_bound(p: float, events: float, u: float) -> None:
    lam = lambda_for(p, events, u)
    # events · 2 exp(−λ²(1 − u)²/2) = p, evaluated independently
    total = events * 2 * mpmath.exp(-(mpmath.mpf(lam) * (1 - mpmath.mpf(u))) ** 2 / 2)
    assert float(total) == pytest.approx(p, rel=1e-9)


def test_lambda_for_refuses_a_probability_outside_0_1() -> None:
    with pytest.raises(SpecError, match="probability=0"):
        lambda_for(0.0, 10)


def test_hoeffding_bound_is_lambda_times_root_sum_of_squares() -> None:
    assert float(hoeffding_bound(9.0 + 16.0, 2.0)) == 10.0


# ---------------------------------------------------------------------------------
# The error model's options


def test_default_accumulation_is_float32_for_16_bit_outputs() -> None:
    assert error_model("bfloat16").acc.name == "float32"
    assert error_model("float16").acc.name == "float32"
    assert error_model("float32").acc.name == "float32"
    assert error_model("float64").acc.name == "float64"
    assert error_model("bfloat16", accumulation_dtype="same").acc.name == "bfloat16"
    assert error_model("float16", accumulation_dtype=np.float64).acc.name == "float64"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"accumulation_dtype": "int8"}, "accumulation_dtype='int8' is not a float format"),
    ({"kernel": "flash"}, "kernel='flash' is not a kernel model"),
    ({"kind": "loose"}, "error_model='loose' is not an error model"),
])
def test_bad_model_options_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        error_model("float32", **kwargs)  # type: ignore[arg-type]


def test_model_description_states_lambda_and_probability() -> None:
    m = error_model("bfloat16").with_events(1e4, 1e8)
    text = m.describe()
    assert "probabilistic" in text and "1e-9" in text and "kernel 'fused'" in text
    # λ for 3e4 Hoeffding events at 5e-10, by the closed form
    assert m.lam == pytest.approx(math.sqrt(2 * math.log(2 * 3e4 / 5e-10)), rel=1e-12)


# ---------------------------------------------------------------------------------
# ulp


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_ulp_agrees_with_numpy_spacing(dtype: type) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200) * 10.0 ** rng.integers(-6, 4, 200)).astype(dtype)
    x = np.concatenate([x, np.array([1.0, 0.5, 2.0 ** -20, 0.0], dtype=dtype)])
    fmt = format_of(dtype)
    expected = np.abs(np.spacing(np.abs(x))).astype(np.float64)
    assert np.array_equal(ulp(x.astype(np.float64), fmt), expected)


def test_ulp_of_bfloat16_by_hand() -> None:
    fmt = format_of("bfloat16")
    assert float(ulp(np.array(1.0), fmt)) == 2.0**-7
    assert float(ulp(np.array(3.0), fmt)) == 2.0**-6
    assert float(ulp(np.array(0.0), fmt)) == 2.0**-133      # smallest subnormal


def test_kernels_table_names_what_each_kernel_rounds() -> None:
    assert KERNELS["fused"].score_stores == 0 and not KERNELS["fused"].scaled_query
    assert KERNELS["eager"].score_stores == 2
    assert KERNELS["eager_scaled_query"].scaled_query


def test_linear_bound_covers_a_float32_product() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((7, 12)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    exact = np.array([[float(sum(Fraction(float(x[i, e])) * Fraction(float(w[o, e]))
                                 for e in range(12)) + Fraction(float(b[o])))
                       for o in range(7)] for i in range(5)])
    got = (x @ w.T + b).astype(np.float64)
    for kind in ("worst_case", "probabilistic"):
        m = error_model("float32", kind=kind).with_events(35, 35 * 13)
        bound = linear_error_bound(x.astype(np.float64), w.astype(np.float64),
                                   b.astype(np.float64), y=exact, model=m)
        assert np.all(np.abs(got - exact) <= bound)
        assert np.all(bound < 1e-4)


def test_flushed_subnormals_cost_the_smallest_normal_of_the_arithmetic() -> None:
    # flushing is a property of the arithmetic (the accumulation dtype); a conversion
    # into a narrower storage dtype keeps its subnormals
    m16 = error_model("float16", subnormals="flush")
    assert (m16.eta, m16.eta_a) == (2.0**-25, 2.0**-126)
    m32 = error_model("float32", subnormals="flush")
    assert (m32.eta, m32.eta_a) == (2.0**-126, 2.0**-126)
    keep = error_model("float32")
    assert (keep.eta, keep.eta_a) == (2.0**-150, 2.0**-150)
    assert "subnormals flushed" in m32.describe()
    with pytest.raises(SpecError, match="subnormals='ftz'"):
        error_model("float32", subnormals="ftz")
