"""The authors' examples of issue 26, each tested: the minimal LaTeX document (checked, and
compiled with its mha-check block hidden by mhacheck.sty when pdflatex is installed) and the
minimal Jupyter Book (its pages built by Sphinx + MyST with mha_symbolic.sphinx_ext: the
build passes as shipped and fails, at the page and line, on a wrong number)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mha_symbolic.textbook.sources import check_source

ROOT = Path(__file__).resolve().parents[3]
LATEX = ROOT / "examples" / "authors" / "latex"
BOOK = ROOT / "examples" / "authors" / "jupyter-book"


def test_latex_example_checks_clean_with_claims_at_the_statements() -> None:
    report = check_source(LATEX / "attention.tex")
    assert report.exit_status == 0
    lines = (LATEX / "attention.tex").read_text().split("\n")
    claims = [r for r in report.records if r.kind == "claim"]
    assert [r.claim.quantity for r in claims] == ["weight[1,1]", "weight[1,2]", "head_output[1]"]
    for r, needle in zip(claims, ("w_1 &=", "w_2 &=", "o = 0.8808"), strict=True):
        assert needle in lines[r.line - 1]


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
@pytest.mark.parametrize("option", ["", "[show]"])
def test_latex_example_compiles_with_the_block_hidden_or_shown(tmp_path: Path, option: str) -> None:
    shutil.copy(LATEX / "mhacheck.sty", tmp_path)
    text = (LATEX / "attention.tex").read_text().replace("\\usepackage{mhacheck}",
                                                         f"\\usepackage{option}{{mhacheck}}")
    (tmp_path / "attention.tex").write_text(text)
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                        "-no-shell-escape", "attention.tex"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:]
    assert (tmp_path / "attention.pdf").stat().st_size > 1000


def _sphinx_build(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", *extra, str(src),
                           str(out)], capture_output=True, text=True, env=env, timeout=300)


def _book(tmp_path: Path, conf: str = "") -> Path:
    """The book's pages with the conf.py that ``jupyter-book config sphinx`` writes for
    its _config.yml (the extension, MyST, the root page and its table of contents)."""
    src = tmp_path / "src"
    src.mkdir()
    for page in BOOK.glob("*.md"):
        shutil.copy(page, src)
    with (src / "intro.md").open("a") as f:
        f.write("\n```{toctree}\nscaling\n```\n")
    (src / "conf.py").write_text('extensions = ["myst_parser", "mha_symbolic.sphinx_ext"]\n'
                                 'root_doc = "intro"\n' + conf)
    return src


def test_book_config_names_the_extension() -> None:
    assert "mha_symbolic.sphinx_ext" in (BOOK / "_config.yml").read_text()


def test_book_builds_and_fails_on_a_wrong_number(tmp_path: Path) -> None:
    pytest.importorskip("sphinx", reason="sphinx is not installed")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed")
    src = _book(tmp_path)
    r = _sphinx_build(src, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "mha-check" not in r.stderr
    html = (tmp_path / "out" / "scaling.html").read_text()
    assert "[[example]]" not in html  # the block renders nothing
    page = src / "scaling.md"
    text = page.read_text()
    page.write_text(text.replace(r"\approx 0.9820", r"\approx 0.9821"))
    line = next(i for i, ln in enumerate(page.read_text().split("\n"), 1) if "0.9821" in ln)
    r = _sphinx_build(src, tmp_path / "out2")
    assert r.returncode == 1
    assert f"scaling.md:{line}: ERROR: mha-check: wrong" in r.stderr


def test_book_fails_on_an_unreadable_block_claim(tmp_path: Path) -> None:
    # a claim the verifier cannot read (head = 0) fails the build, as it exits 2 in the CLI
    pytest.importorskip("sphinx", reason="sphinx is not installed")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed")
    src = _book(tmp_path)
    page = src / "scaling.md"
    page.write_text(page.read_text().replace('statement = "w_1"', 'statement = "w_1"\nhead = 0'))
    r = _sphinx_build(src, tmp_path / "out")
    assert r.returncode == 1 and "ERROR: mha-check: unreadable" in r.stderr, r.stderr


def test_book_warns_for_not_judged_only_when_asked(tmp_path: Path) -> None:
    pytest.importorskip("sphinx", reason="sphinx is not installed")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed")
    src = _book(tmp_path, "mha_check_not_judged = True\n")
    r = _sphinx_build(src, tmp_path / "out")
    assert r.returncode == 0 and "mha-check: not judged" in r.stderr


# The bundled pages in authors' formats, with the slips planted in them by hand (listed in
# docs/author-sources.md): exactly these are wrong, nothing else (no false alarm).
CORPUS = {
    "examples/seed-page.md": [r"\frac{1}{2} \approx 0.707"],
    "examples/authors/latex/attention.tex": [],
    "examples/authors/jupyter-book/scaling.md": [],
    "examples/authors/jupyter-book/intro.md": [],
    "examples/authors/quarto/softmax.qmd": [],
    "examples/authors/sphinx/attention.rst": [],
    "examples/authors/markdown/parameters.md": [r"\frac{14175744}{2^{20}} \approx 13.51",
                                                r"\frac{1}{d_k} = 0.125"],
    "examples/authors/markdown/flops.md": [],
    "examples/authors/notebook/attention.ipynb": [],
}


@pytest.mark.parametrize("path", sorted(CORPUS))
def test_corpus_wrong_statements_are_exactly_the_planted_ones(path: str) -> None:
    report = check_source(ROOT / path)
    wrong = [r.text for r in report.records if r.kind == "statement" and r.verdict == "wrong"]
    assert wrong == CORPUS[path]
    assert not [r for r in report.records if r.verdict == "undecided"]


def test_planted_slips_are_diagnosed() -> None:
    report = check_source(ROOT / "examples/authors/markdown/parameters.md")
    diagnoses = [r.diagnosis or "" for r in report.records if r.verdict == "wrong"]
    assert "truncation" in diagnoses[0] and "√d_k" in diagnoses[1]
