"""Issue 30: the work of one worked-example file, bounded before it is done.

Builds, in a temporary folder: the slowest file the limits admit that we know of (as many
64-token examples of bench_check.py's kind, d_k = 4, entries -3…3, 5 claims each, as
MAX_FILE_WORK admits: 3 of about 310,000 terms), the issue's hostile file (375 such
examples, 990 KB) and the issue's 64 seeded draws of rand(256, 256); times
``mha-symbolic check`` (and ``derive`` for the admitted file) in a fresh interpreter,
printing min and median of CPU (user + system of the child) and wall seconds and the
child's peak RSS, with the load average.

    python bench/bench_file_work.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def n64_file(path: Path, examples: int, claims: int) -> None:
    lines = []
    for e in range(examples):
        rng = random.Random(e)
        q = [[rng.randint(-3, 3) for _ in range(4)] for _ in range(64)]
        k = [[rng.randint(-3, 3) for _ in range(4)] for _ in range(64)]
        v = [[rng.randint(0, 9) for _ in range(2)] for _ in range(64)]
        lines += ["[[example]]", f"name = 'n64-{e}'", f"query = {q}", f"key = {k}", f"value = {v}"]
        for c in range(claims):
            lines += ["[[example.claim]]", f"quantity = 'weight[{c + 1},1]'", "claimed = '0.01'"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def draws_file(path: Path) -> None:
    draws = ", ".join(f'"w_q[{h}] = rand(256, 256)"' for h in range(1, 65))
    path.write_text(f"[[example]]\nname = 'A'\nx = [[1, 2]]\n[example.init]\ntorch_seed = 1\n"
                    f"draws = [{draws}]\n", encoding="utf-8")


def timed(argv: list[str], cwd: Path) -> tuple[float, float, float, int]:
    """(CPU s, wall s, peak RSS MB, exit status) of one run in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mha_symbolic", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, after.ru_maxrss / 1024, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        n64_file(d / "admitted.toml", 3, 5)
        n64_file(d / "hostile.toml", 375, 1)
        draws_file(d / "draws.toml")
        cases = [("check admitted (3 x n64)", ["check", "admitted.toml"]),
                 ("derive admitted (3 x n64)", ["derive", "admitted.toml", "-o", "out.tex"]),
                 ("check hostile (375 x n64, 990 KB)", ["check", "hostile.toml"]),
                 ("check 64 draws of rand(256, 256)", ["check", "draws.toml"])]
        print(f"load average before: {os.getloadavg()}")
        for label, argv in cases:
            runs = [timed(argv, d) for _ in range(args.runs)]
            cpu = [r[0] for r in runs]
            wall = [r[1] for r in runs]
            print(f"{label}: exit {sorted({r[3] for r in runs})}, CPU min {min(cpu):.2f} s median "
                  f"{statistics.median(cpu):.2f} s, wall min {min(wall):.2f} s median "
                  f"{statistics.median(wall):.2f} s, peak RSS {max(r[2] for r in runs):.0f} MB")
        print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
