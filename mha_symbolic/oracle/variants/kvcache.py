"""KV-cache decode (FlashAttention's ``flash_attn_with_kvcache``): each batch element b
attends to its cache's valid keys only, ``cache_leftpad[b] <= j < cache_seqlens[b]``,
and with ``is_causal`` causally *from the end* of them — query i of L sees keys
``j <= i + cache_seqlens[b] - L`` (FlashAttention's bottom-right alignment, relative to
the valid length, not to the cache's).  A kept-key variant: the tiers, the gradients
and the error model need nothing more (docs/variants.md, "KV-cache decode").

:func:`gather_kv_cache` builds the dense keys and values such a kernel reads: a paged
cache gathered through its ``block_table`` (num_blocks, page_size, H_kv, D), and the
new ``k``/``v`` appended at ``cache_seqlens`` (FlashAttention's in-place update), so
that ``reference_attention(q, k_full, v_full, cache_seqlens=seqlens_after, ...)`` is
the exact answer of a decode step.  Shapes are FlashAttention's (B, S, H, D): pass
``layout="bshd"`` to the doors, or transpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import InputValueError, ShapeError, SpecError
from ..inputs import as_exact_array, to_float64, validate_finite
from .protocol import BugClass, Variant, VariantOptions, register
from .semantics import Geometry

__all__ = ["KV_CACHE", "gather_kv_cache"]


def _lengths(x: Any, name: str) -> np.ndarray[Any, Any]:
    arr = np.asarray(x)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
        raise SpecError(f"{name}: expected a 1-D array of integers (batch,), got "
                        f"dtype={arr.dtype}, shape={arr.shape}")
    if arr.size and int(arr.min()) < 0:
        raise InputValueError(f"{name}: lengths must be >= 0 (got {int(arr.min())})")
    return arr.astype(np.int64)


def _parse(cache_seqlens: Any = None, cache_leftpad: Any = None) -> dict[str, Any]:
    if cache_seqlens is None:
        if cache_leftpad is not None:
            raise SpecError("cache_leftpad needs cache_seqlens")
        return {}
    seqlens = _lengths(cache_seqlens, "cache_seqlens")
    out: dict[str, Any] = {"cache_seqlens": seqlens}
    if cache_leftpad is not None:
        left = _lengths(cache_leftpad, "cache_leftpad")
        if left.shape != seqlens.shape:
            raise ShapeError(f"cache_leftpad.shape={left.shape} does not match "
                             f"cache_seqlens.shape={seqlens.shape}")
        if np.any(left > seqlens):
            raise InputValueError("cache_leftpad must be <= cache_seqlens")
        out["cache_leftpad"] = left
    return out


def _keep(opts: VariantOptions, geo: Geometry, is_causal: bool) -> np.ndarray[Any, Any]:
    seqlens = opts.cache_seqlens
    B = geo.outer[0] if geo.outer else 1
    if len(geo.outer) != 1 or seqlens.shape != (B,):
        raise ShapeError(f"cache_seqlens.shape={seqlens.shape}: expected (batch,) for "
                         f"inputs of batch shape {geo.batch} (batch, heads, L, S)")
    if np.any(seqlens > geo.S):
        raise InputValueError(f"cache_seqlens exceed the cache's {geo.S} keys")
    left = opts.cache_leftpad if opts.cache_leftpad is not None else np.zeros_like(seqlens)
    j = np.arange(geo.S)[None, None, :]
    n = seqlens[:, None, None]
    keep = (j >= left[:, None, None]) & (j < n)                       # (B, 1, S)
    if is_causal:
        if geo.L != geo.S and geo.offset != geo.S - geo.L:
            raise SpecError("is_causal with cache_seqlens is causal from the end of the "
                            "valid keys (FlashAttention's): pass causal_alignment="
                            "'bottom_right'")
        i = np.arange(geo.L)[None, :, None]
        keep = keep & (j <= i + n - geo.L)                             # (B, L, S)
    return keep.reshape(B, 1, keep.shape[1], geo.S)


def _query_offsets(opts: VariantOptions, geo: Geometry) -> np.ndarray[Any, Any]:
    """The ``own_positions`` hook: query i of sequence b at cache_seqlens[b] - L + i,
    key j at j — cache indices, left padding or not.  A distance (ALiBi, a window,
    causal) is the same measured from the left padding (FlashAttention's test reference
    shifts both: ``col_idx - key_leftpad`` against ``row_idx + sk - sq`` with sk the
    valid count), and rotary reads these cache indices (FlashAttention-3's
    ``seqlen_rotary = seqlen_k_og + leftpad_k``)."""
    n = opts.cache_seqlens.astype(np.int64)
    if len(geo.outer) != 1 or n.shape != geo.outer:
        raise ShapeError(f"cache_seqlens.shape={n.shape}: expected (batch,) for inputs "
                         f"of batch shape {geo.batch} (batch, heads, L, S)")
    return n - geo.L


def _origins(opts: VariantOptions, geo: Geometry) -> np.ndarray[Any, Any] | None:
    """The ``own_origins`` hook: sequence b's kept-key positions start at its first valid
    key, cache_leftpad[b] (FlashAttention-3's chunks: ``construct_chunk_mask`` counts
    them from ``col_idx - key_leftpad``)."""
    left = opts.cache_leftpad
    if left is None or not np.any(left) or opts.cache_origin_at_zero:
        return None
    return left.astype(np.int64)


def _kv(x: Any) -> bool:
    return x.opts.cache_seqlens is not None


def _kv_short(x: Any) -> bool:
    return _kv(x) and bool(np.any(x.opts.cache_seqlens < x.k.shape[-2]))


def _kv_nonempty(x: Any) -> bool:
    return _kv(x) and bool(np.any(x.opts.cache_seqlens > 0))


def _kv_leftpad(x: Any) -> bool:
    return _kv(x) and x.opts.cache_leftpad is not None and bool(np.any(x.opts.cache_leftpad))


def _kv_leftpad_chunks(x: Any) -> bool:
    return _kv_leftpad(x) and x.opts.attention_chunk is not None


# the kept keys recomputed with the options changed (plain_variant's keep_changes)
_BUGS = (
    BugClass("kv_cache_lengths_ignored", "cache_seqlens ignored: stale cache entries "
             "past each sequence's length attended", _kv,
             lambda x: {"keep_changes": {"cache_seqlens": None, "cache_leftpad": None}}),
    BugClass("kv_cache_length_one_long", "off-by-one cache_seqlens: one stale key past "
             "each sequence's length attended", _kv_short,
             lambda x: {"keep_changes": {"cache_seqlens": np.minimum(
                 x.opts.cache_seqlens + 1, x.k.shape[-2])}}),
    BugClass("kv_cache_length_one_short", "off-by-one cache_seqlens: each sequence's "
             "newest key not attended", _kv_nonempty,
             lambda x: {"keep_changes": {"cache_seqlens": np.maximum(
                 x.opts.cache_seqlens - 1, 0)}}),
    BugClass("kv_cache_leftpad_ignored", "cache_leftpad ignored: the left padding "
             "attended", _kv_leftpad, lambda x: {"keep_changes": {"cache_leftpad": None}}),
    BugClass("kv_cache_leftpad_chunk_origin", "chunks counted from the cache's start, not "
             "from each sequence's first valid key (cache_leftpad)", _kv_leftpad_chunks,
             lambda x: {"keep_changes": {"cache_origin_at_zero": True}}),
)

KV_CACHE = register(Variant(
    name="kv_cache", keywords=("cache_seqlens", "cache_leftpad"),
    # cache_origin_at_zero has no keyword: the bug switch of the chunk-origin class
    fields={"cache_seqlens": None, "cache_leftpad": None, "cache_origin_at_zero": None},
    parse=_parse,
    summary="KV-cache decode: valid keys cache_leftpad <= j < cache_seqlens, causal "
            "from their end (flash_attn_with_kvcache)", keep=_keep,
    bugs=_BUGS, packed=False, own_positions=_query_offsets, own_origins=_origins))


def _bshd(x: Any, name: str) -> np.ndarray[Any, Any]:
    arr = as_exact_array(x, name)
    if arr.dtype == bool or arr.ndim != 4:
        raise ShapeError(f"{name}.shape={getattr(arr, 'shape', None)}: expected a float "
                         "array (batch, seqlen, heads, dim)")
    validate_finite(arr, name)
    return to_float64(arr)


def gather_kv_cache(
    k_cache: Any, v_cache: Any, cache_seqlens: Any, *, k: Any = None, v: Any = None,
    block_table: Any = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The dense (B, S, H_kv, D) keys and values a decode step reads, and the valid
    lengths after it: ``k_cache``/``v_cache`` (B, S_cache, H_kv, D), or paged
    (num_blocks, page_size, H_kv, D) with ``block_table`` (B, max_blocks) of page
    indices (page ``block_table[b, p]`` holds positions ``p·page_size …``); the new
    ``k``/``v`` (B, L_new, H_kv, D) written at ``cache_seqlens[b] …`` (FlashAttention
    updates the cache in place).  Values are copied exactly (float64).

    >>> import numpy as np
    >>> kc = np.zeros((1, 4, 1, 2)); kn = np.ones((1, 1, 1, 2))
    >>> k, v, n = gather_kv_cache(kc, kc, [2], k=kn, v=kn)
    >>> k[0, :, 0, 0].tolist(), n.tolist()
    ([0.0, 0.0, 1.0, 0.0], [3])
    """
    kc, vc = _bshd(k_cache, "k_cache"), _bshd(v_cache, "v_cache")
    if kc.shape[:3] != vc.shape[:3]:
        raise ShapeError(f"k_cache.shape={kc.shape} and v_cache.shape={vc.shape} must agree "
                         "but for the last axis")
    seqlens = _lengths(cache_seqlens, "cache_seqlens")
    if block_table is not None:
        bt = np.asarray(block_table)
        if bt.ndim != 2 or bt.dtype == bool or not np.issubdtype(bt.dtype, np.integer):
            raise SpecError(f"block_table: expected integers (batch, max_blocks), got "
                            f"dtype={bt.dtype}, shape={bt.shape}")
        if bt.size and (int(bt.min()) < 0 or int(bt.max()) >= kc.shape[0]):
            raise InputValueError(f"block_table: page indices must lie in 0 … "
                                  f"{kc.shape[0] - 1} (num_blocks = {kc.shape[0]})")
        page = kc.shape[1]
        kc = kc[bt].reshape(bt.shape[0], bt.shape[1] * page, *kc.shape[2:])
        vc = vc[bt].reshape(bt.shape[0], bt.shape[1] * page, *vc.shape[2:])
    B, S_cache = kc.shape[:2]
    if seqlens.shape != (B,):
        raise ShapeError(f"cache_seqlens.shape={seqlens.shape}: expected ({B},)")
    kc, vc = kc.copy(), vc.copy()
    after = seqlens.copy()
    if (k is None) != (v is None):
        raise SpecError("pass both k and v (the new keys and values) or neither")
    if k is not None:
        kn, vn = _bshd(k, "k"), _bshd(v, "v")
        if kn.shape[0] != B or kn.shape[2:] != kc.shape[2:] or vn.shape[:3] != kn.shape[:3] \
                or vn.shape[3] != vc.shape[3]:
            raise ShapeError(f"k.shape={kn.shape}, v.shape={vn.shape} do not match the "
                             f"cache (batch {B}, heads and dims {kc.shape[2:]})")
        L_new = kn.shape[1]
        if np.any(seqlens + L_new > S_cache):
            raise InputValueError(f"the new keys do not fit: cache_seqlens + {L_new} > "
                                  f"{S_cache} positions of the cache")
        for b in range(B):
            s = int(seqlens[b])
            kc[b, s:s + L_new], vc[b, s:s + L_new] = kn[b], vn[b]
        after = seqlens + L_new
    return kc, vc, after
