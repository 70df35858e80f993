"""Throughput of the long fuzz harness, per kind (issue 30, ring 3).

    PYTHONPATH=. python bench/bench_fuzz_kinds.py [--n 30] [--seed 61]

For each kind of tests/fuzz/long.py: its first N inputs of ``--seed`` (drawn as a
``--only KIND`` run draws them), each made and run in this process as a worker runs it;
prints inputs per CPU second and per wall second, and the slowest input.  The first
input of each kind pays its imports; it is run once before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.fuzz import long as harness


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--seed", type=int, default=61)
    ap.add_argument("--kinds", default=",".join(k for k, _ in harness.KINDS))
    args = ap.parse_args()
    print("| kind | share | inputs | inputs / CPU s | inputs / wall s | slowest (CPU s) | "
          "problems |\n|---|---:|---:|---:|---:|---:|---:|")
    shares = dict(harness.KINDS)
    for kind in args.kinds.split(","):
        harness.ONLY = (kind,)
        n = args.n if kind not in ("signals", "concurrent", "cli-subprocess") else max(
            3, args.n // 6)
        kind0, payload0 = harness.make_input(args.seed, 10**6)  # warm-up: imports
        harness.run_input(kind0, payload0)
        cpu0, wall0, worst, probs = _cpu(), time.perf_counter(), 0.0, 0
        for i in range(n):
            c = _cpu()
            k, payload = harness.make_input(args.seed, i)
            problems, _ = harness.run_input(k, payload)
            probs += len(problems)
            worst = max(worst, _cpu() - c)
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
        print(f"| {kind} | {shares[kind] / 10:g} % | {n} | {n / cpu:.1f} | {n / wall:.1f} | "
              f"{worst:.2f} | {probs} |", flush=True)
    print(f"\nload average {os.getloadavg()}")


if __name__ == "__main__":
    main()
