"""The tolerance rules of other projects' test suites, applied to the same outputs as
ours (bench_verdicts.py, device_sdpa.py).

torch5  PyTorch test_transformers: reference = MATH on inputs upcast (fp32 -> fp64,
        fp16/bf16 -> fp32), atol = 5·max(max|ref - lp|, default_atol), rtol likewise,
        lp = the same-dtype MATH run
flash2  FlashAttention's tests: max|out - ref| <= 2·max|lp - ref|, same ref and lp
"""

from __future__ import annotations

import numpy as np

DEFAULT_ATOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-3}
DEFAULT_RTOL = {"float32": 1.3e-6, "float16": 1e-3, "bfloat16": 1.6e-2}


def torch5(out: np.ndarray, ref: np.ndarray, lp: np.ndarray, dtype: str) -> bool:
    """PyTorch's rule: |out - ref| <= atol + rtol·|ref| elementwise (NaN where ref is
    NaN passes), atol and rtol 5 × the same-dtype MATH run's own deviation."""
    with np.errstate(invalid="ignore", divide="ignore"):
        atol = float(np.nanmax(np.abs(ref - lp), initial=0.0))
        rel = np.abs((ref - lp) / ref)
        rel = np.where(np.isnan(rel), DEFAULT_RTOL[dtype], rel)
        rtol = float(np.nanmax(rel, initial=0.0))
    atol = 5 * max(atol, DEFAULT_ATOL[dtype])
    rtol = 5 * max(rtol, DEFAULT_RTOL[dtype])
    if rtol > 1e30:
        rtol = DEFAULT_RTOL[dtype]
    with np.errstate(invalid="ignore"):
        ok = np.abs(out - ref) <= atol + rtol * np.abs(ref)
    return bool(np.all(ok | (np.isnan(out) & np.isnan(ref))))


def flash2(out: np.ndarray, ref: np.ndarray, lp: np.ndarray) -> bool:
    """FlashAttention's rule: max|out - ref| <= 2·max|lp - ref| (NaN pattern equal)."""
    if np.any(np.isnan(out) != np.isnan(ref)):
        return False
    with np.errstate(invalid="ignore"):
        a = float(np.nanmax(np.abs(out - ref), initial=0.0))
        b = float(np.nanmax(np.abs(lp - ref), initial=0.0))
    return a <= 2 * b
