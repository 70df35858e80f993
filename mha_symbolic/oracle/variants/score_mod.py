"""FlexAttention's ``score_mod`` from the certified menu (:mod:`.score_mods`): a
softcap, ALiBi or a relative-position bias table, applied in the order given.  Its
distances use the raw q_idx, kv_idx and its own offset, as FlexAttention applies it
(a KV cache does not move them; an offset per batch element does)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ShapeError, SpecError
from ..backward.functionals import ScoreFunctional, distance_functional, relative_distances
from .protocol import GradParam, Variant, VariantOptions, register
from .score_mods import AlibiScoreMod, RelativeBiasScoreMod, ScoreMod, SoftcapScoreMod
from .semantics import Bias, Cap, Geometry, _outer_heads, per_problem


def _score_mods(score_mod: Any) -> dict[str, Any]:
    if score_mod is None:
        return {}
    items = tuple(score_mod) if isinstance(score_mod, (tuple, list)) else (score_mod,)
    for m in items:
        if not isinstance(m, ScoreMod):
            raise SpecError(
                f"score_mod={m!r}: an arbitrary float callable cannot be certified (the "
                "oracle needs the exact mathematics of the modification, a callable only "
                "gives float approximations). Use the certified menu: "
                "mha_symbolic.softcap_score_mod(c), alibi_score_mod(slopes), "
                "relative_bias_score_mod(table) (or a tuple of them), or the softcap=, "
                "alibi_slopes= arguments; a boolean mask belongs in mask_mod="
            )
    return {"score_mods": items} if items else {}


def _scores(opts: VariantOptions, geo: Geometry) -> tuple[Cap | Bias, ...]:
    ops: list[Cap | Bias] = []
    for m in opts.score_mods:
        if isinstance(m, SoftcapScoreMod):
            ops.append(Cap(m.cap))
        elif isinstance(m, AlibiScoreMod):
            ops.append(Bias("alibi", per_problem(m.slopes, geo, "score_mod slopes")
                            if m.slopes.ndim == 1 else _outer_heads(m.slopes, geo),
                            _offset(m.offset, geo)))
        elif isinstance(m, RelativeBiasScoreMod):
            tab = m.table if m.table.ndim == 2 else m.table[None]
            if tab.shape[0] not in (1, geo.heads):
                raise ShapeError(f"score_mod table.shape={m.table.shape}: expected "
                                 f"(2W + 1,) or (H={geo.heads}, 2W + 1)")
            ops.append(Bias("table", tab, _offset(m.offset, geo)))
    return tuple(ops)


def _offset(offset: Any, geo: Geometry) -> Any:
    """A score_mod's literal offset: one int, or one per outer batch element."""
    if not np.ndim(offset):
        return offset
    n = int(np.prod(geo.outer, dtype=np.int64)) if geo.outer else 1
    if np.shape(offset) != (n,):
        raise ShapeError(f"score_mod offset.shape={np.shape(offset)}: expected ({n},), one "
                         f"per batch element of inputs of batch shape {geo.batch}")
    return offset


def _table_functional(m: RelativeBiasScoreMod, geo: Any, n_keys: int) -> ScoreFunctional:
    """∂/∂table[h, w]: dS summed over the scores at clipped distance w − W."""
    S, H, B = geo.S, geo.heads, geo.B
    cols = np.arange(n_keys)
    tab = np.asarray(m.table)
    W = (tab.shape[-1] - 1) // 2
    per_head = tab.ndim == 2 and tab.shape[0] > 1
    target = np.arange(B, dtype=np.int64) % H if per_head else np.zeros(B, dtype=np.int64)

    def t_index(e: int, rows: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        d = relative_distances(n_keys, rows,
                               int(m.offset[e // H]) if np.ndim(m.offset) else m.offset)
        col = np.where(cols[None, :] < S, np.clip(d, -W, W) + W, -1)
        return col, np.ones(col.shape)

    return ScoreFunctional("grad_score_mod_table", tuple(tab.shape),
                           tab.shape[0] if per_head else 1, 1, tab.shape[-1], target, False,
                           t_index)


def _functionals(opts: VariantOptions, prep: Any, flat_lead: tuple[int, ...], n_keys: int
                 ) -> tuple[ScoreFunctional | None, ...]:
    """Per score_mod item, the gradient of its tensor: an ALiBi score_mod's slopes, a
    relative bias table's entries; None for a softcap (a constant)."""
    geo = prep.geo
    out: list[ScoreFunctional | None] = []
    for m in opts.score_mods:
        if isinstance(m, AlibiScoreMod):
            out.append(distance_functional("score_mod_slopes", np.asarray(m.slopes), m.offset,
                                        geo, flat_lead, n_keys))
        elif isinstance(m, RelativeBiasScoreMod):
            out.append(_table_functional(m, geo, n_keys))
        else:
            assert isinstance(m, SoftcapScoreMod)
            out.append(None)
    return tuple(out)


SCORE_MOD = register(Variant(
    name="score_mod", keywords=("score_mod",), fields={"score_mods": ()},
    parse=_score_mods, summary="FlexAttention score_mod from the certified menu",
    scores=_scores, order=20,
    transcendental=lambda opts: any(isinstance(m, SoftcapScoreMod)
                                    for m in opts.score_mods),
    positional=lambda opts: any(not isinstance(m, SoftcapScoreMod) for m in opts.score_mods),
    grad_params=(GradParam("d_score_mod", "grad_score_mod", _functionals, many=True),)))
