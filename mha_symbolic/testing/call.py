"""The one record of an attention call on the testing side: what every float64
evaluation (plain, variants, backward, the bug catalogues) and every error model reads.

A door (``compare_attention``, ``compare_attention_backward``, the varlen and MHA
doors) reads the caller's tensors and options once, checks them, and builds one
:class:`AttentionCall`; the buggy variants of the catalogues are this record with
some fields changed (:func:`dataclasses.replace`).  Arrays are float64 copies of the
caller's, in their shapes (SDPA's broadcasting: query (..., H_q, L, E), key
(..., H_kv, S, E), value (..., H_kv, S, E_v)).  The fully-masked-row policy is read
by :meth:`AttentionCall.masked`, i.e. by the oracle's
:func:`~mha_symbolic.oracle.conventions.masked_rows_of`: nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from ..oracle.conventions import MaskedRows, masked_rows_of
from ..oracle.variants.registry import VariantOptions  # (with every variant registered)

__all__ = ["NO_VARIANTS", "AttentionCall"]

#: The options of a call without variants (plain scaled dot-product attention).
NO_VARIANTS = VariantOptions()


@dataclass(frozen=True)
class AttentionCall:
    """One attention call, as float64 arrays of the caller's shapes.

    ``attn_mask``: bool (True = takes part) or float (added); ``dropout_mask``: bool
    keep-mask; ``do``: the grad_output of a backward check; ``opts``: the validated
    variant options (:func:`~mha_symbolic.oracle.variants.registry.variant_options`),
    q, k, v being *as given* (not descaled, heads not expanded); ``mod_keep``: a
    mask_mod / BlockMask evaluated once (..., H, L, S); ``in_format``: the caller's
    input dtype; ``dq``/``dk``/``dv``: error bounds already in q, k, v (the MHA door:
    projections computed by the kernel)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    _: KW_ONLY          # every other field by name (a positional 4th is ambiguous)
    do: np.ndarray | None = None
    attn_mask: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    causal_alignment: str = "top_left"
    masked_rows: str = "zero"
    dropout_p: float = 0.0
    dropout_mask: np.ndarray | None = None
    opts: VariantOptions = NO_VARIANTS
    mod_keep: np.ndarray | None = None
    in_format: str = "float64"
    dq: np.ndarray | None = None
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None

    @property
    def effective_scale(self) -> float:
        """1/sqrt(E) by default (float64 is enough here: this is not the reference)."""
        E = self.q.shape[-1]
        if self.scale is not None:
            return float(self.scale)
        return 1.0 / math.sqrt(E) if E else 0.0

    def masked(self, empty: np.ndarray[Any, Any], S: int) -> MaskedRows:
        """What the call's ``masked_rows`` policy makes of the rows ``empty`` (rows
        with no key) of a float64 evaluation: the oracle's one reading, with
        "error" read as "zero" (a buggy variant may empty rows the call has not)."""
        return masked_rows_of(self.masked_rows, np.asarray(empty, dtype=bool), S,
                              check=False)
