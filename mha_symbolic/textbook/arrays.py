"""Inputs from ``.npy`` and ``.npz`` files beside a worked-example file.

An input key may name a file instead of holding a matrix::

    x = "raschka-inputs.npy"            # the whole file
    w_q = "weights.npz:w_query"         # one array of an archive
    arrays = "weights.npz"              # every array of the archive whose name is an input key

The path is relative to the TOML file's folder and must stay inside it (no absolute
paths, no ``..``, no symbolic link leading out); the file's size is checked before it
is read, an archive's members' sizes before they are inflated, and arrays are loaded
with ``allow_pickle=False``.  Float arrays hold what a program computed, so each
element is taken as its *exact binary value* (float32 0.1 is 13421773/134217728);
integer and boolean arrays as they are.

>>> exact_entries([0.5, 0.1])
[Fraction(1, 2), Fraction(3602879701896397, 36028797018963968)]
"""

from __future__ import annotations

import math
import zipfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from .._text import echo
from ..errors import ExampleFileError

__all__ = ["MAX_ARRAY_BYTES", "MAX_ARRAY_ENTRIES", "exact_entries", "load_array", "resolve_inside"]

#: Largest .npy/.npz file read, and largest total of an archive's inflated members.
MAX_ARRAY_BYTES = 16_000_000
#: Most entries in one array (exact arithmetic on more is far beyond a worked example).
MAX_ARRAY_ENTRIES = 65_536
#: Most dimensions of one array (batch × heads × rows × columns).
MAX_ARRAY_DIMS = 4


def resolve_inside(name: str, base: Path | None, where: str) -> Path:
    """``name`` resolved inside the folder ``base``, or a one-line error."""
    if base is None:
        raise ExampleFileError(f"{where}: {echo(name)} names a file, but the worked example was not "
                               "read from a file (there is no folder to look in)")
    if not name or "\x00" in name or len(name) > 255:
        raise ExampleFileError(f"{where}: {echo(name, 60)} is not a file name")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ExampleFileError(f"{where}: {name!r} must be a path inside the worked example's "
                               "folder (no absolute path, no '..')")
    root = base.resolve()
    path = (root / rel).resolve()
    if root != path and root not in path.parents:
        raise ExampleFileError(f"{where}: {name!r} leads outside the worked example's folder")
    if not path.is_file():
        raise ExampleFileError(f"{where}: no such file {name!r} beside the worked example")
    size = path.stat().st_size
    if size > MAX_ARRAY_BYTES:
        raise ExampleFileError(f"{where}: {name!r} is {size} bytes, more than {MAX_ARRAY_BYTES}")
    return path


def load_array(ref: str, base: Path | None, where: str) -> Any:
    """``file.npy`` → its array; ``file.npz:name`` → one member; ``file.npz`` → a dict."""
    import numpy as np

    name, member = ref.rsplit(":", 1) if ":" in ref else (ref, "")
    path = resolve_inside(name, base, where)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if member:
                raise ExampleFileError(f"{where}: a .npy file holds one array; drop ':{member}'")
            return _checked(np.load(path, allow_pickle=False), ref, where)
        if suffix != ".npz":
            raise ExampleFileError(f"{where}: {name!r} is not a .npy or .npz file")
        with zipfile.ZipFile(path) as zf:
            total = sum(info.file_size for info in zf.infolist())
        if total > MAX_ARRAY_BYTES:
            raise ExampleFileError(f"{where}: {name!r} inflates to {total} bytes, more than "
                                   f"{MAX_ARRAY_BYTES}")
        with np.load(path, allow_pickle=False) as archive:
            names = list(archive.files)
            if member:
                if member not in names:
                    raise ExampleFileError(f"{where}: {name!r} has no array {member!r}; it has "
                                           f"{', '.join(repr(n) for n in names[:20])}")
                return _checked(archive[member], ref, where)
            return {n: _checked(archive[n], f"{name}:{n}", where) for n in names}
    except ExampleFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ExampleFileError(f"{where}: cannot read {name!r} as a numpy file "
                               f"({type(exc).__name__}: {str(exc)[:80]})") from None


def _checked(arr: Any, ref: str, where: str) -> Any:
    kind = arr.dtype.kind
    if kind not in "fiub" and not (kind == "U" and arr.ndim <= 1):
        raise ExampleFileError(f"{where}: {ref!r} holds {arr.dtype} entries; expected numbers")
    if arr.ndim > MAX_ARRAY_DIMS:
        raise ExampleFileError(f"{where}: {ref!r} has {arr.ndim} dimensions; at most {MAX_ARRAY_DIMS}")
    if arr.size > MAX_ARRAY_ENTRIES:
        raise ExampleFileError(f"{where}: {ref!r} has {arr.size} entries; at most {MAX_ARRAY_ENTRIES}")
    return arr


def exact_entries(arr: Any, *, allow_neg_inf: bool = False, where: str = "array") -> Any:
    """Nested lists of exact numbers: floats as their exact binary values (Fractions),
    integers and booleans as they are; NaN and ±inf refused (−inf kept for masks)."""
    data = arr.tolist() if hasattr(arr, "tolist") else arr

    def conv(x: Any) -> Any:
        if isinstance(x, list):
            return [conv(y) for y in x]
        if isinstance(x, (bool, int)):
            return x
        if isinstance(x, float):
            if math.isnan(x) or (math.isinf(x) and not (allow_neg_inf and x < 0)):
                raise ExampleFileError(f"{where}: entry {x!r} is not a finite number")
            if math.isinf(x):
                return "-inf"
            return Fraction(*x.as_integer_ratio())
        raise ExampleFileError(f"{where}: entry {x!r} is not a number")

    return conv(data)
