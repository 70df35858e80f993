"""The dtype level's stores as integer operations (testing/forward/_store_kernels.py)
against ``astype`` (ml_dtypes' bfloat16, numpy's float16): bit-identical on every
16-bit value's float32 neighbourhood (the value, ±1..3 ulp of float32, the midpoints
to the next 16-bit value and ±1 ulp around them: the ties), on random float32 inputs of
every magnitude, float32 subnormals, ±0, ±inf and NaNs (their payloads through the
``astype`` fallback of ``emulated._store_inplace``).  All 2^32 float32 inputs:
bench/store_exhaustive.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("numba")
from mha_symbolic.testing.forward import _store_kernels as sk
from mha_symbolic.testing.forward.emulated import _store_inplace

DTYPES = [("bfloat16", ml_dtypes.bfloat16, sk.bf16_inplace, 16),
          ("float16", np.float16, sk.f16_inplace, None)]


def _neighbourhoods(dt) -> np.ndarray:
    """float32 bit patterns around every 16-bit value of ``dt`` and its midpoints."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dt)
    f = h.astype(np.float32)
    f = f[np.isfinite(f)]
    up = np.nextafter(f.astype(dt), np.array(np.inf, dt)).astype(np.float32)
    lo = np.nextafter(f.astype(dt), np.array(-np.inf, dt)).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        mids = np.concatenate([(f.astype(np.float64) + up) / 2, (f.astype(np.float64) + lo) / 2])
    mids = mids[np.isfinite(mids)].astype(np.float32)   # exact: 16-bit midpoints fit float32
    base = np.concatenate([f, mids]).view(np.int32).astype(np.int64)
    out = [base + d for d in range(-3, 4)]
    allb = np.concatenate(out)
    allb = allb[(allb >= -(1 << 31)) & (allb < (1 << 31))]
    return allb.astype(np.int32).view(np.uint32)


def _check(kern, dt, u: np.ndarray) -> None:
    u = np.ascontiguousarray(u, np.uint32)
    f = u.view(np.float32)
    ref = f.astype(dt).astype(np.float32).view(np.uint32)
    mine = u.copy()
    nans = kern(mine)
    isnan = np.isnan(f)
    assert nans == int(isnan.sum())
    assert np.array_equal(mine[~isnan], ref[~isnan])
    assert np.array_equal(mine[isnan], u[isnan])        # NaNs untouched


@pytest.mark.parametrize("name,dt,kern,_", DTYPES, ids=[d[0] for d in DTYPES])
def test_every_16_bit_value_and_its_ties(name, dt, kern, _):
    u = _neighbourhoods(dt)
    assert u.size > 6 * (1 << 16)
    _check(kern, dt, u)


@pytest.mark.parametrize("name,dt,kern,_", DTYPES, ids=[d[0] for d in DTYPES])
def test_random_and_special_float32(name, dt, kern, _):
    rng = np.random.default_rng(7)
    u = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.996, 65520.0,
                        65536.0, 2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-126,
                        2.0**-149, -2.0**-149, 3.3895314e38, 3.4028235e38], np.float32)
    sub = rng.integers(0, 1 << 23, 1 << 14, dtype=np.uint64).astype(np.uint32)
    _check(kern, dt, np.concatenate([u, special.view(np.uint32), sub, sub | (1 << 31)]))
    # float16 subnormal / normal boundary region in full
    lo, hi = np.float32(2.0**-26).view(np.uint32), np.float32(2.0**-13).view(np.uint32)
    _check(kern, dt, np.arange(lo, hi, 7, dtype=np.uint32))


@pytest.mark.parametrize("dt", [ml_dtypes.bfloat16, np.float16])
def test_store_inplace_is_astype_round_trip_with_nan_payloads(dt):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((37, 129)) * 2.0 ** rng.integers(-30, 20, (37, 129))
         ).astype(np.float32)
    bits = a.view(np.uint32)
    bits[0, :5] = [0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF, 0xFF812345]  # NaNs
    a[1, :3] = [np.inf, -np.inf, 70000.0]
    with np.errstate(over="ignore", invalid="ignore"):
        ref = a.astype(dt).astype(np.float32)
    mine = _store_inplace(a.copy(), np.dtype(dt))
    assert mine.dtype == np.float32
    assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32))
