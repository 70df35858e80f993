"""ALiBi (FlashAttention's ``alibi_slopes``): -slope·|j - (i + off)| added to the
score, slopes (H,) or (B, H)."""

from __future__ import annotations

from typing import Any

from .protocol import Variant, VariantOptions, register
from .semantics import Bias, Geometry, float_array, per_problem, sequence_row


def _parse(alibi_slopes: Any) -> dict[str, Any]:
    if alibi_slopes is None:
        return {}
    return {"alibi_slopes": float_array(alibi_slopes, "alibi_slopes")}


def _scores(opts: VariantOptions, geo: Geometry) -> tuple[Bias, ...]:
    return (Bias("alibi", per_problem(opts.alibi_slopes, geo, "alibi_slopes"),
                 geo.offset),)


def _sequence(opts: VariantOptions, b: int, n: int) -> dict[str, Any]:
    return {"alibi_slopes": sequence_row(opts.alibi_slopes, b, n, "alibi_slopes", "H")}


ALIBI = register(Variant(
    name="alibi", keywords=("alibi_slopes",), fields={"alibi_slopes": None}, parse=_parse,
    summary="ALiBi slopes: -slope·|j - (i + off)| added", scores=_scores, order=30, sequence=_sequence,
    bugs=("alibi_sign_flipped", "alibi_slopes_reversed", "alibi_misaligned", "alibi_missing")))
