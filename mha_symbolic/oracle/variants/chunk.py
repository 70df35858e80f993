"""Chunked attention (FlashAttention 3/4's ``attention_chunk``, Llama 4's local layers):
the aligned position of query i, p = i + off (off = 0 top-left, S - L bottom-right,
FlashAttention's), lies in chunk ⌊p / c⌋, and the query sees only the keys of that
chunk, ``c·⌊p/c⌋ <= j < c·⌊p/c⌋ + c``; ``is_causal`` and a window narrow it further
(FlashAttention's ``col_limit_left = max(window's, chunk start)``, ``col_limit_right =
min(window's, chunk end)`` in ``hopper/mask.h``).  ``attention_chunk=0`` or None is off,
as in FlashAttention.  A kept-key variant: the tiers, the gradients and the error model
need nothing more (docs/variants.md, "Chunked attention").

The field ``attention_chunk_shift`` (None: 0) has no door keyword: it moves the chunk grid
by that many positions, which is how the bug catalogue replays a misaligned or
off-by-one chunk boundary (:mod:`mha_symbolic.testing.forward.bugs_variants`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import SpecError
from .protocol import BugClass, Variant, VariantOptions, lengths_differ, register
from .semantics import Geometry

__all__ = ["ATTENTION_CHUNK", "chunk_allowed"]

#: chunks wider than this are as good as unbounded (and keep int64 arithmetic exact)
_MAX_CHUNK = 2**62


def _parse(attention_chunk: Any = None) -> dict[str, Any]:
    c = attention_chunk
    if c is None:
        return {}
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
        raise SpecError(f"attention_chunk={c!r}: expected an integer >= 1 (keys per "
                        "chunk), or 0/None for off")
    if c < 0:
        raise SpecError(f"attention_chunk={int(c)}: must be >= 1, or 0 for off")
    if c == 0:
        return {}
    return {"attention_chunk": min(int(c), _MAX_CHUNK)}


def chunk_allowed(chunk: int, geo: Geometry, shift: int = 0) -> np.ndarray[Any, Any]:
    """(L, S): key j is kept for query i iff j lies in the chunk of p = i + off + shift.

    >>> chunk_allowed(2, Geometry((), 1, 3, 3, 0)).astype(int).tolist()
    [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    p = np.arange(geo.L, dtype=np.int64) + (geo.offset + shift)
    start = np.floor_divide(p, chunk) * chunk                        # ⌊p/c⌋·c, for p < 0 too
    j = np.arange(geo.S, dtype=np.int64)[None, :]
    return (j >= start[:, None]) & (j < start[:, None] + chunk)


def _keep(opts: VariantOptions, geo: Geometry, is_causal: bool) -> np.ndarray[Any, Any] | None:
    if opts.attention_chunk is None:
        return None
    return chunk_allowed(opts.attention_chunk, geo, opts.attention_chunk_shift or 0)


def _chunk(x: Any) -> bool:
    return x.opts.attention_chunk is not None


def _own_positions(x: Any) -> bool:
    # per-sequence query positions (the KV cache): no single other corner
    return any(v.own_positions is not None for v in x.opts.active())


def _chunk_shift(d: int) -> dict[str, Any]:
    return {"keep_changes": {"attention_chunk_shift": d}}


def _chunk_flip(x: Any) -> dict[str, Any]:
    # the chunk of i + (S - L - off) for that of i + off: the grid of the other corner
    L, S = x.q.shape[-2], x.k.shape[-2]
    off = 0 if x.causal_alignment == "top_left" else S - L
    return _chunk_shift(S - L - 2 * off)


_BUGS = (
    BugClass("attention_chunk_ignored", "attention_chunk ignored: keys of other "
             "chunks attended", _chunk,
             lambda x: {"keep_changes": {"attention_chunk": None}}),
    BugClass("attention_chunk_misaligned", "chunks counted from the other corner "
             "(query i's chunk from i, not i + S - L, or the reverse)",
             lambda x: _chunk(x) and lengths_differ(x) and not _own_positions(x), _chunk_flip),
    BugClass("attention_chunk_boundary_off_by_one", "chunk boundaries one position "
             "early (the chunk of p + 1 for query position p)", _chunk,
             lambda x: _chunk_shift(1)),
    BugClass("attention_chunk_boundary_off_by_one_late", "chunk boundaries one "
             "position late (the chunk of p - 1 for query position p)", _chunk,
             lambda x: _chunk_shift(-1)),
)

ATTENTION_CHUNK = register(Variant(
    name="attention_chunk", keywords=("attention_chunk",),
    fields={"attention_chunk": None, "attention_chunk_shift": None}, parse=_parse,
    summary="chunked attention: a query sees the keys of its own chunk of c positions "
            "(FlashAttention's attention_chunk)", keep=_keep,
    bugs=_BUGS, positional=lambda opts: True))
