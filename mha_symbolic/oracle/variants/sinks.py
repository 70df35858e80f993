"""Attention sinks (gpt-oss): a logit σ_h per query head in the softmax's
denominator only — ``softmax(cat([QK, S]))[..., :-1]``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError
from ..backward.functionals import ScoreFunctional
from .protocol import BugClass, GradParam, Variant, VariantOptions, register
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

def _functionals(opts: VariantOptions, prep: Any, flat_lead: tuple[int, ...], n_keys: int
                 ) -> tuple[ScoreFunctional, ...]:
    """∂/∂σ_h: the sink's column (index S) of dS, per head: σ_h enters row i's softmax
    as a key of value 0, so ∂L/∂σ_h = Σ_{batch, i} dS_{i,sink} = −Σ_i P_{i,sink} D_i."""
    geo = prep.geo
    S, H = geo.S, geo.heads
    cols = np.arange(n_keys)

    def sink_index(e: int, rows: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        col = np.where(cols == S, 0, -1)
        return np.broadcast_to(col, (rows.size, n_keys)), np.ones((rows.size, n_keys))

    return (ScoreFunctional("grad_sinks", (H,), H, 1, 1, np.arange(geo.B, dtype=np.int64) % H,
                            False, sink_index),)


def _reduce(geo: Geometry, shape: tuple[int, ...]) -> Any:
    """The sink column of the lowered mask gradient, summed per head."""
    S, H = geo.S, geo.heads

    def sink_sum(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.asarray(x[..., S].sum(axis=-1)).reshape(-1, H).sum(axis=0)
    return sink_sum


SINKS = register(Variant(
    name="sinks", keywords=("sinks",), fields={"sinks": None}, parse=_parse,
    summary="a logit per head in the denominator only (gpt-oss)", sinks=_sinks,
    bugs=_BUGS,
    grad_params=(GradParam("d_sinks", "grad_sinks", _functionals, reduce=_reduce),)))
