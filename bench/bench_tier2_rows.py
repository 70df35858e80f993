"""Tier 2 by rows against the sliced tier 2, per head (issue 11; docs/oracle.md §3.5a).

For a head of S keys (E = Ev) with float32-valued inputs, the time of tier 2 for r query
rows, each path including its per-head set-up (``KVrows`` or ``KVdd``): the row path
(compensated sums, ``dd_rows.tier2_rows``) and the sliced path (BLAS slices,
``dd_attention.tier2_block``).  One BLAS thread; CPU time (``time.process_time``) and
wall time, min and median of ``--runs``; the load average is printed.  The oracle takes
the row path for every tier-2 block of float32-valued inputs when numba is installed;
this table is why.

    python bench/bench_tier2_rows.py [--runs 7]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mha_symbolic.oracle.arith.jit import numba_active  # noqa: E402
from mha_symbolic.oracle.conventions import Block, dd_scale  # noqa: E402
from mha_symbolic.oracle.forward.dd import KVdd, tier2_block  # noqa: E402
from mha_symbolic.oracle.forward.rows import KVrows, tier2_rows  # noqa: E402


def timed(fn: Callable[[], Any], runs: int) -> tuple[list[float], list[float]]:
    fn()  # warm-up (compilation, caches)
    cpu, wall = [], []
    for _ in range(runs):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(f"## tier 2 per head: by rows vs sliced (numba kernels: {numba_active()})")
    print(f"load average before: {os.getloadavg()}\n")
    print("| S | E | rows | by rows cpu min / med (ms) | sliced cpu min / med (ms) | "
          "sliced ÷ rows (cpu min) | (wall min) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for S, E in ((256, 64), (1024, 64), (4096, 128)):
        k = rng.standard_normal((S, E)).astype(np.float32).astype(np.float64)
        v = rng.standard_normal((S, E)).astype(np.float32).astype(np.float64)
        cs = dd_scale(None, E)
        for r in (1, 4, 16, 64, 256):
            if S * r > 1 << 18:
                continue
            q = rng.standard_normal((r, E)).astype(np.float32).astype(np.float64)
            blk = Block(None, None, None, None)
            c_r, w_r = timed(lambda q=q, k=k, v=v, cs=cs, blk=blk: tier2_rows(
                q, KVrows(k, v), blk, cs), args.runs)
            c_s, w_s = timed(lambda q=q, k=k, v=v, cs=cs, blk=blk: tier2_block(
                q, None, None, KVdd(k, v), blk, cs), args.runs)
            print(f"| {S} | {E} | {r} | {1e3 * min(c_r):.2f} / {1e3 * statistics.median(c_r):.2f}"
                  f" | {1e3 * min(c_s):.2f} / {1e3 * statistics.median(c_s):.2f}"
                  f" | {min(c_s) / max(min(c_r), 1e-9):.2f}x | {min(w_s) / max(min(w_r), 1e-9):.2f}x |")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
