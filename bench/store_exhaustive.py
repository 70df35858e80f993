"""Every float32 input through the integer stores of testing/forward/_store_kernels.py
against ``astype`` (ml_dtypes' bfloat16, numpy's float16) and back: bit-identical on
every non-NaN input, NaN left untouched (issue 29, the dtype level's stores).

    PYTHONPATH=<tree> python bench/store_exhaustive.py [--chunk-log2 24]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from mha_symbolic.testing.forward import _store_kernels as sk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-log2", type=int, default=24)
    n = 1 << ap.parse_args().chunk_log2
    for name, dt, kern in (("bfloat16", ml_dtypes.bfloat16, sk.bf16_inplace),
                           ("float16", np.float16, sk.f16_inplace)):
        t0, bad, nans = time.time(), 0, 0
        for lo in range(0, 1 << 32, n):
            u = np.arange(lo, lo + n, dtype=np.uint64).astype(np.uint32)
            f = u.view(np.float32)
            ref = f.astype(dt).astype(np.float32).view(np.uint32)
            mine = u.copy()
            nans += kern(mine)
            isnan = np.isnan(f)
            bad += int(np.count_nonzero((mine != ref) & ~isnan))
            bad += int(np.count_nonzero((mine != u) & isnan))
        print(f"{name}: {1 << 32} float32 inputs, {nans} NaN left untouched, "
              f"{bad} differences from astype ({time.time() - t0:.0f} s)")
        assert bad == 0


if __name__ == "__main__":
    main()
