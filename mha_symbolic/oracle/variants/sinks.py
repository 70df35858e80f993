"""Attention sinks (gpt-oss): a logit σ_h per query head in the softmax's
denominator only — ``softmax(cat([QK, S]))[..., :-1]``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from .protocol import BugClass, Variant, VariantOptions, register
from .semantics import Geometry, float_array


def _parse(sinks: Any) -> dict[str, Any]:
    return {} if sinks is None else {"sinks": float_array(sinks, "sinks")}


def _sinks(opts: VariantOptions, geo: Geometry) -> np.ndarray[Any, Any]:
    """σ per flat problem (B,)."""
    s = opts.sinks
    if s.ndim != 1 or s.shape[0] != geo.heads:
        raise ShapeError(f"sinks.shape={s.shape}: expected (H,) = ({geo.heads},), one logit "
                         "per query head")
    return np.tile(s, geo.n_outer)


def _has_sinks(x: Any) -> bool:
    return x.opts.sinks is not None


_BUGS = (
    BugClass("sinks_ignored", "attention sinks ignored (plain softmax)", _has_sinks,
             lambda x: {"sink_mode": "ignored"}),
    BugClass("sink_in_numerator", "the sink's e^σ also added to every key's "
             "numerator (weights no longer leave the sink its share)", _has_sinks,
             lambda x: {"sink_mode": "numerator"}),
)

SINKS = register(Variant(
    name="sinks", keywords=("sinks",), fields={"sinks": None}, parse=_parse,
    summary="a logit per head in the denominator only (gpt-oss)", sinks=_sinks,
    bugs=_BUGS))
