"""The public entry point: derive() and the ``derive`` command."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..._text import sanitize
from ...errors import ExampleFileError, SpecError
from .attention import _attention_steps
from .backward import _backward_steps
from .checks import _attention_checks
from .claims import _claim_lines
from .dimensions import _count_steps, _shape_steps
from .model import DEFAULT_TITLE, FORMATS, Check, Derivation, ExampleDerivation, Figure, Step
from .numbers import _tex

__all__ = ["cli_derive", "derive"]


def _is_example(obj: Any) -> bool:
    return hasattr(obj, "claims") and hasattr(obj, "attention") and hasattr(obj, "name")


def _records_for(example: Any, report: Any) -> list[Any]:
    if report is None:
        if not getattr(example, "claims", None):
            return []
        from ..check import check_examples

        report = check_examples([example])
    return [r for r in report.records if _record_example_name(r) == example.name]


def _record_example_name(rec: Any) -> str:
    ex = getattr(rec, "example", None)
    return str(getattr(ex, "name", ex))


def _wants(example: Any, kind: str) -> bool:
    """Whether a dimension-only example asks about shapes or about counts (by its
    claims' quantities: ``shape.*``/``dim.*`` or ``params.*``); both when it has none."""
    quantities = [str(getattr(c, "quantity", "")) for c in getattr(example, "claims", ()) or ()]
    if not quantities:
        return True
    prefixes = ("params.",) if kind == "count" else ("shape.", "dim.")
    return any(q.replace(" ", "").startswith(prefixes) for q in quantities)


def _derive_spec(name: str, title: str, notes: str, spec: Any, example: Any) -> ExampleDerivation:
    steps: list[Step] = []
    checks: list[Check] = []
    shapes = spec.n_q is not None and _wants(example, "shape")
    counts = _wants(example, "count") or not shapes
    if shapes:
        s, c = _shape_steps(spec)
        steps += s
        checks += c
    if counts:
        s, c = _count_steps(spec)
        steps += s
        checks += c
    return ExampleDerivation(name, title, notes, tuple(steps), tuple(checks))


def _derive_one(obj: Any, report: Any) -> ExampleDerivation:
    from ...exact.engine import ExactAttention
    from ...exact.spec import AttentionSpec

    if isinstance(obj, ExactAttention):
        return ExampleDerivation("attention", "Attention", "", tuple(_attention_steps(obj)),
                                 tuple(_attention_checks(obj)))
    if isinstance(obj, AttentionSpec):
        return _derive_spec("spec", "Attention block", "", obj, None)
    if not _is_example(obj):
        raise SpecError(
            f"derive() takes a WorkedExample, an ExactAttention, an AttentionSpec or a list "
            f"of them; got {type(obj).__name__}")
    name = str(obj.name)
    title = f"Example {name}" + (f" — {obj.title}" if getattr(obj, "title", "") else "")
    notes = str(getattr(obj, "notes", "") or "")
    att = obj.attention()
    if att is not None:
        steps = _attention_steps(att, getattr(obj, "inputs", None))
        grads = obj.gradients() if hasattr(obj, "gradients") else None
        if grads is not None:
            steps += _backward_steps(grads, att.scale)
        ex = ExampleDerivation(name, title, notes, tuple(steps), tuple(_attention_checks(att)))
    elif getattr(obj, "spec", None) is not None:
        ex = _derive_spec(name, title, notes, obj.spec, obj)
    else:
        raise ExampleFileError(f"example {name!r} has neither inputs nor sizes to derive from")
    return replace(ex, claims=_claim_lines(obj, _records_for(obj, report)))


def derive(
    example_or_attention: Any,
    *,
    format: str = "tex",
    report: Any = None,
    title: str = DEFAULT_TITLE,
    figures: str | Path | None = None,
    relative_to: str | Path | None = None,
) -> Derivation:
    r"""Derive one or more worked examples (or exact attention computations) step by step.

    ``example_or_attention``: a :class:`~mha_symbolic.textbook.examples.WorkedExample`, an
    :class:`~mha_symbolic.exact.engine.ExactAttention`, an
    :class:`~mha_symbolic.exact.spec.AttentionSpec` (shape algebra and counts), or a
    list of them.  ``report``: a :class:`~mha_symbolic.textbook.reports.CheckReport`
    whose records give the verdicts; when omitted, examples with claims are
    checked here.  ``figures``: a directory to draw figures into (needs
    matplotlib); the document refers to them relative to ``relative_to``
    (default: the current directory).

    >>> from mha_symbolic.exact.engine import exact_attention
    >>> d = derive(exact_attention(scores=[[2, 2, 2]], value=[[10], [20], [30]]),
    ...            format="fragment")
    >>> r"w_{11} &= \frac{e^{2}}{e^{2} + e^{2} + e^{2}} = \frac{1}{3}" in d.text
    True
    """
    if format not in FORMATS:
        raise SpecError(f"format={format!r} must be one of {', '.join(FORMATS)}")
    if isinstance(example_or_attention, (list, tuple)):
        items = list(example_or_attention)
        if not items:
            raise SpecError("derive() got an empty list of examples")
    else:
        items = [example_or_attention]
    derived = [_derive_one(obj, report) for obj in items]
    if figures is not None:
        derived = [_with_figures(ex, obj, Path(figures), relative_to, format)
                   for ex, obj in zip(derived, items, strict=True)]
    return Derivation(tuple(derived), format=format, title=title)


def _with_figures(ex: ExampleDerivation, obj: Any, folder: Path,
                  relative_to: str | Path | None, fmt: str) -> ExampleDerivation:
    from .. import figures as fig
    from ..selection import require_matplotlib

    att = obj if not _is_example(obj) else obj.attention()
    if att is None or not hasattr(att, "heads"):
        return ex
    require_matplotlib()          # one line, exit 2, before the folder exists
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".png" if fmt == "markdown" else ".pdf"
    stem = re.sub(r"[^A-Za-z0-9-]+", "-", ex.name).strip("-") or "example"
    base = Path(relative_to) if relative_to is not None else Path.cwd()
    made: list[Figure] = []
    if att.heads[0].weights.cols > 1:
        path = folder / f"{stem}-weights{suffix}"
        # no title: the caption says what it would (a title over a caption repeats it);
        # the keys and queries named as the example names its tokens
        fig.heatmap_figure(att, path, titled=False,
                           **fig._token_labels(att, getattr(obj, "tokens", None)))
        made.append(Figure(str(path), _relative(path, base),
                           "Attention weights (rows: queries, columns: keys), certified values "
                           "rounded to 3 places."))
    collapse = fig.collapse_parameters(att)
    if collapse is not None:
        n, gap = collapse
        path = folder / f"{stem}-collapse{suffix}"
        fig.collapse_figure(path, n_tokens=n, gap=gap)
        made.append(Figure(str(path), _relative(path, base),
                           f"Weight on the dominant token against the score gap ({n} tokens); "
                           f"the dot marks this example's gap ${_tex(gap)}$."))
    return replace(ex, figures=tuple(made))


def _relative(path: Path, base: Path) -> str:
    import os

    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()

# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _select(examples: list[Any], names: Sequence[str] | None) -> list[Any]:
    from ..examples import select_examples

    return select_examples(examples, names)


def _document_title(examples: Sequence[Any], file: str) -> str:
    """The file's own ``title`` when it has one, else "Derivations: FILE"."""
    titles = [str(getattr(e, "file_title", "") or "") for e in examples]
    return titles[0] if titles and titles[0] else f"Derivations: {Path(file).name}"


def cli_derive(args: Any) -> int:
    """``mha-symbolic derive FILE [--format F] [-o OUT] [--example NAME] [--pdf] [--figures]``."""
    from ..._io import check_not_input, output_lock, output_path
    from ..check import check_examples, load_examples

    fmt = args.format
    out = output_path(args.output, inputs=[args.file],
                      default_name=Path(str(args.file)).stem + (".md" if fmt == "markdown" else ".tex")
                      if args.file not in (None, "-") else None)
    if out is not None and args.pdf:  # every output, not only -o, is checked against the input
        check_not_input(out.with_suffix(".pdf"), [args.file], "--pdf")
    if args.pdf and (out is None or fmt != "tex"):
        raise SpecError("--pdf needs -o OUT and --format tex (the default)")
    if args.figures and out is None:
        raise SpecError("--figures needs -o OUT: the figures are written next to it")
    examples = _select(load_examples(args.file), args.example)
    report = check_examples(examples) if any(getattr(e, "claims", None) for e in examples) else None
    if out is None:
        return _derive_run(args, examples, report, None)
    with output_lock(out):  # concurrent runs on one -o take turns (issue 30)
        return _derive_run(args, examples, report, out)


def _derive_run(args: Any, examples: Any, report: Any, out: Path | None) -> int:
    """The derivation of ``cli_derive`` written to ``out`` (stdout when None), with its
    figures and PDF."""
    from ..._io import write_output

    fmt = args.format
    # the figures' folder name goes into \includegraphics: letters, digits, '.', '-' only
    figures_dir = (out.parent / (re.sub(r"[^A-Za-z0-9.-]+", "-", out.stem).strip("-.")
                                 + "-figures") if (args.figures and out) else None)
    derivation = derive(examples, format=fmt, report=report, figures=figures_dir,
                        relative_to=out.parent if out else None,
                        title=_document_title(examples, args.file))
    text = derivation.text
    if out is None:
        print(text, end="")
        return 0
    write_output(out, text)
    if args.pdf:
        from ..._latex import compile_tex

        resources = [f.ref for ex in derivation.examples for f in ex.figures]
        from ...errors import LatexError

        try:
            pdf = compile_tex(out, resources=resources)
        except LatexError:
            # the new .tex is in place: an old PDF of that name would look like its
            # compiled form (issue 30); it is removed, never left beside the new .tex
            out.with_suffix(".pdf").unlink(missing_ok=True)
            raise
        print(f"wrote {sanitize(str(out))} and {sanitize(str(pdf))}")
    else:
        print(f"wrote {sanitize(str(out))}")
    return 0
