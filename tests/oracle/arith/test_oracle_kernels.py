"""The oracle's building blocks against exact arithmetic: error-free transformations
and double-double operations (mha_symbolic.oracle.arith.dd) against Fractions, the two
exponentials (oracle.expo) against Arb, their constants against Arb, the exact
slice products (oracle.exact_scores) against Fractions, the double-double scale
(oracle.conventions.dd_scale) against Arb and the vectorised rounding decision
(oracle.formats.decide_rounding) against the independent neighbour-search rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mha_symbolic.oracle.arith import constants as C
from mha_symbolic.oracle.arith import dd, expo
from mha_symbolic.oracle.arith.formats import decide_rounding, get_format
from mha_symbolic.oracle.arith.products import beta_for, exact_product, slice_rows
from mha_symbolic.oracle.conventions import dd_scale

flint = pytest.importorskip("flint")
arb = flint.arb

from oracle_reference import ref_round  # noqa: E402

F = Fraction
U2 = F(1, 2**106)


def _adversarial(rng: Any, n: int) -> np.ndarray[Any, Any]:
    """Doubles of all magnitudes (no overflow/underflow in products), with ties."""
    x = rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))
    x[: n // 8] = np.round(x[: n // 8])  # small integers
    x[n // 8: n // 4] = 1.0 + np.exp2(-rng.integers(1, 53, n // 4 - n // 8))  # 1 + 2**-k
    return x


def test_two_sum_and_two_prod_are_exact() -> None:
    rng = np.random.default_rng(0)
    a, b = _adversarial(rng, 2000), _adversarial(rng, 2000)[::-1].copy()
    s, e = dd.two_sum(a, b)
    p, f = dd.two_prod(a, b)
    for ai, bi, si, ei, pi, fi in zip(a, b, s, e, p, f, strict=True):
        assert F(ai) + F(bi) == F(si) + F(ei)
        assert F(ai) * F(bi) == F(pi) + F(fi)
        assert si == ai + bi and pi == ai * bi


def test_dd_mul_div_add_are_within_their_bounds() -> None:
    rng = np.random.default_rng(1)
    ah, al = dd.two_sum(_adversarial(rng, 1500), rng.standard_normal(1500) * 1e-17)
    bh, bl = dd.two_sum(np.abs(_adversarial(rng, 1500)) + 1e-3, rng.standard_normal(1500) * 1e-17)
    ph, pl = dd.dd_mul(ah, al, bh, bl)
    qh, ql = dd.dd_div(ah, al, bh, bl)
    mh, ml = dd.dd_mul_d(ah, al, bh)
    c = rng.standard_normal(1500) * 10
    sh, sl = dd.dd_add_d(ah, al, c)
    for i in range(1500):
        A, B = F(ah[i]) + F(al[i]), F(bh[i]) + F(bl[i])
        assert abs(A * B - F(ph[i]) - F(pl[i])) <= F(8.02) * U2 * abs(A * B)
        assert abs(A * F(bh[i]) - F(mh[i]) - F(ml[i])) <= F(4.02) * U2 * abs(A * F(bh[i]))
        assert abs(A / B - F(qh[i]) - F(ql[i])) <= F(2) ** -100 * abs(F(qh[i]))
        s_exact = A + F(c[i])
        bound = F(C.U) * (F(C.U) * abs(F(float(ah[i] + c[i]))) + abs(F(al[i])))
        assert abs(s_exact - F(sh[i]) - F(sl[i])) <= bound
        assert abs(pl[i]) <= C.U * abs(ph[i]) and abs(ql[i]) <= C.U * abs(qh[i])


def test_range_reduction_constants_agree_with_arb() -> None:
    with_prec = flint.ctx
    old = with_prec.prec
    with_prec.prec = 400
    try:
        ln2 = arb(2).log()
        for div, hi, lo, bits in ((128, C.LN2_128_HI, C.LN2_128_LO, 36),):
            assert F(hi).numerator.bit_length() <= bits  # N·HI exact for |N| < 2**17
            assert abs(ln2 / div - arb(hi) - arb(lo)) < arb(2) ** -100
        for x in (C.LN2_1024_A, C.LN2_1024_B):
            assert F(x).numerator.bit_length() <= 33  # N·A, N·B exact for |N| < 2**20
        rest = ln2 / 1024 - arb(C.LN2_1024_A) - arb(C.LN2_1024_B) - arb(C.LN2_1024_C)
        assert abs(rest) < arb(2) ** -130
        # RN of 128/ln2 and 1024/ln2 (used only to choose N; any rounding is proved safe)
        assert abs(arb(128) / ln2 - arb(C.INV_LN2_128)) < arb(2) ** -45
        assert abs(arb(1024) / ln2 - arb(C.INV_LN2_1024)) < arb(2) ** -42
        # the cut-off bounds: exp(-707) <= TINY1, exp(-599) <= TINY2
        assert arb(-707).exp() < arb(C.TINY1) and arb(-599).exp() < arb(C.TINY2)
        assert arb(C.EXP1_CUT).exp() > arb(2) ** -1022  # results stay normal
    finally:
        with_prec.prec = old


def _exp_points(rng: Any, cut: float, step: float) -> np.ndarray[Any, Any]:
    """Random points, the largest reduced arguments (t = (N + 1/2)·step), 0 and the cut."""
    t = np.concatenate([-rng.random(3000) * -cut, -rng.random(500) * 0.01,
                        -(rng.integers(0, int(-cut / step), 1500) + 0.5) * step,
                        [0.0, cut, cut + 1e-9, -1e-300, -step / 2]])
    return t[t >= cut]


def test_exp_double_is_within_its_proved_bound() -> None:
    rng = np.random.default_rng(2)
    t = _exp_points(rng, C.EXP1_CUT, math.log(2) / 128)
    got = expo.exp_double(t)
    ctx = flint.ctx
    old = ctx.prec
    ctx.prec = 200
    try:
        worst = arb(0)
        for ti, gi in zip(t.tolist(), got.tolist(), strict=True):
            ex = arb(ti).exp()
            worst = max(worst, abs(arb(gi) - ex) / ex, key=lambda z: float(z.upper()))
        assert worst < arb(C.RHO_EXP1)
    finally:
        ctx.prec = old
    assert expo.exp_double(np.array([0.0]))[0] == 1.0
    # masked keys (-inf) come back as exp~(-708), which the callers zero
    assert expo.exp_double(np.array([-np.inf]))[0] == expo.exp_double(np.array([C.EXP1_CUT]))[0]


def test_exp_dd_is_within_its_proved_bound() -> None:
    rng = np.random.default_rng(3)
    th = _exp_points(rng, C.EXP2_CUT, math.log(2) / 1024)
    tl = th * rng.uniform(-1, 1, th.size) * 2.0**-53
    th, tl = dd.two_sum(th, tl)
    tl[th == 0] = rng.uniform(-1, 1, int(np.sum(th == 0))) * 1e-20
    wh, wl = expo.exp_dd(th, tl)
    ctx = flint.ctx
    old = ctx.prec
    ctx.prec = 300
    try:
        for a, b, c, d_ in zip(th.tolist(), tl.tolist(), wh.tolist(), wl.tolist(), strict=True):
            ex = (arb(a) + arb(b)).exp()
            assert abs(arb(c) + arb(d_) - ex) < arb(C.RHO_EXP2) * ex, (a, b)
    finally:
        ctx.prec = old
    one = expo.exp_dd(np.array([0.0]), np.array([0.0]))
    assert one[0][0] == 1.0 and one[1][0] == 0.0


@pytest.mark.parametrize("d", [1, 7, 64, 100, 256])
def test_slices_are_exact_and_their_products_error_free(d: int) -> None:
    rng = np.random.default_rng(d)
    beta = beta_for(d)
    assert 2 * beta + math.ceil(math.log2(d)) <= 53
    x = rng.standard_normal((6, d)) * np.exp2(rng.integers(-30, 0, (6, d)))
    x[0] = 0.0
    x[1, :] = 2.0**-1074  # subnormals (aligned at the clamp)
    y = rng.standard_normal((5, d)).astype(np.float32).astype(np.float64) / 8
    xs = slice_rows(x, beta, 5)
    ys = slice_rows(y, beta, 5)
    for s_obj, src in ((xs, x), (ys, y)):
        total = sum(s_obj.parts)
        rem = src - total
        for i in range(src.shape[0]):
            for l_ in range(d):
                assert sum(F(p[i, l_]) for p in s_obj.parts) + F(rem[i, l_]) == F(src[i, l_])
            rn = math.sqrt(sum(float(F(rem[i, l_]) ** 2) for l_ in range(d)))
            assert rn <= s_obj.rem_norm[i] * (1 + 1e-12) + 1e-300
        for p, bnd in zip(s_obj.parts, s_obj.bounds, strict=True):
            assert np.all(np.abs(p) <= bnd[:, None])
    for p in xs.parts:  # every pair product is exact (BLAS, any order)
        for q_ in ys.parts:
            got = p @ q_.T
            for i in range(6):
                for j in range(5):
                    assert F(got[i, j]) == sum(F(a) * F(b) for a, b in zip(p[i], q_[j], strict=True))


def test_exact_product_bound_holds_against_fractions() -> None:
    rng = np.random.default_rng(5)
    d = 32
    a = rng.standard_normal((8, d)) * np.exp2(rng.integers(-45, 0, (8, d)))
    b = rng.standard_normal((9, d)) * np.exp2(rng.integers(-45, 0, (9, d)))
    a /= np.max(np.abs(a)) * 1.01
    b /= np.max(np.abs(b)) * 1.01
    beta = beta_for(d)
    for n_slices, prune in ((5, 112), (2, 112), (5, 40)):  # exact, truncated, pruned
        prod = exact_product(slice_rows(a, beta, n_slices), slice_rows(b, beta, n_slices), prune)
        err = prod.err()
        for i in range(8):
            for j in range(9):
                ex = sum(F(x) * F(y) for x, y in zip(a[i], b[j], strict=True))
                assert abs(ex - F(prod.hi[i, j]) - F(prod.lo[i, j])) <= F(err[i, j]), (n_slices, i, j)
        if n_slices == 5 and prune == 112:
            assert np.max(err) < 2.0**-95


@pytest.mark.parametrize("E", [1, 2, 3, 4, 5, 8, 63, 64, 100, 127, 4096, 10**6])
def test_dd_scale_is_within_rho_of_the_exact_scale(E: int) -> None:
    cs = dd_scale(None, E)
    ctx = flint.ctx
    old = ctx.prec
    ctx.prec = 400
    try:
        c = arb(E).rsqrt()
        approx = (arb(cs.hi) + arb(cs.lo)) * arb(2) ** cs.e
        assert abs(c - approx) <= arb(cs.rho) * arb(2) ** cs.e
        assert 1 <= abs(cs.hi) < 2 and cs.rho < 2.0**-100
    finally:
        ctx.prec = old
    f = dd_scale(Fraction(0.3), 5)
    assert (f.hi * 2.0**f.e, f.lo, f.rho) == (0.3, 0.0, 0.0)


@pytest.mark.parametrize("name", ["float64", "float32", "float16", "bfloat16"])
def test_decide_rounding_agrees_with_independent_rounding(name: str) -> None:
    fmt = get_format(name)
    rng = np.random.default_rng(6)
    n = 3000
    mf = rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))
    # intervals of all widths around values, near rounding boundaries, and around 0
    grid = np.where(np.isfinite(mf), mf, 1.0)
    spacing = np.abs(grid) * 2.0 ** (1 - fmt.p)
    mf[: n // 4] = grid[: n // 4] + spacing[: n // 4] * rng.uniform(-0.5, 0.5, n // 4)
    mf[n // 4: n // 3] = rng.standard_normal(n // 3 - n // 4) * 1e-30
    rf = mf * rng.uniform(-1, 1, n) * 2.0**-54
    rad = np.abs(mf) * np.exp2(-rng.integers(20, 110, n).astype(np.float64))
    rad[n // 4: n // 3] = 1e-29 * rng.random(n // 3 - n // 4)
    ok, val = decide_rounding(mf, rf, rad, fmt)
    assert ok.mean() > 0.3
    for i in np.flatnonzero(ok).tolist():
        centre = F(mf[i]) + F(rf[i])
        lo, hi = centre - F(rad[i]), centre + F(rad[i])
        want_lo, want_hi = ref_round(lo, name), ref_round(hi, name)
        for w in (want_lo, want_hi):
            assert val[i] == w and math.copysign(1, val[i]) == math.copysign(1, w), (i, name)


def test_decide_rounding_leaves_intervals_around_zero_undecided() -> None:
    fmt = get_format("float16")
    ok, val = decide_rounding(np.array([1e-30, 1e-30, -1e-30, 0.0]), np.zeros(4),
                              np.array([2e-30, 1e-31, 1e-31, 0.0]), fmt)
    assert ok.tolist() == [False, True, True, True]
    assert [math.copysign(1, v) for v in val[1:]] == [1.0, -1.0, 1.0]
