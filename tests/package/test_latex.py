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
    textbook_document,
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


def test_textbook_document_loads_booktabs_and_breaks_displays_only_between_equations() -> None:
    doc = textbook_document("$x$", title="A & B", packages=["graphicx"], intro="Intro.")
    packages = [line for line in doc.splitlines() if line.startswith("\\usepackage")]
    assert packages == ["\\usepackage{amsmath}", "\\usepackage{amssymb}",
                        "\\usepackage{booktabs}", "\\usepackage{graphicx}"]
    # a page may break between a display's equations (the derivation joins the rows of
    # one equation by \\*), so no unbreakable align* leaves a half-empty page
    assert "\\allowdisplaybreaks[1]" in doc and "\\raggedbottom" in doc
    assert "\\providecommand{\\needspace}" in doc
    assert "\\title{A \\& B}" in doc
    assert doc.index("\\maketitle") < doc.index("Intro.") < doc.index("$x$")


def test_textbook_document_refuses_a_package_that_is_not_a_name() -> None:
    with pytest.raises(MhaSymbolicError, match="not a LaTeX package name"):
        textbook_document("x", title="T", packages=["graphicx}\\input{/etc/passwd"])


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


# -- pdflatex in a sandbox (issue 15): a hostile document can read, write and run nothing ------


def _doc(body: str) -> str:
    return "\\documentclass{article}\n\\begin{document}\n" + body + "\nok\n\\end{document}\n"


@needs_pdflatex
@pytest.mark.parametrize("payload", [r"\input{/etc/passwd}", r"^^5cinput{/etc/passwd}",
                                     r"\input{../outside}", r"\openin1=/etc/passwd "
                                     r"\read1 to \x \x"])
def test_a_document_cannot_read_outside_its_folder(tmp_path: Path, payload: str) -> None:
    (tmp_path / "outside.tex").write_text("SECRET")
    sub = tmp_path / "doc"
    sub.mkdir()
    tex = sub / "d.tex"
    tex.write_text(_doc(payload))
    try:
        pdf = compile_tex(tex, runs=1, log_to=tmp_path / "d.log")
    except MhaSymbolicError:
        return  # refused: the file could not be opened
    # \openin of a refused file reads nothing (end of file): no system text in the log
    log = (tmp_path / "d.log").read_text(errors="replace")
    assert "root:" not in log and "SECRET" not in log
    assert pdf.read_bytes()[:5] == b"%PDF-"


@needs_pdflatex
def test_the_paranoid_setting_is_what_stops_the_read(tmp_path: Path) -> None:
    """Control: pdflatex with TeX Live's default openin_any reads /etc/passwd."""
    import os
    import subprocess

    if not Path("/etc/passwd").is_file():
        pytest.skip("no /etc/passwd")
    tex = tmp_path / "d.tex"
    tex.write_text(_doc(r"\input{/etc/passwd}"))
    env = {k: v for k, v in os.environ.items() if k != "openin_any"}
    proc = subprocess.run([_latex.pdflatex_path() or "pdflatex", "-interaction=nonstopmode",
                           "-no-shell-escape", "d.tex"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=120)
    log = (tmp_path / "d.log").read_text(errors="replace")
    assert "(/etc/passwd" in log or proc.returncode != 0  # read (or at least tried)
    with pytest.raises(MhaSymbolicError, match="passwd"):
        compile_tex(tex, runs=1)


@needs_pdflatex
def test_a_document_cannot_write_beside_itself_or_anywhere(tmp_path: Path) -> None:
    target = tmp_path / "abs-target.txt"
    tex = tmp_path / "d.tex"
    tex.write_text(_doc(r"\immediate\openout5=pwned.txt \immediate\write5{x}"
                        r"\immediate\closeout5"))
    compile_tex(tex, runs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pdf", "d.tex"]
    tex.write_text(_doc(rf"\immediate\openout5={target} \immediate\write5{{x}}"
                        r"\immediate\closeout5"))
    with pytest.raises(MhaSymbolicError):
        compile_tex(tex, runs=1)
    assert not target.exists()


@needs_pdflatex
def test_write18_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "shell-ran"
    tex = tmp_path / "d.tex"
    tex.write_text(_doc(rf"\immediate\write18{{touch {marker}}}"))
    compile_tex(tex, runs=1)
    assert not marker.exists()


def test_latex_escape_leaves_no_command_and_no_control_character() -> None:
    text = "\\input{x} ^^5c $y$ % # & _ ~ \x1b[31m \u202e"
    out = latex_escape(text)
    assert "\\input" not in out and "^^" not in out and "$y$" not in out
    assert "\x1b" not in out and "\u202e" not in out and "[U+001B]" in out
