"""Issue 26: `mha-symbolic check` on authors' sources — statements found, judged, wrong,
not judged, and the wall time per file (in process, after a warm-up; and the whole command
in a fresh process: imports and SymPy's caches included).  Also a chapter: the seed page
repeated 5 times (warm: its repeats hit the caches, so this bounds the cost of reading).

    python bench/bench_sources.py
    python bench/bench_sources.py --real [--mirror /work/.mirror]

``--real`` measures the real sources of :data:`REAL` (third-party texts, never committed):
each file is read from a mirror of its repository at the commit named there
(``MIRROR/owner+name/repo``, a bare git directory, as ``fetch github:owner/name`` leaves
it) and written to a temporary folder, then checked; every wrong statement is listed.
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


#: (repository, commit, paths): the real sources measured (bench/RESULTS.md, "Issue 26: real
#: sources"; docs/books.md, "Real sources").
REAL = [
    ("jax-ml/scaling-book", "0819a7d8c55ddc113f5cba0285a5f97380cac1e3",
     ["transformers.md", "inference.md", "roofline.md", "applied-inference.md"]),
    ("wangywUST/wangywust.github.io", "e9dae7623c9fa5810cd28e2dc60ce90129a74545",
     ["CourseLLM2025/lecture_3.md", "CourseLLM2025/lecture_4.md", "CourseLLM2025/lecture_8.md",
      "CourseNLP2026/lecture_1.md", "CourseNLP2026/lecture_5.md",
      "CoursePR2026/lecture_1.md", "CoursePR2026/lecture_2.md", "CoursePR2026/lecture_3.md",
      "CoursePR2026/lecture_4.md"]
     + [f"CourseADSP2026/lecture_{i}.md" for i in range(1, 8)]),
    ("Roni6291/genai_learning_path", "5881277482386b506e2be48f01647d0cbc88374d",
     ["1.3-Transformer_Attention/q2_softmax_calculation.md",
      "1.3-Transformer_Attention/q8_attn_mat_properties.md"]),
    ("gwthomas/math4ml", "d8f8996c68aebea08f60796c974f92b747e3b2c0",
     ["cs189-linalg.tex", "cs189-probability.tex", "cs189-calculus-optimization.tex",
      "measure-probability.tex"]),
    ("rasbt/LLMs-from-scratch", "28c65cdfbc3338e2e040016eea4b7fdf556e4d57",
     ["ch03/01_main-chapter-code/ch03.ipynb", "ch04/01_main-chapter-code/ch04.ipynb"]),
    ("phlippe/uvadlc_notebooks", "0da8037c7abc32f478ff6142acceb72dbcf088ee",
     ["docs/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.ipynb",
      "docs/tutorial_notebooks/tutorial2/Introduction_to_PyTorch.ipynb"]),
    ("karpathy/nanoGPT", "3adf61e154c3fe3fca428ad6bc3818b27a3b8291",
     ["transformer_sizing.ipynb", "scaling_laws.ipynb"]),
    ("rsnemmen/toy-transformer", "9eeec76624135b86a5f9006627ed2f28736855af",
     ["attention.ipynb", "scaled-dot-p.ipynb"]),
]


def real(mirror: Path) -> None:
    import tempfile

    from mha_symbolic.exact.grammar import _parse
    from mha_symbolic.textbook.sources import check_source

    check_source(ROOT / FILES[0])  # warm-up
    wrong_lines: list[str] = []
    print(f"{'file':52s} {'kB':>5s} {'stmts':>5s} {'judged':>6s} {'hold':>4s} {'wrong':>5s} "
          f"{'n.j.%':>5s} {'warm s':>6s} {'cpu s':>5s} {'fresh s':>7s}")
    totals = [0, 0, 0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for repo, commit, paths in REAL:
            git = mirror / repo.replace("/", "+") / "repo"
            for path in paths:
                data = subprocess.run(["git", f"--git-dir={git}", "show", f"{commit}:{path}"],
                                      capture_output=True, check=True).stdout
                name = f"{repo.split('/')[1]}/{path}"
                local = Path(tmp) / path.replace("/", "--")
                local.write_bytes(data)
                _parse.cache_clear()
                t, c = time.perf_counter(), time.process_time()
                report = check_source(local, name=name)
                warm, cpu = time.perf_counter() - t, time.process_time() - c
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "mha_symbolic", "check", str(local), "-q"],
                               cwd=ROOT, capture_output=True, check=False)
                fresh = time.perf_counter() - t
                s = report.summary()
                row = [s["statements"], s["judged"], s["hold"], s["wrong"]]
                totals = [a + b for a, b in zip(totals, row, strict=True)]
                short = name if len(name) <= 52 else "…" + name[-51:]
                print(f"{short:52s} {len(data) / 1000:5.0f} {row[0]:5d} {row[1]:6d} {row[2]:4d} "
                      f"{row[3]:5d} {100 * s['not_judged'] / max(row[0], 1):5.0f} "
                      f"{warm:6.2f} {cpu:5.2f} {fresh:7.2f}")
                wrong_lines += [f"{name}:{r.line}: {' '.join(r.text.split())[:110]}"
                                for r in report.records if r.verdict == "wrong"]
    print(f"{'total':52s} {'':5s} {totals[0]:5d} {totals[1]:6d} {totals[2]:4d} {totals[3]:5d} "
          f"{100 * (totals[0] - totals[1]) / max(totals[0], 1):5.0f}")
    print("wrong statements:")
    for line in wrong_lines:
        print("  " + line)


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
    if "--real" in sys.argv:
        i = sys.argv.index("--mirror") if "--mirror" in sys.argv else -1
        real(Path(sys.argv[i + 1]) if i >= 0 else Path("/work/.mirror"))
    else:
        main()
