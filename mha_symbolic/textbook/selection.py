"""Which worked examples a command works on: one meaning of ``--example`` for ``check``,
``derive`` and ``plot``.

* ``FILE`` (``check``, ``derive``) or ``--file FILE`` (``plot``): a worked-example file
  of yours;
* ``--example SET`` or ``--example SET:EXAMPLE``: a set that ships with the package
  (``seed``, ``books``, ``books/NAME``; ``mha-symbolic examples`` lists them), optionally
  one example of it (``seed:D``);
* ``--only NAME`` (repeatable): only the examples of that name, of FILE or of the set.

FILE and ``--example`` are exclusive: ``--example`` never names an example of FILE
(that is ``--only``), so ``check book.toml --example D`` is an error that says so.

>>> split_spec("seed:D")
('seed', 'D')
>>> split_spec("books/vaswani-2017")
('books/vaswani-2017', None)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._text import echo
from ..errors import ExampleFileError, OptionalDependencyError, SpecError

__all__ = ["Selection", "require_matplotlib", "require_pdflatex", "resolve", "split_spec"]


def split_spec(spec: str) -> tuple[str, str | None]:
    """``SET[:EXAMPLE]`` as (set, example or None)."""
    name, sep, example = spec.partition(":")
    if sep and not example:
        raise SpecError(f"--example={echo(spec, 40)}: nothing after ':' (SET:EXAMPLE, e.g. seed:D)")
    return name, (example if sep else None)


@dataclass(frozen=True)
class Selection:
    """Files to read and the example names to keep (None: all of them)."""

    files: tuple[str, ...]
    only: tuple[str, ...] | None
    bundled: bool

    def examples(self) -> list[Any]:
        """The selected :class:`~mha_symbolic.textbook.examples.WorkedExample` objects."""
        from .examples import load_examples, select_examples

        loaded = [ex for f in self.files for ex in load_examples(f)]
        return select_examples(loaded, list(self.only) if self.only else None)


def _file_and_example(file: str | None, spec: str | None) -> None:
    if file is not None and spec is not None:
        set_name, example = split_spec(spec)
        hint = f"--only {example or set_name}"
        raise SpecError(f"--example={echo(spec, 40)} names a bundled set (seed, books, "
                        "books/NAME, or SET:EXAMPLE such as seed:D), not an example of "
                        f"{echo(file, 60)}: to pick examples of a file use {hint}")


def resolve(file: str | None, examples: Sequence[str] | None, only: Sequence[str] | None,
            *, file_flag: str = "FILE") -> list[Selection]:
    """The selections of a command line: one per ``--example`` (bundled sets) or one for
    FILE; ``only`` applies to each."""
    from .bundled import files

    specs = list(examples or [])
    for spec in specs[:1]:
        _file_and_example(file, spec)
    extra = tuple(only) if only else ()
    if file is not None:
        return [Selection((file,), extra or None, False)]
    if not specs:
        raise ExampleFileError(f"give a worked-example {file_flag}, or --example SET for a set "
                               "that ships with the package (`mha-symbolic examples` lists them)")
    out: list[Selection] = []
    for spec in specs:
        set_name, example = split_spec(spec)
        names = ((example,) if example else ()) + extra
        out.append(Selection(tuple(str(p) for p in files(set_name)), names or None, True))
    return out


def one_file(selections: list[Selection], command: str) -> Selection:
    """The single file that ``derive`` and ``plot`` work on."""
    paths = {f for s in selections for f in s.files}
    if len(paths) != 1:
        raise SpecError(f"{command} works on one file; the selection has {len(paths)} "
                        "(pick one with --example SET:EXAMPLE or books/NAME)")
    names = [n for s in selections for n in (s.only or ())]
    if any(s.only is None for s in selections):
        names = []
    return Selection(tuple(paths), tuple(dict.fromkeys(names)) or None,
                     selections[0].bundled)


# -- optional parts, checked before any work (nothing is written when one is missing) -----

def require_matplotlib(feature: str = "figures") -> None:
    """Raise the one-line install hint when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise OptionalDependencyError("matplotlib", feature, "plot")


def require_pdflatex(feature: str = "--pdf") -> None:
    """Raise the one-line hint when pdflatex is not on PATH."""
    from .._latex import pdflatex_path

    if pdflatex_path() is None:
        raise OptionalDependencyError(
            "pdflatex", feature, hint="install a TeX system (Debian: apt-get install "
            "texlive-latex-base texlive-latex-recommended)")


def cli_derive(args: Any) -> int:
    """``mha-symbolic derive FILE|--example SET[:EXAMPLE] [--only NAME …] …``: the
    selection resolved to one file, the optional parts checked before anything is
    written, then :func:`mha_symbolic.textbook.derivation.cli_derive`."""
    sel = one_file(resolve(args.file, args.example, args.only), "derive")
    # a usage error (--pdf without -o, …) is said first, by the derivation's own checks
    usable = bool(args.output) and args.output != "-"
    if args.figures and usable:
        require_matplotlib()
    if args.pdf and usable and args.format == "tex":
        require_pdflatex()
    args.file = sel.files[0]
    args.example = list(sel.only) if sel.only else None
    from .derivation import cli_derive as derive_command

    return int(derive_command(args))


def cli_plot(args: Any) -> int:
    """``mha-symbolic plot KIND [--file FILE | --example SET[:EXAMPLE]] [--only NAME]``:
    matplotlib checked first, then :func:`mha_symbolic.textbook.figures.cli_plot`."""
    require_matplotlib()
    spec = [args.example] if args.example else []
    if args.file is not None or spec:
        sel = one_file(resolve(args.file, spec, [args.only] if args.only else None,
                               file_flag="--file FILE"), "plot")
        if sel.only and len(sel.only) > 1:
            raise SpecError("plot draws one example: give one of --only NAME or SET:EXAMPLE")
        args.file = sel.files[0]
        args.example = sel.only[0] if sel.only else None
    from .figures import cli_plot as plot_command

    return int(plot_command(args))
