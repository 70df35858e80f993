"""Input conversion for the oracle and the testing tool.

Every element is taken as the exact number its dtype represents. torch and jax
are never imported here: a tensor is recognised by ``type(x).__module__`` and
converted through its own methods.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .._validate import tensor_kind
from ..errors import InputValueError, SpecError
from .mp import mpmath_to_array

__all__ = ["as_exact_array", "is_float_dtype", "to_float64", "validate_finite"]

_FLOAT_NAMES = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
# torch dtypes that numpy cannot hold, taken through an exact float32 step to the
# ml_dtypes type of the same name (every value of these formats is a float32)
_VIA_FLOAT32 = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def is_float_dtype(dtype: np.dtype[Any]) -> bool:
    """True for float64/32/16, ml_dtypes.bfloat16 and the fp8 formats
    ml_dtypes.float8_e4m3fn and float8_e5m2."""
    return dtype.name in _FLOAT_NAMES


def _is_torch_tensor(x: Any) -> bool:
    """A torch tensor: torch's own classes by module name, subclasses (wrappers,
    parameters, user subclasses) by isinstance when torch is already imported —
    never importing torch here."""
    if (type(x).__module__ or "").startswith("torch"):
        return True
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    return isinstance(tensor, type) and isinstance(x, tensor)


def _from_torch(x: Any, name: str) -> np.ndarray[Any, Any]:
    """A tensor on any device as numpy, exactly: ``.detach()`` (no autograd),
    ``.cpu()`` *before* any numpy conversion (a CUDA tensor has no numpy view; the
    device-to-host copy is bitwise), the lazy negation/conjugation bits resolved
    (exact: a sign flip), then numpy; bfloat16 and fp8 through float32."""
    t = x.detach()
    if getattr(t, "is_complex", lambda: False)():
        raise SpecError(f"{name}.dtype={t.dtype}: complex tensors are not supported")
    t = t.cpu()
    if hasattr(t, "resolve_neg"):
        t = t.resolve_neg()
    name = str(t.dtype).removeprefix("torch.")
    if name in _VIA_FLOAT32:
        import ml_dtypes

        # bf16/fp8 -> fp32 is exact (fp32 has the wider exponent range and more
        # significand bits), and fp32 -> the same format of a value that came from
        # it is exact too.
        return np.asarray(t.float().numpy()).astype(getattr(ml_dtypes, name))
    return np.asarray(t.numpy())


def as_exact_array(x: Any, name: str) -> np.ndarray[Any, Any]:
    """``x`` as a numpy array holding exactly the same numbers.

    numpy arrays (ml_dtypes.bfloat16 included) keep their dtype; torch tensors
    on any device (CUDA included) go through ``.detach().cpu()`` before numpy
    (bfloat16 and fp8 through an exact float32 step; subclasses included);
    jax arrays through ``np.asarray``; nested lists and Python scalars become
    float64 (a Python float is a double, so this is exact; an integer must be
    exactly representable). Bool arrays are returned as bool (for masks).  mpmath
    numbers (``mpf``, ``mpmath.matrix``, lists or object arrays of them) become float64
    when each is exactly a float64, else one clear line (:mod:`.mp`); ``mpc`` and
    ``mpi`` are refused.

    >>> as_exact_array([[1, 2.5]], "query").dtype
    dtype('float64')
    """
    kind = tensor_kind(x)
    if kind is not None:
        raise SpecError(f"{name} is {kind}: the oracle reads the numbers a tensor holds")
    module = type(x).__module__ or ""
    if module.startswith("mpmath") or (isinstance(x, np.ndarray) and x.dtype == object
                                       and _holds_mpmath(x)):
        arr = mpmath_to_array(x, name)
    elif _is_torch_tensor(x):
        arr = _from_torch(x, name)
    elif module.startswith(("jax", "jaxlib")):
        arr = np.asarray(x)
    elif isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, np.generic):
        arr = np.asarray(x)
    else:
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as exc:
            raise SpecError(
                f"{name} could not be read as an array of numbers (ragged nested lists?): "
                f"{exc}"
            ) from None
        if arr.dtype == object and _holds_mpmath(arr):
            return mpmath_to_array(x, name)
        if arr.dtype == object or arr.dtype.kind in "US":
            raise SpecError(
                f"{name} must hold numbers, got an array of dtype={arr.dtype} "
                "(ragged nested lists or strings?)"
            )
        if arr.dtype.kind in "iuf":
            arr = _ints_to_float64(arr, name) if arr.dtype.kind in "iu" else arr.astype(
                np.float64
            )
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind in "iu":
        return _ints_to_float64(arr, name)
    if not is_float_dtype(arr.dtype):
        raise SpecError(
            f"{name}.dtype={arr.dtype}: expected float64, float32, float16, bfloat16, "
            "float8_e4m3fn, float8_e5m2 (or bool for a mask)"
        )
    return arr


def _holds_mpmath(arr: np.ndarray[Any, Any]) -> bool:
    """Whether an object array holds an mpmath number (looked at in full: an array of
    Python objects is small)."""
    return any((type(v).__module__ or "").startswith("mpmath") for v in arr.flat)


def _ints_to_float64(arr: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    if arr.size and int(np.max(np.abs(arr.astype(object)))) > 2**53:
        raise InputValueError(
            f"{name} holds an integer above 2**53 in magnitude, which float64 cannot "
            "hold exactly; pass floats"
        )
    return arr.astype(np.float64)


def to_float64(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Exact widening to float64 (every supported format is a subset of it)."""
    return np.asarray(arr, dtype=np.float64)


def validate_finite(x: np.ndarray[Any, Any], name: str, *, allow_neg_inf: bool = False) -> None:
    """Raise InputValueError naming ``name`` and the first index holding NaN or
    ±Inf (only NaN and +Inf when ``allow_neg_inf``, as for additive masks)."""
    if x.dtype == bool or x.size == 0:
        return
    if not allow_neg_inf and is_float_dtype(x.dtype):
        # one pass without a float64 copy (issue 29, decode): a sum is finite only
        # if every term is (inf, -inf and NaN propagate, in any order of summation).
        # float32 is summed in float32 (no cast: half the time of a float64 sum), the
        # others in float64 (cannot overflow on the narrower formats); an overflow
        # only sends the call to the elementwise search below
        acc = np.float32 if x.dtype == np.float32 else np.float64
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.add.reduce(x, axis=None, dtype=acc)):
                return
    a = np.asarray(x, dtype=np.float64)
    bad = np.isnan(a) | (a == np.inf) if allow_neg_inf else ~np.isfinite(a)
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputValueError(
            f"{name}[{', '.join(map(str, idx))}] = {float(a[idx])!r}: expected a finite number"
            + (" (or -inf)" if allow_neg_inf else "")
        )
