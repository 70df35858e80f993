"""Issue 26: `mha-symbolic check` on authors' sources — statements found, judged, wrong,
not judged, and the wall time per file (in process, after a warm-up; and the whole command
in a fresh process: imports and SymPy's caches included).  Also a chapter: the seed page
repeated 5 times (warm: its repeats hit the caches, so this bounds the cost of reading).

    python bench/bench_sources.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FILES = ["examples/seed-page.md", "examples/authors/latex/attention.tex",
         "examples/authors/jupyter-book/intro.md", "examples/authors/jupyter-book/scaling.md",
         "examples/authors/quarto/softmax.qmd", "examples/authors/sphinx/attention.rst",
         "examples/authors/markdown/parameters.md", "examples/authors/markdown/flops.md",
         "examples/authors/notebook/attention.ipynb"]


def main() -> None:
    from mha_symbolic.textbook.sources import check_source

    check_source(ROOT / FILES[0])  # warm-up: imports, caches of SymPy and the grammar
    print(f"{'file':44s} {'stmts':>5s} {'judged':>6s} {'hold':>4s} {'wrong':>5s} "
          f"{'n.j.':>4s} {'n.j.%':>5s} {'claims':>6s} {'c.wrong':>7s} {'warm s':>7s} {'fresh s':>7s}")
    totals = [0] * 7
    for name in FILES:
        from mha_symbolic.exact.grammar import _parse

        _parse.cache_clear()
        t = time.perf_counter()
        report = check_source(ROOT / name)
        wall = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mha_symbolic", "check", name], cwd=ROOT,
                       capture_output=True, check=False)
        fresh = time.perf_counter() - t
        s = report.summary()
        row = [s["statements"], s["judged"], s["hold"], s["wrong"], s["not_judged"],
               s["claims"], s["claims_wrong"]]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        print(f"{name:44s} {row[0]:5d} {row[1]:6d} {row[2]:4d} {row[3]:5d} {row[4]:4d} "
              f"{100 * row[4] / max(row[0], 1):5.0f} {row[5]:6d} {row[6]:7d} {wall:7.3f} {fresh:7.3f}")
    print(f"{'total':44s} {totals[0]:5d} {totals[1]:6d} {totals[2]:4d} {totals[3]:5d} "
          f"{totals[4]:4d} {100 * totals[4] / max(totals[0], 1):5.0f} {totals[5]:6d} "
          f"{totals[6]:7d}")
    chapter = (ROOT / FILES[0]).read_text()
    text = "\n\n".join(chapter.replace("```{mha-check}", "```text") for _ in range(5))
    _parse.cache_clear()
    t = time.perf_counter()
    report = check_source(text=text, name="chapter.md")
    print(f"chapter (seed page x5, {len(text):,} characters, "
          f"{report.summary()['statements']} statements): {time.perf_counter() - t:.3f} s")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mha_symbolic", "check", FILES[0]], cwd=ROOT,
                   capture_output=True, check=False)
    print(f"mha-symbolic check {FILES[0]} in a fresh process: {time.perf_counter() - t:.3f} s")


if __name__ == "__main__":
    main()
