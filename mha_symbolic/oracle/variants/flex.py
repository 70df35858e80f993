"""FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``, or a torch BlockMask
(its block structure and mask_mod), as kept keys."""

from __future__ import annotations

from typing import Any

from ...errors import SpecError
from .protocol import Variant, VariantOptions, register
from .semantics import Geometry, block_mask_allowed, eval_mask_mod


def _is_block_mask(x: Any) -> bool:
    return type(x).__name__ == "BlockMask" and (type(x).__module__ or "").startswith("torch")


def _parse(mask_mod: Any) -> dict[str, Any]:
    if mask_mod is None:
        return {}
    if _is_block_mask(mask_mod):
        return {"block_mask": mask_mod}
    if not callable(mask_mod):
        raise SpecError(f"mask_mod={mask_mod!r}: expected a callable mask_mod(b, h, "
                        "q_idx, kv_idx) -> bool or a torch BlockMask")
    return {"mask_mod": mask_mod}


def _keep(opts: VariantOptions, geo: Geometry, is_causal: bool) -> Any:
    shape = (*geo.batch, geo.L, geo.S)
    keep = None
    if opts.mask_mod is not None:
        keep = eval_mask_mod(opts.mask_mod, geo).reshape(shape)
    if opts.block_mask is not None:
        bm = block_mask_allowed(opts.block_mask, geo).reshape(shape)
        keep = bm if keep is None else keep & bm
    return keep


def _sequence(opts: VariantOptions, b: int, n: int) -> dict[str, Any]:
    """A mask_mod of a packed varlen call gets sequence b as its batch index (and
    indices within the sequence); a BlockMask describes one padded batch: refused."""
    if opts.block_mask is not None:
        raise SpecError("mask_mod: a BlockMask is not available for packed varlen calls "
                        "(its blocks index a padded batch); pass its mask_mod")
    mask_mod = opts.mask_mod

    def mm(bb: Any, h: Any, qi: Any, ki: Any) -> Any:
        return mask_mod(bb + b, h, qi, ki)
    return {"mask_mod": mm}


FLEX = register(Variant(
    name="mask_mod", keywords=("mask_mod",), fields={"mask_mod": None, "block_mask": None},
    parse=_parse, summary="FlexAttention mask_mod or BlockMask", keep=_keep,
    sequence=_sequence))
