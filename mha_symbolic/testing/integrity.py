"""Kernels that game the check: inputs mutated in place, an output that is (a view
of) an input.  :class:`Guard` wraps the kernel :func:`~.check.check_attention` runs:
it snapshots the arrays the kernel receives (their bits), calls it, and records

* every input whose bits changed during the call ("mutated its input query in place:
  12 / 256 element(s) changed") — the check then judges the output against the
  snapshot, the inputs as they were before the call;
* an output that shares memory with an input: torch by the byte ranges of the
  tensors' untyped storages (``untyped_storage().data_ptr()`` and ``nbytes()``),
  numpy by ``np.shares_memory``; jax arrays are immutable and never alias.

Either is a failed check, whatever the output's values.

>>> import numpy as np
>>> g = Guard()
>>> q = np.ones((1, 2, 3)); out = g.wrap(lambda q, k, v: q)(q, q, q)
>>> g.problems[0]
'the output shares memory with input query (the kernel returned a view of its input)'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .determinism import bits

__all__ = ["Guard"]

_NAMES = ("query", "key", "value")


def _framework(x: Any) -> str:
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


def _byte_range(t: Any) -> tuple[int, int]:
    s = t.untyped_storage()
    start = int(s.data_ptr())
    return start, start + int(s.nbytes())


def shares_memory(out: Any, x: Any) -> bool:
    """Whether ``out`` and ``x`` share memory (torch: overlapping storage byte ranges;
    numpy: ``np.shares_memory``; False for anything else)."""
    fo, fx = _framework(out), _framework(x)
    if fo == fx == "torch":
        if out.device != x.device:
            return False
        a0, a1 = _byte_range(out)
        b0, b1 = _byte_range(x)
        return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0
    if fo == fx == "numpy" and isinstance(out, np.ndarray) and isinstance(x, np.ndarray):
        return bool(np.shares_memory(out, x))
    return False


class Guard:
    """Wraps a kernel: snapshots what it receives, checks it after the call."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        #: the first call's inputs as they were before it (numpy copies of the bits'
        #: arrays, or the torch clones), for judging against
        self.before: tuple[Any, ...] | None = None

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            arrays = args[:3]
            if any(_framework(a) == "jax" for a in arrays):
                return fn(*args, **kwargs)   # immutable (and traced under jax.vjp)
            snap = [bits(a) if hasattr(a, "shape") else None for a in arrays]
            if self.before is None:
                self.before = tuple(_copy(a) for a in arrays)
            out = fn(*args, **kwargs)
            for name, a, s in zip(_NAMES, arrays, snap, strict=False):
                if s is None:
                    continue
                now = bits(a)
                changed = int(np.sum(now != s)) if now.shape == s.shape else int(s.size)
                if changed:
                    self.problems.append(f"the kernel mutated its input {name} in place: "
                                         f"{changed} / {s.size} element(s) changed")
            for name, a in zip(_NAMES, arrays, strict=False):
                if hasattr(out, "shape") and shares_memory(out, a):
                    self.problems.append(f"the output shares memory with input {name} (the "
                                         "kernel returned a view of its input)")
            return out

        return guarded


def _copy(a: Any) -> Any:
    if _framework(a) == "torch":
        return a.detach().clone()
    if _framework(a) == "numpy" and isinstance(a, np.ndarray):
        return a.copy()
    return a
