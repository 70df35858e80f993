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

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed.toml"
FIGURES = ROOT / "docs" / "figures"
# The commands that write docs/figures/ (the README lists them).
README_COMMANDS = {
    "softmax-collapse.png": ["plot", "collapse", "--gap", "20"],
    "heatmap-example-g.png": ["plot", "heatmap", "--file", "examples/seed.toml",
                              "--only", "G"],
}
# Sizes in pixels at the default 300 dpi: the collapse plot is 4.8 x 2.3 inches; a 1 x 6
# heatmap is 4.8 by max(1.6, 1.0 + 0.3*1) = 1.6 inches.
SIZES = {"softmax-collapse.png": (1440, 690), "heatmap-example-g.png": (1440, 480)}


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

    from mha_symbolic.textbook.figures import MAGENTA, _collapse_plot, _styled

    with _styled():
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
    assert "0.9999999958" in texts  # certified leading digits of w


@needs_mpl
def test_heatmap_size_follows_the_shape(tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import heatmap_figure

    att = exact_attention(scores=[[1, 2, 3, 4, 5], [0, 0, 0, 0, 0], [5, 4, 3, 2, 1]])
    out = heatmap_figure(att, tmp_path / "h.png")
    # 4.8 in wide, max(1.6, 1.0 + 0.3*3) = 1.9 in high, at 300 dpi
    assert png_size(out) == (1440, 570)
    big = exact_attention(scores=[[0] * 4] * 30)
    # 1.0 + 0.3*30 = 10 in is capped at 7 in; at 100 dpi
    assert png_size(heatmap_figure(big, tmp_path / "b.png", dpi=100)) == (480, 700)


@needs_mpl
def test_heatmap_cells_show_correctly_rounded_weights() -> None:
    from mha_symbolic.textbook.figures import _heatmap_plot, _styled

    att = exact_attention(scores=[[2, 2, 2], [0, 0, 20]])
    with _styled():
        fig = _heatmap_plot(att, 0, None, None, None)
    cells = [t.get_text() for t in fig.axes[0].texts]
    # row 1: 1/3 -> 0.333; row 2: 1/(2+e^20) = 1/485165197.4... = 2.0611...e-9 (by hand:
    # e^20 = 485165195.4098) -> 3 significant digits in scientific notation, not "0.000";
    # e^20/(2+e^20) = 0.99999999588 -> 1.000 (not exactly 1, so not "1")
    assert cells == ["0.333", "0.333", "0.333", r"$2.06\times10^{-9}$",
                     r"$2.06\times10^{-9}$", "1.000"]


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

    with pytest.raises(SpecError, match=r"suffix '\.jpg'"):
        collapse_figure(tmp_path / "c.jpg")
    with pytest.raises(SpecError, match="format=png does not match the suffix"):
        collapse_figure(tmp_path / "c.svg", format="png")
    with pytest.raises(SpecError, match="dpi=5000 must be an integer from 50 to 1200"):
        collapse_figure(tmp_path / "c.png", dpi=5000)
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
    assert main(["plot", "heatmap", "--file", str(SEED), "--only", "H",
                 "-o", str(tmp_path / "p.png")]) == 2
    assert "has no inputs" in capsys.readouterr().err
    assert main(["plot", "collapse", "--file", str(SEED), "--only", "G",
                 "-o", str(tmp_path / "p.png")]) == 2
    assert "collapse curve does not apply" in capsys.readouterr().err


@needs_mpl
def test_cli_collapse_reads_the_gap_from_an_example(tmp_path: Path) -> None:
    out = tmp_path / "d.png"
    assert main(["plot", "collapse", "--file", str(SEED), "--only", "D", "-o", str(out),
                 "--dpi", "100"]) == 0
    assert png_size(out) == (480, 230)  # 4.8 x 2.3 inches at 100 dpi


@needs_mpl
def test_derive_includes_figures_next_to_the_output(tmp_path: Path) -> None:
    out = tmp_path / "seed.tex"
    assert main(["derive", str(SEED), "--only", "D", "--only", "H", "-o", str(out),
                 "--figures"]) == 0
    tex = out.read_text()
    assert "\\usepackage{graphicx}" in tex
    assert "\\includegraphics[width=0.85\\linewidth]{seed-figures/D-weights.pdf}" in tex
    assert "{seed-figures/D-collapse.pdf}" in tex
    made = sorted(p.name for p in (tmp_path / "seed-figures").iterdir())
    assert made == ["D-collapse.pdf", "D-weights.pdf"]  # H has sizes only: no figure


@needs_mpl
def test_heatmap_labels_a_nan_row_under_the_nan_policy() -> None:
    from mha_symbolic.textbook.figures import _heatmap_plot, _styled

    att = exact_attention(scores=[[1, 2], [3, 3]], mask=[[False, False], [True, True]],
                          masked_rows="nan")
    with _styled():
        cells = [t.get_text() for t in _heatmap_plot(att, 0, None, None, None).axes[0].texts]
    assert cells == ["NaN", "NaN", "0.500", "0.500"]  # equal scores 3, 3: 1/2 each


def _texts(fig):  # every visible, non-empty text of a figure
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@needs_mpl
@pytest.mark.parametrize("kind", ["collapse", "heatmap"])
def test_figure_text_is_computer_modern_at_the_document_size(kind: str) -> None:
    from mha_symbolic.textbook.figures import _collapse_plot, _heatmap_plot, _styled

    with _styled():
        fig = (_collapse_plot(3, 20) if kind == "collapse" else
               _heatmap_plot(exact_attention(scores=[[0, 0, 20], [1, 2, 3]]), 0, "Example",
                             None, None))
        texts = _texts(fig)
        assert len(texts) >= 8
        for t in texts:
            # the serif text font is cmr10 and math is set in mathtext's Computer Modern
            assert t.get_fontname() == "cmr10", t.get_text()
            assert t.get_fontproperties().get_math_fontfamily() == "cm", t.get_text()
            assert 5 <= t.get_fontsize() <= 10, (t.get_text(), t.get_fontsize())
        ax = fig.axes[0]
        for t in (ax.title, ax.xaxis.label, ax.yaxis.label):
            assert t.get_fontsize() == 10  # the document's 10 pt at the printed width
        for t in ax.get_xticklabels():
            assert t.get_fontsize() == 9
    width, _ = fig.get_size_inches()
    assert width == 4.8  # drawn at the width it is printed at: no scaling in the document


@needs_mpl
def test_small_cell_values_are_written_in_scientific_notation() -> None:
    import sympy as sp

    from mha_symbolic.exact.certified import certify
    from mha_symbolic.textbook.figures import _cell_text

    cases = {  # expected strings written by hand
        sp.Rational(1, 3): "0.333",
        sp.Rational(6, 10000): "0.001",  # rounds to 0.001 at 3 places: not scientific
        sp.Rational(5, 10000): r"$5\times10^{-4}$",  # 0.0005 rounds (half even) to 0.000
        sp.Rational(4, 10**13): r"$4\times10^{-13}$",
        1 / (1 + sp.exp(32)): r"$1.27\times10^{-14}$",  # 1.2664165549e-14 by hand
        sp.Integer(0): "0",  # a masked weight: exactly zero
        sp.Integer(1): "1",  # a one-hot row: exactly one
        1 / (1 + sp.exp(-20)): "1.000",  # 0.999999997938...: not exactly one
    }
    assert {k: _cell_text(certify(k)) for k in cases} == cases
    assert _cell_text(None) == "NaN"


@needs_mpl
@pytest.mark.parametrize(("n_tokens", "gap", "label"), [
    (2, 32, "$1 - w_{\\mathrm{top}}$\n$\\approx 1.27\\times10^{-14}$"),  # 1/(1+e^32), by hand
    (3, 20, "$1 - w_{\\mathrm{top}}$\n$\\approx 4.12\\times10^{-9}$"),  # 2/(2+e^20) = 4.1223e-9
    (8, 0, "$1 - w_{\\mathrm{top}}$\n$\\approx 0.875$"),  # 7/8: no exponent for 0.875
    (2, 1000, None),
])
def test_collapse_labels_lie_where_no_curve_runs(n_tokens: int, gap: int, label: str | None) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.text import Text

    from mha_symbolic.textbook.figures import BLUE, _collapse_plot, _styled

    with _styled():
        fig = _collapse_plot(n_tokens, gap)
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            curves = [ln for ln in ax.get_lines() if isinstance(ln, Line2D)
                      and ln.get_color() == BLUE]
            assert len(curves) == 1
            (curve,) = curves
            path = curve.get_transform().transform_path(curve.get_path())  # display coords
            # clear of the spines by 4 points at least: a label touching the y axis ran
            # into its tick labels (issue 27 item 6, "1 - w_top ≈ 1.27e-14", gap 32)
            inside = ax.get_window_extent(renderer).padded(-4 * fig.dpi / 72)
            assert ax.texts
            for t in ax.texts:
                t.update_positions(renderer)
                box = Text.get_window_extent(t, renderer)  # the text, not its pointer line
                assert not path.intersects_bbox(box, filled=False), (t.get_text(), gap)
                assert inside.x0 <= box.x0 and box.x1 <= inside.x1, t.get_text()
                assert inside.y0 <= box.y0 and box.y1 <= inside.y1, t.get_text()
        if label is not None:
            assert fig.axes[1].texts[0].get_text() == label


@needs_mpl
def test_plot_writes_svg_and_png_at_the_requested_dpi(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    svg = tmp_path / "c.svg"
    assert main(["plot", "collapse", "--gap", "32", "-o", str(svg)]) == 0
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("width") == "345.6pt" and root.get("height") == "165.6pt"  # 4.8 x 2.3 in
    png = tmp_path / "c.png"
    assert main(["plot", "collapse", "-o", str(png), "--dpi", "150"]) == 0
    assert png_size(png) == (720, 345)  # 4.8 x 2.3 in at 150 dpi
    # --format picks the format whatever the name
    named = tmp_path / "figure"
    assert main(["plot", "heatmap", "--file", str(SEED), "--only", "D", "-o", str(named),
                 "--format", "svg"]) == 0
    assert ET.parse(named).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    pdf = tmp_path / "h"
    assert main(["plot", "heatmap", "--file", str(SEED), "--only", "D", "-o", str(pdf),
                 "--format", "pdf"]) == 0
    assert pdf.read_bytes()[:5] == b"%PDF-"


@needs_mpl
def test_plot_format_and_dpi_mistakes_are_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", "collapse", "-o", str(tmp_path / "c.svg"), "--format", "png"]) == 2
    assert "format=png does not match the suffix" in capsys.readouterr().err
    assert main(["plot", "collapse", "-o", str(tmp_path / "c.png"), "--dpi", "100000"]) == 2
    assert "dpi=100000 must be an integer from 50 to 1200" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["plot", "collapse", "-o", str(tmp_path / "c.png"), "--dpi", "many"])
    assert exc.value.code == 2
    assert "--dpi: expected an integer" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@needs_mpl
def test_axis_numbers_use_scientific_notation_beyond_the_limits() -> None:
    from mha_symbolic.textbook.figures import _collapse_plot, _heatmap_plot, _styled

    with _styled():
        fig = _collapse_plot(2, 32)
        fig.draw_without_rendering()
        log_labels = [t.get_text() for t in fig.axes[1].get_yticklabels() if t.get_text()]
        # the log axis of 1 - w: powers of ten written by mathtext, 10^{-14} among them
        assert r"$\mathdefault{10^{-14}}$" in log_labels
        heat = _heatmap_plot(exact_attention(scores=[[0, 1]]), 0, None, None, None)
        bar = heat.axes[1].yaxis.get_major_formatter()
        # the colour bar's numbers switch to m×10^k below 10^-3 and from 10^4, in mathtext
        assert bar.get_useMathText() is True
        assert list(bar._powerlimits) == [-3, 4]


@needs_mpl
def test_a_pdf_asked_to_be_typeset_by_latex_is_written_either_way(tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import collapse_figure, pgf_available

    # with pdflatex and pgf.sty, LaTeX typesets the text (pgf backend); without them (or
    # if LaTeX refuses) the same figure is drawn with matplotlib's Computer Modern
    out = collapse_figure(tmp_path / "c.pdf", n_tokens=2, gap=32, tex=True)
    data = out.read_bytes()
    assert data[:5] == b"%PDF-"
    if not pgf_available():
        assert b"CMR10" in data.upper()  # cmr10 embedded: the document's font


@needs_mpl
def test_a_wide_heatmap_labels_at_most_16_columns_and_keeps_its_bar_inside() -> None:
    from mha_symbolic.textbook.figures import _heatmap_plot, _styled

    att = exact_attention(scores=[[(3 * i + j) % 7 for j in range(40)] for i in range(3)])
    with _styled():
        fig = _heatmap_plot(att, 0, "x" * 100, None, [f"token{j}" for j in range(40)])
        ax, bar = fig.axes
        labels = [t.get_text() for t in ax.get_xticklabels()]
        # every 3rd of 40 columns (ceil(40/16) = 3): token0, token3, ..., token39
        assert labels == [f"token{j}" for j in range(0, 40, 3)]
        assert ax.get_title() == "x" * 67 + "..."  # one line: cut at 70 characters
        renderer = fig.canvas.get_renderer()
        width = fig.bbox.width
        for t in bar.get_yticklabels():
            assert t.get_window_extent(renderer).x1 <= width  # colour bar numbers not cut off


@needs_mpl
def test_vector_figures_are_reproducible_byte_for_byte(tmp_path: Path) -> None:
    from mha_symbolic.textbook.figures import collapse_figure

    for suffix in (".svg", ".pdf"):
        a = collapse_figure(tmp_path / f"a{suffix}", tex=False)
        b = collapse_figure(tmp_path / f"b{suffix}", tex=False)
        assert a.read_bytes() == b.read_bytes(), suffix  # no date, no random ids


@needs_mpl
def test_a_derivations_heatmap_has_no_title_over_its_caption_and_names_the_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mha_symbolic.textbook import figures
    from mha_symbolic.textbook.derivation import derive
    from mha_symbolic.textbook.examples import load_examples

    made: list[object] = []
    real = figures._heatmap_plot

    def spy(*args: object, **kwargs: object) -> object:
        fig = real(*args, **kwargs)  # type: ignore[arg-type]
        made.append(fig)
        return fig

    monkeypatch.setattr(figures, "_heatmap_plot", spy)
    (g,) = [e for e in load_examples(ROOT / "examples" / "seed.toml") if e.name == "G"]
    derive(g, figures=tmp_path, relative_to=tmp_path)
    (fig,) = made
    ax = fig.axes[0]  # type: ignore[attr-defined]
    assert ax.get_title() == ""  # the caption says "Attention weights (rows: ...)"
    # the page names the 'it' row's query and its first key, "cat"; the rest stay k_j
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "cat", "$k_{2}$", "$k_{3}$", "$k_{4}$", "$k_{5}$", "$k_{6}$"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["it"]
