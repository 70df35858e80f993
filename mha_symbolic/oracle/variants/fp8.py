"""FP8 descale factors (FlashAttention-3's ``q_descale``/``k_descale``/``v_descale``,
(batch, H_kv)): the kernel computes with q·d_q, k·d_k, v·d_v, which are exact
doubles for fp8/fp16/bf16/fp32 inputs and fp32 factors (checked, refused otherwise)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import InputValueError, ShapeError, SpecError
from ..inputs import as_exact_array, to_float64
from .protocol import BugClass, Variant, VariantOptions, register
from .semantics import Geometry, float_array, products_exact, sequence_row
from .views import scaled

_NAMES = ("q_descale", "k_descale", "v_descale")


def _parse(q_descale: Any = None, k_descale: Any = None, v_descale: Any = None
           ) -> dict[str, Any]:
    given = dict(zip(_NAMES, (q_descale, k_descale, v_descale), strict=True))
    return {n: float_array(d, n) for n, d in given.items() if d is not None}


#: significant bits of the input formats whose values are exact in float32
_SIGNIFICAND_BITS = {"float8_e4m3fn": 4, "float8_e5m2": 3, "bfloat16": 8, "float16": 11,
                     "float32": 24}


def _descaled(x: np.ndarray[Any, Any], d: np.ndarray[Any, Any] | None, name: str,
              dname: str, outer: tuple[int, ...], heads: int,
              group: int = 1) -> np.ndarray[Any, Any]:
    """x · d with d of shape (outer..., H_kv) (FlashAttention-3: (batch, nheads_k)); the
    query heads of a GQA group share their kv head's factor.  Exact or refused."""
    x64 = to_float64(x)
    if d is None:
        return x64
    if x.ndim < 3:
        raise ShapeError(f"{dname} needs {name} with a head axis (..., heads, L, E); got "
                         f"{name}.shape={x.shape}")
    hk = heads // group
    try:
        dd = np.broadcast_to(d, (*outer, hk))
    except ValueError:
        raise ShapeError(f"{dname}.shape={d.shape} does not broadcast to (batch..., "
                         f"nheads_k) = {(*outer, hk)}") from None
    dd = np.repeat(dd, group, axis=-1) if group > 1 else dd
    factor = dd.reshape(*dd.shape, 1, 1)
    with np.errstate(over="ignore", under="ignore"):
        out = x64 * factor
    # significands of at most p_x and 24 bits multiply exactly in a double when
    # p_x + 24 <= 53 (fp8, fp16, bf16, fp32 inputs; float32 factors), and the product of
    # two float32-range numbers is a normal double: no TwoProduct needed
    narrow = (_SIGNIFICAND_BITS.get(str(x.dtype), 53) <= 29
              and bool(np.all(d.astype(np.float32) == d)))
    if narrow:
        return out
    xb, fb = np.broadcast_arrays(x64, factor)
    if not np.all(np.isfinite(out)) or not products_exact(xb, fb, out):
        raise InputValueError(
            f"{name} · {dname} is not exactly representable in float64: descale factors "
            "are meant for fp8 (or fp16/bf16/fp32) inputs, whose products with an fp32 "
            "factor are exact; pass the descaled values instead"
        )
    return out


def _inputs(opts: VariantOptions, q: Any, k: Any, v: Any, geo: Geometry, group: int
            ) -> tuple[Any, Any, Any]:
    outer = geo.outer
    return (_descaled(q, opts.q_descale, "query", "q_descale", outer, geo.heads, group),
            _descaled(k, opts.k_descale, "key", "k_descale", outer, geo.heads // group),
            _descaled(v, opts.v_descale, "value", "v_descale", outer, geo.heads // group))


def _sequence(opts: VariantOptions, b: int, n: int) -> dict[str, Any]:
    return {name: sequence_row(getattr(opts, name), b, n, name, "H_kv")
            for name in _NAMES if getattr(opts, name) is not None}


def _plain_descale(x: np.ndarray[Any, Any], d: np.ndarray[Any, Any] | None, power: int,
                   heads_kv: int, group: int, outer: tuple[int, ...]) -> np.ndarray[Any, Any]:
    if d is None or power == 0:
        return x
    dd = np.broadcast_to(d, (*outer, heads_kv))
    if group > 1:
        dd = np.repeat(dd, group, axis=-1)
    return x * (dd ** power)[..., None, None]


def _plain_inputs(opts: VariantOptions, q: Any, k: Any, v: Any, outer: tuple[int, ...],
                  H: int, group: int, *, descale_power: tuple[int, int, int] = (1, 1, 1)
                  ) -> tuple[Any, Any, Any, bool, bool]:
    """The testing side's float64 descale (``plain_inputs``): q, k, v times their factors
    to the powers ``descale_power`` (the bug classes': 0 missing, 2 applied twice); the
    kernel folds d_q·d_k into the scale and d_v into the output."""
    pq, pk, pv = descale_power
    hk = H // group
    return (_plain_descale(q, opts.q_descale, pq, hk, group, outer),
            _plain_descale(k, opts.k_descale, pk, hk, 1, outer),
            _plain_descale(v, opts.v_descale, pv, hk, 1, outer),
            opts.q_descale is not None or opts.k_descale is not None,
            opts.v_descale is not None)


def _whole(opts: VariantOptions) -> dict[str, Any]:
    """A packed call read as one sequence (``packed_whole``): no descale factors."""
    return dict.fromkeys(_NAMES)


def _has(name: str) -> Any:
    return lambda x: getattr(x.opts, name) is not None


def _any_descale(x: Any) -> bool:
    return any(getattr(x.opts, name) is not None for name in _NAMES)


_BUGS = (
    BugClass("q_descale_missing", "FP8 q_descale not applied", _has("q_descale"),
             lambda x: {"descale_power": (0, 1, 1)}),
    BugClass("k_descale_missing", "FP8 k_descale not applied", _has("k_descale"),
             lambda x: {"descale_power": (1, 0, 1)}),
    BugClass("v_descale_missing", "FP8 v_descale not applied", _has("v_descale"),
             lambda x: {"descale_power": (1, 1, 0)}),
    BugClass("descale_missing", "no FP8 descale factor applied", _any_descale,
             lambda x: {"descale_power": (0, 0, 0)}),
    BugClass("descale_applied_twice", "FP8 descale factors applied twice",
             _any_descale, lambda x: {"descale_power": (2, 2, 2)}),
)

def _descale_factor(d: Any, x_lead: tuple[int, ...], prep: Any, kv: bool) -> Any:
    """The descale factor of every flat problem of an input with leading shape x_lead
    (FlashAttention-3: (batch, nheads_k), the query heads of a group sharing their kv
    head's factor)."""
    if d is None:
        return None
    geo = prep.geo
    hk = geo.heads // prep.group
    full = np.broadcast_to(d, (*geo.outer, hk))
    if not kv and prep.group > 1:
        full = np.repeat(full, prep.group, axis=-1)
    try:
        return np.broadcast_to(full, x_lead).reshape(-1)
    except ValueError:  # pragma: no cover - the forward's checks refuse it first
        raise ShapeError(f"descale factors of shape {d.shape} do not match {x_lead}") from None


def _backward_inputs(opts: VariantOptions, prep: Any, query: Any, key: Any, value: Any
                     ) -> Any:
    """The chain rule through q·d_q, k·d_k, v·d_v: the gradients with respect to the
    fp8 tensors are d_q·dq', d_k·dk', d_v·dv' (the query heads of a GQA group share
    their kv head's d_q).  The gradient of an fp8 input broadcast over batches with
    different descale factors would be a sum of differently scaled copies: refused.
    No gradient of the descale factors is given (FlashAttention-3's autograd returns
    None for them)."""
    for name, x, x64, d in (("query", query, prep.q64, opts.q_descale),
                            ("key", key, prep.k64, opts.k_descale),
                            ("value", value, prep.v64, opts.v_descale)):
        if d is not None and tuple(as_exact_array(x, name).shape) != tuple(x64.shape):
            raise SpecError(f"{name}.shape does not cover the descale factors' batch: pass "
                            f"{name} with its batch dimension (shape {x64.shape}) for the "
                            "backward with descale factors")

    def chain(res: dict[str, Any]) -> dict[str, Any]:
        out = dict(res)
        for name, d, x64, kv in (("dq", opts.q_descale, prep.q64, False),
                                 ("dk", opts.k_descale, prep.k64, True),
                                 ("dv", opts.v_descale, prep.v64, True)):
            f = _descale_factor(d, tuple(x64.shape[:-2]), prep, kv)
            if f is not None:
                out[name] = scaled(res[name], f)
        return out
    return chain


FP8 = register(Variant(
    name="fp8_descale", keywords=_NAMES, fields=dict.fromkeys(_NAMES), parse=_parse,
    summary="FP8 descale factors (batch, H_kv), FlashAttention-3", inputs=_inputs, sequence=_sequence,
    bugs=_BUGS, plain_inputs=_plain_inputs, packed_whole=_whole,
    backward_inputs=_backward_inputs, backward_check="FP8 descale factors"))
