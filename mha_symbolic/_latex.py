r"""Shared LaTeX utilities: wrap a fragment in a document, find and run pdflatex.

Used by ``mha-symbolic prove --latex`` and by the derivations writer.  Nothing
here imports SymPy; the fragments are produced by the callers (with
``sympy.latex``) and only need ``amsmath`` and ``amssymb``.

>>> doc = standalone_document(r"$1 + 1 = 2$", title="Arithmetic")
>>> print(doc.splitlines()[0])
\documentclass[11pt]{article}
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._io import write_atomic
from .errors import LatexError

__all__ = ["compile_tex", "latex_escape", "latex_text", "pdflatex_path", "smart_quotes",
           "standalone_document", "textbook_document"]

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
    # typographic quotes (smart_quotes makes them of ASCII ones): TeX's own ligatures
    "‘": "`", "’": "'", "“": "``", "”": "''",
}
# control characters (and TeX's end-of-line and invalid characters) never reach TeX raw
_CONTROL_CLASS = ("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                  "\u2066-\u2069]")
_TEXT_ESCAPE_RE = re.compile(_CONTROL_CLASS + "|" + "|".join(re.escape(c) for c in _TEXT_ESCAPES))


def _escape_one(m: re.Match[str]) -> str:
    c = m.group(0)
    if c in _TEXT_ESCAPES:
        return _TEXT_ESCAPES[c]
    return rf"\texttt{{[U+{ord(c):04X}]}}"


def latex_escape(text: str) -> str:
    r"""Escape ``text`` for LaTeX text mode (``&``, ``%``, ``_`` ..., and the
    mathematical unicode the library prints: ``×``, ``·``, ``≤`` ...); a control
    character becomes a visible ``[U+001B]``.  Every backslash, brace, ``$``, ``^``
    and ``%`` is escaped, so no command, math, ``^^`` escape or comment can come
    from ``text``.

    >>> latex_escape("d_k & 50%")
    'd\\_k \\& 50\\%'
    """
    return _TEXT_ESCAPE_RE.sub(_escape_one, text)


#: A quote mark here opens a quotation: at the start, after a space, an opening bracket,
#: a dash or another opening quote.
_OPENS_AFTER = " \t\n([{<\u2014\u2013-/\u2018\u201c"


def smart_quotes(text: str, before: str = "") -> str:
    r"""ASCII quotes as typographic ones, which :func:`latex_escape` sets as TeX's
    ```` ` ```` / ``'`` and ```` `` ```` / ``''``: TeX prints a straight ``'`` as a
    closing quote, so ``'it'`` would read ’it’.  A ``'`` or ``"`` opens a quotation
    when it follows ``before`` + the text's start, a space, an opening bracket, a dash
    or another opening quote (and is followed by something other than a space); every
    other ``'`` is an apostrophe or a closing quote.  ``before``: the character that
    precedes ``text`` where it is part of a longer text (``""``: none).

    >>> smart_quotes("the 'it' row, \"cat\" and don't")
    'the ‘it’ row, “cat” and don’t'
    """
    out: list[str] = []
    prev = before[-1:] if before else ""
    for k, ch in enumerate(text):
        if ch in "'\"":
            nxt = text[k + 1:k + 2]
            opens = (prev == "" or prev in _OPENS_AFTER) and nxt not in ("", " ", "\t", "\n")
            ch = ("‘" if opens else "’") if ch == "'" else ("“" if opens else "”")
        out.append(ch)
        prev = ch
    return "".join(out)


def latex_text(text: str) -> str:
    r"""Text with inline math: ``$...$`` segments pass through, the rest is escaped.

    For the library's *own* markup only (the proofs' reasons): the math passes to
    LaTeX verbatim, so text read from a file must go through :func:`latex_escape`
    instead.  An unmatched ``$`` is escaped like any other special character.

    >>> latex_text("weights sum to $1$ & more")
    'weights sum to $1$ \\& more'
    """
    parts = text.split("$")
    if len(parts) % 2 == 0:  # odd number of '$': treat the text as plain
        return latex_escape(text)
    return "".join(f"${p}$" if k % 2 else latex_escape(p) for k, p in enumerate(parts))


def standalone_document(body: str, *, title: str, packages: Sequence[str] = ()) -> str:
    r"""Wrap the LaTeX fragment ``body`` in a complete ``article`` document.

    Only ``amsmath`` and ``amssymb`` are loaded, so the result compiles with a
    minimal TeX Live (Debian ``texlive-latex-base`` + ``texlive-latex-recommended``).
    ``packages`` adds more (``("booktabs", "array")``: both in
    ``texlive-latex-recommended``/``-base``); each must be a plain package name.
    ``title`` is plain text and is escaped.

    >>> "\\begin{document}" in standalone_document("x", title="T")
    True
    """
    for name in packages:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", name):
            raise LatexError(f"packages: {name!r} is not a LaTeX package name")
    extra = "".join(f"\\usepackage{{{name}}}\n" for name in packages)
    return (
        "\\documentclass[11pt]{article}\n"
        "\\usepackage{amsmath}\n"
        "\\usepackage{amssymb}\n"
        f"{extra}"
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


#: Packages :func:`textbook_document` loads (all in Debian's texlive-latex-base,
#: -latex-recommended): amsmath/amssymb for the mathematics, booktabs for tables.
TEXTBOOK_PACKAGES = ("amsmath", "amssymb", "booktabs")


def textbook_document(body: str, *, title: str, packages: Sequence[str] = (),
                      intro: str = "", title_tex: str | None = None) -> str:
    r"""Wrap ``body`` in an ``article`` set as a mathematics textbook sets its pages.

    amsmath, amssymb and booktabs (and ``packages``, e.g. ``graphicx``); displays are
    *not* broken across pages (no ``\allowdisplaybreaks``: a caller splits a display
    that is too long for a page into several); a ragged bottom, so that keeping a
    display whole never stretches a page's glue; floats allowed to fill most of a page
    (a figure stays beside its caption, in one ``figure``).  ``title`` is plain text
    and is escaped (its quotes made typographic); ``title_tex``, when given, is the
    title as LaTeX already (the caller built it from escaped text); ``intro`` is LaTeX,
    set before ``body``.

    >>> doc = textbook_document("x", title="T", packages=["graphicx"])
    >>> "\\usepackage{booktabs}" in doc and "\\allowdisplaybreaks[1]" in doc
    True
    """
    for name in packages:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", name):
            raise LatexError(f"packages: {name!r} is not a LaTeX package name")
    loaded = [*TEXTBOOK_PACKAGES, *[p for p in packages if p not in TEXTBOOK_PACKAGES]]
    return (
        "\\documentclass[11pt]{article}\n"
        + "".join(f"\\usepackage{{{name}}}\n" for name in loaded)
        + "\\setlength{\\textwidth}{6.2in}\n"
        "\\setlength{\\oddsidemargin}{0.15in}\n"
        "\\setlength{\\evensidemargin}{0.15in}\n"
        "\\setlength{\\textheight}{8.6in}\n"
        "\\setlength{\\topmargin}{-0.25in}\n"
        "\\setlength{\\parindent}{0pt}\n"
        "\\setlength{\\parskip}{0.5em plus 0.2em minus 0.1em}\n"
        "\\raggedbottom\n"
        # headings ragged-right (a title with math never runs into the margin), and a
        # third pass of line breaking with extra stretch before a line may overflow
        "\\makeatletter\n"
        "\\renewcommand\\section{\\@startsection{section}{1}{\\z@}{-3.5ex \\@plus -1ex "
        "\\@minus -.2ex}{2.3ex \\@plus.2ex}{\\normalfont\\Large\\bfseries\\raggedright}}\n"
        "\\renewcommand\\subsection{\\@startsection{subsection}{2}{\\z@}{-3.25ex\\@plus -1ex "
        "\\@minus -.2ex}{1.5ex \\@plus .2ex}{\\normalfont\\large\\bfseries\\raggedright}}\n"
        "\\setlength{\\emergencystretch}{2em}\n"
        # \needspace{h} (the needspace package's \Needspace, which is not in the minimal
        # TeX Live): a page break here unless h of the page is left, so that a heading
        # is never stranded above the display or table it introduces
        "\\providecommand{\\needspace}[1]{\\par\\penalty-100\\begingroup"
        "\\setlength{\\dimen@}{#1}\\dimen@ii\\pagegoal\\advance\\dimen@ii-\\pagetotal"
        "\\ifdim\\dimen@>\\dimen@ii\\ifdim\\dimen@ii>\\z@\\vfil\\fi\\penalty-\\@M\\fi"
        "\\endgroup}\n"
        "\\makeatother\n"
        # a long display may break between its equations, never inside one: a row that
        # continues an equation (``&= ...``) is joined to it by ``\\*``
        "\\allowdisplaybreaks[1]\n"
        # a figure may fill a page and sit near the top with little text: never split
        # from its caption (one float), never pushed to the document's end
        "\\renewcommand{\\topfraction}{0.85}\n"
        "\\renewcommand{\\textfraction}{0.1}\n"
        "\\renewcommand{\\floatpagefraction}{0.75}\n"
        f"\\title{{{latex_escape(smart_quotes(title)) if title_tex is None else title_tex}}}\n"
        "\\author{}\n"
        "\\date{}\n"
        "\\begin{document}\n"
        "\\maketitle\n"
        + (intro.rstrip() + "\n\n" if intro else "")
        + f"{body.rstrip()}\n"
        "\\end{document}\n"
    )


def pdflatex_path() -> str | None:
    """The full path of ``pdflatex`` on ``PATH``, or ``None`` when there is none.

    >>> p = pdflatex_path()
    >>> p is None or p.endswith("pdflatex")
    True
    """
    return shutil.which("pdflatex")


#: kpathsea settings for every pdflatex run: reading and writing only inside the working
#: directory ("p" = paranoid: no absolute paths, no "..", no dot files), no shell.
_SAFE_TEX_ENV = {"openin_any": "p", "openout_any": "p", "shell_escape": "f"}


def _resource_path(resource: str | Path) -> Path:
    rel = Path(resource)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise LatexError(f"resource={str(resource)!r} must be a relative path inside the "
                         "document's folder")
    return rel


def compile_tex(tex_file: Path, *, runs: int = 2, timeout: float = 120,
                resources: Sequence[str | Path] = (), log_to: Path | None = None) -> Path:
    """Run ``pdflatex`` ``runs`` times on ``tex_file``; return the PDF written beside it.

    pdflatex never runs in the folder of ``tex_file``: the document is copied into a
    private temporary directory (with ``resources``, files the document includes, given
    relative to the document's folder), compiled there, and only the PDF is copied
    back.  pdflatex runs with ``-no-shell-escape`` (``\\write18`` runs nothing, not even
    the restricted shell), with kpathsea's ``openin_any`` and ``openout_any`` set to
    ``p`` (paranoid: ``\\input`` and ``\\openout`` can reach no absolute path, no
    ``..`` and no dot file), ``-interaction=nonstopmode -halt-on-error``, and each run
    is stopped after ``timeout`` seconds.  So a document built from a hostile file can
    neither read a system file nor write anywhere but the temporary directory.
    ``log_to``: also copy pdflatex's log there (nothing else is ever copied out).

    Raises :class:`~mha_symbolic.errors.LatexError` with the first LaTeX error line
    (``! Undefined control sequence.`` and the line it points at) when the document
    does not compile, when pdflatex is absent, or when a run takes too long.
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
    folder = tex_file.resolve().parent
    env = {k: v for k, v in os.environ.items() if k not in ("TEXMFOUTPUT", "TEXMFVAR_WRITE")}
    env.update(_SAFE_TEX_ENV)
    with tempfile.TemporaryDirectory(prefix="mha-symbolic-tex-") as tmp:
        work = Path(tmp)
        shutil.copyfile(tex_file, work / "document.tex")
        for resource in resources:
            rel = _resource_path(resource)
            source = folder / rel
            if not source.is_file():
                raise LatexError(f"resource {str(rel)!r} of {tex_file.name} does not exist")
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, work / rel)
        cmd = [exe, "-no-shell-escape", "-interaction=nonstopmode", "-halt-on-error",
               "document.tex"]
        for run in range(1, runs + 1):
            try:
                proc = subprocess.run(
                    cmd, cwd=work, env=env, capture_output=True, text=True,
                    errors="replace", timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                raise LatexError(
                    f"pdflatex on {tex_file.name} took longer than timeout={timeout} s "
                    f"(run {run} of {runs})"
                ) from None
            if proc.returncode != 0:
                log = work / "document.log"
                text = log.read_text(errors="replace") if log.is_file() else proc.stdout
                raise LatexError(
                    f"pdflatex failed on {tex_file.name} (exit {proc.returncode}, run {run}): "
                    f"{_first_error(text)}"
                )
        built = work / "document.pdf"
        if not built.is_file():
            raise LatexError(f"pdflatex ran on {tex_file.name} but wrote no PDF")
        pdf = tex_file.with_suffix(".pdf")
        write_atomic(pdf, built.read_bytes())  # an existing PDF is replaced whole or kept
        if log_to is not None:
            shutil.copyfile(work / "document.log", log_to)
    return pdf


def _first_error(log: str) -> str:
    """The first ``! ...`` error of a TeX log and the ``l.<n>`` line that follows it."""
    lines = log.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("!"):
            where = next((x.strip() for x in lines[k + 1 : k + 12] if x.startswith("l.")), "")
            return _cut(f"{line[1:].strip()} {where}".strip())
    tail = [x for x in lines if x.strip()][-3:]
    return _cut(" / ".join(tail) or "no error message in the log")


def _cut(text: str, limit: int = 300) -> str:
    """A line of the TeX log for a message: control characters visible, at most ``limit``."""
    from ._text import sanitize

    text = sanitize(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
