"""Stores of float32 arrays to bfloat16 / float16 and back, in place, as integer
operations on the float32 bits (compiled with numba; imported only when it is
installed).  Round to nearest, ties to even, exactly as ``a.astype(dt).astype(float32)``
(ml_dtypes' bfloat16, numpy's float16): float32 subnormals, float16 subnormals and
overflow to ±inf included.  NaN elements are left untouched (their payload is the
caller's :func:`..emulated._store_f32` business: it redoes them with ``astype``);
the kernels return how many there were.  Checked on every float32 input
(bench/store_exhaustive.py) and in tests/testing/forward/test_store_bits.py."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

Array = np.ndarray[Any, Any]
njit = numba.njit(cache=True, nogil=True, error_model="numpy")


@njit
def bf16_inplace(u: Array) -> int:
    """``u``: the uint32 view of a contiguous float32 array; each element rounded to
    bfloat16 (8 significant bits; the same exponent range as float32)."""
    nan = 0
    for i in range(u.size):
        x = u[i]
        if (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            nan += 1
            continue
        x = x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))
        u[i] = x & np.uint32(0xFFFF0000)
    return nan


@njit
def f16_inplace(u: Array) -> int:
    """``u``: the uint32 view of a contiguous float32 array; each element rounded to
    float16 (11 significant bits, normal from 2^-14, subnormal steps of 2^-24, above
    65504 + 16 infinite)."""
    nan = 0
    for i in range(u.size):
        x = u[i]
        s = x & np.uint32(0x80000000)
        a = x & np.uint32(0x7FFFFFFF)
        if a > np.uint32(0x7F800000):
            nan += 1
            continue
        if a >= np.uint32(0x38800000):               # normal in float16 (or beyond)
            a = (a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) \
                & np.uint32(0xFFFFE000)
            if a >= np.uint32(0x47800000):           # 65536 and up: overflow
                a = np.uint32(0x7F800000)
        else:                                        # n · 2^-24, n = RNE(|x| · 2^24)
            e = a >> np.uint32(23)
            if e == 0:                               # float32 subnormal: below 2^-126
                a = np.uint32(0)
            else:
                m = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
                sh = np.uint32(126) - e              # |x| 2^24 = m 2^-sh, sh >= 14
                if sh >= np.uint32(25):
                    n = np.uint32(0)                 # below 2^-25: rounds to 0
                else:
                    n = m >> sh
                    rem = m & ((np.uint32(1) << sh) - np.uint32(1))
                    half = np.uint32(1) << (sh - np.uint32(1))
                    if rem > half or (rem == half and (n & np.uint32(1)) == 1):
                        n += np.uint32(1)
                if n == 0:
                    a = np.uint32(0)
                else:                                # n 2^-24 as float32 bits
                    k = np.uint32(0)
                    while (n >> (k + np.uint32(1))) != 0:
                        k += np.uint32(1)
                    a = ((k + np.uint32(103)) << np.uint32(23)) | (
                        (n << (np.uint32(23) - k)) & np.uint32(0x7FFFFF))
        u[i] = s | a
    return nan
