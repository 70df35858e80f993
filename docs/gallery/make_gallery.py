"""Regenerate docs/gallery/: the first pages of the seed derivation and of the proofs,
rendered to PNG, and the figures as PNG and SVG, so that anyone can see the output
without building it.

    python docs/gallery/make_gallery.py            # needs matplotlib, pdflatex, pdftoppm

It runs this checkout's CLI (``python -m mha_symbolic``, with the repository first on
the path):

* ``derive examples/seed.toml -o seed.tex --pdf --figures`` → the seed derivation PDF;
* ``prove --pdf proofs.pdf`` → the proofs PDF;
* ``pdftoppm -f 1 -l 1 -r 100`` → the first page of each as PNG (850 × 1100 px for a
  letter page; under 300 KB), and three more pages found by their text (``pdftotext``):
  Example A's softmax, Example G's heatmap page and Theorem 6;
* ``plot collapse --gap 20`` and ``plot heatmap`` (Examples D and G) → PNG (150 dpi)
  and SVG.

The PDFs themselves are built in a temporary folder and not kept (the derivation is
about 27 pages).  Prints each file written with its size; exits 1 if a step fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: Resolution of the rendered pages (dots per inch): readable, and small to commit.
PAGE_DPI = 100
#: Resolution of the figures' PNGs here (the CLI's default is 300, for print).
FIGURE_DPI = 150

FIGURES = {
    "softmax-collapse": ["plot", "collapse", "--gap", "20"],
    "softmax-collapse-gap32": ["plot", "collapse", "--file", "examples/seed.toml",
                               "--only", "F-unscaled"],
    "heatmap-example-d": ["plot", "heatmap", "--file", "examples/seed.toml", "--only", "D"],
    "heatmap-example-g": ["plot", "heatmap", "--file", "examples/seed.toml", "--only", "G"],
}


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def cli(*args: str, cwd: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mha_symbolic ARGS`` from this checkout."""
    cmd = [sys.executable, "-m", "mha_symbolic", *args]
    print("$ mha-symbolic " + " ".join(args), flush=True)
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=900, check=False)
    if check and done.returncode not in (0,):
        sys.exit(f"failed (exit {done.returncode}): {' '.join(args)}\n{done.stderr[-2000:]}")
    return done


def first_page(pdf: Path, png: Path, page: int = 1) -> None:
    """Render page ``page`` (default 1) of ``pdf`` to ``png`` with pdftoppm."""
    stem = png.with_suffix("")
    subprocess.run(["pdftoppm", "-f", str(page), "-l", str(page), "-r", str(PAGE_DPI),
                    "-png", "-singlefile", str(pdf), str(stem)], check=True, timeout=120)


def page_with(pdf: Path, line: str) -> int:
    """The first page of ``pdf`` with a line (as pdftotext reads it) starting ``line``."""
    k = 1
    while True:
        done = subprocess.run(["pdftotext", "-f", str(k), "-l", str(k), str(pdf), "-"],
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            sys.exit(f"no page of {pdf.name} has a line starting {line!r}")
        if any(x.startswith(line) for x in done.stdout.splitlines()):
            return k
        k += 1


#: Pages shown besides the first ones: (PDF, PNG name, a line that starts the page's
#: telling content): Example A's softmax (one notation for e^t), Example G's named
#: denominator and heatmap (keys named as the example names them), Theorem 6.
PAGES = (("seed", "seed-derivation-softmax.png", "3. Softmax, row by row"),
         ("seed", "seed-derivation-example-g.png", "cat"),
         ("proofs", "proofs-theorem-6.png", "Theorem 6."))


def seed_pdf(tmp: Path) -> Path:
    out = tmp / "seed" / "seed.tex"
    out.parent.mkdir()
    cli("derive", "examples/seed.toml", "-o", str(out), "--pdf", "--figures")
    return out.with_suffix(".pdf")


def proofs_pdf(tmp: Path) -> Path:
    """The proofs typeset by ``prove --pdf`` (pdflatex in the project's sandbox)."""
    folder = tmp / "proofs"
    folder.mkdir()
    pdf = folder / "proofs.pdf"
    cli("prove", "--pdf", str(pdf))
    if not pdf.is_file():
        sys.exit(f"prove --pdf wrote no {pdf.name}")
    return pdf


def figures() -> list[Path]:
    made = []
    for name, args in FIGURES.items():
        for suffix, extra in ((".png", ["--dpi", str(FIGURE_DPI)]), (".svg", [])):
            path = HERE / f"{name}{suffix}"
            cli(*args, "-o", str(path.relative_to(ROOT)), *extra)
            made.append(path)
    return made


def main() -> None:
    for tool in ("pdflatex", "pdftoppm", "pdftotext"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not on PATH: the gallery needs a TeX system and poppler-utils")
    made = figures()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        pdfs = {"seed": seed_pdf(tmp), "proofs": proofs_pdf(tmp)}
        for pdf, name in ((pdfs["seed"], "seed-derivation-page1.png"),
                          (pdfs["proofs"], "proofs-page1.png")):
            first_page(pdf, HERE / name)
            made.append(HERE / name)
        for key, name, line in PAGES:
            first_page(pdfs[key], HERE / name, page_with(pdfs[key], line))
            made.append(HERE / name)
    for path in made:
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
