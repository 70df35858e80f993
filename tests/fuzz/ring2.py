"""Generators and properties for issue 30's classes (hostile input, the next ring).

``api``: a public function called with arguments of every type and size (huge integers,
strings for booleans, floats where integers go, NaN, the float maximum, wrong objects,
misspelt keywords): the call either returns or raises a ``MhaSymbolicError`` with a
one-line message; no foreign exception, no RuntimeWarning.

``arrays``: ``.npy``/``.npz`` bytes with hostile headers (shapes of 2^40, negative,
many dimensions, object and structured dtypes, truncated data, zip archives named
``.npy``, archives whose members lie) loaded as a worked example's input: a verdict or
one ``ExampleFileError``, in bounded time and memory.

Each input is made from ``(seed, i)`` alone, as in :mod:`.generators`.
"""

from __future__ import annotations

import io
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

from .generators import Source

__all__ = ["api_call", "array_file", "run_api", "run_array"]

_F64_MAX = 1.7976931348623157e308
SCALARS: list[Any] = [0, 1, -1, 2, 0.5, -0.0, 1e-310, _F64_MAX, -_F64_MAX, float("nan"),
                      float("inf"), float("-inf"), 10**5000, -(10**5000), 2**1100, 2**63, 1e300,
                      True, False, None, "no", "yes", "1", "", "x" * 5000, b"1", [], [1], (1, 2),
                      (10**5000, 0), {}, object(), 1j, "sqrt(2)"]
#: public functions and the arguments each takes (None: a keyword-only option name)
_OPTIONS = {
    "reference_attention": ["scale", "is_causal", "enable_gqa", "masked_rows", "window",
                            "softcap", "dropout_p", "return_weights", "causal_alignment",
                            "progress", "scael", "is_casual"],
    "compare_attention": ["rtol", "atol", "ulps", "safety", "is_causal", "scale", "rule",
                          "diagnose_bugs", "factor", "rtoll"],
    "exact_attention": ["scale", "heads", "mask", "masked_rows", "window", "softcap", "d_k",
                        "scael"],
    "certify": ["digits", "truncate_places", "round_places", "compare", "round_significant"],
    "enclosure": ["exact_prec", "mpi_bits", "mpf_dps"],
}


def api_call(src: Source) -> tuple[str, str, int, int]:
    """(function, option, index of the value in SCALARS, index of the input's scale)."""
    fn = src.choice(sorted(_OPTIONS))
    return fn, src.choice(_OPTIONS[fn]), src.integer(0, len(SCALARS) - 1), src.integer(0, 4)


def _inputs(which: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(which)
    q, k, v = (rng.standard_normal((1, 3, 4)) for _ in range(3))
    big = [1.0, 1e150, 1e300, _F64_MAX, 2.0**-1070][which]
    with np.errstate(all="ignore"):  # finite: the largest |entry| is exactly ``big``
        v = np.clip(v / np.max(np.abs(v)), -1.0, 1.0) * big
    return q, k, v


def run_api(call: tuple[str, str, int, int]) -> list[tuple[str, str]]:
    import mha_symbolic as ms
    from mha_symbolic.errors import MhaSymbolicError

    from .properties import _foreign, _message_problems

    fn, option, vi, which = call
    value = SCALARS[vi]
    q, k, v = _inputs(which)
    problems: list[tuple[str, str]] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            if fn == "reference_attention":
                ms.reference_attention(q, k, v, **{option: value})
            elif fn == "compare_attention":
                ms.compare_attention(ms.reference_attention(q, k, v).midpoint, q, k, v,
                                     **{option: value})
            elif fn == "exact_attention":
                ms.exact_attention(query=[[1, 0]], key=[[1, 0], [0, 1]], value=[[1], [2]],
                                   **{option: value})
            elif fn == "certify":
                c = ms.certify("1/3")
                getattr(c, option)(value)
            else:
                enc = ms.reference_attention(q, k, v)
                if option == "exact_prec":
                    enc.exact((0, 0, 0), prec=value)
                elif option == "mpi_bits":
                    enc.mpi(bits=value)
                else:
                    enc.mpf(value)
    except MhaSymbolicError as exc:
        problems += _message_problems(exc)
        if "please report" in str(exc):
            problems.append(("bad-message", f"'please report' for {call}: {str(exc)[:200]}"))
    except RuntimeWarning as exc:
        problems.append(("foreign-exception", f"RuntimeWarning leaked: {exc} for {call}"))
    except Exception as exc:
        problems += _foreign(exc)
    return problems


_DESCRS = ["<f8", "<f4", "<i8", "|b1", "|O", "<U3", "<c16", "[('a', '<f8')]", "<f2", ">f8",
           "<M8[s]", "|V8", "('<f8', (2,))"]
_SHAPES = ["(2, 2)", "(1099511627776,)", "(-1,)", "(2, 2, 2, 2, 2)", "()", "(0,)",
           "(65537,)", "(256, 256)", "(3, 1099511627776)", "(1, 2", "'x'", "(2.5,)"]


def _npy(src: Source) -> bytes:
    descr = src.choice(_DESCRS)
    shape = src.choice(_SHAPES)
    order = src.choice(["False", "True", "1", "'x'"])
    text = f"{{'descr': {descr!r}, 'fortran_order': {order}, 'shape': {shape}, }}"
    if src.chance(0.2):
        text = text[: src.integer(0, len(text))]
    major = src.choice([1, 1, 2, 3, 9])
    head = text.encode("latin1") + b" " * 16 + b"\n"
    length = (len(head).to_bytes(2, "little") if major == 1 else len(head).to_bytes(4, "little"))
    if src.chance(0.1):
        length = b"\xff\xff" if major == 1 else b"\xff\xff\xff\x7f"
    data = bytes(src.integer(0, 255) for _ in range(src.integer(0, 64)))
    magic = b"\x93NUMPY" if src.chance(0.9) else src.choice([b"PK\x03\x04", b"\x93NUMPZ", b""])
    return magic + bytes([major, 0]) + length + head + data


def array_file(src: Source) -> tuple[str, bytes, str]:
    """(file name, its bytes, the reference a worked example makes to it)."""
    if src.chance(0.6):
        name = src.choice(["a.npy", "a.npy", "a.npz"])
        body = _npy(src)
        if name.endswith(".npz") or src.chance(0.1):
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                for j in range(src.integer(0, 3)):
                    z.writestr(src.choice(["scores.npy", "x.npy", "w_q.npy", "__recipe__.npy",
                                           f"m{j}.npy", "../evil.npy"]), body)
            body = buf.getvalue()
            if src.chance(0.2):
                body = body[: src.integer(0, len(body))]
        ref = name + (src.choice(["", ":scores", ":x", ":nope"]) if name.endswith(".npz") else "")
        return name, body, ref
    import numpy as np

    arr = np.zeros(tuple(src.integer(1, 4) for _ in range(src.integer(1, 3))),
                   dtype=src.choice(["float64", "float32", "int8", "bool"]))
    buf = io.BytesIO()
    np.save(buf, arr)
    body = buf.getvalue()
    if src.chance(0.5):  # flip bytes in the header or the data
        b = bytearray(body)
        for _ in range(src.integer(1, 4)):
            b[src.integer(0, len(b) - 1)] = src.integer(0, 255)
        body = bytes(b)
    return "a.npy", body, "a.npy"


def run_array(payload: tuple[str, bytes, str]) -> list[tuple[str, str]]:
    from mha_symbolic.errors import MhaSymbolicError
    from mha_symbolic.textbook import check_examples, load_examples

    from .properties import _foreign, _message_problems

    name, body, ref = payload
    problems: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="mha-fuzz-arrays-") as tmp:
        folder = Path(tmp)
        (folder / name).write_bytes(body)
        f = folder / "e.toml"
        f.write_text(f"[[example]]\nname = 'E'\nscale = 1\nscores = {ref!r}\n"
                     "[[example.claim]]\nquantity = 'weight[1,1]'\nclaimed = '0.5'\n",
                     encoding="utf-8")
        try:
            check_examples(load_examples(f))
        except MhaSymbolicError as exc:
            problems += _message_problems(exc)
        except Exception as exc:
            problems += _foreign(exc)
    return problems
