"""What must hold for every input, however hostile (issue 15).

Each ``run_*`` function feeds one input to one entry point and returns the list of
*problems* it found (empty: the input was handled correctly).  A problem is a
category and a detail:

``foreign-exception``   an exception that is not a ``MhaSymbolicError`` (a traceback)
``bad-message``         an error message on several lines, over 1500 characters, or
                        holding a control character
``control-in-report``   a control character in a report (text, Markdown, JSON, HTML),
                        a derivation, or anything the command line printed
``tex-injection``       a TeX primitive that could read, write or run something
                        (``\\input``, ``\\openout``, ``\\write``, ``^^`` …) in LaTeX output
``markup-injection``    markup from a file live in a Markdown or HTML rendering: a raw
                        ``<script``/``<img``/``<iframe`` tag, a ``](javascript:`` link or an
                        ``![`` image that no backslash escapes
``file-outside``        a file written outside the output folder
``bad-exit``            a command-line exit status outside 0, 1, 2, 4 (3 is an internal
                        error), or an error that is not exactly one line
``over-time``           added by the callers: more than the per-input time limit

What the functions return is data; :mod:`.long` counts it, the quick tests assert it
is empty.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mha_symbolic._text import has_control
from mha_symbolic.errors import MhaSymbolicError

from .generators import CliCall

REPO_ROOT = Path(__file__).resolve().parents[2]

#: TeX primitives and macros that read or write files, run programs or change how TeX
#: reads its input: none may come out of a derivation (ours never uses them; a file's
#: text is always escaped).
DANGEROUS_TEX = re.compile(
    r"\\(?:input|include|openout|openin|write|immediate|catcode|csname|special|def|edef|gdef|"
    r"xdef|let|read|directlua|endinput|scantokens|lowercase|uppercase|usepackage\{[^a]"
    r")(?![A-Za-z])|\^\^")

MAX_MESSAGE = 1500

#: Markup that a file's text must never turn into live Markdown or HTML (the payloads of
#: generators.MARKUP); in Markdown a backslash before it makes it text.
_LIVE_MARKDOWN = re.compile(r"(?<!\\)<(?:script|img|iframe)|(?<!\\)\]\(javascript:|(?<!\\)!\[",
                            re.IGNORECASE)
_LIVE_HTML = re.compile(r"<(?:script|img|iframe)", re.IGNORECASE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")

Problems = list[tuple[str, str]]


def _message_problems(exc: BaseException) -> Problems:
    msg = str(exc)
    problems: Problems = []
    if "\n" in msg or len(msg) > MAX_MESSAGE or not msg.strip():
        problems.append(("bad-message", f"{type(exc).__name__}: {msg[:300]!r}"))
    elif has_control(msg):
        problems.append(("bad-message", f"control character in {type(exc).__name__}: {msg[:300]!r}"))
    return problems


def _foreign(exc: BaseException) -> Problems:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
    return [("foreign-exception", f"{type(exc).__name__}: {str(exc)[:300]} | {tb[-1500:]}")]


@contextlib.contextmanager
def _guard(problems: Problems) -> Iterator[None]:
    """Only MhaSymbolicError may escape (checked for a good message); anything else is a
    foreign exception.  Time-limit and interrupt signals pass through."""
    try:
        yield
    except MhaSymbolicError as exc:
        problems.extend(_message_problems(exc))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        if type(exc).__name__ == "OverLimit":
            raise
        problems.extend(_foreign(exc))


def _markup(text: str, what: str, *, markdown: bool = True) -> Problems:
    """Live markup from a file's text in a Markdown (code spans are inert) or HTML
    rendering."""
    if markdown:
        text = _CODE_SPAN.sub("", text)
    m = (_LIVE_MARKDOWN if markdown else _LIVE_HTML).search(text)
    if m:
        return [("markup-injection", f"{what}: {text[max(0, m.start() - 80):m.end() + 40]!r}")]
    return []


def _control_lines(text: str, what: str) -> Problems:
    """Control characters in a rendering (newlines separate lines and are allowed)."""
    for line in text.split("\n"):
        if has_control(line):
            return [("control-in-report", f"{what}: {line[:200]!r}")]
    return []


# -- entry points ---------------------------------------------------------------------------


def run_number(text: str) -> Problems:
    from mha_symbolic.exact.grammar import parse_number

    problems: Problems = []
    with _guard(problems):
        value = parse_number(text)
        import sympy as sp

        if not isinstance(value, sp.Expr) or value.free_symbols or value.has(
                sp.nan, sp.zoo, sp.oo, -sp.oo, sp.I):
            problems.append(("foreign-exception", f"parse_number gave {str(value)[:100]!r}"))
    return problems


def run_claim(text: str, value_text: str) -> Problems:
    """Read a printed answer; judge it against an exact value (itself from the grammar)."""
    from fractions import Fraction

    from mha_symbolic.exact.grammar import parse_number
    from mha_symbolic.textbook.claims import parse_printed
    from mha_symbolic.textbook.verdicts import describe, holds, judge

    problems: Problems = []
    with _guard(problems):
        parse_printed(text, shape=True)
    with _guard(problems):
        p = parse_printed(text)
        value = parse_number(value_text)
        rtol = Fraction(1, 10**6)
        if p.kind == "tuple":
            holds((value,) * len(p.parts), p, rtol)
        elif p.kind != "shape":
            j = judge(value, p, rtol)
            for part in (j.rounded, j.error_units, j.detail):
                if part and has_control(part):
                    problems.append(("control-in-report", f"judgement: {part[:200]!r}"))
            describe(value, 15)
    return problems


def _report_problems(report: Any) -> Problems:
    problems: Problems = []
    problems += _control_lines(report.text(), "text report")
    md, page = report.markdown(), report._repr_html_()
    problems += _control_lines(md, "markdown report") + _markup(md, "markdown report")
    problems += _control_lines(page, "html report") + _markup(page, "html report",
                                                              markdown=False)
    raw = report.json()
    problems += _control_lines(raw, "json report")
    try:
        json.loads(raw)
    except ValueError as exc:
        problems.append(("foreign-exception", f"report.json() is not JSON: {exc}"))
    return problems


def run_document(text: str) -> Problems:
    """Load a worked-example file, check it, render every report format."""
    from mha_symbolic.textbook import check_examples, load_examples

    problems: Problems = []
    with _guard(problems):
        report = check_examples(load_examples(text=text))
        problems += _report_problems(report)
    return problems


def run_source(text: str, fmt: str) -> Problems:
    """Check an author's file (issue 26) and render every report format."""
    from mha_symbolic.textbook.sources import check_source

    problems: Problems = []
    with _guard(problems):
        report = check_source(text=text, fmt=fmt, name="fuzzed")
        problems += _control_lines(report.text(not_judged=True), "source text report")
        md = report.markdown(not_judged=True)
        problems += _control_lines(md, "source markdown report") + _markup(md, "source markdown report")
        raw = report.json()
        problems += _control_lines(raw, "source json report")
        try:
            json.loads(raw)
        except ValueError as exc:
            problems.append(("foreign-exception", f"report.json() is not JSON: {exc}"))
        for r in report.records:
            if r.kind == "statement" and r.verdict in ("wrong", "undecided") and not r.relations:
                problems.append(("foreign-exception", f"a verdict without relations: {r!r:.200}"))
    return problems


def run_derivation(text: str, fmt: str) -> Problems:
    """Load a worked-example file and derive it (LaTeX document, fragment or Markdown)."""
    from mha_symbolic.textbook import load_examples
    from mha_symbolic.textbook.derivation import derive

    problems: Problems = []
    with _guard(problems):
        d = derive(load_examples(text=text), format=fmt)
        out = d.text
        problems += _control_lines(out, f"derivation ({fmt})")
        if fmt == "markdown":
            problems += _markup(out, "derivation (markdown)")
        else:
            m = DANGEROUS_TEX.search(out)
            if m:
                around = out[max(0, m.start() - 80):m.end() + 40]
                problems.append(("tex-injection", f"{m.group(0)!r} in {around!r}"))
    return problems


# -- the command line -------------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, float]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath, f)
            with contextlib.suppress(OSError):
                out[str(p.relative_to(root))] = p.stat().st_mtime_ns
    return out


def _tex_dirs() -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {p.name for p in tmp.glob("mha-symbolic-tex-*")}


def _cli_output_problems(rc: int, out: str, err: str, call: CliCall) -> Problems:
    problems: Problems = []
    if rc == 3 or "Traceback" in err or "internal error" in err:
        problems.append(("foreign-exception", f"exit {rc}: {err[-1500:]!r} argv={call.argv!r}"))
    elif rc not in (0, 1, 2, 4):
        problems.append(("bad-exit", f"exit {rc}: {err[-500:]!r} argv={call.argv!r}"))
    elif rc == 2:
        # one line per error: a refused input, or each unreadable claim of a checked file
        lines = [x for x in err.splitlines() if x.strip()]
        if not lines or not all(x.startswith("mha-symbolic") for x in lines):
            problems.append(("bad-exit", f"exit 2 with stderr {err[-500:]!r} argv={call.argv!r}"))
        elif any(len(x) > MAX_MESSAGE + 200 for x in lines):
            problems.append(("bad-message", f"{max(lines, key=len)[:300]!r}"))
    problems += _control_lines(out, f"stdout of {call.argv[:2]!r}")
    problems += _control_lines(err, f"stderr of {call.argv[:2]!r}")
    return problems


def _prepare(call: CliCall, root: Path) -> None:
    (root / "in").mkdir()
    (root / "out").mkdir()
    for name, text in call.files.items():
        with open(root / "in" / name, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)


def _outputs(call: CliCall) -> tuple[str, ...]:
    """What the call names as its output (``-o PATH``): that file, the PDF beside it and
    its figures' folder may be written, wherever it is."""
    argv = call.argv
    for k, a in enumerate(argv[:-1]):
        if a in ("-o", "--output") and argv[k + 1] not in ("", "-"):
            path = os.path.normpath(argv[k + 1])
            stem = os.path.splitext(path)[0]
            return (path, stem + ".pdf", stem + "-figures")
    return ()


def _files_outside(before: dict[str, float], after: dict[str, float],
                   allowed: tuple[str, ...] = ()) -> Problems:
    new = [p for p, t in after.items() if (p not in before or before[p] != t)
           and not p.startswith("out" + os.sep) and p != "out"
           and not any(p == a or p.startswith(a + os.sep) for a in allowed)]
    return [("file-outside", f"written: {new[:5]!r}")] if new else []


def run_cli_inprocess(call: CliCall) -> Problems:
    """``mha_symbolic.cli.main(argv)`` in this process, in a sandbox folder."""
    from mha_symbolic.cli import main

    problems: Problems = []
    with tempfile.TemporaryDirectory(prefix="mha-fuzz-") as tmp:
        root = Path(tmp)
        _prepare(call, root)
        before = _snapshot(root)
        tex_before = _tex_dirs()
        out, err = io.StringIO(), io.StringIO()
        stdin = io.TextIOWrapper(io.BytesIO(call.stdin.encode("utf-8", "surrogatepass")),
                                 encoding="utf-8", errors="surrogateescape")
        old = os.getcwd()
        saved = sys.stdin
        try:
            os.chdir(root)
            sys.stdin = stdin
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(list(call.argv))
                except SystemExit as exc:  # argparse: --help, --version, usage errors
                    rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            if type(exc).__name__ == "OverLimit":
                raise
            return _foreign(exc)
        finally:
            sys.stdin = saved
            os.chdir(old)
        problems += _cli_output_problems(rc, out.getvalue(), err.getvalue(), call)
        problems += _files_outside(before, _snapshot(root), _outputs(call))
        if _tex_dirs() - tex_before:
            problems.append(("file-outside", "a pdflatex working directory was left behind"))
    return problems


def run_cli_subprocess(call: CliCall, timeout: float = 120) -> tuple[Problems, float]:
    """``python -m mha_symbolic ARGV`` in a fresh interpreter with the call's terminal
    encoding; returns the problems and the child's CPU seconds."""
    import resource

    problems: Problems = []
    with tempfile.TemporaryDirectory(prefix="mha-fuzz-") as tmp:
        root = Path(tmp)
        _prepare(call, root)
        before = _snapshot(root)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["PYTHONIOENCODING"] = call.encoding
        env.pop("MHA_SYMBOLIC_DEBUG", None)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        # an argument the OS can carry: a lone surrogate outside U+DC80–U+DCFF (which
        # no real argv holds) becomes U+FFFD; NUL, which no argv can hold, becomes '?'
        argv = [a.encode("utf-8", "surrogateescape" if all(
            not 0xD800 <= ord(c) < 0xDC80 for c in a) else "replace").decode(
            "utf-8", "surrogateescape").replace("\x00", "?") for a in call.argv]
        try:
            proc = subprocess.run([sys.executable, "-m", "mha_symbolic", *argv],
                                  input=call.stdin.encode("utf-8", "surrogatepass"),
                                  capture_output=True, cwd=root, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [("over-time", f"subprocess ran past {timeout} s: {call.argv!r}")], timeout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
        out = proc.stdout.decode(call.encoding, errors="replace")
        err = proc.stderr.decode(call.encoding, errors="replace")
        problems += _cli_output_problems(proc.returncode, out, err, call)
        problems += _files_outside(before, _snapshot(root), _outputs(call))
    return problems, cpu
