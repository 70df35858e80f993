"""Tests of the shared LaTeX utilities (mha_symbolic/_latex.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_symbolic import _latex
from mha_symbolic._latex import (
    compile_tex,
    latex_escape,
    latex_text,
    pdflatex_path,
    standalone_document,
)
from mha_symbolic.errors import MhaSymbolicError

needs_pdflatex = pytest.mark.skipif(pdflatex_path() is None, reason="pdflatex is not installed")


def test_latex_escape_special_characters() -> None:
    assert latex_escape("a_b & 50% #1 {x} $y$") == r"a\_b \& 50\% \#1 \{x\} \$y\$"
    assert latex_escape("x ~ y ^ z \\") == (
        r"x \textasciitilde{} y \textasciicircum{} z \textbackslash{}")


def test_latex_escape_maps_the_unicode_the_library_prints() -> None:
    assert latex_escape("3 × 5 · 2 ≤ 4") == (
        r"3 \ensuremath{\times} 5 \ensuremath{\cdot} 2 \ensuremath{\le} 4")


def test_latex_text_keeps_inline_math_and_escapes_the_rest() -> None:
    assert latex_text("sum $w_j = 1$ for x_1") == r"sum $w_j = 1$ for x\_1"
    assert latex_text("costs $5") == r"costs \$5"  # an unmatched $ is plain text


def test_standalone_document_loads_only_amsmath_and_amssymb() -> None:
    doc = standalone_document("$x$", title="A & B")
    packages = [line for line in doc.splitlines() if line.startswith("\\usepackage")]
    assert packages == ["\\usepackage{amsmath}", "\\usepackage{amssymb}"]
    assert "\\title{A \\& B}" in doc
    assert doc.index("\\begin{document}") < doc.index("$x$") < doc.index("\\end{document}")


@needs_pdflatex
def test_compile_tex_makes_a_pdf(tmp_path: Path) -> None:
    tex = tmp_path / "ok.tex"
    tex.write_text(standalone_document(r"\[ \sum_{j=1}^{n} \frac{1}{n} = 1 \]", title="T"))
    pdf = compile_tex(tex, runs=1)
    assert pdf == tmp_path / "ok.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"


@needs_pdflatex
def test_compile_tex_reports_the_first_latex_error(tmp_path: Path) -> None:
    tex = tmp_path / "bad.tex"
    tex.write_text(standalone_document(r"\undefinedmacro", title="T"))
    with pytest.raises(MhaSymbolicError, match=r"pdflatex failed on bad\.tex .*Undefined "
                                               r"control sequence"):
        compile_tex(tex)


def test_compile_tex_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MhaSymbolicError, match="does not exist"):
        compile_tex(tmp_path / "missing.tex")


def test_compile_tex_without_pdflatex_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tex = tmp_path / "a.tex"
    tex.write_text("x")
    monkeypatch.setattr(_latex, "pdflatex_path", lambda: None)
    with pytest.raises(MhaSymbolicError, match="pdflatex is not on PATH: install"):
        compile_tex(tex)


def test_compile_tex_rejects_zero_runs(tmp_path: Path) -> None:
    with pytest.raises(MhaSymbolicError, match="runs=0"):
        compile_tex(tmp_path / "a.tex", runs=0)


def test_first_error_falls_back_to_the_log_tail() -> None:
    assert _latex._first_error("a\n\nb\nc\n") == "a / b / c"
    assert _latex._first_error("! Missing $ inserted.\n<inserted text>\nl.7 x_1") == (
        "Missing $ inserted. l.7 x_1")
