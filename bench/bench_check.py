"""End-to-end time of `mha-symbolic check` (issue 11 item 7, issue 14).

Targets: the seed page (`mha-symbolic check examples/seed.toml`) under 1 s wall on an idle
machine; an example of n = 64 tokens under 2 s; the whole book corpus (`check --example
books`, 151 claims) under 5 s.

Each command runs in a fresh interpreter several times; printed are the min and median
wall time and the min and median CPU time of the child (user + system, from
``resource.getrusage(RUSAGE_CHILDREN)``), with baselines measured in the same run:
``python -c pass`` and ``python -c "import sympy"`` (the import the checker cannot avoid
for claims with e, sqrt or exp).  Bytecode is written to a temporary PYTHONPYCACHEPREFIX
by one warm-up run, as an installed package has it.  ``--baseline-tree DIR`` times the seed and n = 64
commands with another source tree as well (for example ``/work/main`` before a change),
in the same run and with the same thread settings.  The load average is printed: on a
shared machine wall times vary; CPU times and same-run ratios are steadier.

    python bench/bench_check.py [--runs N] [--baseline-tree DIR]
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
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def n64_example(path: Path) -> None:
    """A 64-token worked example: integer queries and keys (d_k = 4), claims that hold,
    one a slip reproduces (the scale 1/d_k), and wrong ones no slip explains."""
    import random

    import mpmath

    rng = random.Random(1)
    n, d = 64, 4
    q = [[rng.randint(-3, 3) for _ in range(d)] for _ in range(n)]
    k = [[rng.randint(-3, 3) for _ in range(d)] for _ in range(n)]
    v = [[rng.randint(0, 9) for _ in range(2)] for _ in range(n)]

    def weight(scale: mpmath.mpf, i: int, j: int) -> mpmath.mpf:
        row = [sum(a * b for a, b in zip(q[i], k[t], strict=True)) * scale for t in range(n)]
        return mpmath.exp(row[j]) / mpmath.fsum(mpmath.exp(x) for x in row)

    mpmath.mp.dps = 30
    good = mpmath.nstr(weight(mpmath.mpf(1) / 2, 0, 0), 4, min_fixed=-10, max_fixed=10)
    slip = mpmath.nstr(weight(mpmath.mpf(1) / 4, 1, 2), 4, min_fixed=-10, max_fixed=10)
    claims = [("weight[1,1]", good), ("weight[2,3]", slip), ("weight[3,3]", "0.2"),
              ("head_output[5,1]", "4.5"), ("weight[10,10]", "0.01")]
    lines = ["[[example]]", "name = 'n64'", f"query = {q}", f"key = {k}", f"value = {v}"]
    for quantity, claimed in claims:
        lines += ["[[example.claim]]", f"quantity = '{quantity}'", f"claimed = '{claimed}'"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def measure(cmd: list[str], tree: Path, runs: int, ok: tuple[int, ...],
            pycache: Path) -> tuple[list[float], list[float]]:
    env = dict(os.environ, **THREADS)
    env["PYTHONPATH"] = str(tree)
    # bytecode as an installed package has it: written once (outside the trees), then reused
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        # cwd = the tree: `python -m` puts the working directory first on sys.path
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if proc.returncode not in ok:
            sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-tree", type=Path, default=None)
    args = ap.parse_args()
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="bench-check-"))
    n64 = work / "n64.toml"
    n64_example(n64)
    seed = str(ROOT / "examples" / "seed.toml")
    commands = [
        ("python -c pass (baseline)", [py, "-c", "pass"], (0,), None, False),
        ("python -c 'import sympy' (baseline)", [py, "-c", "import sympy"], (0,), None, False),
        ("mha-symbolic check examples/seed.toml", [py, "-m", "mha_symbolic", "check", seed], (1,),
         1.0, True),
        ("mha-symbolic check n64.toml (64 tokens)", [py, "-m", "mha_symbolic", "check", str(n64)],
         (1,), 2.0, True),
        ("mha-symbolic check --example books (151 claims)",
         [py, "-m", "mha_symbolic", "check", "--example", "books"], (1,), 5.0, False),
    ]
    print(f"{args.runs} runs each; python {sys.version.split()[0]}; threads 1; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    trees = [("this tree", ROOT)] + ([("baseline", args.baseline_tree)] if args.baseline_tree else [])
    for name, cmd, ok, target, compare in commands:
        for label, tree in trees:
            if label == "baseline" and not compare:
                continue
            measure(cmd, tree, 1, ok, work / "pycache")  # warm-up: writes the bytecode
            walls, cpus = measure(cmd, tree, args.runs, ok, work / "pycache")
            line = (f"{name + ('' if label == 'this tree' else ' [' + label + ']'):58s} "
                    f"wall min {min(walls):6.3f} s median {statistics.median(walls):6.3f} s   "
                    f"cpu min {min(cpus):6.3f} s median {statistics.median(cpus):6.3f} s")
            if target is not None:
                line += f"   {statistics.median(walls) / target:4.2f} of the {target:g} s target"
            print(line, flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
