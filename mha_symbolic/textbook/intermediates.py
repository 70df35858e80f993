"""Intermediates books print that are not steps of the engine (issue 25), each defined
exactly from the example's inputs and the exact attention:

================  =============================================================
``x``             the input embedding X as given (n_q × d_model)
``mask``          1 where key j takes part in query i's softmax, 0 where it is masked
                  (``torch.tril(torch.ones(n, n))`` for a causal mask)
``mask_out``      1 where masked, 0 where it takes part (``torch.triu(…, diagonal=1)``,
                  the boolean ``masked_fill`` takes)
``masked_score``  the raw scores Q_i K_iᵀ with masked entries −∞, before scaling
                  (``scores.masked_fill(mask, -inf)`` printed before the division)
``weight_masked`` the unmasked softmax with the masked keys' weights set to 0 and the
                  rows *not* renormalised (a "simple" mask after the softmax)
``k_t``           the head's keys transposed, K_iᵀ (d_k × n_k)
``weighted_value`` ``[i,j]``: the weighted value vector w_ij · v_j (a row of d_v)
================  =============================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ClaimError

if TYPE_CHECKING:
    from .examples import WorkedExample

__all__ = ["INTERMEDIATES", "intermediate", "keep_matrix", "masked_after_softmax"]

#: name -> description (the matrix quantities this module computes).
INTERMEDIATES = {
    "x": "the input embedding X",
    "mask": "1 where the key takes part, 0 where masked",
    "mask_out": "1 where the key is masked, 0 where it takes part",
    "masked_score": "raw scores with masked entries -inf, before scaling",
    "weight_masked": "unmasked softmax with masked weights set to 0, not renormalised",
    "k_t": "the head's keys transposed, K_i^T",
    "weighted_value": "[i,j]: the weighted value vector w_ij v_j",
}
#: Those that exist once per head.
PER_HEAD_INTERMEDIATES = ("mask", "mask_out", "masked_score", "weight_masked", "k_t",
                          "weighted_value")


def keep_matrix(head: Any) -> list[list[bool]]:
    """Which keys take part in each query's softmax: the scaled score is not −∞, and a
    key replaced by a finite fill (``mask_fill``) is masked too."""
    import sympy as sp

    s = head.scaled
    return [[s[r, c] != -sp.oo for c in range(s.cols)] for r in range(s.rows)]


def _keep(ex: WorkedExample, batch: int, head: Any) -> list[list[bool]]:
    keep = keep_matrix(head)
    if ex.options.get("mask_fill") is not None:  # the fill is finite: read the mask itself
        masked = ex.options.get("masked")
        given = ex.engine_inputs()[batch].get("mask")
        if isinstance(masked, list) and masked and isinstance(masked[0], list) \
                and all(isinstance(b, bool) for row in masked for b in row):
            keep = [[not b for b in row] for row in masked]
        elif given == "causal":
            keep = [[c <= r for c in range(len(keep[0]))] for r in range(len(keep))]
        else:
            raise ClaimError("the mask of a finite mask_fill is not read here: give mask = "
                             "\"causal\" or masked = [[…]]")
    return keep


#: Options under which "the softmax without the mask" is the same attention minus the
#: mask (an additive mask of finite numbers, ALiBi, sinks, a softcap or a window are not).
_PLAIN_MASKS = {"layout", "qkv_layout", "inputs", "heads", "kv_heads", "d_k", "scale", "mask",
                "masked", "valid_lens", "causal_alignment", "masked_rows"}


def masked_after_softmax(ex: WorkedExample, batch: int, h: int, keep: list[list[bool]]) -> Any:
    """The unmasked softmax's weights with the masked ones set to 0 (rows not
    renormalised)."""
    import sympy as sp

    mask = ex.options.get("mask")
    additive = isinstance(mask, list) and any(
        not isinstance(e, bool) for e in _flat(mask))
    if set(ex.options) - _PLAIN_MASKS or additive:
        raise ClaimError("weight_masked is defined for causal and boolean masks (masked, "
                         "valid_lens) only")

    free = ex.attention(batch, mask=None, mask_fill=None)
    w0 = free.heads[h].weights
    return sp.Matrix(w0.rows, w0.cols, lambda r, c: w0[r, c] if keep[r][c] else 0)


def intermediate(ex: WorkedExample, att: Any, name: str, batch: int, h: int) -> Any:
    """The SymPy matrix an intermediate names (``weighted_value``: the weights, whose
    rows blend the values; see :func:`weighted_value`)."""
    import sympy as sp

    head = att.heads[h]
    if name == "x":
        from ..exact.engine import exact_matrix

        given = ex.engine_inputs()[batch].get("x")
        if given is None:
            raise ClaimError("x: the example gives no x (it starts from queries or scores)")
        return exact_matrix(given, "x")
    if name == "k_t":
        if head.k is None:
            raise ClaimError("k_t: the example gives no keys")
        return head.k.T
    keep = _keep(ex, batch, head)
    if name in ("mask", "mask_out"):
        on = name == "mask"
        return sp.Matrix(len(keep), len(keep[0]),
                         lambda r, c: sp.Integer(1 if keep[r][c] == on else 0))
    if name == "masked_score":
        s = head.scores
        if s is None:
            raise ClaimError("masked_score: the example gives no raw scores")
        return sp.Matrix(s.rows, s.cols, lambda r, c: s[r, c] if keep[r][c] else -sp.oo)
    if name == "weight_masked":
        return masked_after_softmax(ex, batch, h, keep)
    raise ClaimError(f"unknown intermediate {name!r}")  # pragma: no cover - names are checked


def weighted_value(att: Any, h: int, i: int, j: int) -> tuple[Any, ...]:
    """w_ij · v_j for the head (0-based i, j)."""
    head = att.heads[h]
    if head.v is None:
        raise ClaimError("weighted_value needs `value` (or x with w_v)")
    w = head.weights
    if not (0 <= i < w.rows and 0 <= j < w.cols):
        raise ClaimError(f"weighted_value[{i + 1},{j + 1}] is out of range 1..{w.rows}, 1..{w.cols}")
    return tuple(w[i, j] * head.v[j, c] for c in range(head.v.cols))


def _flat(v: Any) -> list[Any]:
    return [e for x in v for e in _flat(x)] if isinstance(v, list) else [v]
