"""Start-up cost of the package and the CLI (issue 2: `--help` well under a second).

Prints the median wall time of each command over several runs, next to the
baseline `python -c pass` measured in the same run, and the ratio to the 1 s target.

    python bench/bench_startup.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 7
TARGET_S = 1.0

COMMANDS = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "import mha_symbolic": [sys.executable, "-c", "import mha_symbolic"],
    "mha-symbolic --help": [sys.executable, "-m", "mha_symbolic", "--help"],
    "mha-symbolic params --d-model 512 --heads 8 --no-bias":
        [sys.executable, "-m", "mha_symbolic", "params", "--d-model", "512", "--heads", "8",
         "--no-bias"],
}


def median_seconds(cmd: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    heavy = subprocess.run(
        [sys.executable, "-c",
         "import sys, mha_symbolic; print(sorted(m for m in ('sympy', 'mpmath', 'flint', 'numpy',"
         " 'torch', 'jax', 'matplotlib') if m in sys.modules))"],
        check=True, capture_output=True, text=True).stdout.strip()
    print(f"heavy modules loaded by `import mha_symbolic`: {heavy}")
    base = None
    for name, cmd in COMMANDS.items():
        t = median_seconds(cmd)
        base = base if base is not None else t
        print(f"{name:58s} median {t * 1000:7.1f} ms   {t / base:5.1f}x baseline   "
              f"{t / TARGET_S:5.2f} of the 1 s target")


if __name__ == "__main__":
    main()
