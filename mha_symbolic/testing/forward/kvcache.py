"""One decode step of a KV cache judged with the arguments a kernel takes
(FlashAttention's ``flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
cache_seqlens=, block_table=, cache_leftpad=, causal=)``).

:func:`compare_kvcache_decode` builds the dense keys and values the step reads with
:func:`~mha_symbolic.oracle.variants.kvcache.gather_kv_cache` (pages gathered through
the block table, the new k/v written at ``cache_seqlens``), and judges the output by
:func:`~mha_symbolic.testing.forward.compare.compare_attention` with the lengths after
the step (``cache_seqlens=``, causal from the end of the valid keys).  On a failure it
also tries the step *without* the new k/v written (the keys and values the cache held
at those positions before): an output within tolerance of that is named
``kv_cache_new_kv_not_appended``, a bug the dense comparison alone cannot name (the
same keys are kept; their values differ).  Pass the cache as it was *before* the
kernel ran (FlashAttention updates it in place): with an already updated cache the two
readings coincide and the bug is not looked for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import SpecError
from ...oracle.inputs import as_exact_array
from ...oracle.variants.kvcache import gather_kv_cache
from ..verdict import Diagnosis
from .compare import compare_attention

__all__ = ["KV_NOT_APPENDED", "compare_kvcache_decode"]

KV_NOT_APPENDED = "kv_cache_new_kv_not_appended"


def _like(x: np.ndarray, ref: Any) -> np.ndarray:
    """The gathered float64 copy in the cache's own dtype (exact: the values are the
    cache's and the new k/v's, which that dtype holds when they share it)."""
    dt = as_exact_array(ref, "k_cache").dtype
    out = x.astype(dt)
    if not np.array_equal(out.astype(np.float64), x):
        raise SpecError(f"the new k/v are not representable in the cache's dtype {dt}: "
                        "pass them in the cache's dtype")
    return out


def compare_kvcache_decode(
    actual: Any, query: Any, k_cache: Any, v_cache: Any, cache_seqlens: Any, *,
    k: Any = None, v: Any = None, block_table: Any = None, cache_leftpad: Any = None,
    is_causal: bool = False, diagnose_bugs: bool = True, **options: Any,
) -> Any:
    """Judge ``actual`` (batch, L, H, E_v), the output of one decode step with the
    kernel's own arguments (module docstring); shapes are FlashAttention's
    (batch, seqlen, heads, dim), so ``layout="bshd"`` is implied, ``enable_gqa`` is
    on when the cache has fewer heads than the query, and ``is_causal`` counts from
    the end of the valid keys.  Every other option is ``compare_attention``'s.

    >>> import numpy as np
    >>> kc = np.zeros((1, 4, 1, 2), np.float32)        # 2 valid entries, 2 free slots
    >>> q = np.zeros((1, 1, 1, 2), np.float32)         # every score 0: the mean value
    >>> kn = np.ones((1, 1, 1, 2), np.float32)         # the new token's k and v
    >>> good = np.full((1, 1, 1, 2), 1 / 3, np.float32)
    >>> compare_kvcache_decode(good, q, kc, kc, [2], k=kn, v=kn).passed
    True
    >>> c = compare_kvcache_decode(np.zeros_like(good), q, kc, kc, [2], k=kn, v=kn)
    >>> c.passed, c.diagnoses[0].bug
    (False, 'kv_cache_new_kv_not_appended')
    """
    kd, vd, after = gather_kv_cache(k_cache, v_cache, cache_seqlens, k=k, v=v,
                                    block_table=block_table)
    q_heads = as_exact_array(query, "query").shape[2] if np.ndim(query) == 4 else None
    kw: dict[str, Any] = {"layout": "bshd", "cache_seqlens": after,
                          "cache_leftpad": cache_leftpad, "is_causal": is_causal,
                          "enable_gqa": q_heads is not None and q_heads != kd.shape[2],
                          **options}
    if is_causal:
        kw.setdefault("causal_alignment", "bottom_right")
    comp = compare_attention(actual, query, _like(kd, k_cache), _like(vd, v_cache),
                             diagnose_bugs=diagnose_bugs, **kw)
    if comp.passed or not diagnose_bugs or k is None:
        return comp
    ko, vo, _ = gather_kv_cache(k_cache, v_cache, cache_seqlens, block_table=block_table)
    if np.array_equal(ko, kd) and np.array_equal(vo, vd):
        return comp   # the cache already holds the new k/v: the readings coincide
    alt = compare_attention(actual, query, _like(ko, k_cache), _like(vo, v_cache),
                            diagnose_bugs=False, **kw)
    if not alt.passed:
        return comp
    ratio = alt.worst.ratio if alt.worst is not None else 0.0
    found = Diagnosis(KV_NOT_APPENDED, "the new k/v not written into the cache: the step "
                      "attended the cache's old entries at positions cache_seqlens … "
                      "cache_seqlens + L_new", ratio)
    return replace(comp, diagnosis_run=True, diagnoses=(found, *comp.diagnoses))
