"""Cost per score of the fp32-rounded certified reference from L = 256 to 16384 (issue 29,
item 3: "within 1.3x across the range").

    python bench/bench_per_score.py [--max-len 16384] [--runs 3]

(1, 8, L, L, 64) float32 inputs (the shape of the issue's growth figures; ``--heads``):
``reference_attention(q, k, v)
.rounded("float32")``, and numpy float64 attention one head at a time (the same
max-shifted softmax as bench/bench_oracle.py; per head, so that L = 16384 fits in
memory) as the baseline of the same run.  One thread everywhere (set before numpy is
imported).  Printed per L: CPU and wall time per score (ns), min and median over
``--runs`` (``--runs`` + 2 at L <= 512, one run at L >= 8192), the oracle / numpy
ratio, and the oracle's cost per score relative to the smallest over all L (the
target: at most 1.3 everywhere).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_oracle import inputs, load, plain_attention, timed  # noqa: E402

from mha_symbolic.oracle import reference_attention  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--min-len", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--heads", type=int, default=8)
    args = ap.parse_args()
    q, k, v = inputs(1, 1, 8, 8, 64)
    reference_attention(q, k, v, progress=False).rounded("float32")  # warm-up
    print(f"load {load()}")
    print("| L | heads | scores | numpy ns/score CPU min/med | oracle r32 ns/score CPU min/med | "
          "wall min | / numpy | / best |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    L = args.min_len
    while args.max_len >= L:
        H = args.heads
        q, k, v = inputs(1, H, L, L, 64, seed=L)
        n = H * L * L
        runs = args.runs + 2 if L <= 512 else args.runs if L < 8192 else 1

        def numpy_side(q=q, k=k, v=v, H=H) -> None:
            for h in range(H):
                plain_attention(q[:, h], k[:, h], v[:, h])

        def oracle_side(q=q, k=k, v=v) -> None:
            reference_attention(q, k, v, progress=False).rounded("float32")

        base = timed(numpy_side, runs)
        ours = timed(oracle_side, runs)
        rows.append((L, H, n, base, ours))
        L *= 2
        del q, k, v
    best = min(o["cpu_min"] / n for _, _, n, _, o in rows)
    for L, H, n, base, ours in rows:
        ns = 1e9 / n
        print(f"| {L} | {H} | {n:,} | {base['cpu_min'] * ns:.1f} / {base['cpu_med'] * ns:.1f} | "
              f"{ours['cpu_min'] * ns:.1f} / {ours['cpu_med'] * ns:.1f} | "
              f"{ours['wall_min'] * ns:.1f} | {ours['cpu_min'] / base['cpu_min']:.2f}x | "
              f"{ours['cpu_min'] / n / best:.2f} |")
    print(f"load {load()}")
    np.seterr(all="ignore")


if __name__ == "__main__":
    main()
