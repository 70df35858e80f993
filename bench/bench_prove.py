"""Time ``mha-symbolic prove``: wall and CPU time of the whole run, and the wall time
until the first theorem's row appears (issue 16: rows are streamed as theorems finish).

Usage (from the repository root)::

    python bench/bench_prove.py [--runs 3] [--root DIR]

``--root`` runs the command of another checkout (e.g. an older commit unpacked with
``git archive``), so that before/after are measured in the same session, alternately
if the script is started for each side in turn.  Each run is a fresh process with
``OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=MKL_NUM_THREADS=1``; CPU time is the child's
user + system time (``resource.getrusage``); the load average is printed beside.
Nothing here is asserted: the numbers go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_run(root: Path) -> tuple[float, float, float | None, int]:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mha_symbolic", "prove"], cwd=root,
                            stdout=subprocess.PIPE, text=True, env=env)
    first: float | None = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if first is None and line[:1].isdigit():  # a theorem's row ("1   uniform ...")
            first = time.perf_counter() - start
    code = proc.wait()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, first, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    walls, cpus, firsts = [], [], []
    for k in range(args.runs):
        load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() \
            else ["?"]
        wall, cpu, first, code = one_run(args.root)
        walls.append(wall)
        cpus.append(cpu)
        if first is not None:
            firsts.append(first)
        shown = f"{first:.2f} s" if first is not None else "-"
        print(f"run {k + 1}: wall {wall:.2f} s, CPU {cpu:.2f} s, first row after {shown}, "
              f"exit {code}, load {' '.join(load)}", flush=True)
    print(f"wall  min {min(walls):.2f} s  median {statistics.median(walls):.2f} s")
    print(f"CPU   min {min(cpus):.2f} s  median {statistics.median(cpus):.2f} s")
    if firsts:
        print(f"first row  min {min(firsts):.2f} s  median {statistics.median(firsts):.2f} s")


if __name__ == "__main__":
    main()
