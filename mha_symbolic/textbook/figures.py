"""Figures: the softmax collapse curve and attention-weight heatmaps.

matplotlib is an optional extra (``pip install 'mha-symbolic[plot]'``); it is
imported inside the functions, and its absence raises
:class:`~mha_symbolic.errors.OptionalDependencyError` with that hint.  Figures
are drawn on a :class:`matplotlib.figure.Figure` (no pyplot global state) and
saved by suffix: ``.png``, ``.pdf`` or ``.pgf`` (PGF measures its text with
pdflatex, so it needs a TeX system).

The collapse curve is the closed form of a softmax row with one score ``g``
above ``n − 1`` equal others::

    w_top(g) = e^g / (e^g + (n − 1)) = 1 / (1 + (n − 1) e^(−g))

The curve is drawn from float64 samples (a picture, not a claim); the marked
point's value is the exact ``w_top`` at the given gap, certified with Arb, and
so are the numbers written in the heatmap cells (correctly rounded to 3 places).

Sizes are fixed so that a figure's pixel size is known in advance: at
``dpi=100`` the collapse figure is 900 × 400 pixels and a heatmap of an
``n_q × n_k`` weight matrix is ``100·max(6.4, 1.6 + 0.8·n_k)`` ×
``100·max(3.0, 1.6 + 0.5·n_q)`` pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from .._text import echo, expr_text, sanitize
from ..errors import MhaSymbolicError, OptionalDependencyError, SpecError

__all__ = [
    "COLLAPSE_SIZE",
    "SUFFIXES",
    "cli_plot",
    "collapse_figure",
    "collapse_parameters",
    "heatmap_figure",
    "heatmap_size",
]

SUFFIXES = (".png", ".pdf", ".pgf")
#: Figure size of the collapse plot, in inches.
COLLAPSE_SIZE = (9.0, 4.0)
DPI = 100
MAGENTA = "#d1007a"
#: Largest gap accepted for the collapse plot.
MAX_GAP = 1000
#: A row counts as collapsed (nearly one-hot) when its top weight exceeds this.
COLLAPSED = Fraction(999, 1000)


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise OptionalDependencyError("matplotlib", "drawing figures", "plot") from None
    return matplotlib


def _new_figure(size: tuple[float, float]) -> Any:
    _matplotlib()
    from matplotlib.figure import Figure as MplFigure

    return MplFigure(figsize=size, dpi=DPI)


def _check_suffix(path: str | Path) -> Path:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise SpecError(f"output={echo(str(path))} has suffix {echo(suffix or '(none)', 20)}; "
                        f"expected one of {', '.join(SUFFIXES)}")
    return path


def _save(fig: Any, path: str | Path) -> Path:
    from .._io import check_name

    check_name(path, "-o ")
    path = _check_suffix(path)
    suffix = path.suffix.lower()
    if not path.parent.is_dir():
        raise SpecError(f"-o {sanitize(str(path))}: the folder {sanitize(str(path.parent))} "
                        "does not exist")
    if suffix == ".pgf":
        from .._latex import pdflatex_path

        if pdflatex_path() is None:
            raise MhaSymbolicError("PGF output measures its text with pdflatex, which is not "
                                   "on PATH: install a TeX system or write .png/.pdf")
        import matplotlib

        with matplotlib.rc_context({"pgf.texsystem": "pdflatex", "pgf.rcfonts": False}):
            _savefig(fig, path)
    else:
        _savefig(fig, path)
    return path


def _savefig(fig: Any, path: Path) -> None:
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as exc:  # name the file: "/dev/full: No space left on device"
        raise OSError(exc.errno, exc.strerror or type(exc).__name__, str(path)) from None


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


def collapse_figure(path: str | Path, *, n_tokens: int = 3, gap: Any = 20) -> Path:
    """Draw the weight on the dominant token against the score gap; mark ``gap``.

    Left: ``w_top`` on a linear scale, the curve climbing to the ceiling 1.
    Right: ``1 − w_top`` on a log scale, where the climb is a straight line of
    slope ``−1/ln 10`` per unit gap.  The magenta dot is at ``gap`` (Example D: 20).

    >>> import tempfile, pathlib                                  # doctest: +SKIP
    >>> collapse_figure(pathlib.Path(tempfile.mkdtemp()) / "c.png")  # doctest: +SKIP
    """
    _check_suffix(path)
    return _save(_collapse_plot(n_tokens, gap), path)


def _collapse_plot(n_tokens: int, gap: Any) -> Any:
    """The collapse figure as a matplotlib Figure (not saved)."""
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
    ax1.plot(x, y, color="#1f4e79", lw=2)
    ax1.axhline(1.0, color="0.6", lw=1, ls="--")
    ax1.axhline(1.0 / n_tokens, color="0.8", lw=1, ls=":")
    ax1.plot([g_float], [w.to_float()], "o", color=MAGENTA, ms=9, zorder=5)
    ax1.set_xlim(0, top)
    ax1.set_ylim(0, 1.05)
    ax1.set_xlabel("score gap $g$ (top score minus the others)")
    ax1.set_ylabel(r"weight on the dominant token $w_{\mathrm{top}}$")
    ax1.set_title(f"Softmax collapse, {n_tokens} tokens")
    ax1.annotate(f"gap {_short(g)}\n$w$ = {w.digits(12).replace('…', '...')}",
                 xy=(g_float, w.to_float()), xytext=(0.45, 0.35), textcoords="axes fraction",
                 color=MAGENTA, arrowprops={"arrowstyle": "->", "color": MAGENTA})
    ax2.semilogy(x, y_rest, color="#1f4e79", lw=2)
    ax2.plot([g_float], [rest.to_float()], "o", color=MAGENTA, ms=9, zorder=5)
    ax2.set_xlim(0, top)
    ax2.set_xlabel("score gap $g$")
    ax2.set_ylabel(r"$1 - w_{\mathrm{top}}$ (log scale)")
    ax2.set_title("What is left for the other tokens")
    ax2.annotate(f"$1 - w \\approx {_scientific(rest.round_significant(3))}$",
                 xy=(g_float, rest.to_float()), xytext=(-75, 14), textcoords="offset points",
                 color=MAGENTA)
    for ax in (ax1, ax2):
        ax.grid(True, color="0.9")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.9, wspace=0.28)
    return fig


def _scientific(q: Fraction) -> str:
    """Mathtext ``m\\times10^{k}`` for a non-zero decimal ``q`` (printed exactly)."""
    from decimal import Decimal

    d = Decimal(q.numerator) / Decimal(q.denominator)  # q is a short decimal: exact here
    sign, digits, exp = d.normalize().as_tuple()
    assert isinstance(exp, int)
    mantissa = "".join(map(str, digits))
    k = exp + len(mantissa) - 1
    m = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    return ("-" if sign else "") + (m if k == 0 else f"{m}\\times10^{{{k}}}")


def _short(expr: Any) -> str:
    return expr_text(expr, 15).replace("…", "...")


def heatmap_size(n_q: int, n_k: int) -> tuple[float, float]:
    """Figure size (inches) of a heatmap of an ``n_q × n_k`` weight matrix.

    >>> heatmap_size(1, 6)  # Example G's row: 640 × 300 pixels at 100 dpi
    (6.4, 3.0)
    """
    return (max(6.4, 1.6 + 0.8 * n_k), max(3.0, 1.6 + 0.5 * n_q))


def heatmap_figure(
    attention: Any,
    path: str | Path,
    *,
    head: int = 0,
    title: str | None = None,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
) -> Path:
    """Draw the attention weights of one head (rows: queries, columns: keys).

    ``attention`` is an :class:`~mha_symbolic.exact.engine.ExactAttention`.  Each cell
    shows its weight correctly rounded to 3 places (certified); the colours use
    the correctly rounded float64 values.  Masked weights are exactly 0.
    """
    tex = _check_suffix(path).suffix.lower() == ".pgf"
    return _save(_heatmap_plot(attention, head, title, query_labels, key_labels, tex=tex), path)


def _heatmap_plot(attention: Any, head: int, title: str | None,
                  query_labels: Sequence[str] | None, key_labels: Sequence[str] | None,
                  *, tex: bool = False) -> Any:
    """The heatmap as a matplotlib Figure (not saved); ``tex``: for the PGF backend,
    whose text LaTeX reads."""
    from ..exact.certified import certify

    weights = attention.weights(head)
    n_q, n_k = weights.shape
    q_labels = _labels(query_labels, n_q, "q", "query_labels", tex=tex)
    k_labels = _labels(key_labels, n_k, "k", "key_labels", tex=tex)
    if any(getattr(e, "free_symbols", None) for e in weights):
        raise SpecError("the weights are symbolic: give numbers to draw a heatmap")
    import sympy as sp

    # a fully masked row under the 'nan' policy has NaN weights: drawn blank, labelled NaN
    values = [[None if weights[r, c] is sp.nan else certify(weights[r, c]) for c in range(n_k)]
              for r in range(n_q)]
    floats = [[float("nan") if v is None else v.to_float() for v in row] for row in values]

    fig = _new_figure(heatmap_size(n_q, n_k))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(floats, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for r in range(n_q):
        for c in range(n_k):
            text = _rounded3(values[r][c])
            ax.text(c, r, text, ha="center", va="center",
                    color="black" if floats[r][c] > 0.6 else "white", fontsize=10)
    ax.set_xticks(range(n_k))
    ax.set_xticklabels(k_labels)
    ax.set_yticks(range(n_q))
    ax.set_yticklabels(q_labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    heads = len(attention.heads)
    ax.set_title(_label_text(title, tex) if title else (
        f"Attention weights, head {head + 1}" if heads > 1 else "Attention weights"))
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
    fig.subplots_adjust(left=0.14, right=0.95, bottom=0.2, top=0.86)
    return fig


def _rounded3(value: Any) -> str:
    if value is None:
        return "NaN"
    q = value.round_places(3)
    return f"{float(q):.3f}"  # q has at most 3 decimals, so this prints it exactly


def _label_text(text: str, tex: bool) -> str:
    """Text from a file (an example's name, token labels) for a figure, shown literally:
    control characters made visible; for PNG/PDF every ``$`` escaped (matplotlib would
    read ``$...$`` as mathtext); for PGF, whose text LaTeX reads, fully LaTeX-escaped,
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
    labels = [_label_text(str(x), tex) for x in labels]
    if len(labels) != n:
        raise SpecError(f"{name} has {len(labels)} entries; expected {n}")
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
    """``mha-symbolic plot KIND -o OUT [--file F --example NAME] [--gap 20]``."""
    from .._io import output_path

    kind = args.kind
    if output_path(args.output, inputs=[args.file] if args.file else []) is None:
        raise SpecError("plot needs -o FILE (.png, .pdf or .pgf): a figure is not text")
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
        path = collapse_figure(args.output, n_tokens=n_tokens, gap=gap)
    elif kind == "heatmap":
        if not args.file:
            raise SpecError("plot heatmap needs --file FILE (and --example NAME)")
        att, example = _example_attention(args.file, args.example)
        tokens = getattr(example, "tokens", None)
        path = heatmap_figure(att, args.output,
                              title=f"Example {example.name}: attention weights",
                              **_token_labels(att, tokens))
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
                            f"{len(candidates)} examples with inputs")
        example = candidates[0]
    else:
        from .examples import select_examples

        (example,) = select_examples(examples, [name])
    att = example.attention()
    if att is None:
        raise SpecError(f"--example={echo(example.name, 40)} has no inputs (sizes only): "
                        "nothing to draw")
    return att, example
