"""Time of `mha-symbolic plot` (issue 16: figures at print size, fonts, SVG, --dpi).

Each command runs as a fresh process (`python -m mha_symbolic plot …`, so the
import of matplotlib and SymPy is included, as a user pays it); the script prints
min and median wall time and the children's CPU time over several runs, next to
the baseline `python -c pass` measured in the same run, and the load.

    python bench/bench_plot.py [--runs 5] [--pythonpath DIR]

``--pythonpath`` times another copy of the package (e.g. an older commit unpacked
with ``git archive``), so before/after are measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commands(out: Path) -> dict[str, list[str]]:
    seed = str(ROOT / "examples" / "seed.toml")
    return {
        "collapse --gap 20 -o c.png": ["plot", "collapse", "--gap", "20", "-o", str(out / "c.png")],
        "collapse --gap 32 (2 tokens from F-unscaled) -o c.pdf":
            ["plot", "collapse", "--file", seed, "--only", "F-unscaled", "-o",
             str(out / "c.pdf")],
        "heatmap --example G -o h.png": ["plot", "heatmap", "--file", seed, "--only", "G",
                                         "-o", str(out / "h.png")],
        "heatmap --example D -o h.pdf": ["plot", "heatmap", "--file", seed, "--only", "D",
                                         "-o", str(out / "h.pdf")],
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pythonpath", default=str(ROOT), help="the package copy to time")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": a.pythonpath, "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    print(f"package: {a.pythonpath}; load {Path('/proc/loadavg').read_text().split()[:3]}")
    with tempfile.TemporaryDirectory() as tmp:
        base = [timed([sys.executable, "-c", "pass"], env) for _ in range(a.runs)]
        print(f"{'python -c pass (baseline)':56s} wall min {min(w for w, _ in base):6.2f} s")
        for name, args in commands(Path(tmp)).items():
            runs = [timed([sys.executable, "-m", "mha_symbolic", *args], env)
                    for _ in range(a.runs)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            print(f"{name:56s} wall min {min(walls):6.2f} s, median "
                  f"{statistics.median(walls):6.2f} s; CPU median {statistics.median(cpus):6.2f} s")
    print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
