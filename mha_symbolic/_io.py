"""Reading untrusted input with its size limit applied *before* it is read.

:func:`read_bounded` looks at a file before opening it (a directory, a missing
file, a device or a pipe are refused by name; a regular file larger than the limit
is refused from its size alone) and then reads at most ``limit + 1`` bytes, so
that neither a 20 GB sparse file nor an endless stdin can exhaust memory.  ``-``
is standard input, read the same bounded way.

>>> import tempfile, os
>>> with tempfile.NamedTemporaryFile("wb", suffix=".toml", delete=False) as f:
...     _ = f.write(b"x" * 10)
>>> len(read_bounded(f.name, 100))
10
>>> read_bounded(f.name, 5)
Traceback (most recent call last):
...
mha_symbolic.errors.ExampleFileError: ...: larger than 5 bytes (10 bytes)
>>> os.unlink(f.name)
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ._text import sanitize
from .errors import ExampleFileError

__all__ = ["STDIN", "check_name", "check_not_input", "output_lock", "output_path", "read_bounded",
           "write_atomic", "write_output"]

#: The file name that means standard input.
STDIN = "-"


#: Longest file name echoed in a message (longer names are cut with "…").
MAX_SHOWN_NAME = 80


def _shown(path: str | os.PathLike[str]) -> str:
    text = sanitize(str(path))
    return text if len(text) <= MAX_SHOWN_NAME else text[: MAX_SHOWN_NAME - 1] + "…"


def check_name(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a name the operating system cannot take: an embedded NUL, or a lone
    surrogate that no file-system encoding can write (os.fsencode would raise)."""
    try:
        os.fsencode(path)
    except (UnicodeError, TypeError):
        raise ExampleFileError(f"{what}{_shown(path)}: not a valid file name") from None
    if "\x00" in os.fspath(path):
        raise ExampleFileError(f"{what}{_shown(path)}: not a valid file name (a NUL character)")


def read_bounded(path: str | os.PathLike[str], limit: int, *,
                 stdin: BinaryIO | None = None) -> bytes:
    """The bytes of ``path`` (``"-"``: standard input), refusing more than ``limit``.

    Raises :class:`~mha_symbolic.errors.ExampleFileError` naming the file: missing,
    a directory, not a regular file (devices, pipes, sockets), unreadable, or larger
    than ``limit`` bytes (checked from the file's size before reading, and again on
    what is read, since a file may grow and standard input has no size).
    """
    name = _shown(path)
    if str(path) == STDIN:
        stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
        if stream is None:  # started with standard input closed (`check - <&-`)
            raise ExampleFileError("<stdin>: standard input is closed")
        try:
            data = stream.read(limit + 1)
        except (OSError, ValueError) as exc:  # a closed or unreadable descriptor
            raise ExampleFileError(f"<stdin>: cannot read standard input "
                                   f"({getattr(exc, 'strerror', None) or exc})") from None
        if len(data) > limit:
            raise ExampleFileError(f"<stdin>: larger than {limit} bytes")
        return data
    check_name(path, "")
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ExampleFileError(f"{name}: no such file") from None
    except NotADirectoryError:
        raise ExampleFileError(f"{name}: no such file (a parent is not a directory)") from None
    except PermissionError:
        raise ExampleFileError(f"{name}: permission denied") from None
    except OSError as exc:
        raise ExampleFileError(f"{name}: {exc.strerror or type(exc).__name__}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ExampleFileError(f"{name}: is a directory, not a worked-example file")
    if not stat.S_ISREG(st.st_mode):
        raise ExampleFileError(f"{name}: not a regular file (a device, pipe or socket); "
                               f"use - to read standard input")
    if st.st_size > limit:
        raise ExampleFileError(f"{name}: larger than {limit} bytes ({st.st_size} bytes)")
    try:
        # O_NONBLOCK: if the name was swapped for a pipe since stat(), open() does not wait
        # for a writer; fstat() then looks at what was really opened
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ExampleFileError(f"{name}: not a regular file (it changed while opened)")
            data = f.read(limit + 1)
    except PermissionError:
        raise ExampleFileError(f"{name}: permission denied") from None
    except OSError as exc:
        raise ExampleFileError(f"{name}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > limit:
        raise ExampleFileError(f"{name}: larger than {limit} bytes (it grew while read)")
    return data


def output_path(value: str | None, *, inputs: Sequence[str | os.PathLike[str]] = (),
                option: str = "-o", default_name: str | None = None) -> Path | None:
    """The file an ``-o`` option names, checked before any work is done; None for
    standard output (no ``-o``, or ``-o -``).

    An existing regular file is overwritten, as ``cc -o`` and ``pandoc -o`` do (a
    derivation or figure is regenerated by running the command again), except that the
    output may never be one of ``inputs`` (``derive book.toml -o book.toml`` would
    destroy the book).  Refused: an empty name, a directory, a missing folder.  With
    ``default_name``, a folder (``-o out/``, or an existing directory) means the file of
    that name inside it; a name ending in ``/`` is always a folder, never a file.

    >>> output_path("-") is None and output_path(None) is None
    True
    >>> output_path("")
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.ExampleFileError: -o '': an empty file name; use -o - for standard output
    """
    if value is None or value == STDIN:
        return None
    if value == "":
        raise ExampleFileError(f"{option} '': an empty file name; use {option} - for standard "
                               "output")
    check_name(value, f"{option} ")
    path = Path(value)
    shown = _shown(value)
    folder = value.endswith(("/", os.sep))
    if folder and not path.is_dir():
        raise ExampleFileError(f"{option} {shown}: the folder does not exist")
    if path.is_dir():
        if default_name is None:
            raise ExampleFileError(f"{option} {shown}: is a directory; give a file name")
        path = path / default_name
        shown = _shown(path)
        if path.is_dir():
            raise ExampleFileError(f"{option} {shown}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise ExampleFileError(f"{option} {shown}: the folder {_shown(path.parent)} does not "
                               "exist")
    check_not_input(path, inputs, option)
    return path


def check_not_input(path: Path, inputs: Sequence[str | os.PathLike[str]], option: str = "-o"
                    ) -> None:
    """Refuse an output ``path`` that is one of the ``inputs`` (the same file, also through
    a link or another spelling of its name)."""
    shown = _shown(path)
    for source in inputs:
        if str(source) == STDIN:
            continue
        try:
            os.fsencode(source)
        except (UnicodeError, TypeError):
            continue  # not a name any file can have: not the output's either
        try:
            same = path.exists() and Path(source).exists() and path.samefile(source)
        except OSError:
            same = False
        if same:
            raise ExampleFileError(f"{option} {shown} is the input file {_shown(source)}: "
                                   "refusing to overwrite it")


@contextlib.contextmanager
def output_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock for the whole run on the folder ``path`` is written to, so
    that two concurrent runs writing the same ``out.tex`` (and its ``out.pdf``, figures)
    take turns and never leave a pair from different runs (issue 30).

    The lock is ``fcntl.flock`` on the folder itself (opened read-only): no lock file is
    left behind, and the kernel drops a dead process's locks, so a killed run never
    leaves a stale one.  Runs writing other files of the same folder also take turns
    (harmless: each run is seconds).  A run that has to wait says so on stderr, once.
    Where ``fcntl`` is missing (Windows) or the folder cannot be opened, runs are not
    serialised: the outputs are still each written whole (:func:`write_atomic`)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    try:
        fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # a missing folder fails later, at the write, with its own message
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"mha-symbolic: waiting for another run writing {_shown(path)}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock
            pass
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def write_output(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomic`)."""
    write_atomic(path, text.encode("utf-8"))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file in ``path``'s folder, then rename it onto
    ``path`` (``os.replace``, atomic on one file system): an existing file is never left
    truncated by a write that fails part-way (a full disk, a file-size limit, a signal),
    and a reader never sees half a file.  The temporary file is removed on any failure.
    An OSError names the path (``/dev/full: No space left on device``)."""
    import tempfile

    folder = path.parent
    try:
        if path.exists() and not path.is_file():  # /dev/null, a FIFO: write in place
            with open(path, "wb") as f:
                f.write(data)
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:40]}.", suffix=".part")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or type(exc).__name__, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
        if path.exists():  # keep the mode of the file replaced
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or type(exc).__name__, str(path)) from None
        raise
