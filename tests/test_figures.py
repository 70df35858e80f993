"""Tests of mha_symbolic.textbook.figures: the softmax collapse curve and weight heatmaps.

Pixel sizes are read from the PNG header here (not through matplotlib); the
marked point's value is checked against the closed form computed with mpmath.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import mpmath
import pytest

from mha_symbolic.cli import main
from mha_symbolic.errors import MhaSymbolicError, OptionalDependencyError, SpecError
from mha_symbolic.exact.engine import exact_attention

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "seed.toml"
FIGURES = ROOT / "docs" / "figures"
# The commands that write docs/figures/ (the README lists them).
README_COMMANDS = {
    "softmax-collapse.png": ["plot", "collapse", "--gap", "20"],
    "heatmap-example-g.png": ["plot", "heatmap", "--file", "examples/seed.toml",
                              "--example", "G"],
}
# Sizes in pixels: 9 x 4 inches at 100 dpi; a 1 x 6 heatmap is max(6.4, 1.6 + 0.8*6) = 6.4
# by max(3.0, 1.6 + 0.5*1) = 3.0 inches.
SIZES = {"softmax-collapse.png": (900, 400), "heatmap-example-g.png": (640, 300)}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_missing_matplotlib_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    from mha_symbolic.textbook import figures

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(OptionalDependencyError, match=r"mha-symbolic\[plot\]"):
        figures.collapse_figure(tmp_path / "c.png")


def test_committed_readme_figures_have_their_sizes() -> None:
    for name, size in SIZES.items():
        path = FIGURES / name
        assert path.is_file(), f"missing {path}: run mha-symbolic {' '.join(README_COMMANDS[name])}"
        assert png_size(path) == size


def test_collapse_parameters_recognise_a_collapsed_row_only() -> None:
    from mha_symbolic.textbook.figures import collapse_parameters

    assert collapse_parameters(exact_attention(scores=[[0, 0, 20]])) == (3, 20)
    assert collapse_parameters(exact_attention(scores=[[40, 8]])) == (2, 32)
    # gap 4 with two tokens: w = 1/(1 + e^-4) = 0.982 < 0.999, not collapsed
    assert collapse_parameters(exact_attention(scores=[[-3, 1]])) is None
    assert collapse_parameters(exact_attention(scores=[[2, 2, 2]])) is None  # no gap
    assert collapse_parameters(exact_attention(scores=[[3, 1, 0]])) is None  # others differ


needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                               reason="matplotlib is an optional extra (mha-symbolic[plot])")


@needs_mpl
def test_readme_commands_produce_the_figures(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    for name, args in README_COMMANDS.items():
        out = tmp_path / name
        assert main([*args, "-o", str(out)]) == 0
        assert out.stat().st_size > 5000
        assert png_size(out) == SIZES[name]


@needs_mpl
def test_collapse_marks_the_gap_with_a_magenta_dot_at_the_exact_weight() -> None:
    from matplotlib.colors import to_hex

    from mha_symbolic.textbook.figures import MAGENTA, _collapse_plot

    fig = _collapse_plot(3, 20)
    left = fig.axes[0]
    dots = [ln for ln in left.get_lines() if to_hex(ln.get_color()) == MAGENTA]
    assert len(dots) == 1
    x, y = dots[0].get_xdata()[0], dots[0].get_ydata()[0]
    with mpmath.workdps(40):
        w = 1 / (1 + 2 * mpmath.e ** -20)  # e^20 / (e^20 + 2), by hand
    assert x == 20.0
    assert y == float(w)  # the correctly rounded float64 of the certified value
    texts = " ".join(t.get_text() for t in left.texts)
    assert "0.999999995877" in texts  # certified leading digits of w


@needs_mpl
def test_heatmap_size_follows_the_shape(tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import heatmap_figure

    att = exact_attention(scores=[[1, 2, 3, 4, 5], [0, 0, 0, 0, 0], [5, 4, 3, 2, 1]])
    out = heatmap_figure(att, tmp_path / "h.png")
    # max(6.4, 1.6 + 0.8*5) = 6.4 in, max(3.0, 1.6 + 0.5*3) = 3.1 in, at 100 dpi
    assert png_size(out) == (640, 310)


@needs_mpl
def test_heatmap_cells_show_correctly_rounded_weights() -> None:
    from mha_symbolic.textbook.figures import _heatmap_plot

    att = exact_attention(scores=[[2, 2, 2], [0, 0, 20]])
    fig = _heatmap_plot(att, 0, None, None, None)
    cells = [t.get_text() for t in fig.axes[0].texts]
    # row 1: 1/3 -> 0.333; row 2: 1/(2+e^20) -> 0.000, e^20/(2+e^20) -> 1.000
    assert cells == ["0.333", "0.333", "0.333", "0.000", "0.000", "1.000"]


@needs_mpl
def test_pdf_output_by_suffix(tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import collapse_figure

    out = collapse_figure(tmp_path / "c.pdf", n_tokens=2, gap="32")
    assert out.read_bytes()[:5] == b"%PDF-"


@pytest.mark.slow
@needs_mpl
def test_pgf_output_needs_pdflatex(tmp_path: Path) -> None:
    from mha_symbolic._latex import pdflatex_path
    from mha_symbolic.textbook.figures import collapse_figure

    if pdflatex_path() is None:
        with pytest.raises(MhaSymbolicError, match="pdflatex"):
            collapse_figure(tmp_path / "c.pgf")
        return
    out = collapse_figure(tmp_path / "c.pgf")
    assert "\\begin{pgfpicture}" in out.read_text()


@needs_mpl
def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import collapse_figure

    with pytest.raises(SpecError, match=r"suffix '\.svg'"):
        collapse_figure(tmp_path / "c.svg")
    with pytest.raises(SpecError, match="gap='-1' must lie between 0 and 1000"):
        collapse_figure(tmp_path / "c.png", gap="-1")
    with pytest.raises(SpecError, match="n_tokens=1 must be an integer >= 2"):
        collapse_figure(tmp_path / "c.png", n_tokens=1)
    with pytest.raises(MhaSymbolicError):
        collapse_figure(tmp_path / "c.png", gap="import os")
    assert not list(tmp_path.iterdir())


@needs_mpl
def test_cli_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", "pie", "-o", str(tmp_path / "p.png")]) == 2
    assert "KIND='pie' must be 'collapse' or 'heatmap'" in capsys.readouterr().err
    assert main(["plot", "heatmap", "-o", str(tmp_path / "p.png")]) == 2
    assert "needs --file" in capsys.readouterr().err
    assert main(["plot", "heatmap", "--file", str(SEED), "--example", "H",
                 "-o", str(tmp_path / "p.png")]) == 2
    assert "has no inputs" in capsys.readouterr().err
    assert main(["plot", "collapse", "--file", str(SEED), "--example", "G",
                 "-o", str(tmp_path / "p.png")]) == 2
    assert "collapse curve does not apply" in capsys.readouterr().err


@needs_mpl
def test_cli_collapse_reads_the_gap_from_an_example(tmp_path: Path) -> None:
    out = tmp_path / "d.png"
    assert main(["plot", "collapse", "--file", str(SEED), "--example", "D", "-o", str(out)]) == 0
    assert png_size(out) == (900, 400)


@needs_mpl
def test_derive_includes_figures_next_to_the_output(tmp_path: Path) -> None:
    out = tmp_path / "seed.tex"
    assert main(["derive", str(SEED), "--example", "D", "--example", "H", "-o", str(out),
                 "--figures"]) == 0
    tex = out.read_text()
    assert "\\usepackage{graphicx}" in tex
    assert "\\includegraphics[width=0.85\\linewidth]{seed-figures/D-weights.pdf}" in tex
    assert "{seed-figures/D-collapse.pdf}" in tex
    made = sorted(p.name for p in (tmp_path / "seed-figures").iterdir())
    assert made == ["D-collapse.pdf", "D-weights.pdf"]  # H has sizes only: no figure


@needs_mpl
def test_heatmap_labels_a_nan_row_under_the_nan_policy() -> None:
    from mha_symbolic.textbook.figures import _heatmap_plot

    att = exact_attention(scores=[[1, 2], [3, 3]], mask=[[False, False], [True, True]],
                          masked_rows="nan")
    cells = [t.get_text() for t in _heatmap_plot(att, 0, None, None, None).axes[0].texts]
    assert cells == ["NaN", "NaN", "0.500", "0.500"]  # equal scores 3, 3: 1/2 each
