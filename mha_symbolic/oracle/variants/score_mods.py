"""The score modifications the oracle can certify: a fixed menu, in FlexAttention's form.

PyTorch's FlexAttention (``torch.nn.attention.flex_attention``, documented at
https://pytorch.org/docs/stable/nn.attention.flex_attention.html) lets a kernel
author pass any ``score_mod(score, b, h, q_idx, kv_idx) -> score`` applied to the
*scaled* score ``scale · q·k`` before the mask.  An arbitrary Python float callable
cannot be certified: the oracle would have to know its exact mathematical value,
and a callable only gives float approximations.  So the oracle accepts a menu of
modifications whose mathematics it knows exactly:

``softcap_score_mod(c)``
    ``score -> c · tanh(score / c)`` (Gemma 2, FlashAttention's ``softcap``);
``alibi_score_mod(slopes, offset=0)``
    ``score -> score - slopes[h] · |d|``,  ``d = kv_idx - (q_idx + offset)`` (an
    ``offset`` of one integer per batch element reads ``offset[b]``: a decode step's
    own query positions)
    (Press et al., "Train short, test long", ICLR 2022; FlashAttention's
    ``alibi_slopes`` is ``offset = S - L``);
``relative_bias_score_mod(table, offset=0)``
    ``score -> score + table[h, clip(d, -W, W) + W]`` for a table of 2W + 1 columns
    (a learned relative-position bias, as T5 without its logarithmic buckets).

Each object is also a valid FlexAttention ``score_mod``: calling it with torch
tensors computes the same modification in torch, so one object can be given both to
``flex_attention(..., score_mod=m)`` and to
``reference_attention(..., score_mod=m)``.  A tuple of them is applied in order.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import InputValueError, SpecError
from ..inputs import as_exact_array, to_float64, validate_finite

__all__ = [
    "AlibiScoreMod",
    "RelativeBiasScoreMod",
    "ScoreMod",
    "SoftcapScoreMod",
    "alibi_score_mod",
    "relative_bias_score_mod",
    "softcap_score_mod",
]


class ScoreMod:
    """A score modification from the certified menu (see the module docstring)."""

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        raise NotImplementedError


def _is_torch(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("torch")


def _torch_copy(arr: np.ndarray[Any, Any]) -> Any:
    """A float64 torch copy of ``arr`` when torch is already imported (else None): made
    once, so that calling the object under FlexAttention's tracing mutates nothing."""
    if "torch" not in sys.modules:
        return None
    import torch

    return torch.as_tensor(arr)


def _on(t: Any, arr: np.ndarray[Any, Any], like: Any) -> Any:
    import torch

    base = t if t is not None else torch.as_tensor(arr)
    return base.to(dtype=like.dtype, device=like.device)


def _offset_copy(offset: Any) -> Any:
    return _torch_copy(offset) if np.ndim(offset) else None


def _offset_at(offset: Any, t: Any, b: Any, like: Any) -> Any:
    """The query offset of batch element b: the int, or ``offset[b]`` (torch or numpy).
    (No numpy call on the int path: FlexAttention traces it with torch.compile.)"""
    if isinstance(offset, (int, np.integer)):
        return offset
    if _is_torch(like):
        import torch

        base = t if t is not None else torch.as_tensor(offset)
        return base.to(device=like.device)[b]
    return offset[b]


def _exact_positive(value: Any, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise SpecError(f"{name}={value!r}: expected a positive real number")
    f = float(value)
    if not np.isfinite(f) or f <= 0:
        raise InputValueError(f"{name}={value!r}: expected a finite number > 0")
    return Fraction(f)


@dataclass(frozen=True, eq=False)
class SoftcapScoreMod(ScoreMod):
    """``score -> cap · tanh(score / cap)``; ``cap`` is taken as its exact binary value."""

    cap: float

    @property
    def exact_cap(self) -> Fraction:
        return Fraction(self.cap)

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if _is_torch(score):
            return (score / self.cap).tanh() * self.cap
        return np.tanh(np.asarray(score) / self.cap) * self.cap


@dataclass(frozen=True, eq=False)
class AlibiScoreMod(ScoreMod):
    """``score -> score - slopes[h] · |kv_idx - (q_idx + offset)|`` (slopes (H,) or (B, H);
    offset one int, or (B,) ints: ``offset[b]``)."""

    slopes: np.ndarray[Any, Any]
    offset: Any = 0
    _torch: Any = field(default=None, repr=False, compare=False)
    _torch_offset: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_torch", _torch_copy(self.slopes))
        object.__setattr__(self, "_torch_offset", _offset_copy(self.offset))

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        d = kv_idx - (q_idx + _offset_at(self.offset, self._torch_offset, b, score))
        if _is_torch(score):
            t = _on(self._torch, self.slopes, score)
            slope = t[h] if t.ndim == 1 else t[b, h]
            return score - slope * d.abs()
        slope = self.slopes[h] if self.slopes.ndim == 1 else self.slopes[b, h]
        return np.asarray(score) - slope * np.abs(d)


@dataclass(frozen=True, eq=False)
class RelativeBiasScoreMod(ScoreMod):
    """``score -> score + table[h, clip(d, -W, W) + W]``, ``d = kv_idx - (q_idx + offset)``,
    for a table of shape (2W + 1,) (shared by the heads) or (H, 2W + 1); offset one int,
    or (B,) ints: ``offset[b]``."""

    table: np.ndarray[Any, Any]
    offset: Any = 0
    _torch: Any = field(default=None, repr=False, compare=False)
    _torch_offset: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_torch", _torch_copy(self.table))
        object.__setattr__(self, "_torch_offset", _offset_copy(self.offset))

    @property
    def half_width(self) -> int:
        return (self.table.shape[-1] - 1) // 2

    def __call__(self, score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        w = self.half_width
        d = kv_idx - (q_idx + _offset_at(self.offset, self._torch_offset, b, score))
        if _is_torch(score):
            t = _on(self._torch, self.table, score)
            col = d.clamp(-w, w) + w
            return score + (t[col] if t.ndim == 1 else t[h, col])
        col = np.clip(d, -w, w) + w
        tab = self.table
        return np.asarray(score) + (tab[col] if tab.ndim == 1 else tab[h, col])


def softcap_score_mod(cap: float) -> SoftcapScoreMod:
    """The soft cap ``score -> cap · tanh(score / cap)`` as a certified score_mod.

    >>> m = softcap_score_mod(30.0)
    >>> float(m(np.float64(0.0), 0, 0, 0, 0))
    0.0
    """
    return SoftcapScoreMod(float(_exact_positive(cap, "cap")))


def _exact_array(x: Any, name: str) -> np.ndarray[Any, Any]:
    arr = as_exact_array(x, name)
    if arr.dtype == bool:
        raise SpecError(f"{name}.dtype=bool: expected a float array")
    validate_finite(arr, name)
    return to_float64(arr)


def _offset(offset: Any) -> Any:
    if isinstance(offset, (list, tuple, np.ndarray)) or _is_torch(offset):
        arr = np.asarray(offset.cpu() if _is_torch(offset) else offset)
        if arr.ndim != 1 or arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise SpecError(f"offset: expected an integer or a 1-D array of integers "
                            f"(batch,), got dtype={arr.dtype}, shape={arr.shape}")
        if arr.size and int(np.abs(arr).max()) > 2**53:
            raise SpecError("offset: expected |offset| <= 2**53")
        return arr.astype(np.int64)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise SpecError(f"offset={offset!r}: expected an integer, or (batch,) integers")
    if abs(int(offset)) > 2**53:
        raise SpecError(f"offset={offset!r}: expected |offset| <= 2**53")
    return int(offset)


def alibi_score_mod(slopes: Any, offset: int = 0) -> AlibiScoreMod:
    """ALiBi, ``score -> score - slopes[h] · |kv_idx - (q_idx + offset)|``, as a
    certified score_mod; ``slopes`` of shape (H,) or (B, H), taken exactly; ``offset``
    one integer or one per batch element (B,) (a KV-cache decode's ``cache_seqlens -
    L``: FlexAttention's ``q_idx + offset[b]``).

    >>> m = alibi_score_mod([0.5, 0.25])
    >>> float(m(np.float64(1.0), 0, 1, 3, 0))
    0.25
    """
    arr = _exact_array(slopes, "slopes")
    if arr.ndim not in (1, 2):
        raise SpecError(f"slopes.shape={arr.shape}: expected (H,) or (B, H)")
    return AlibiScoreMod(arr, _offset(offset))


def relative_bias_score_mod(table: Any, offset: int = 0) -> RelativeBiasScoreMod:
    """A relative-position bias table as a certified score_mod:
    ``score -> score + table[h, clip(d, -W, W) + W]`` with ``d = kv_idx - (q_idx +
    offset)`` and a table of shape (2W + 1,) or (H, 2W + 1), taken exactly; ``offset``
    one integer or (B,) integers (``offset[b]``).

    >>> m = relative_bias_score_mod([0.0, 1.0, 2.0])   # W = 1: d = -1, 0, +1
    >>> float(m(np.float64(0.0), 0, 0, 5, 9))           # d = 4 is clipped to +1
    2.0
    """
    arr = _exact_array(table, "table")
    if arr.ndim not in (1, 2) or arr.shape[-1] % 2 == 0:
        raise SpecError(f"table.shape={arr.shape}: expected (2W + 1,) or (H, 2W + 1) "
                        "(an odd number of columns, the middle one for d = 0)")
    return RelativeBiasScoreMod(arr, _offset(offset))
