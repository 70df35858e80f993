"""FlashAttention's chunked-attention limits (``hopper/mask.h``), one element at a time
in Python integers: the independent reference that tests/oracle/variants/test_chunk.py
and bench/bench_chunk.py judge ``attention_chunk`` against."""

from __future__ import annotations

import numpy as np


def fa_chunk_mask(L: int, S: int, c: int, causal: bool, off: int,
                  window: tuple[int, int] | None = None) -> np.ndarray:
    """(L, S) keys kept: ``col_limit_left = max(window's, round_down(i + off, c))``,
    ``col_limit_right = min(window's, that + c)`` (exclusive), causal ``j <= i + off``."""
    m = np.zeros((L, S), dtype=bool)
    for i in range(L):
        p = i + off
        lo = (p // c) * c                     # round_down, Python's floor for p < 0
        hi = lo + c                           # exclusive
        if causal:
            hi = min(hi, p + 1)
        if window is not None:
            left, right = window
            if left >= 0:
                lo = max(lo, p - left)
            if right >= 0:
                hi = min(hi, p + right + 1)
        for j in range(S):
            m[i, j] = lo <= j < hi
    return m
