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

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from ._text import sanitize
from .errors import ExampleFileError

__all__ = ["STDIN", "read_bounded"]

#: The file name that means standard input.
STDIN = "-"


def _shown(path: str | os.PathLike[str]) -> str:
    return sanitize(str(path))


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
        stream = stdin if stdin is not None else sys.stdin.buffer
        data = stream.read(limit + 1)
        if len(data) > limit:
            raise ExampleFileError(f"<stdin>: larger than {limit} bytes")
        return data
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
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except PermissionError:
        raise ExampleFileError(f"{name}: permission denied") from None
    except OSError as exc:
        raise ExampleFileError(f"{name}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > limit:
        raise ExampleFileError(f"{name}: larger than {limit} bytes (it grew while read)")
    return data
