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

import errno
import math
import stat
import zipfile
import zlib
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
        raise ExampleFileError(f"{where}: {echo(name)} must be a path inside the worked example's "
                               "folder (no absolute path, no '..')")
    try:
        root = base.resolve()
        path = (root / rel).resolve(strict=True)
        st = path.stat()
    except FileNotFoundError:
        raise ExampleFileError(f"{where}: no such file {echo(name)} beside the worked example"
                               ) from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic-link loop (Python < 3.13)
        why = "a symbolic-link loop" if isinstance(exc, RuntimeError) or getattr(
            exc, "errno", None) == errno.ELOOP else (getattr(exc, "strerror", None) or type(exc).__name__)
        raise ExampleFileError(f"{where}: cannot open {echo(name)} ({why})") from None
    if root != path and root not in path.parents:
        raise ExampleFileError(f"{where}: {echo(name)} leads outside the worked example's folder")
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a device, pipe or socket"
        raise ExampleFileError(f"{where}: {echo(name)} is not a regular file ({kind})")
    if st.st_size > MAX_ARRAY_BYTES:
        raise ExampleFileError(f"{where}: {echo(name)} is {st.st_size} bytes, more than "
                               f"{MAX_ARRAY_BYTES}")
    return path


#: Most arrays in one .npz archive.
MAX_ARCHIVE_MEMBERS = 64
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def load_array(ref: str, base: Path | None, where: str) -> Any:
    """``file.npy`` → its array; ``file.npz:name`` → one member; ``file.npz`` → a dict.

    Every array is read by its header first: the dtype, the number of dimensions and of
    entries are checked against the limits before any memory is allocated for the data
    (a 136-byte file whose header claims 2^40 entries is refused from the header), and an
    archive's members each by their own header, never by the sizes the archive declares.
    """
    name, member = ref.rsplit(":", 1) if ":" in ref else (ref, "")
    path = resolve_inside(name, base, where)
    suffix = path.suffix.lower()
    shown = echo(name)
    try:
        if suffix == ".npy":
            if member:
                raise ExampleFileError(f"{where}: a .npy file holds one array; drop ':{echo(member)}'")
            with open(path, "rb") as f:
                head = f.read(len(_NPY_MAGIC))
                if head[:4] == _ZIP_MAGIC:
                    raise ExampleFileError(f"{where}: {shown} is a zip archive, not a .npy file "
                                           "(name an archive .npz)")
                if head != _NPY_MAGIC:
                    raise ExampleFileError(f"{where}: {shown} is not a .npy file (it does not "
                                           "begin with the .npy signature)")
                f.seek(0)
                return _read_npy(f, ref, where)
        if suffix != ".npz":
            raise ExampleFileError(f"{where}: {shown} is not a .npy or .npz file")
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            if len(infos) > MAX_ARCHIVE_MEMBERS:
                raise ExampleFileError(f"{where}: {shown} holds {len(infos)} files; at most "
                                       f"{MAX_ARCHIVE_MEMBERS}")
            members = {i.filename[:-4] if i.filename.endswith(".npy") else i.filename: i
                       for i in infos}
            if member:
                if member not in members:
                    listed = ", ".join(echo(n, 40) for n in list(members)[:20])
                    raise ExampleFileError(f"{where}: {shown} has no array {echo(member)}; it has "
                                           f"{listed or 'none'}")
                members = {member: members[member]}
            out: dict[str, Any] = {}
            total = 0
            for key, info in members.items():
                label = f"{name}:{key}"
                with zf.open(info) as f:
                    arr = _read_npy(f, label, where)
                total += arr.nbytes
                if total > MAX_ARRAY_BYTES:
                    raise ExampleFileError(f"{where}: {shown} inflates to more than "
                                           f"{MAX_ARRAY_BYTES} bytes")
                out[key] = arr
            return out[member] if member else out
    except ExampleFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, NotImplementedError,
            RuntimeError, zlib.error) as exc:
        raise ExampleFileError(f"{where}: cannot read {shown} as a numpy file "
                               f"({type(exc).__name__}: {echo(str(exc), 80)})") from None


def _read_npy(f: Any, ref: str, where: str) -> Any:
    """One array from the open .npy stream ``f``, its header checked before its data is read."""
    import numpy as np
    from numpy.lib import format as npformat

    shown = echo(ref)
    if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
        raise ExampleFileError(f"{where}: {shown} is not a .npy array (no .npy signature)")
    version = tuple(f.read(2))  # the two bytes after the signature: major, minor
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ExampleFileError(f"{where}: {shown} has .npy format version {version}; expected 1, 2 "
                               "or 3")
    read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
    try:
        shape, fortran, dtype = read(f, max_header_size=10_000)
    except Exception as exc:  # numpy parses the header as a Python literal: any error of it
        raise ExampleFileError(f"{where}: {shown} has an unreadable .npy header "
                               f"({type(exc).__name__}: {echo(str(exc), 60)})") from None
    if dtype.hasobject:
        raise ExampleFileError(f"{where}: {shown} holds Python objects, which are never unpickled "
                               "(allow_pickle=False); expected numbers")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise ExampleFileError(f"{where}: {shown} holds {echo(str(dtype), 40)} entries; expected numbers")
    _check_header(np.dtype(dtype), tuple(shape), ref, where)
    count = math.prod(shape)
    data = f.read(count * dtype.itemsize + 1)
    if len(data) != count * dtype.itemsize:
        raise ExampleFileError(f"{where}: {shown} holds {len(data)} bytes of data where its header "
                               f"promises {count * dtype.itemsize}")
    arr = np.frombuffer(data, dtype=dtype, count=count)
    arr = arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape)
    return _checked(arr, ref, where)


def _check_header(dtype: Any, shape: tuple[int, ...], ref: str, where: str) -> None:
    kind = dtype.kind
    if kind not in "fiub" and not (kind == "U" and len(shape) <= 1):
        raise ExampleFileError(f"{where}: {echo(ref)} holds {echo(str(dtype), 40)} entries; "
                               "expected numbers")
    if len(shape) > MAX_ARRAY_DIMS:
        raise ExampleFileError(f"{where}: {echo(ref)} has {len(shape)} dimensions; at most "
                               f"{MAX_ARRAY_DIMS}")
    size = math.prod(shape)
    if size > MAX_ARRAY_ENTRIES:
        raise ExampleFileError(f"{where}: {echo(ref)} has {size} entries; at most "
                               f"{MAX_ARRAY_ENTRIES}")
    if size * dtype.itemsize > MAX_ARRAY_BYTES:
        raise ExampleFileError(f"{where}: {echo(ref)} holds {size * dtype.itemsize} bytes; at most "
                               f"{MAX_ARRAY_BYTES}")


def _checked(arr: Any, ref: str, where: str) -> Any:
    _check_header(arr.dtype, tuple(arr.shape), ref, where)
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
