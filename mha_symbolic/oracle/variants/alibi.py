"""ALiBi (FlashAttention's ``alibi_slopes``): -slope·|j - (i + off)| added to the
score, slopes (H,) or (B, H).  With a KV cache (``cache_seqlens``) each sequence's
queries sit at its own offset ``cache_seqlens[b] - L`` (FlashAttention's
``seqlen_k - seqlen_q`` per batch element): the bias reads them itself through the
``own_positions`` hook, so it is not ``positional`` (one offset per call)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backward.functionals import ScoreFunctional, distance_functional
from .protocol import (
    BugClass,
    GradParam,
    Variant,
    VariantOptions,
    lengths_differ,
    own_query_offsets,
    register,
)
from .semantics import Bias, Geometry, float_array, per_problem, sequence_row


def _parse(alibi_slopes: Any) -> dict[str, Any]:
    if alibi_slopes is None:
        return {}
    return {"alibi_slopes": float_array(alibi_slopes, "alibi_slopes")}


def _scores(opts: VariantOptions, geo: Geometry) -> tuple[Bias, ...]:
    own = own_query_offsets(opts, geo)
    return (Bias("alibi", per_problem(opts.alibi_slopes, geo, "alibi_slopes"),
                 geo.offset if own is None else np.asarray(own, dtype=np.int64)),)


def _sequence(opts: VariantOptions, b: int, n: int) -> dict[str, Any]:
    return {"alibi_slopes": sequence_row(opts.alibi_slopes, b, n, "alibi_slopes", "H")}


def _plain_scores(opts: VariantOptions, geo: Geometry, *, alibi_sign: float = 1.0,
                  alibi_reverse: bool = False, flip_alibi_alignment: bool = False
                  ) -> tuple[tuple[str, Bias], ...]:
    """The testing side's bias (``plain_scores``), as the bug classes make it: slopes
    times ``alibi_sign`` (-1 flipped, 0 missing), in reversed head order, or measured
    from the other corner."""
    slopes = per_problem(opts.alibi_slopes, geo, "alibi_slopes") * alibi_sign
    if alibi_reverse:
        slopes = slopes[:, ::-1]
    own = own_query_offsets(opts, geo)
    if own is None:
        aoff: Any = (geo.S - geo.L) - geo.offset if flip_alibi_alignment else geo.offset
    else:   # each sequence's own query positions (the KV cache's), or the other corner:
        # queries at 0 … L-1 (not offset by the cache; from the cache's end the bias
        # would change by a constant per row: no bug)
        aoff = np.zeros_like(own) if flip_alibi_alignment else np.asarray(own)
    return (("scores", Bias("alibi", np.ascontiguousarray(slopes), aoff)),)


def _whole(opts: VariantOptions) -> dict[str, Any]:
    """A packed call read as one sequence (``packed_whole``): sequence 0's slopes, (H,)
    kept whole (one slope per head; a (B, H) array gives its row 0)."""
    sl = opts.alibi_slopes
    return {"alibi_slopes": sl if sl.ndim == 1 else sl[0]}


def _alibi(x: Any) -> bool:
    return x.opts.alibi_slopes is not None


def _alibi_asym(x: Any) -> bool:
    s = x.opts.alibi_slopes
    return s is not None and s.shape[-1] > 1 and not np.array_equal(s, s[..., ::-1])


_BUGS = (
    BugClass("alibi_sign_flipped", "ALiBi bias added with the wrong sign "
             "(+slope·|i - j|: distant keys favoured)", _alibi,
             lambda x: {"alibi_sign": -1.0}),
    BugClass("alibi_slopes_reversed", "ALiBi slopes applied in reversed head order",
             _alibi_asym, lambda x: {"alibi_reverse": True}),
    BugClass("alibi_misaligned", "ALiBi distance measured from the other corner "
             "(|i - j| vs |i + S - L - j|)", lambda x: _alibi(x) and lengths_differ(x),
             lambda x: {"flip_alibi_alignment": True}),
    BugClass("alibi_missing", "ALiBi bias not added", _alibi,
             lambda x: {"alibi_sign": 0.0}),
)

def _functionals(opts: VariantOptions, prep: Any, flat_lead: tuple[int, ...], n_keys: int
                 ) -> tuple[ScoreFunctional, ...]:
    geo = prep.geo
    own = own_query_offsets(opts, geo)
    return (distance_functional("alibi_slopes", opts.alibi_slopes, geo.offset if own is None
                             else np.asarray(own), geo, flat_lead, n_keys),)


def _reduce(geo: Geometry, shape: tuple[int, ...]) -> Any:
    """Σ |j − (i + off)| x_ij per flat problem, summed to the slopes' shape."""
    L, S, H = geo.L, geo.S, geo.heads
    dist = np.abs(np.arange(S)[None, :] - (np.arange(L)[:, None] + geo.offset)).astype(
        np.float64)

    def slope_sum(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        per = (x[..., :S] * dist).sum(axis=(-2, -1)).reshape(-1, H)
        return per.sum(axis=0).reshape(shape) if len(shape) == 1 else per.reshape(shape)
    return slope_sum


def _without(**changes: Any) -> Any:
    return lambda x: {"variant_changes": changes}


def _reversed_slopes(x: Any) -> dict[str, Any]:
    sl = x.opts.alibi_slopes
    return {"variant_changes": {"alibi_slopes": np.ascontiguousarray(sl[..., ::-1])}}


_BACKWARD_BUGS = (
    BugClass("alibi_missing_in_backward", "ALiBi bias not added when the backward "
             "recomputes P = exp(S − lse)", _alibi, _without(alibi_slopes=None)),
    BugClass("alibi_slopes_reversed_in_backward", "ALiBi slopes in reversed head order "
             "when the backward recomputes P = exp(S − lse)", _alibi_asym, _reversed_slopes),
)

ALIBI = register(Variant(
    name="alibi", keywords=("alibi_slopes",), fields={"alibi_slopes": None}, parse=_parse,
    summary="ALiBi slopes: -slope·|j - (i + off)| added", scores=_scores, order=30, sequence=_sequence,
    bugs=_BUGS, positional=lambda opts: False, plain_scores=_plain_scores,
    packed_whole=_whole,
    grad_params=(GradParam("d_alibi_slopes", "grad_alibi_slopes", _functionals,
                           stacked=lambda opts: opts.alibi_slopes.ndim == 2,
                           reduce=_reduce),),
    backward_bugs=_BACKWARD_BUGS))
