"""A kernel test suite at production size, run as users run it (issue 29).

    python bench/bench_suite300.py                      # 300 cases, 2 pytest-xdist workers
    python bench/bench_suite300.py --cases 20           # a subset; the total is extrapolated
    python bench/bench_suite300.py --cases 20 --side baseline

The suite is a pytest file written to a temporary folder: ``--cases`` tests at
(1, 16, 2048, 2048, 128), each with its own seed, half of them causal, the output a
bf16 torch SDPA (CPU) of bf16 inputs.  Each test is one line with the pytest plugin,
``attention_oracle.assert_close(out, q, k, v, is_causal=causal)`` (side ``ours``), or
what users write today, a float64 SDPA reference and ``torch.testing.assert_close``
(side ``baseline``; its mismatches are recorded, not failed).  The suite runs under
``pytest -n WORKERS`` (pytest-xdist) with one thread per worker (OMP/OpenBLAS/MKL and
``torch.set_num_threads``), so both sides use the same cores.  Printed: the wall time
of the pytest run (collection and worker start included), the CPU time of the
children, the load, and for a subset the extrapolation to 300 cases: the start-up
(a run of the same command that selects no test: interpreters, imports, collection)
plus (wall − start-up) × 300 / cases, stated as such.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SUITE = '''
import pytest
import torch

torch.set_num_threads(1)
SHAPE = {shape}
N = {cases}


def _case(i):
    B, H, L, S, E = SHAPE
    g = torch.Generator().manual_seed(1000 + i)
    q, k, v = (torch.randn(B, H, n, E, generator=g).to(torch.bfloat16) for n in (L, S, S))
    causal = i % 2 == 1
    with torch.no_grad():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out, q, k, v, causal


@pytest.mark.parametrize("i", range(N))
def test_ours(i, attention_oracle):
    out, q, k, v, causal = _case(i)
    attention_oracle.assert_close(out, q, k, v, is_causal=causal)


@pytest.mark.parametrize("i", range(N))
def test_baseline(i):
    out, q, k, v, causal = _case(i)
    with torch.no_grad():
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), is_causal=causal)
    try:
        torch.testing.assert_close(out, ref.to(out.dtype))
    except AssertionError:
        pass  # what the baseline would report is not the question here: its cost is
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--side", choices=["ours", "baseline", "both"], default="both")
    ap.add_argument("--shape", default="1,16,2048,2048,128")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    sides = ["baseline", "ours"] if args.side == "both" else [args.side]
    print(f"shape {shape}, {args.cases} cases, pytest -n {args.workers}, 1 thread per worker")
    with tempfile.TemporaryDirectory(prefix="suite300-") as tmp:
        path = Path(tmp) / "test_suite300.py"
        path.write_text(textwrap.dedent(_SUITE.format(shape=shape, cases=args.cases)))
        def pytest(select: str) -> tuple[subprocess.CompletedProcess[str], float, float]:
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                 str(args.workers), "-k", select, str(path)],
                cwd=tmp, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            return run, wall, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)

        _, start, _ = pytest("test_nothing_selected")
        print(f"start-up (no test selected): {start:.1f} s wall")
        print("| side | cases | passed | failed | wall s | children CPU s | "
              "extrapolated wall for 300 s | load before / after |")
        print("|---|---|---|---|---|---|---|---|")
        for side in sides:
            with open("/proc/loadavg") as fh:
                before = " ".join(fh.read().split()[:3])
            run, wall, cpu = pytest(f"test_{side}")
            with open("/proc/loadavg") as fh:
                after = " ".join(fh.read().split()[:3])
            tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-300:]
            passed = _count(tail, "passed")
            failed = _count(tail, "failed")
            print(f"| {side} | {args.cases} | {passed} | {failed} | {wall:.1f} | {cpu:.1f} | "
                  f"{start + max(wall - start, 0.0) * 300 / args.cases:.0f} | "
                  f"{before} / {after} |", flush=True)
            if run.returncode not in (0, 1):
                print(run.stdout[-2000:], run.stderr[-2000:])


def _count(line: str, word: str) -> int:
    parts = line.replace(",", " ").split()
    return next((int(parts[i - 1]) for i, w in enumerate(parts) if w == word and i > 0), 0)


if __name__ == "__main__":
    main()
