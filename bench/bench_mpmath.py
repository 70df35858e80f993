"""What the mpmath views cost (issue 16).

    python bench/bench_mpmath.py [--repeats N]

CertifiedValue.mpf(dps) against digits(dps) of the same value (both certified, both
from a fresh value: no cached enclosure) and against mpmath's own uncertified
evaluation at dps digits; Enclosure.mpf(50) and .mpi() of a (1, 2, 8, 16) attention
output against its rounded("float64").  One thread; CPU (process_time) and wall time,
min and median of --repeats runs; /proc/loadavg printed beside.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import mpmath  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mha_symbolic import certify, reference_attention  # noqa: E402
from mha_symbolic.exact.certified import CertifiedValue  # noqa: E402

VALUES: dict[str, tuple[str, Callable[[], Any]]] = {
    "1 - e^-32": ("1 - e^(-32)", lambda: 1 - mpmath.exp(-32)),
    "softmax weight": ("e^(sqrt(2)/2)/(e^(sqrt(2)/2)+1)",
                       lambda: mpmath.exp(mpmath.sqrt(2) / 2)
                       / (mpmath.exp(mpmath.sqrt(2) / 2) + 1)),
}


def _time(fn: Callable[[], Any], repeats: int) -> tuple[float, float, float, float]:
    """(CPU min, CPU median, wall min, wall median) in milliseconds."""
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(1e3 * (time.process_time() - c0))
        wall.append(1e3 * (time.perf_counter() - w0))
    return min(cpu), statistics.median(cpu), min(wall), statistics.median(wall)


def _fresh(text: str) -> CertifiedValue:
    v = certify(text)
    return CertifiedValue(v.expr, v.exact)   # no cached enclosures


def _row(name: str, t: tuple[float, float, float, float], base: float | None) -> str:
    ratio = f"{t[1] / base:8.2f}" if base else "       –"
    return (f"| {name:<38} | {t[0]:9.2f} | {t[1]:9.2f} | {t[2]:9.2f} | {t[3]:9.2f} | "
            f"{ratio} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"load: {Path('/proc/loadavg').read_text().split()[:3]}")
    head = ("| what | CPU min ms | CPU median ms | wall min ms | wall median ms | "
            "CPU median ratio |\n|---|---|---|---|---|---|")
    print(head)
    for label, (text, mp_eval) in VALUES.items():
        for dps in (15, 50, 1000):
            base = _time(lambda t=text, d=dps: _fresh(t).digits(d), args.repeats)
            print(_row(f"{label}: digits({dps})", base, None))
            print(_row(f"{label}: mpf({dps})",
                       _time(lambda t=text, d=dps: _fresh(t).mpf(d), args.repeats), base[1]))

            def direct(d: int = dps, f: Callable[[], Any] = mp_eval) -> Any:
                with mpmath.workdps(d):
                    return f()

            print(_row(f"{label}: mpmath at {dps} digits", _time(direct, args.repeats),
                       base[1]))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 16)) for _ in range(3))
    encs = [reference_attention(q, k, v) for _ in range(3 * args.repeats)]
    it = iter(encs)
    base = _time(lambda: next(it).rounded("float64"), args.repeats)
    print(_row("(1,2,8,16) output: rounded('float64')", base, None))
    print(_row("(1,2,8,16) output: mpf(50)", _time(lambda: next(it).mpf(50), args.repeats),
               base[1]))
    print(_row("(1,2,8,16) output: mpi()", _time(lambda: next(it).mpi(), args.repeats),
               base[1]))


if __name__ == "__main__":
    main()
