"""The worked-example sets that ship with the package: the seed page and the book corpus.

In an installed wheel they live in ``mha_symbolic/data/`` (``seed.toml``,
``books/*.toml`` with the ``.npz`` files beside them); in a clone of the repository
they are read from ``examples/``.  ``mha-symbolic examples`` lists them,
``mha-symbolic check --example seed`` checks one, and ``mha-symbolic examples --copy
seed`` writes its TOML into the current folder to edit.

>>> "seed" in names() and "books" in names()
True
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .._text import echo, plural, sanitize
from ..errors import ExampleFileError

__all__ = ["cli_examples", "data_dir", "files", "names"]


def data_dir() -> Path:
    """The folder holding ``seed.toml`` and ``books/``: the package's data, else the
    repository's ``examples/`` (a clone, an editable install)."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "data"
    if (packaged / "seed.toml").is_file():
        return packaged
    clone = here.parent / "examples"
    if (clone / "seed.toml").is_file():
        return clone
    raise ExampleFileError("the bundled worked examples are missing from this installation "
                           f"(looked in {packaged} and {clone})")


def _sets() -> dict[str, list[Path]]:
    root = data_dir()
    sets: dict[str, list[Path]] = {"seed": [root / "seed.toml"]}
    books = sorted((root / "books").glob("*.toml")) if (root / "books").is_dir() else []
    if books:
        sets["books"] = books
        for path in books:
            sets[f"books/{path.stem}"] = [path]
    return sets


def names() -> list[str]:
    """The names ``--example`` accepts without a file: ``seed``, ``books`` (every book
    file) and ``books/NAME`` (one)."""
    return list(_sets())


def files(name: str) -> list[Path]:
    """The TOML files of a bundled set."""
    sets = _sets()
    if name not in sets:
        import difflib

        close = difflib.get_close_matches(name, list(sets), n=1, cutoff=0.6)
        hint = (f" (did you mean {close[0]!r}?)" if close else
                f" (one example of a set is SET:EXAMPLE, e.g. seed:{name})" if ":" not in name
                and "/" not in name and len(name) <= 40 else "")
        raise ExampleFileError(f"no bundled worked-example set {echo(name)}{hint}; "
                               f"`mha-symbolic examples` lists them: {', '.join(sets)}")
    return sets[name]


def _title(path: Path) -> tuple[str, int, int]:
    """(title, examples, claims) of a file, read cheaply."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    exs = doc.get("example", [])
    return (str(doc.get("title", path.stem)), len(exs),
            sum(len(e.get("claim", [])) for e in exs if isinstance(e, dict)))


def speak_of_itself(text: str, target: Path) -> str:
    """A copied file's ``# Check it:`` comment names the copy, not the bundled set.

    >>> speak_of_itself("# Check it:  mha-symbolic check --example seed\\nx = 1\\n", Path("b/seed.toml"))
    '# Check it:  mha-symbolic check b/seed.toml\\nx = 1\\n'
    """
    import re
    import shlex

    return re.sub(r"(?m)^# Check it:(\s+)mha-symbolic check .*$",
                  lambda m: f"# Check it:{m.group(1)}mha-symbolic check {shlex.quote(target.as_posix())}",
                  text)


def cli_examples(args: Any) -> int:
    """``mha-symbolic examples [--copy NAME] [-o DIR]``."""
    if args.copy:
        paths = files(args.copy)
        out = Path(args.output or ".")
        if out.exists() and not out.is_dir():
            raise ExampleFileError(f"{out}: exists and is not a folder to copy into")
        targets = [(src, out / src.name) for path in paths
                   for src in [path, *sorted(path.parent.glob(path.stem + "*.npz"))]]
        for _, target in targets:  # all or nothing: checked before the first write
            if target.exists():
                raise ExampleFileError(f"{target}: exists; not overwritten")
        out.mkdir(parents=True, exist_ok=True)
        for src, target in targets:
            if src.suffix == ".toml":
                target.write_text(speak_of_itself(src.read_text(encoding="utf-8"), target),
                                  encoding="utf-8")
            else:
                target.write_bytes(src.read_bytes())
            print(f"wrote {sanitize(str(target))}")
        return 0
    for name, paths in _sets().items():
        if name == "books":
            total = sum(_title(p)[2] for p in paths)
            print(f"{name:40s} {plural(len(paths), 'file')}, {plural(total, 'claim')} "
                  "(the whole corpus)")
            continue
        title, n_ex, n_claims = _title(paths[0])
        print(f"{name:40s} {n_ex:3d} {'example ' if n_ex == 1 else 'examples'} "
              f"{n_claims:4d} {'claim ' if n_claims == 1 else 'claims'}  {title}")
    print("\ncheck one:  mha-symbolic check --example NAME   (one example of it: NAME:EXAMPLE)\n"
          "derive one: mha-symbolic derive --example NAME -o NAME.tex\n"
          "copy one:   mha-symbolic examples --copy NAME -o DIR")
    return 0
