"""Figures: the softmax collapse curve and attention-weight heatmaps.

matplotlib is an optional extra (``pip install 'mha-symbolic[plot]'``); it is
imported inside the functions, and its absence raises
:class:`~mha_symbolic.errors.OptionalDependencyError` with that hint.  Figures
are drawn on a :class:`matplotlib.figure.Figure` (no pyplot global state) and
saved in the format named by ``format=`` or, without it, by the file's suffix:
``png``, ``svg``, ``pdf`` or ``pgf`` (PGF measures its text with pdflatex, so it
needs a TeX system).

**Print size.**  A figure is drawn at the width it is printed at,
:data:`TEXT_WIDTH` = 4.8 inches, with its text at :data:`FONT_SIZE` = 10 pt
(tick labels and cell values 9 pt or less) in Computer Modern: matplotlib's own
``cmr10`` and mathtext's ``cm`` set, the fonts of a pdflatex document.  A document
includes the figure at its natural width (``\\includegraphics{…}`` without a
``width=``), so the 10 pt stay 10 pt.  A PDF is typeset by pdflatex itself
(matplotlib's pgf backend) when pdflatex and the LaTeX package ``pgf`` are
installed, and falls back to the mathtext fonts otherwise.  PNGs default to
:data:`DEFAULT_DPI` = 300 dots per inch (1440 pixels across).

The collapse curve is the closed form of a softmax row with one score ``g``
above ``n − 1`` equal others::

    w_top(g) = e^g / (e^g + (n − 1)) = 1 / (1 + (n − 1) e^(−g))

The curve is drawn from float64 samples (a picture, not a claim); the marked
point's value is the exact ``w_top`` at the given gap, certified with Arb, and
so are the numbers written in the heatmap cells (correctly rounded to 3 places,
or to 3 significant digits in scientific notation below 0.0005).  Labels are
placed where no curve runs: each candidate position's box, measured by
matplotlib's renderer, is tested against the drawn paths.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from .._text import echo, expr_text, plural, sanitize
from ..errors import MhaSymbolicError, OptionalDependencyError, SpecError

__all__ = [
    "COLLAPSE_SIZE",
    "DEFAULT_DPI",
    "FONT_SIZE",
    "FORMATS",
    "SUFFIXES",
    "TEXT_WIDTH",
    "cli_plot",
    "collapse_figure",
    "collapse_parameters",
    "heatmap_figure",
    "heatmap_size",
]

#: Output formats, each also the file suffix that selects it.
FORMATS = ("png", "svg", "pdf", "pgf")
SUFFIXES = tuple(f".{f}" for f in FORMATS)
#: The printed width of every figure (inches): a textbook's text width.
TEXT_WIDTH = 4.8
#: Size (pt) of titles, axis labels and notes: the document's text at the printed width.
FONT_SIZE = 10.0
#: Size (pt) of tick labels, annotations and heatmap cells (a heatmap with many small
#: cells writes them smaller, never below :data:`MIN_CELL_FONT`).
SMALL_FONT = 9.0
MIN_CELL_FONT = 5.0
#: Figure size of the collapse plot, in inches.
COLLAPSE_SIZE = (TEXT_WIDTH, 2.3)
#: Dots per inch of a PNG by default (print quality); also the resolution of any
#: raster part of a PDF/SVG.  ``dpi=`` may choose MIN_DPI … MAX_DPI.
DEFAULT_DPI = 300
MIN_DPI, MAX_DPI = 50, 1200
#: Most labelled columns (rows) of a heatmap, and longest title (characters) shown.
MAX_TICKS = 16
MAX_TITLE = 70
MAGENTA = "#d1007a"
BLUE = "#1f4e79"
#: Largest gap accepted for the collapse plot.
MAX_GAP = 1000
#: A row counts as collapsed (nearly one-hot) when its top weight exceeds this.
COLLAPSED = Fraction(999, 1000)

#: matplotlib settings of every figure: Computer Modern at the document's sizes.
#: ``cmr10`` has no minus sign, so numbers on the axes are written by mathtext
#: (``axes.formatter.use_mathtext``), which also writes scientific notation as
#: ``m×10^k`` whenever a tick value is below 10^−3 or at least 10^4.
STYLE: dict[str, Any] = {
    "font.family": "serif",
    "font.serif": ["cmr10"],
    "mathtext.fontset": "cm",
    "font.size": FONT_SIZE,
    "axes.titlesize": FONT_SIZE,
    "axes.labelsize": FONT_SIZE,
    "xtick.labelsize": SMALL_FONT,
    "ytick.labelsize": SMALL_FONT,
    "legend.fontsize": SMALL_FONT,
    "axes.formatter.use_mathtext": True,
    "axes.formatter.limits": (-3, 4),
    "axes.unicode_minus": True,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.2,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "svg.fonttype": "path",  # an SVG looks the same without the fonts installed
    "svg.hashsalt": "mha-symbolic",
    "pdf.fonttype": 42,
}
#: Extra settings when pdflatex typesets the text (pgf backend): the document's own fonts.
TEX_STYLE: dict[str, Any] = {
    "pgf.texsystem": "pdflatex",
    "pgf.rcfonts": False,
    "pgf.preamble": "\\usepackage{amsmath}",
    "text.usetex": False,
}


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise OptionalDependencyError("matplotlib", "figures", "plot") from None
    return matplotlib


@contextlib.contextmanager
def _styled(tex: bool = False) -> Iterator[None]:
    """matplotlib's settings for a figure, restored afterwards (fonts are looked up
    when a text is created and again when it is drawn: both happen inside)."""
    matplotlib = _matplotlib()
    with matplotlib.rc_context({**STYLE, **(TEX_STYLE if tex else {})}):
        yield


def _new_figure(size: tuple[float, float]) -> Any:
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)  # a renderer to measure text with (label placement)
    return fig


def output_format(path: str | Path, format: str | None = None) -> str:
    """The format a figure is written in: ``format`` when given (any file name is then
    accepted), else the file's suffix.

    >>> output_format("fig.SVG"), output_format("fig", "pdf")
    ('svg', 'pdf')
    """
    if format is not None:
        fmt = str(format).lower().lstrip(".")
        if fmt not in FORMATS:
            raise SpecError(f"format={echo(str(format), 20)} must be one of {', '.join(FORMATS)}")
        suffix = Path(path).suffix.lower().lstrip(".")
        if suffix in FORMATS and suffix != fmt:
            raise SpecError(f"format={fmt} does not match the suffix of "
                            f"output={echo(str(path))}: name the file .{fmt} or leave out the "
                            "format")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise SpecError(f"output={echo(str(path))} has suffix {echo(suffix or '(none)', 20)}; "
                        f"expected one of {', '.join(SUFFIXES)} (or give the format)")
    return suffix[1:]


def _check_dpi(dpi: Any) -> int:
    if dpi is None:
        return DEFAULT_DPI
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not MIN_DPI <= dpi <= MAX_DPI:
        shown = str(dpi) if isinstance(dpi, int) else echo(str(dpi), 20)
        raise SpecError(f"dpi={shown} must be an integer from {MIN_DPI} to "
                        f"{MAX_DPI} (for a vector figure write .pdf or .svg)")
    return dpi


@functools.cache
def pgf_available() -> bool:
    """Whether pdflatex and its ``pgf`` package are installed, so that a PDF figure can be
    typeset by LaTeX itself (matplotlib's pgf backend)."""
    import shutil
    import subprocess

    from .._latex import pdflatex_path

    if pdflatex_path() is None or shutil.which("kpsewhich") is None:
        return False
    try:
        found = subprocess.run(["kpsewhich", "pgf.sty"], capture_output=True, text=True,
                               timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(found)


def _render(build: Callable[[bool], Any], path: str | Path, format: str | None,
            dpi: int | None, tex: bool | None = None) -> Path:
    """Build the figure (``build(tex)``) and write it.  ``tex``: typeset a PDF's text with
    pdflatex (default: when :func:`pgf_available`); a ``.pgf`` file is always LaTeX."""
    from .._io import check_name

    check_name(path, "-o ")
    fmt = output_format(path, format)
    resolution = _check_dpi(dpi)
    path = Path(path)
    if not path.parent.is_dir():
        raise SpecError(f"-o {sanitize(str(path))}: the folder {sanitize(str(path.parent))} "
                        "does not exist")
    if fmt == "pgf":
        from .._latex import pdflatex_path

        if pdflatex_path() is None:
            raise MhaSymbolicError("PGF output measures its text with pdflatex, which is not "
                                   "on PATH: install a TeX system or write .png/.svg/.pdf")
        with _styled(tex=True):
            _savefig(build(True), path, fmt, resolution)
        return path
    if fmt == "pdf" and (pgf_available() if tex is None else tex):
        from matplotlib.backends.backend_pgf import LatexError

        try:
            with _styled(tex=True):
                _savefig(build(True), path, fmt, resolution, backend="pgf")
            return path
        except (LatexError, RuntimeError):  # LaTeX refused: the mathtext fonts instead
            pass
    with _styled():
        _savefig(build(False), path, fmt, resolution)
    return path


@contextlib.contextmanager
def _quiet_fonttools() -> Iterator[None]:
    """fontTools, subsetting cmr10 into a PDF, logs a warning that the font's 1990s
    timestamps "seem very low": harmless, and not the user's business."""
    import logging

    logger = logging.getLogger("fontTools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


#: No date in a PDF or SVG (and fixed SVG ids, ``svg.hashsalt``): the same figure gives the
#: same bytes, so regenerated files in a repository change only when the figure does.
_METADATA = {"pdf": {"Creator": "mha-symbolic", "CreationDate": None},
             "svg": {"Creator": "mha-symbolic", "Date": None}}


def _savefig(fig: Any, path: Path, fmt: str, dpi: int, backend: str | None = None) -> None:
    """Render into memory, then write the file: matplotlib's PDF writer, stopped by a
    failing write (``-o /dev/full``), raised an AttributeError from its own cleanup."""
    import io

    buffer = io.BytesIO()
    with _quiet_fonttools():
        fig.savefig(buffer, format=fmt, dpi=dpi, backend=backend,
                    **({"metadata": _METADATA[fmt]} if fmt in _METADATA and backend is None else {}))
    from .._io import write_atomic

    write_atomic(path, buffer.getvalue())  # whole or not at all; the OSError names the file


# -- label placement ------------------------------------------------------------------

def _crosses(box: Any, avoid: Sequence[Any]) -> bool:
    """Whether any artist of ``avoid`` (lines: their drawn path) runs through ``box``
    (display coordinates)."""
    for artist in avoid:
        path = artist.get_transform().transform_path(artist.get_path())
        if path.intersects_bbox(box, filled=False):
            return True
    return False


#: Clear space (points) a label keeps from the axes' edges.
LABEL_MARGIN = 6
#: Near places of a label, tried first: offsets (points) from its point and alignments.
_NEAR = [(-8, -10, "right", "top"), (8, -10, "left", "top"), (-8, 10, "right", "bottom"),
         (8, 10, "left", "bottom")]
#: Then a grid of places over the axes (axes fractions of the label's centre), nearest
#: to the point first, the label joined to its point by a thin line.
_GRID = [(0.1 + 0.8 * i / 8, 0.1 + 0.8 * j / 8) for i in range(9) for j in range(9)]


def _place_label(ax: Any, text: str, xy: tuple[float, float] | None, avoid: Sequence[Any],
                 **style: Any) -> Any:
    """Annotate ``xy`` (data coordinates; None: a free note) with ``text`` at the first
    place whose box, measured with the figure's renderer once the layout is fixed, lies
    inside the axes and crosses none of ``avoid``: next to the point if it can, else at
    the nearest free place of a grid over the axes."""
    renderer = ax.figure.canvas.get_renderer()
    # a clear margin inside the spines: a label touching an axis reads as running into
    # its tick labels
    inside = ax.get_window_extent(renderer).padded(-LABEL_MARGIN * ax.figure.dpi / 72)
    line = {"arrowstyle": "-", "color": style.get("color", "k"), "lw": 0.6, "shrinkA": 2,
            "shrinkB": 4}

    from matplotlib.text import Text

    def fits(ann: Any) -> bool:
        # the text's own box (an Annotation's box would include its line to the point)
        ann.update_positions(renderer)
        box = Text.get_window_extent(ann, renderer).padded(2)
        return (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0
                and box.y1 <= inside.y1 and not _crosses(box, avoid))

    tries: list[dict[str, Any]] = []
    if xy is not None:
        tries += [{"xytext": (dx, dy), "textcoords": "offset points", "ha": ha, "va": va}
                  for dx, dy, ha, va in _NEAR]
        px, py = ax.transAxes.inverted().transform(ax.transData.transform(xy))
        grid = sorted(_GRID, key=lambda p: (p[0] - px) ** 2 + (p[1] - py) ** 2)
    else:
        grid = sorted(_GRID, key=lambda p: (p[0] - 0.5) ** 2 + (p[1] - 0.5) ** 2)
    tries += [{"xytext": p, "textcoords": "axes fraction", "ha": "center", "va": "center",
               "arrowprops": line if xy is not None else None} for p in grid]
    for place in tries:
        ann = ax.annotate(text, xy=xy if xy is not None else place["xytext"],
                          xycoords="data" if xy is not None else "axes fraction",
                          multialignment="left", **place, **style)
        if fits(ann):
            return ann
        ann.remove()
    # nowhere free (the tests of each figure would catch it): next to the point
    return ax.annotate(text, xy=xy if xy is not None else (0.5, 0.5),
                       xycoords="data" if xy is not None else "axes fraction",
                       **tries[0], multialignment="left", **style)


# -- the collapse curve -------------------------------------------------------------

def _gap_value(gap: Any) -> Any:
    """The gap as an exact SymPy number, validated."""
    from ..exact.certified import certify
    from ..exact.engine import exact_number

    value = exact_number(gap, "gap")
    if getattr(value, "free_symbols", None):
        raise SpecError(f"gap={echo(str(gap), 40)} must be a number")
    c = certify(value)
    if c.sign() < 0 or c.compare(Fraction(MAX_GAP)) > 0:
        raise SpecError(f"gap={echo(str(gap), 40)} must lie between 0 and {MAX_GAP}")
    return value


def collapse_weight(n_tokens: int, gap: Any) -> Any:
    """Exact ``w_top = e^g / (e^g + n − 1)`` as a SymPy expression.

    >>> collapse_weight(3, 20)
    exp(20)/(2 + exp(20))
    """
    import sympy as sp

    return sp.exp(gap) / (sp.exp(gap) + (n_tokens - 1))


def collapse_figure(path: str | Path, *, n_tokens: int = 3, gap: Any = 20,
                    format: str | None = None, dpi: int | None = None,
                    tex: bool | None = None) -> Path:
    """Draw the weight on the dominant token against the score gap; mark ``gap``.

    Left: ``w_top`` on a linear scale, the curve climbing to the ceiling 1.
    Right: ``1 − w_top`` on a log scale, where the climb is a straight line of
    slope ``−1/ln 10`` per unit gap.  The magenta dot is at ``gap`` (Example D: 20).
    ``format``: ``png``, ``svg``, ``pdf`` or ``pgf`` (default: the suffix of ``path``);
    ``dpi``: a PNG's resolution (default 300); ``tex``: typeset a PDF's text with
    pdflatex (default: when it and its ``pgf`` package are installed).

    >>> import tempfile, pathlib                                  # doctest: +SKIP
    >>> collapse_figure(pathlib.Path(tempfile.mkdtemp()) / "c.svg")  # doctest: +SKIP
    """
    output_format(path, format)
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 2:
        raise SpecError(f"n_tokens={expr_text(n_tokens, 20)} must be an integer >= 2")
    g = _gap_value(gap)
    return _render(lambda t: _collapse_plot(n_tokens, g, tex=t), path, format, dpi, tex)


def _gap_math(g: Any) -> str:
    """The gap in math mode (mathtext and LaTeX read it alike): its LaTeX form when short,
    else its certified leading digits."""
    import sympy as sp

    from ..exact.certified import certify

    text = sp.latex(g) if g.is_number and sp.count_ops(g) <= 12 else ""
    if not text or len(text) > 40:
        text = certify(g).digits(6).replace("…", r"\ldots")
    return text


def _collapse_plot(n_tokens: int, gap: Any, *, tex: bool = False) -> Any:
    """The collapse figure as a matplotlib Figure (not saved); call inside :func:`_styled`.
    ``tex``: the text is for LaTeX (pgf backend)."""
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 2:
        raise SpecError(f"n_tokens={expr_text(n_tokens, 20)} must be an integer >= 2")
    import numpy as np

    from ..exact.certified import certify

    g = _gap_value(gap)
    w = certify(collapse_weight(n_tokens, g))
    rest = certify(1 - collapse_weight(n_tokens, g))  # = (n-1)/(e^g + n - 1), exactly
    g_float = certify(g).to_float()
    top = max(25.0, 1.25 * g_float)
    x = np.linspace(0.0, top, 600)
    m = n_tokens - 1
    # 1 - w = m e^{-x} / (1 + m e^{-x}); both forms are stable in float64 for x >= 0
    y_rest = m * np.exp(-x) / (1.0 + m * np.exp(-x))
    y = 1.0 / (1.0 + m * np.exp(-x))

    fig = _new_figure(COLLAPSE_SIZE)
    ax1, ax2 = fig.subplots(1, 2)
    (curve1,) = ax1.plot(x, y, color=BLUE)
    ceiling = ax1.axhline(1.0, color="0.6", lw=0.8, ls="--")
    uniform = ax1.axhline(1.0 / n_tokens, color="0.75", lw=0.8, ls=":")
    ax1.plot([g_float], [w.to_float()], "o", color=MAGENTA, ms=5, zorder=5)
    ax1.set_xlim(0, top)
    ax1.set_ylim(0, 1.08)
    ax1.set_xlabel("score gap $g$")
    ax1.set_ylabel(r"$w_{\mathrm{top}}$")
    ax1.set_title(f"Weight on the top score ($n = {n_tokens}$)")
    (curve2,) = ax2.semilogy(x, y_rest, color=BLUE)
    if rest.compare(Fraction(1, 10**300)) > 0:
        ax2.plot([g_float], [rest.to_float()], "o", color=MAGENTA, ms=5, zorder=5)
    ax2.set_xlim(0, top)
    ax2.set_xlabel("score gap $g$")
    ax2.set_ylabel(r"$1 - w_{\mathrm{top}}$")
    ax2.set_title("Left for the other scores")
    for ax in (ax1, ax2):
        ax.grid(True, color="0.9", lw=0.5)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.19, top=0.88, wspace=0.42)
    digits = w.digits(10).replace("…", r"\ldots")
    _place_label(ax1, f"$g = {_gap_math(g)}$\n$w_{{\\mathrm{{top}}}} = {digits}$",
                 (g_float, w.to_float()), [curve1, ceiling, uniform], color=MAGENTA,
                 fontsize=SMALL_FONT)
    # beyond float64's range (1 - w < 1e-300, a gap above ~690) the point cannot be drawn
    # on the log scale: the certified value is written as a note instead
    shown = rest.compare(Fraction(1, 10**300)) > 0
    # on two lines, as the left panel's label: one line (about 125 pt) fits nowhere
    # between the falling curve and the axes' margins, and ran into the y axis
    _place_label(ax2, f"$1 - w_{{\\mathrm{{top}}}}$\n$\\approx "
                 f"{_readable(rest.round_significant(3))}$",
                 (g_float, rest.to_float()) if shown else None, [curve2], color=MAGENTA,
                 fontsize=SMALL_FONT)
    return fig


def _scientific(q: Fraction) -> str:
    """Math-mode ``m\\times10^{k}`` for a non-zero decimal ``q`` (printed exactly; no
    exponent when ``k`` is 0).

    >>> _scientific(Fraction(127, 10**16)), _scientific(Fraction(-5, 2))
    ('1.27\\\\times10^{-14}', '-2.5')
    """
    from decimal import Decimal

    d = Decimal(q.numerator) / Decimal(q.denominator)  # q is a short decimal: exact here
    sign, digits, exp = d.normalize().as_tuple()
    assert isinstance(exp, int)
    mantissa = "".join(map(str, digits))
    k = exp + len(mantissa) - 1
    m = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return ("-" if sign else "") + (m if k == 0 else f"{m}\\times10^{{{k}}}")


def _readable(q: Fraction) -> str:
    """A short decimal ``q`` in math mode: plainly when ``10^-3 <= |q| < 10^4`` (0.875),
    else in scientific notation (``1.27\\times10^{-14}``).

    >>> _readable(Fraction(7, 8)), _readable(Fraction(206, 10**11))
    ('0.875', '2.06\\\\times10^{-9}')
    """
    if Fraction(1, 1000) <= abs(q) < 10**4:
        from decimal import Decimal

        text = format((Decimal(q.numerator) / Decimal(q.denominator)).normalize(), "f")
        return text
    return _scientific(q)


# -- heatmaps ------------------------------------------------------------------------

def heatmap_size(n_q: int, n_k: int) -> tuple[float, float]:
    """Figure size (inches) of a heatmap of an ``n_q × n_k`` weight matrix: the text
    width, and 0.3 inch per row plus 1 inch for the title and labels (1.6 to 7 inches).

    >>> heatmap_size(1, 6)  # Example G's row: 1440 × 480 pixels at 300 dpi
    (4.8, 1.6)
    """
    return (TEXT_WIDTH, round(min(7.0, max(1.6, 1.0 + 0.3 * n_q)), 2))


def heatmap_figure(
    attention: Any,
    path: str | Path,
    *,
    head: int = 0,
    title: str | None = None,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    titled: bool = True,
    format: str | None = None,
    dpi: int | None = None,
    tex: bool | None = None,
) -> Path:
    """Draw the attention weights of one head (rows: queries, columns: keys).

    ``attention`` is an :class:`~mha_symbolic.exact.engine.ExactAttention`.  Each cell
    shows its weight correctly rounded to 3 places, or below 0.0005 to 3 significant
    digits as ``m×10^k`` (certified); an exact 0 (masked) is written ``0``.  The
    colours use the correctly rounded float64 values.  ``format``/``dpi``/``tex`` as
    for :func:`collapse_figure`.  ``titled=False``: no title (a figure with a caption,
    which would only repeat it).

    >>> from mha_symbolic import exact_attention                  # doctest: +SKIP
    >>> heatmap_figure(exact_attention(scores=[[0, 1]]), "w.svg")  # doctest: +SKIP
    PosixPath('w.svg')
    """
    output_format(path, format)
    return _render(lambda t: _heatmap_plot(attention, head, title, query_labels, key_labels,
                                           tex=t, titled=titled), path, format, dpi, tex)


def _heatmap_plot(attention: Any, head: int, title: str | None,
                  query_labels: Sequence[str] | None, key_labels: Sequence[str] | None,
                  *, tex: bool = False, titled: bool = True) -> Any:
    """The heatmap as a matplotlib Figure (not saved); call inside :func:`_styled`.
    ``tex``: for the pgf backend, whose text LaTeX reads."""
    from ..exact.certified import certify

    weights = attention.weights(head)
    n_q, n_k = weights.shape
    q_labels = _labels(query_labels, n_q, "q", "query_labels", tex=tex)
    k_labels = _labels(key_labels, n_k, "k", "key_labels", tex=tex)
    if any(getattr(e, "free_symbols", None) for e in weights):
        raise SpecError("the weights are symbolic: give numbers to draw a heatmap")
    import numpy as np
    import sympy as sp

    # a fully masked row under the 'nan' policy has NaN weights: drawn blank, labelled NaN
    values = [[None if weights[r, c] is sp.nan else certify(weights[r, c]) for c in range(n_k)]
              for r in range(n_q)]
    floats = np.array([[np.nan if v is None else v.to_float() for v in row] for row in values])

    fig = _new_figure(heatmap_size(n_q, n_k))
    ax = fig.add_subplot(1, 1, 1)
    # vector cells (pcolormesh), crisp in PDF and SVG at any zoom
    mesh = ax.pcolormesh(np.ma.masked_invalid(floats), cmap="viridis", vmin=0.0, vmax=1.0,
                         edgecolors="face", linewidth=0)
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)
    # at most MAX_TICKS labelled columns (and rows): every k-th one beyond that
    x_step, y_step = -(-n_k // MAX_TICKS), -(-n_q // MAX_TICKS)
    ax.set_xticks([c + 0.5 for c in range(0, n_k, x_step)])
    ax.set_yticks([r + 0.5 for r in range(0, n_q, y_step)])
    ax.tick_params(length=0)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    heads = len(attention.heads)
    if title and len(title) > MAX_TITLE:  # one line across the figure, at most
        title = title[: MAX_TITLE - 3] + "..."
    if titled:
        ax.set_title(_label_text(title, tex) if title else (
            f"Attention weights, head {head + 1}" if heads > 1 else "Attention weights"))
    height = heatmap_size(n_q, n_k)[1]
    # key labels turned 40 degrees when, written level, they would not fit their columns
    # (a label's width estimated at 0.55 em a character; the axes are ~3.7 in wide)
    k_labels, q_labels = k_labels[::x_step], q_labels[::y_step]
    longest = max((len(s) for s in k_labels), default=1)
    rotate = longest * 0.55 * SMALL_FONT * len(k_labels) > 3.7 * 72
    bottom, top = (0.8 if rotate else 0.5) / height, 1 - (0.3 if titled else 0.1) / height
    fig.subplots_adjust(left=0.14, right=0.86, bottom=bottom, top=top)
    # the colour bar a fixed 0.1 in wide beside the cells, its labels inside the figure
    bar = fig.colorbar(mesh, cax=fig.add_axes((0.88, bottom, 0.1 / TEXT_WIDTH, top - bottom)))
    bar.ax.tick_params(labelsize=SMALL_FONT - 1)
    bar.outline.set_linewidth(0.5)
    texts = [[_cell_text(values[r][c]) for c in range(n_k)] for r in range(n_q)]
    size = _cell_font(ax, texts, n_q, n_k)
    ax.set_xticklabels(k_labels, rotation=40 if rotate else 0, ha="right" if rotate else "center")
    ax.set_yticklabels(q_labels)
    if size is not None:
        for r in range(n_q):
            for c in range(n_k):
                ax.text(c + 0.5, r + 0.5, texts[r][c], ha="center", va="center",
                        fontsize=size, color="black" if floats[r][c] > 0.6 else "white")
    return fig


def _cell_font(ax: Any, texts: list[list[str]], n_q: int, n_k: int) -> float | None:
    """Largest font size (≤ SMALL_FONT) at which every cell's text fits its cell; None when
    even MIN_CELL_FONT does not (the cells are then left unlabelled)."""
    fig = ax.figure
    box = ax.get_window_extent(fig.canvas.get_renderer())
    cell_w = box.width / n_k * 72 / fig.dpi  # points
    cell_h = box.height / n_q * 72 / fig.dpi
    # a digit of Computer Modern is 0.5 em wide; '×10' and a superscript about 2.6 em
    widest = max(_em_width(s) for row in texts for s in row)
    size = min(SMALL_FONT, 0.9 * cell_w / widest, 0.7 * cell_h)
    return size if size >= MIN_CELL_FONT else None


def _em_width(text: str) -> float:
    """Width of a cell text in em (an estimate from its characters: digits 0.5 em)."""
    if text.startswith("$"):
        mantissa = text[1:text.index("\\")] if "\\" in text else text.strip("$")
        return 0.5 * len(mantissa) + 2.6
    return 0.5 * len(text) + 0.2


def _cell_text(value: Any) -> str:
    """A cell's certified weight: ``0`` exactly zero (masked), ``1`` exactly one, else
    correctly rounded to 3 places, or to 3 significant digits (``2.06×10^{-9}`` in math
    mode) when that would print 0.000; ``NaN`` for a fully masked row's weight.

    >>> from mha_symbolic.exact.certified import certify
    >>> import sympy as sp
    >>> [_cell_text(certify(x)) for x in (sp.Rational(1, 3), 1 / (2 + sp.exp(20)), 0)]
    ['0.333', '$2.06\\\\times10^{-9}$', '0']
    """
    if value is None:
        return "NaN"
    exact = value.rational()
    if exact is not None and exact in (0, 1):
        return str(int(exact))
    q = value.round_places(3)
    if q == 0:
        return f"${_scientific(value.round_significant(3))}$"
    return f"{float(q):.3f}"  # q has at most 3 decimals, so this prints it exactly


def _label_text(text: str, tex: bool) -> str:
    """Text from a file (an example's name, token labels) for a figure, shown literally:
    control characters made visible; for PNG/SVG/PDF every ``$`` escaped (matplotlib would
    read ``$...$`` as mathtext); for LaTeX (PGF, pdflatex-typeset PDF) fully LaTeX-escaped,
    so that no TeX command from the file reaches LaTeX."""
    text = sanitize(text)
    if tex:
        from .._latex import latex_escape

        return latex_escape(text)
    return text.replace("$", r"\$")


def _labels(labels: Sequence[str] | None, n: int, prefix: str, name: str, *,
            tex: bool = False) -> list[str]:
    if labels is None:
        return [f"${prefix}_{{{i + 1}}}$" for i in range(n)]
    # an empty name (a token the text leaves unnamed) keeps its q_i / k_j
    labels = [_label_text(str(x), tex) if str(x) else f"${prefix}_{{{i + 1}}}$"
              for i, x in enumerate(labels)]
    if len(labels) != n:
        raise SpecError(f"{name} has {plural(len(labels), 'entry', 'entries')}; expected {n}")
    return labels


def collapse_parameters(attention: Any) -> tuple[int, Any] | None:
    """``(n_tokens, gap)`` when the collapse curve describes a nearly one-hot row exactly.

    That is the case for a single-head, single-query computation whose scaled
    scores are one top score and ``n − 1`` equal others, with a gap large enough
    that the top weight exceeds ``COLLAPSED`` (certified): the row has collapsed.
    """
    import sympy as sp

    if len(attention.heads) != 1:
        return None
    t = attention.heads[0].scaled
    if t.rows != 1 or t.cols < 2 or any(e in (sp.oo, -sp.oo) for e in t):
        return None
    entries = list(t)
    if any(getattr(e, "free_symbols", None) for e in entries):
        return None
    from ..exact.certified import certify

    top = max(range(len(entries)), key=lambda j: certify(entries[j]).to_float())
    others = [e for j, e in enumerate(entries) if j != top]
    if any(certify(o - others[0]).sign() != 0 for o in others[1:]):
        return None
    gap = entries[top] - others[0]
    c = certify(gap)
    if c.sign() <= 0 or c.compare(Fraction(MAX_GAP)) > 0:
        return None
    if certify(collapse_weight(len(entries), gap)).compare(COLLAPSED) <= 0:
        return None
    return len(entries), gap


def cli_plot(args: Any) -> int:
    """``mha-symbolic plot KIND -o OUT [--format F] [--dpi N] [--file F --example NAME]
    [--gap 20]``."""
    from .._io import output_path

    kind = args.kind
    fmt = getattr(args, "format", None)
    dpi = getattr(args, "dpi", None)
    if output_path(args.output, inputs=[args.file] if args.file else []) is None:
        raise SpecError("plot needs -o FILE (.png, .svg, .pdf or .pgf): a figure is not text")
    output_format(args.output, fmt)  # before any work: a wrong suffix is one line at once
    _check_dpi(dpi)
    if kind == "collapse":
        n_tokens = 3
        gap: Any = args.gap
        if args.file:
            att, _ = _example_attention(args.file, args.example)
            params = collapse_parameters(att)
            if params is None:
                raise SpecError(f"--example={echo(str(args.example), 40)}: its scores are not "
                                "one top score above equal others, so the collapse curve does "
                                "not apply")
            n_tokens, gap = params
        path = collapse_figure(args.output, n_tokens=n_tokens, gap=gap, format=fmt, dpi=dpi)
    elif kind == "heatmap":
        if not args.file:
            raise SpecError("plot heatmap needs --file FILE (and --example NAME)")
        att, example = _example_attention(args.file, args.example)
        tokens = getattr(example, "tokens", None)
        path = heatmap_figure(att, args.output,
                              title=f"Example {example.name}: attention weights",
                              format=fmt, dpi=dpi, **_token_labels(att, tokens))
    else:
        raise SpecError(f"KIND={echo(kind, 40)} must be 'collapse' or 'heatmap'")
    print(f"wrote {sanitize(str(path))}")
    return 0


def _token_labels(att: Any, tokens: Any) -> dict[str, Any]:
    """Labels from an example's token names, when it gives them."""
    if not tokens:
        return {}
    if isinstance(tokens, dict):
        q, k = tokens.get("query"), tokens.get("key")
        return {"query_labels": q, "key_labels": k}
    n_q, n_k = att.weights(0).shape
    tokens = list(tokens)
    out: dict[str, Any] = {}
    if len(tokens) == n_k:
        out["key_labels"] = tokens
    if len(tokens) == n_q:
        out["query_labels"] = tokens
    return out


def _example_attention(file: str, name: str | None) -> tuple[Any, Any]:
    from .examples import load_examples

    examples = load_examples(file)
    if name is None:
        candidates = [e for e in examples if e.attention() is not None]
        if len(candidates) != 1:
            raise SpecError("--example NAME is needed: the file has "
                            f"{plural(len(candidates), 'example')} with inputs")
        example = candidates[0]
    else:
        from .examples import select_examples

        (example,) = select_examples(examples, [name])
    att = example.attention()
    if att is None:
        raise SpecError(f"--example={echo(example.name, 40)} has no inputs (sizes only): "
                        "nothing to draw")
    return att, example
