"""The ``mha-symbolic prove`` command: the table of theorems, printed row by row as each
is done, with ``--latex DIR``, ``--pdf PATH`` and ``--format json``
(:mod:`mha_symbolic.exact.prove` runs the theorems; this module only drives it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import MhaSymbolicError
from .prove import ProofResult, run_proofs, select_theorems, write_pdf

if TYPE_CHECKING:
    import argparse

__all__ = ["cli_prove"]


def _pdf_target(value: str | None) -> Path | None:
    """``--pdf PATH`` checked before any proof runs: a usable file name in an existing
    folder, and pdflatex on PATH (else one line, exit status 2)."""
    if value is None:
        return None
    from .._io import output_path
    from .._latex import pdflatex_path
    from ..errors import LatexError

    path = output_path(value, option="--pdf")
    if path is None:
        raise MhaSymbolicError("--pdf -: a PDF cannot go to standard output; give a file name")
    if pdflatex_path() is None:
        raise LatexError("--pdf needs pdflatex, which is not on PATH: install a TeX system "
                         "(Debian: apt-get install texlive-latex-base "
                         "texlive-latex-recommended), or use --latex DIR")
    return path


def cli_prove(args: argparse.Namespace) -> int:
    """``mha-symbolic prove [--only NAME] [--latex DIR] [--pdf PATH] [--format text|json]``.

    In text format each theorem's row is printed (and flushed) as soon as the theorem
    is done, so a long run shows its progress."""
    from .._text import sanitize
    from .proof_render import (
        SUMMARY_HEADER,
        column_widths,
        format_row,
        held_phrase,
        plain_text,
        proved_and_stated,
        summary_row,
    )

    pdf = _pdf_target(getattr(args, "pdf", None))
    if args.latex is not None:
        from .._io import check_name

        check_name(args.latex, "--latex ")
    theorems = select_theorems(args.only)  # unknown names refused before anything runs
    as_json = getattr(args, "format", "text") == "json"
    widths = column_widths([t.name for t in theorems])

    def show_row(r: ProofResult) -> None:
        print(format_row([sanitize(c) for c in summary_row(r)], widths), flush=True)

    if not as_json:
        print(format_row(SUMMARY_HEADER, widths))
        print(format_row(["-" * max(w, len(h), 6 if k == len(widths) - 1 else 0)
                          for k, (w, h) in enumerate(zip(widths, SUMMARY_HEADER, strict=True))],
                         widths), flush=True)
    start = time.perf_counter()
    results = run_proofs(only=[t.name for t in theorems], latex_dir=args.latex,
                         on_result=None if as_json else show_row)
    if pdf is not None:
        write_pdf(results, pdf)
    total = time.perf_counter() - start
    failed = [r for r in results if not r.ok]
    if as_json:
        print(json.dumps({"ok": not failed, "seconds": round(total, 3),
                          "results": [r.to_dict() for r in results]}, indent=2))
        return 0 if not failed else 1
    for r in failed:
        print(f"\n{r.status}: theorem {r.number} ({r.name}): {sanitize(r.message)}")
    for r in results:
        for c in r.checks:
            if c.status == "skipped":
                print(f"skipped: theorem {r.number} ({r.name}): {plain_text(c.what)}: "
                      f"{sanitize(c.detail)}")
    held = len(results) - len(failed)
    print(f"\n{held_phrase(held, len(results)).capitalize()}{proved_and_stated(results)} "
          f"({total:.1f} s)")
    if args.latex:
        print(f"LaTeX written to {sanitize(str(Path(args.latex) / 'proofs.tex'))}")
    if pdf is not None:
        print(f"PDF written to {sanitize(str(pdf))}")
    return 0 if not failed else 1
