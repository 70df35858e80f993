"""Issue 25: the grown corpus and the planted-slip files, claim by claim, and the wall
time of `mha-symbolic check` on each corpus file (5 runs, min and median).

    PYTHONPATH=. python bench/bench_issue25.py
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [*sorted((ROOT / "examples" / "books").glob("*.toml")),
         ROOT / "tests" / "data" / "planted.toml", ROOT / "tests" / "data" / "planted-roots.toml"]


def main() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print("| file | claims | hold | wrong | diagnosed | ambiguous | unreadable "
          "| wall min / median (s) | CPU min (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = [0] * 6
    for f in FILES:
        walls, cpus, summary = [], [], {}
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "mha_symbolic", "check", str(f),
                                  "--format", "json"], capture_output=True, text=True, env=env,
                                 check=False)
            walls.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            summary = json.loads(out.stdout)["summary"]
        row = [summary["claims"], summary["hold"], summary["wrong"], summary["diagnosed"],
               summary.get("ambiguous", 0), summary["unreadable"]]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        print(f"| {f.relative_to(ROOT)} | " + " | ".join(map(str, row))
              + f" | {min(walls):.2f} / {statistics.median(walls):.2f} | {min(cpus):.2f} |")
    print("| **total** | " + " | ".join(f"**{t}**" for t in totals) + " | | |")


if __name__ == "__main__":
    main()
