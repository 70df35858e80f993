r"""Shared LaTeX utilities: wrap a fragment in a document, find and run pdflatex.

Used by ``mha-symbolic prove --latex`` and by the derivations writer.  Nothing
here imports SymPy; the fragments are produced by the callers (with
``sympy.latex``) and only need ``amsmath`` and ``amssymb``.

>>> doc = standalone_document(r"$1 + 1 = 2$", title="Arithmetic")
>>> print(doc.splitlines()[0])
\documentclass[11pt]{article}
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .errors import LatexError

__all__ = ["compile_tex", "latex_escape", "latex_text", "pdflatex_path", "standalone_document"]

# Characters that are special in LaTeX text mode, with their escaped forms.
_TEXT_ESCAPES: dict[str, str] = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    # mathematical unicode the library prints, so that pdflatex never meets it raw
    "×": r"\ensuremath{\times}",
    "·": r"\ensuremath{\cdot}",
    "−": "-",
    "≈": r"\ensuremath{\approx}",
    "≤": r"\ensuremath{\le}",
    "≥": r"\ensuremath{\ge}",
    "≠": r"\ensuremath{\ne}",
    "∞": r"\ensuremath{\infty}",
    "²": r"\ensuremath{^2}",
    "√": r"\ensuremath{\surd}",
    "→": r"\ensuremath{\to}",
}
_TEXT_ESCAPE_RE = re.compile("|".join(re.escape(c) for c in _TEXT_ESCAPES))


def latex_escape(text: str) -> str:
    r"""Escape ``text`` for LaTeX text mode (``&``, ``%``, ``_`` ..., and the
    mathematical unicode the library prints: ``×``, ``·``, ``≤`` ...).

    >>> latex_escape("d_k & 50%")
    'd\\_k \\& 50\\%'
    """
    return _TEXT_ESCAPE_RE.sub(lambda m: _TEXT_ESCAPES[m.group(0)], text)


def latex_text(text: str) -> str:
    r"""Text with inline math: ``$...$`` segments pass through, the rest is escaped.

    An unmatched ``$`` is escaped like any other special character.

    >>> latex_text("weights sum to $1$ & more")
    'weights sum to $1$ \\& more'
    """
    parts = text.split("$")
    if len(parts) % 2 == 0:  # odd number of '$': treat the text as plain
        return latex_escape(text)
    return "".join(f"${p}$" if k % 2 else latex_escape(p) for k, p in enumerate(parts))


def standalone_document(body: str, *, title: str) -> str:
    r"""Wrap the LaTeX fragment ``body`` in a complete ``article`` document.

    Only ``amsmath`` and ``amssymb`` are loaded, so the result compiles with a
    minimal TeX Live (Debian ``texlive-latex-base`` + ``texlive-latex-recommended``).
    ``title`` is plain text and is escaped.

    >>> "\\begin{document}" in standalone_document("x", title="T")
    True
    """
    return (
        "\\documentclass[11pt]{article}\n"
        "\\usepackage{amsmath}\n"
        "\\usepackage{amssymb}\n"
        "\\allowdisplaybreaks\n"
        # wider text than the article default (no geometry package: amsmath/amssymb only)
        "\\setlength{\\textwidth}{6.2in}\n"
        "\\setlength{\\oddsidemargin}{0.15in}\n"
        "\\setlength{\\evensidemargin}{0.15in}\n"
        "\\setlength{\\parindent}{0pt}\n"
        "\\setlength{\\parskip}{0.5em}\n"
        f"\\title{{{latex_escape(title)}}}\n"
        "\\date{}\n"
        "\\begin{document}\n"
        "\\maketitle\n"
        f"{body.rstrip()}\n"
        "\\end{document}\n"
    )


def pdflatex_path() -> str | None:
    """The full path of ``pdflatex`` on ``PATH``, or ``None`` when there is none.

    >>> p = pdflatex_path()
    >>> p is None or p.endswith("pdflatex")
    True
    """
    return shutil.which("pdflatex")


def compile_tex(tex_file: Path, *, runs: int = 2, timeout: float = 120) -> Path:
    """Run ``pdflatex`` ``runs`` times on ``tex_file`` in its directory; return the PDF path.

    pdflatex runs with ``-interaction=nonstopmode -halt-on-error``.  Raises
    :class:`~mha_symbolic.errors.LatexError` with the first LaTeX error
    line (``! Undefined control sequence.`` and the line it points at) when the
    document does not compile, when pdflatex is absent, or when a run takes
    longer than ``timeout`` seconds.
    """
    tex_file = Path(tex_file)
    if runs < 1:
        raise LatexError(f"runs={runs} must be at least 1")
    if not tex_file.is_file():
        raise LatexError(f"tex_file={str(tex_file)!r} does not exist")
    exe = pdflatex_path()
    if exe is None:
        raise LatexError(
            "pdflatex is not on PATH: install a TeX system "
            "(Debian: apt-get install texlive-latex-base texlive-latex-recommended)"
        )
    workdir = tex_file.resolve().parent
    cmd = [exe, "-interaction=nonstopmode", "-halt-on-error", tex_file.name]
    for run in range(1, runs + 1):
        try:
            proc = subprocess.run(
                cmd, cwd=workdir, capture_output=True, text=True,
                errors="replace", timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            raise LatexError(
                f"pdflatex on {tex_file.name} took longer than timeout={timeout} s "
                f"(run {run} of {runs})"
            ) from None
        if proc.returncode != 0:
            log = workdir / (tex_file.stem + ".log")
            text = log.read_text(errors="replace") if log.is_file() else proc.stdout
            raise LatexError(
                f"pdflatex failed on {tex_file.name} (exit {proc.returncode}, run {run}): "
                f"{_first_error(text)}"
            )
    pdf = workdir / (tex_file.stem + ".pdf")
    if not pdf.is_file():
        raise LatexError(f"pdflatex ran on {tex_file.name} but wrote no {pdf.name}")
    return pdf


def _first_error(log: str) -> str:
    """The first ``! ...`` error of a TeX log and the ``l.<n>`` line that follows it."""
    lines = log.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("!"):
            where = next((x.strip() for x in lines[k + 1 : k + 12] if x.startswith("l.")), "")
            return f"{line[1:].strip()} {where}".strip()
    tail = [x for x in lines if x.strip()][-3:]
    return " / ".join(tail) or "no error message in the log"
