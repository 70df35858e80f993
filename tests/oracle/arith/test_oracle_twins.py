"""The compiled kernels of the fp64-rounded backward's hot loops (issue 29 item 4) and
their numpy twins give bit-identical arrays: the slices of a matrix (slice_rows), the
weights P = w/D of tier 2 (weights_dd), the float64 rounding decision
(decide_rounding, through enclosure._decide) and the outward bounds of a double-double
(dd_enclosure), on random and edge values (signed zeros, subnormals, infinities, NaN)."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from mha_symbolic.oracle import enclosure
from mha_symbolic.oracle.arith import jit
from mha_symbolic.oracle.arith.formats import get_format
from mha_symbolic.oracle.arith.products import slice_rows
from mha_symbolic.oracle.forward.dd import weights_dd

Arr = np.ndarray[Any, Any]


def _both(monkeypatch: Any, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """fn() with numba's kernels, then with the numpy twins (MHA_SYMBOLIC_NUMBA=0)."""
    pytest.importorskip("numba")
    out = []
    for flag in ("1", "0"):
        monkeypatch.setenv("MHA_SYMBOLIC_NUMBA", flag)
        jit._kernels.cache_clear()
        try:
            with np.errstate(all="ignore"):
                out.append(fn())
        finally:
            monkeypatch.delenv("MHA_SYMBOLIC_NUMBA")
            jit._kernels.cache_clear()
    assert jit.numba_active()
    return out[0], out[1]


def _same(a: Arr, b: Arr) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        assert np.array_equal(nan, np.isnan(b))
        assert np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64))  # signs of 0
    else:
        assert np.array_equal(a, b)


def _values(rng: Any, shape: tuple[int, ...]) -> Arr:
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 4, shape))
    flat = x.reshape(-1)
    flat[::7] = -0.0
    flat[3::11] = 0.0
    flat[5::13] *= 2.0**-1000                 # tiny and subnormal entries
    return x


@pytest.mark.parametrize("beta", [21, 22, 26])
def test_slices_equal_their_twin(monkeypatch: Any, beta: int) -> None:
    rng = np.random.default_rng(beta)
    x = _values(rng, (37, 61))
    x[4] = 0.0
    x[6] = -0.0
    a = np.zeros(37, dtype=np.int64)          # |x| < 1: aligned at 2**0
    x = x / (np.max(np.abs(x)) * 2)

    def run() -> Any:
        s = slice_rows(x, beta, 5, a)
        return [*s.parts, s.rem_norm, s.norm, np.asarray(s.nonzero), np.asarray([s.zero_rem])]

    got, twin = _both(monkeypatch, run)
    assert len(got) == len(twin)
    for p, q in zip(got[:-4], twin[:-4], strict=True):
        # the same values; the signs of zero differ where an entry is -0.0: the numpy
        # loop slices it to -0.0, the kernel (as before issue 29's rewrite) leaves +0
        assert np.array_equal(p, q)
        assert np.array_equal(np.signbit(p) & (p == 0), np.signbit(q) & (q == 0) & (x != 0))
    for p, q in zip(got[-4:], twin[-4:], strict=True):
        _same(p, q)
    assert np.array_equal(sum(got[:-4]), x) or not got[-1][0]  # exact when no remainder


def test_transposed_operands_are_sliced_as_their_copies() -> None:
    # a transposed (F-ordered) matrix is sliced in place by its own kernel: the same
    # slices, bit for bit, as its C-ordered copy
    pytest.importorskip("numba")
    rng = np.random.default_rng(5)
    y = _values(rng, (53, 31))
    y = y / (np.max(np.abs(y)) * 2)
    x = y.T
    assert not x.flags.c_contiguous
    a = np.zeros(31, dtype=np.int64)
    got = slice_rows(x, 22, 5, a)
    ref = slice_rows(np.ascontiguousarray(x), 22, 5, a)
    assert len(got.parts) == len(ref.parts) and got.nonzero == ref.nonzero
    for p, q in zip([*got.parts, got.rem_norm], [*ref.parts, ref.rem_norm], strict=True):
        _same(np.ascontiguousarray(p), np.ascontiguousarray(q))
    assert got.zero_rem == ref.zero_rem


def test_weights_equal_their_twin(monkeypatch: Any) -> None:
    rng = np.random.default_rng(7)
    r, s = 29, 43
    wh = np.exp(-rng.random((r, s)) * 40)
    wl = wh * 2.0**-54 * rng.standard_normal((r, s))
    dh = wh.sum(axis=1)
    dl = dh * 2.0**-55
    ed = dh * 2.0**-90
    d_low = dh * (1 - 2.0**-50)
    tau = np.full(r, 2.0**-84)
    tau_d = tau * 1.5
    dh[3], d_low[3] = 0.0, 0.0                # a zero normaliser: inf/NaN rows
    dh[5] = np.nan
    tau_d[7] = 1.0                            # 1 - tau_d = 0
    na = rng.random((r, s)) < 0.25
    for notallowed in (None, na):
        got, twin = _both(monkeypatch, lambda na=notallowed: weights_dd(
            wh, wl, dh, dl, ed, d_low, tau, tau_d, na, None, None, np.ones(r, dtype=bool)))
        for name in ("hi", "lo", "err", "ok"):
            _same(getattr(got, name), getattr(twin, name))


@np.errstate(over="ignore", invalid="ignore")
def _intervals(rng: Any, n: int) -> tuple[Arr, Arr, Arr]:
    mf = rng.standard_normal(n) * np.exp2(rng.integers(-1074, 1000, n) * (rng.random(n) < 0.1))
    edge = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.0**-960, 2.0**-961,
            np.finfo(np.float64).max, -np.finfo(np.float64).max, 1.0, 2.0, 0.5, -1.0]
    mf[:len(edge)] = edge
    ulp = np.spacing(np.abs(np.where(np.isfinite(mf), mf, 1.0)))
    rf = rng.standard_normal(n) * ulp * rng.choice([0.0, 0.1, 0.49, 0.5, 0.51, 1.0], n)
    rad = np.abs(rng.standard_normal(n)) * ulp * rng.choice([0.0, 1e-3, 0.1, 0.5, 1e10], n)
    rf[20:60] = rng.choice([0.0, -0.0, 1e-320, np.nan, np.inf, -1e-300], 40)
    rad[20:60] = rng.choice([0.0, 1e-320, np.inf, np.nan, 1.0], 40)
    return mf, rf, rad


def test_float64_decision_equals_its_twin(monkeypatch: Any) -> None:
    mf, rf, rad = _intervals(np.random.default_rng(11), 20000)
    fmt = get_format("float64")
    got, twin = _both(monkeypatch, lambda: enclosure._decide(mf, rf, rad, fmt))
    for a, b in zip(got, twin, strict=True):
        _same(a, b)
    assert 0.2 < got[0].mean() < 0.9                  # both outcomes exercised
    got2, _ = _both(monkeypatch, lambda: enclosure._decide(
        mf.reshape(100, 200), rf.reshape(100, 200), rad.reshape(100, 200), fmt))
    _same(got2[0].reshape(-1), got[0])


def test_dd_enclosure_equals_its_twin(monkeypatch: Any) -> None:
    hi, lo, err = _intervals(np.random.default_rng(13), 20000)
    err = np.abs(err)
    got, twin = _both(monkeypatch, lambda: enclosure.dd_enclosure(hi, lo, err))
    for a, b in zip(got, twin, strict=True):
        _same(a, b)
    fin = np.isfinite(hi) & np.isfinite(lo) & np.isfinite(err)
    for i in np.flatnonzero(fin)[:300].tolist():     # outward, checked exactly
        mid = Fraction(hi[i]) + Fraction(lo[i])
        assert Fraction(got[0][i]) <= mid - Fraction(err[i]) or not np.isfinite(got[0][i])
        assert Fraction(got[1][i]) >= mid + Fraction(err[i]) or not np.isfinite(got[1][i])
