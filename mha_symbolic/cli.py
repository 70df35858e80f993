"""The ``mha-symbolic`` command line.

Each subcommand's arguments are declared here; its work is done by a
``cli_<name>(args) -> int`` function in the module that owns the concept,
imported only when that subcommand runs (so ``--help`` stays fast).

Exit status: 0 success; 1 a checked statement is false (a wrong claim, a failed
proof); 2 unusable input (one line on stderr, never a traceback); 3 an internal error
(a bug of ours: one line on stderr; ``--debug`` or ``MHA_SYMBOLIC_DEBUG=1`` shows
the traceback); 4 (``check``) no claim is wrong but some could not be decided;
130 interrupted.

Everything printed is safe on any terminal: text read from files has its control
characters made visible, and on a stream whose encoding cannot show ✓ ✗ ≈ − × …
(``PYTHONIOENCODING=ascii``, cp1252) they are written as ASCII (``ok``, ``XX``,
``~``, ``-``, ``x``) instead of failing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from ._startup import release
from ._text import register_ascii_fallback, sanitize
from .errors import MhaSymbolicError

PROG = "mha-symbolic"

# subcommand -> (module, function)
_HANDLERS: dict[str, tuple[str, str]] = {
    "shapes": ("exact.shapes", "cli_shapes"),
    "params": ("exact.params", "cli_params"),
    "check": ("textbook.check", "cli_check"),
    "examples": ("textbook.bundled", "cli_examples"),
    "derive": ("textbook.selection", "cli_derive"),
    "plot": ("textbook.selection", "cli_plot"),
    "prove": ("exact.prove_cli", "cli_prove"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit status 2; its description
    is wrapped here (the formatter keeps it and the examples' layout as written)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("description"):
            import textwrap

            kwargs["description"] = textwrap.fill(kwargs["description"], 79)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


def _selection(p: argparse.ArgumentParser, *, repeat: bool) -> None:
    """``--example SET[:EXAMPLE]`` and ``--only NAME``: one meaning in every command
    (see :mod:`mha_symbolic.textbook.selection`)."""
    action = "append" if repeat else "store"
    again = " (repeatable)" if repeat else ""
    p.add_argument("--example", action=action, metavar="SET[:EXAMPLE]",
                   help=f"a bundled set instead of a file: seed, books, books/NAME, optionally "
                   f"one example of it, as in seed:D{again} (see `mha-symbolic examples`)")
    p.add_argument("--only", action=action, metavar="NAME",
                   help=f"only the example of this name{again}" + (
                       "" if repeat else " (needed when the file has several)"))


def _dims(p: argparse.ArgumentParser, *, symbolic_default: bool) -> None:
    note = " (omit to keep it symbolic)" if symbolic_default else ""
    p.add_argument("--d-model", type=str, help=f"model width d_model{note}")
    p.add_argument("--heads", type=str, help=f"number of query heads h{note}")
    p.add_argument("--kv-heads", type=str,
                   help="number of key/value heads (GQA; 1 = MQA; default: heads)")
    p.add_argument("--d-k", type=str, help="query/key width per head (default d_model/heads)")
    p.add_argument("--d-v", type=str, help="value width per head (default d_model/heads)")
    p.add_argument("--kdim", type=str, help="width of the key input (cross-attention; default d_model)")
    p.add_argument("--vdim", type=str, help="width of the value input (cross-attention; default d_model)")


#: The exit statuses, shown under the main help.
_EXIT_STATUS = ("exit status: 0 success; 1 a checked statement is false (a wrong claim, a "
                "failed proof);\n  2 unusable input; 3 an internal error; 4 (check) none is "
                "wrong but some\n  could not be decided; 130 interrupted")


def _examples(*lines: str) -> str:
    """An epilog of usage examples, one command a line (argparse keeps the layout when the
    parser has ``formatter_class=RawDescriptionHelpFormatter``)."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _dpi(text: str) -> int:
    """``--dpi``: an integer of ASCII digits (the range is checked by the figure code)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6):
        raise argparse.ArgumentTypeError(f"expected an integer, got {sanitize(text[:20])!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Multi-head attention, exactly: check worked examples, derive, prove, count.",
        epilog=_examples(
            "mha-symbolic check --example seed            # the bundled seed page, claim by claim",
            "mha-symbolic check book.toml --format markdown",
            "mha-symbolic derive examples/seed.toml -o seed.tex --pdf --figures",
            "mha-symbolic plot collapse --gap 20 -o collapse.svg",
            "mha-symbolic params --d-model 512 --heads 8",
            "mha-symbolic shapes --heads 8 --d-model 512",
            "mha-symbolic prove",
            "mha-symbolic COMMAND --help                  # each command's options and examples",
        ) + "\n\n" + _EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an internal error (exit status 3); "
                        "also MHA_SYMBOLIC_DEBUG=1")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("check", help="check a worked-example file claim by claim",
                       description="Check every claim of a worked-example TOML file, or every closed "
                       "statement of an author's Markdown/MyST/Quarto, reST, LaTeX or notebook "
                       "source (and its mha-check blocks). Exit 0 when "
                       "all claims hold, 1 when any is wrong, 2 for unusable input, 4 when "
                       "none is wrong but some could not be decided, 3 for an internal error.",
                       epilog=_examples(
                           "mha-symbolic check --example seed",
                           "mha-symbolic check book.toml -q             # only what fails",
                           "mha-symbolic check --example seed:A          # one example of a set",
                           "mha-symbolic check book.toml --only D --format json",
                           "cat book.toml | mha-symbolic check - --format markdown",
                           "mha-symbolic check examples/seed-page.md   # an author's page, math as written",
                           "mha-symbolic check examples/seed-page.md --not-judged -q",
                       ), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", help="worked-example TOML file, or an author's source "
                   "(.md, .qmd, .rst, .tex, .ipynb: every closed statement of its math judged) "
                   "('-': standard input; none: --example names a bundled set)")
    p.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                   help="report format: text for a terminal, json (schema "
                   "mha-symbolic-check/2) for programs, markdown for a document "
                   "(default: %(default)s)")
    _selection(p, repeat=True)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="show only the claims that fail (and the summary)")
    p.add_argument("--input-format", choices=["toml", "markdown", "myst", "quarto", "rst",
                                              "latex", "notebook"],
                   help="how FILE is read (default: from its suffix: .toml worked examples; "
                   ".md/.qmd/.txt Markdown, MyST, Quarto; .rst; .tex; .ipynb)")
    p.add_argument("--not-judged", action="store_true",
                   help="author's sources: also list the statements not judged, with why")

    p = sub.add_parser("examples", help="list the bundled worked examples (seed page, book corpus)",
                       description="List the worked-example sets that ship with the package; "
                       "--copy writes one into a folder to edit.",
                       epilog=_examples(
                           "mha-symbolic examples",
                           "mha-symbolic examples --copy seed -o mybook/",
                       ), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copy", metavar="NAME", help="write this set's TOML (and .npz) files out")
    p.add_argument("-o", "--output", metavar="DIR", help="folder for --copy (default: .)")

    p = sub.add_parser("derive", help="write a step-by-step derivation (LaTeX or Markdown)",
                       description="Derive every example of a worked-example file step by step.",
                       epilog=_examples(
                           "mha-symbolic derive --example seed -o seed.tex --pdf --figures",
                           "mha-symbolic derive --example seed:D --format markdown -o d.md",
                           "mha-symbolic derive book.toml --only D --format fragment",
                       ), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", help="worked-example TOML file (none: --example names a "
                   "bundled set)")
    p.add_argument("--format", choices=["tex", "fragment", "markdown"], default="tex",
                   help="tex: a standalone LaTeX document; fragment: LaTeX to paste into a "
                   "book; markdown (default: %(default)s)")
    p.add_argument("-o", "--output", metavar="OUT", help="output file (default: standard output)")
    _selection(p, repeat=True)
    p.add_argument("--pdf", action="store_true",
                   help="also run pdflatex on the .tex output (needs -o and a TeX system)")
    p.add_argument("--figures", action="store_true",
                   help="generate figures next to the output and include them (needs matplotlib)")

    p = sub.add_parser("plot", help="draw a figure (softmax collapse, attention heatmap)",
                       description="Draw one of the documented figure kinds, 4.8 in wide "
                       "with 10 pt Computer Modern text, to print at its natural size.",
                       epilog=_examples(
                           "mha-symbolic plot collapse --gap 20 -o collapse.png",
                           "mha-symbolic plot collapse --example seed:D -o collapse-d.pdf",
                           "mha-symbolic plot heatmap --example seed:G -o weights.svg",
                           "mha-symbolic plot heatmap --file book.toml --only G "
                           "-o weights.png --dpi 600",
                       ), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", metavar="KIND", help="'collapse': the weight on the top score "
                   "against the score gap; 'heatmap': an example's attention weights")
    p.add_argument("-o", "--output", metavar="OUT", required=True,
                   help="output file; its suffix (.png, .svg, .pdf, .pgf) picks the format "
                   "unless --format is given")
    p.add_argument("--format", choices=["png", "svg", "pdf", "pgf"], default=None,
                   help="figure format (default: from the suffix of OUT)")
    p.add_argument("--dpi", type=_dpi, default=None, metavar="N",
                   help="resolution of a PNG in dots per inch, 50 to 1200 (default: 300); "
                   "figures are 4.8 in wide, the text width they are printed at")
    p.add_argument("--file", help="worked-example TOML file (heatmap: its weights; collapse: "
                   "the number of tokens and the gap of a collapsed row)")
    _selection(p, repeat=False)
    p.add_argument("--gap", type=str, default="20",
                   help="score gap to mark on the collapse curve (default 20, Example D)")

    p = sub.add_parser("shapes", help="shape of every intermediate, symbolic or numeric",
                       description="Print the shape of every intermediate of multi-head "
                       "attention. Sizes left out stay symbolic.",
                       epilog=_examples(
                           "mha-symbolic shapes                          # all symbolic",
                           "mha-symbolic shapes --n-q 10 --d-model 512 --heads 8",
                           "mha-symbolic shapes --n-q 10 --n-k 20 --d-model 512 --heads 8 "
                           "--kv-heads 2 --format latex",
                       ), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-q", type=str, help="query length n_q (omit to keep it symbolic)")
    p.add_argument("--n-k", type=str, help="key/value length n_k (default n_q: self-attention)")
    _dims(p, symbolic_default=True)
    p.add_argument("--format", choices=["text", "json", "latex"], default="text",
                   help="output format: a text table, json, or a LaTeX table "
                   "(default: %(default)s)")

    p = sub.add_parser("params", help="parameter and FLOP counts",
                       description="Count the learnable parameters (and forward FLOPs) of one "
                       "multi-head attention block; matches torch.nn.MultiheadAttention.",
                       epilog=_examples(
                           "mha-symbolic params --d-model 512 --heads 8",
                           "mha-symbolic params --d-model 512 --heads 8 --no-bias --format json",
                           "mha-symbolic params --n-q 1024            # d_model, h symbolic",
                       ), formatter_class=argparse.RawDescriptionHelpFormatter)
    _dims(p, symbolic_default=True)
    p.add_argument("--no-bias", action="store_true", help="projections without biases")
    p.add_argument("--add-bias-kv", action="store_true",
                   help="learned extra key/value bias rows (torch add_bias_kv=True)")
    p.add_argument("--n-q", type=str, help="query length, for FLOP counts")
    p.add_argument("--n-k", type=str, help="key length, for FLOP counts (default n_q)")
    p.add_argument("--format", choices=["text", "json", "latex"], default="text",
                   help="output format: a text table, json, or a LaTeX table "
                   "(default: %(default)s)")

    p = sub.add_parser("prove", help="run the machine-checked proofs in proofs/",
                       description="Prove every theorem for general sizes and cross-check it "
                       "numerically with Arb.\nEach theorem's row is printed as soon as it is "
                       "done. Exit 0 only if all hold,\n1 if one does not, 2 for unusable input.",
                       epilog=_PROVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only this theorem (repeatable), by name, number or tNN; the "
                   f"names: {', '.join(_theorem_names())}")
    p.add_argument("--latex", metavar="DIR",
                   help="write proofs.tex and one tNN_<name>.tex per theorem into DIR")
    p.add_argument("--pdf", metavar="PATH",
                   help="typeset the proofs with pdflatex and write the PDF to PATH")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text: a table, streamed row by row; json: steps, checks and timings "
                   "at the end (default: %(default)s)")
    return parser


_PROVE_EPILOG = """examples:
  mha-symbolic prove                           all theorems, one row each as it finishes
  mha-symbolic prove --only onehot --only 7    by name or number
  mha-symbolic prove --pdf proofs.pdf          typeset them (needs pdflatex)
  mha-symbolic prove --latex out/              out/proofs.tex + out/tNN_<name>.tex
  mha-symbolic prove --format json             steps, checks and timings"""


def _theorem_names() -> list[str]:
    """The theorem names for ``prove --help``, from the file names alone (fast)."""
    try:
        from .exact.prove import theorem_names

        return theorem_names()
    except Exception:  # no proofs folder: --help must still work
        return []


def _version() -> str:
    from . import __version__

    return __version__


def _safe_streams() -> None:
    """Never fail on an encoding: what stdout/stderr cannot encode is written as ASCII
    (✓ as ``ok``, ≈ as ``~``) or ``\\uXXXX`` (see :func:`mha_symbolic._text.ascii_fallback`)."""
    handler = register_ascii_fallback()
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):
                reconfigure(errors=handler)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the program is, so that every ``with`` block
    (temporary folders, a running pdflatex, which subprocess.run kills) is left cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum: int, frame: Any) -> None:
    raise _Terminated(signum)


def _catch_signals() -> dict[int, Any]:
    """Install the SIGTERM/SIGHUP handlers; the previous ones, to be restored."""
    import signal

    previous: dict[int, Any] = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                previous[sig] = signal.signal(sig, _on_signal)
    return previous


def _quit_130() -> None:
    """Exit 130 now, the streams flushed.  A KeyboardInterrupt that reached a C
    extension's ``PyRun_String`` (some library imports run code that way) leaves CPython's
    "unhandled KeyboardInterrupt" flag set even after we catch it, and the interpreter
    then ends by re-raising SIGINT on itself (status -2) after our one line; os._exit
    skips that.  Only when this process is the command (never for main() called in
    process)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    previous = _catch_signals()
    early = release()  # the start-up SIGINT handler (mha_symbolic/_startup.py)
    if early is not None:
        previous[signal.SIGINT] = early  # back in place for the exit itself
    try:
        code = _main(argv)
        if code == 130 and early is not None:  # interrupted inside the command
            _quit_130()
        return code
    except KeyboardInterrupt:  # Ctrl-C before the command started (parsing, imports)
        if early is not None:  # a second Ctrl-C while the line is printed: still one line
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGINT, early)  # type: ignore[arg-type]
        print(f"{PROG}: interrupted", file=sys.stderr)
        if early is not None:  # this process is the command: end it here (_quit_130)
            _quit_130()
        return 130
    except _Terminated as exc:
        print(f"{PROG}: terminated by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    finally:  # main() called in-process (tests, a fuzz worker) leaves the handlers as found
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)
        if early is not None:
            # this process is the command and its work is done: a Ctrl-C now, while the
            # interpreter finalises (module locks, weakref callbacks), would print
            # "Exception ignored … KeyboardInterrupt"; the exit status is already decided
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout is None or sys.stdout.closed:  # started with stdout closed (`>&-`)
        if sys.stderr is not None:
            print(f"{PROG}: error: standard output is closed (use >/dev/null to discard "
                  "the output)", file=sys.stderr)
        return 2
    _safe_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        print(f"{PROG}: error: a command is needed ({', '.join(_HANDLERS)})", file=sys.stderr)
        return 2
    module_name, func_name = _HANDLERS[args.command]
    debug = args.debug or os.environ.get("MHA_SYMBOLIC_DEBUG", "") not in ("", "0")
    try:
        module = importlib.import_module(f"mha_symbolic.{module_name}")
        handler = getattr(module, func_name)
        return int(handler(args))
    except MhaSymbolicError as exc:
        print(f"{PROG} {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0
    except OSError as exc:
        name = f"{_one_line(exc.filename, 80)}: " if getattr(exc, "filename", None) else ""
        print(f"{PROG} {args.command}: error: {name}{_one_line(exc.strerror or exc)}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{PROG} {args.command}: internal error: out of memory", file=sys.stderr)
        return 3
    except Exception as exc:  # a bug of ours: one line, exit 3 (never 1, "a claim is wrong")
        if debug:
            traceback.print_exc()
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {os.path.basename(where.filename)}:{where.lineno}" if where else ""
        print(f"{PROG} {args.command}: internal error: {type(exc).__name__}{at}: "
              f"{_one_line(exc)} (please report it; --debug shows the traceback)",
              file=sys.stderr)
        return 3


#: Longest error message printed (each part that echoes input is already cut to ~80).
MAX_MESSAGE = 1000


def _one_line(exc: object, limit: int = MAX_MESSAGE) -> str:
    """A message on one line: control characters visible, whitespace runs collapsed,
    at most ``limit`` characters (:data:`MAX_MESSAGE`)."""
    try:
        text = str(exc).strip()
    except Exception:  # str() itself may fail (a huge integer in the arguments)
        text = ""
    text = text or type(exc).__name__
    text = " ".join(sanitize(" ".join(text.split())).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
