"""End-to-end time of `mha-symbolic check examples/seed.toml` (issue 3: under 3 s).

Runs the CLI in a fresh interpreter several times and prints the median wall time,
next to the baseline `python -c pass` and `mha-symbolic --help` measured in the same
run, and the ratio to the 3 s target.

    python bench/bench_check.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 3.0


def wall(cmd: list[str], runs: int, ok_codes: tuple[int, ...]) -> list[float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode not in ok_codes:
            sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    runs = ap.parse_args().runs
    py = sys.executable
    seed = str(ROOT / "examples" / "seed.toml")
    commands = {
        "python -c pass (baseline)": ([py, "-c", "pass"], (0,)),
        "mha-symbolic --help": ([py, "-m", "mha_symbolic", "--help"], (0,)),
        # exit 1: the seed page has 3 wrong claims
        "mha-symbolic check examples/seed.toml": ([py, "-m", "mha_symbolic", "check", seed], (1,)),
        "mha-symbolic check examples/seed.toml --format json":
            ([py, "-m", "mha_symbolic", "check", seed, "--format", "json"], (1,)),
    }
    print(f"{runs} runs each; python {sys.version.split()[0]}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    base = None
    for name, (cmd, ok) in commands.items():
        t = wall(cmd, runs, ok)
        med = statistics.median(t)
        base = base if base is not None else med
        print(f"{name:55s} median {med:6.3f} s  (min {min(t):.3f}, max {max(t):.3f})  "
              f"{med / base:5.1f}x baseline  {med / TARGET_S:5.2f} of the {TARGET_S:g} s target")


if __name__ == "__main__":
    main()
