"""Fused loops of the tolerance model (:mod:`.model`), compiled with numba when it is
installed (issue 29: the model's ~100 elementwise passes over the (rows × keys)
arrays of a chunk are most of a check's time).

Each kernel (:mod:`._model_kernels`) computes the arrays of a numpy step of
:mod:`.model` with the same IEEE 754 operations in the same order, so the tolerances
are bit-identical with and without numba (tests/testing/forward/test_model_jit.py).
Without numba, or with the environment variable ``MHA_SYMBOLIC_NUMBA=0`` (the
oracle's switch, :mod:`mha_symbolic.oracle.arith.jit`), the numpy steps run."""

from __future__ import annotations

import os
from typing import Any


def kernels() -> Any:
    """The compiled kernels (a module), or None without numba / when disabled."""
    if os.environ.get("MHA_SYMBOLIC_NUMBA", "1") == "0":
        return None
    return _load()


_LOADED: list[Any] = []


def _load() -> Any:
    if not _LOADED:
        try:
            from . import _model_kernels
        except ImportError:
            _LOADED.append(None)
        else:
            _LOADED.append(_model_kernels)
    return _LOADED[0]
