"""Arguments checked at the door of every public function, before any work.

One decorator, :func:`door`, applied to the public functions (the oracle's
``reference_*``, the engine's ``exact_attention``, and through
:func:`mha_symbolic.testing.options.checked` every ``compare_*``).  From the function's
own signature it checks, before the function body runs:

- a misspelt keyword: :class:`~mha_symbolic.errors.UnknownOptionError` naming the
  function and the closest names (never a TypeError from deep inside);
- a parameter whose default is ``True`` or ``False`` takes only a bool (``numpy.bool_``
  too): ``is_causal="no"`` is refused, not read as true;
- an integer argument, or one inside a short tuple or list (``window=(10**5000, 0)``),
  of more than :data:`MAX_INT_BITS` bits: refused by its size, found with
  ``int.bit_length`` (no ``str()``: Python refuses to print an integer of more than
  4300 digits, and the refusal would come out of the error message itself).

:func:`shown` writes any argument for a message safely (never raises, never thousands of
characters); :func:`tensor_kind` names the tensor kinds the oracle cannot read (meta,
sparse, nested, fake and traced tensors, exotic dtypes) so that the conversion refuses
them with one line.

>>> @door
... def f(x: int = 0, *, flag: bool = False) -> int:
...     return x
>>> f(flag="no")
Traceback (most recent call last):
...
mha_symbolic.errors.SpecError: f(): flag='no' (str): expected True or False
>>> f(10**5000)
Traceback (most recent call last):
...
mha_symbolic.errors.SpecError: f(): x=<an integer of 16610 bits>: too large (at most 1100 bits)
>>> f(flg=True)
Traceback (most recent call last):
...
mha_symbolic.errors.UnknownOptionError: f() got an unexpected keyword argument 'flg'; did you mean 'flag'?
"""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .errors import SpecError, UnknownOptionError

__all__ = ["MAX_INT_BITS", "check_flag", "close_matches", "door", "shown", "tensor_kind",
           "unknown_option"]

F = TypeVar("F", bound=Callable[..., Any])

#: Largest integer argument, in bits: beyond the float64 range (2^1024) no size, index,
#: scale or count of attention means anything.
MAX_INT_BITS = 1100
#: Longest string option (a rule's or a policy's name is a few words).
MAX_OPTION_CHARS = 1000
#: Longest tuple or list whose entries are checked as scalars (``window=(l, r)``).
_SHORT = 8


def shown(value: Any, limit: int = 60) -> str:
    """``value`` for a message: an integer of more than 40 digits by its size in bits, any
    other value's repr cut at ``limit`` characters with its type; never raises."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # a repr that raises (a traced value, a broken object)
        text = f"<{type(value).__name__}>"
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text if isinstance(value, (int, float, type(None))) else \
        f"{text} ({type(value).__name__})"


def close_matches(name: str, known: Iterable[str]) -> list[str]:
    """The known names closest to ``name`` (difflib's ratio at least 0.6), best first."""
    return difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)


def unknown_option(func: str, name: str, known: Iterable[str]) -> UnknownOptionError:
    """The error for option ``name`` given to ``func``, which takes ``known``: one line,
    Python's wording, with the closest known names."""
    from ._text import echo

    near = close_matches(name, known)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    return UnknownOptionError(f"{func}() got an unexpected keyword argument {echo(name, 60)}"
                              f"{hint}")


def _numpy_bool(value: Any) -> bool:
    return (type(value).__module__ or "") == "numpy" and type(value).__name__ in ("bool_", "bool")


def check_flag(value: Any, name: str, func: str = "") -> bool:
    """``value`` as a bool, refusing anything but ``True``/``False`` (numpy's too)."""
    if isinstance(value, bool):
        return value
    if _numpy_bool(value):
        return bool(value)
    where = f"{func}(): " if func else ""
    raise SpecError(f"{where}{name}={shown(value)}: expected True or False")


def _check_size(value: Any, name: str, func: str, max_chars: int | None) -> None:
    items = value if isinstance(value, (tuple, list)) and len(value) <= _SHORT else (value,)
    for v in items:
        if max_chars is not None and isinstance(v, (str, bytes)) and len(v) > max_chars:
            raise SpecError(f"{func}(): {name}=<a {type(v).__name__} of {len(v)} characters>: "
                            f"too long (at most {max_chars})")
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
            raise SpecError(f"{func}(): {name}={shown(v)}: too large (at most {MAX_INT_BITS} "
                            "bits)")


def door(fn: F, *, max_bits: int | None = MAX_INT_BITS, quiet: bool = False,
         sized: Iterable[str] | None = None, max_chars: int | None = MAX_OPTION_CHARS) -> F:
    """``fn`` with its arguments checked first (see the module's docstring);
    ``max_bits=None`` leaves integers to ``fn``; ``sized``: only these arguments are
    checked for size (the exact engine takes rationals of any size as entries and scale,
    but a count or an option is never huge);
    ``quiet``: numpy's floating-point warnings silenced while ``fn`` runs."""
    sig = inspect.signature(fn)
    name = fn.__name__
    params = sig.parameters
    keywords = {p.name for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                               p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    flags = {p.name for p in params.values() if isinstance(p.default, bool)}
    only = None if sized is None else frozenset(sized)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if not takes_any:
            for key in kwargs:
                if key not in keywords:
                    raise unknown_option(name, key, keywords)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:  # a missing or doubled argument: Python's words, ours
            raise UnknownOptionError(f"{name}(): {exc}") from None
        for key, value in bound.arguments.items():
            if key in flags and value is not params[key].default:
                check_flag(value, key, name)
            if max_bits is None or (only is not None and key not in only):
                continue
            kind = params[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                for k, v in value.items():
                    _check_size(v, k, name, max_chars)
            elif kind is not inspect.Parameter.VAR_POSITIONAL:
                _check_size(value, key, name, max_chars)
        if not quiet:
            return fn(*args, **kwargs)
        import numpy as np

        # float overflow inside the oracle is detected by its own finiteness checks (an
        # element not enclosed in float64 is recomputed or reported); numpy's warnings
        # about it are internal and never reach the caller
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


#: Tensor layouts other than torch.strided, by name: what each one is, for a message.
_LAYOUTS = {"sparse_coo": "a sparse (COO) tensor", "sparse_csr": "a sparse (CSR) tensor",
            "sparse_csc": "a sparse (CSC) tensor", "sparse_bsr": "a sparse (BSR) tensor",
            "sparse_bsc": "a sparse (BSC) tensor", "jagged": "a nested (jagged) tensor",
            "_mkldnn": "an MKL-DNN tensor"}
#: dtypes no exact conversion is written for: what each one is.
_EXOTIC = ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
           "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits", "uint1", "int1")


def tensor_kind(x: Any) -> str | None:
    """What makes the torch tensor or jax array ``x`` unreadable as exact numbers, or None.

    Looked up by attributes only (torch and jax are never imported here): a meta tensor
    (no data), a sparse, nested or MKL-DNN layout, a FakeTensor or a functorch wrapper
    (inside ``torch.vmap``/``torch.func.grad``: values not yet computed), a quantized
    tensor or an exotic dtype (fnuz fp8, e8m0, fp4, quantized, bit types), a jax tracer
    (inside ``jit``/``grad``/``vmap``)."""
    cls = type(x)
    module = cls.__module__ or ""
    if (module.startswith("jax") and "Tracer" in cls.__name__) or any(
            "Tracer" in c.__name__ and (c.__module__ or "").startswith("jax") for c in cls.__mro__):
        return ("a jax tracer (inside jax.jit, grad or vmap the values are not known yet; "
                "check the arrays outside the transformation)")
    if not (module.startswith("torch") or any((c.__module__ or "").startswith("torch")
                                              for c in cls.__mro__)):
        return None
    if "FakeTensor" in cls.__name__ or "FunctionalTensor" in cls.__name__:
        return f"a {cls.__name__} (it has no values)"
    try:
        from_functorch = bool(getattr(x, "_is_functorch_wrapped", False)) or _wrapped(x)
    except Exception:
        from_functorch = False
    if from_functorch:
        return ("a tensor inside torch.vmap or torch.func.grad (its values are not "
                "materialised; check outside the transformation)")
    if getattr(x, "is_meta", False) or str(getattr(x, "device", "")) == "meta":
        return "a meta tensor (it has a shape but no values)"
    if getattr(x, "is_nested", False):
        return "a nested tensor"
    layout = str(getattr(x, "layout", "torch.strided")).removeprefix("torch.")
    if layout != "strided":
        return _LAYOUTS.get(layout, f"a tensor of layout {layout}")
    if getattr(x, "is_quantized", False):
        return f"a quantized tensor ({str(x.dtype).removeprefix('torch.')})"
    dtype = str(getattr(x, "dtype", "")).removeprefix("torch.")
    if dtype in _EXOTIC or dtype.startswith(("float4", "float8_e8m0")):
        return f"a tensor of dtype {dtype} (no exact conversion for this format)"
    return None


def _wrapped(x: Any) -> bool:
    """A functorch (vmap/grad) wrapper tensor, asked of torch only when it is loaded."""
    import sys

    torch = sys.modules.get("torch")
    c = getattr(torch, "_C", None)
    for probe in ("_functorch", ):
        mod = getattr(c, probe, None)
        fn = getattr(mod, "is_functorch_wrapped_tensor", None)
        if fn is not None:
            return bool(fn(x))
    return False


#: Largest Arb precision a caller may ask for (``exact(prec=)``, ``mpi(bits=)``): twice
#: the certified evaluation's own cap of 32,768 bits (a ball at 10^9 bits would take
#: hours and gigabytes).
MAX_PREC_BITS = 65_536
#: Most digits a caller may ask for (``digits(n)``, ``round_significant``), and most
#: decimal places (``truncate_places``, ``round_places``): 10^k is built exactly.
MAX_DIGITS = 10_000


def check_int(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo … hi`` (numpy integers too), else one SpecError naming
    ``name``; sizes by ``bit_length``, never by ``str()``."""
    try:
        if isinstance(value, bool) or _numpy_bool(value):
            raise TypeError
        v = operator.index(value)  # int, numpy integers; never a float or a string
    except TypeError:
        raise SpecError(f"{name}={shown(value)}: expected an integer from {lo:,} to {hi:,}"
                        ) from None
    if not lo <= v <= hi:
        raise SpecError(f"{name}={shown(v)}: expected an integer from {lo:,} to {hi:,}")
    return v


def check_bits(value: Any, name: str = "prec") -> int:
    """An Arb precision in bits: 2 … :data:`MAX_PREC_BITS`."""
    return check_int(value, name, 2, MAX_PREC_BITS)
