"""The quantities a claim can name (``weight[1,2]``, ``shape.w_q``, ``params.total``
…) and their exact values for a worked example."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..errors import ClaimError

if TYPE_CHECKING:
    from .examples import Claim, WorkedExample


MATRIX_QUANTITIES = {
    "score": "scores Q_i K_i^T",
    "scaled_score": "scaled scores",
    "weight": "softmax weights",
    "head_output": "head output A_i V_i",
    "concat": "concatenated heads",
    "output": "block output",
    "q": "queries", "k": "keys", "v": "values",
    "bias": "ALiBi bias -slope·|j - (i + off)|",
}
_SHAPE_NAMES = ("x", "x_kv", "w_q", "w_k", "w_v", "q", "k", "v", "scores", "weights", "head",
                "concat", "w_o", "output")
_DIM_NAMES = ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim",
              "concat_width")
_PARAM_NAMES = ("total", "weights", "biases", "w_q", "w_k", "w_v", "w_o", "w_q_head", "w_k_head",
                "w_v_head", "qkv")
_QUANTITY = re.compile(r"^(?P<name>[a-z_]+)(?:\.(?P<sub>[a-z_]+))?(?:\[(?P<idx>[\d,\s]*)\])?$")


def parse_quantity(q: str) -> tuple[str, str | None, tuple[int, ...]]:
    m = _QUANTITY.match(q.replace(" ", ""))
    if not m:
        raise ClaimError(f"quantity={q!r} is not of the form name, name[i], name[i,j] or "
                         "shape.name / dim.name / params.name")
    name, sub, idx = m.group("name"), m.group("sub"), m.group("idx")
    indices = tuple(int(i) for i in idx.split(",") if i) if idx else ()
    if any(i < 1 for i in indices):
        raise ClaimError(f"quantity={q!r}: indices are 1-based")
    if name in MATRIX_QUANTITIES:
        if sub or len(indices) not in (1, 2):
            raise ClaimError(f"quantity={q!r}: {name} needs [row] or [row,column]")
    elif name in ("weight_sum", "gap", "sink_weight"):
        if sub or len(indices) != 1:
            raise ClaimError(f"quantity={q!r}: {name} needs [row]")
    elif name in ("expr", "scale"):
        if sub or indices:
            raise ClaimError(f"quantity={q!r}: {name} takes no index")
    elif name in ("shape", "dim", "params"):
        allowed = {"shape": _SHAPE_NAMES, "dim": _DIM_NAMES, "params": _PARAM_NAMES}[name]
        if sub not in allowed or indices:
            raise ClaimError(f"quantity={q!r}: {name}.NAME with NAME one of {', '.join(allowed)}")
    else:
        known = sorted([*MATRIX_QUANTITIES, "weight_sum", "gap", "sink_weight", "scale", "expr",
                        "shape.*",
                        "dim.*", "params.*"])
        raise ClaimError(f"unknown quantity={q!r}; known: {', '.join(known)}")
    return name, sub, indices


def quantity_value(ex: WorkedExample, claim: Claim, att: Any = None) -> Any:
    """The exact value of a claim's quantity: a SymPy scalar, a tuple, a Shape or an int."""
    name, sub, idx = parse_quantity(claim.quantity)
    if name == "expr":
        from ..exact.grammar import parse_number

        assert claim.expr is not None
        return parse_number(claim.expr)
    if name == "shape":
        from ..exact.shapes import attention_shapes

        return attention_shapes(ex.spec)[sub or ""].shape
    if name == "dim":
        spec = ex.spec
        if sub == "concat_width":
            return _count(spec.heads) * _count(spec.d_v)
        return _count(getattr(spec, sub or ""))
    if name == "params":
        return _param(ex.spec, sub or "")
    att = att if att is not None else ex.attention()
    if att is None:
        raise ClaimError(f"{claim.quantity}: example {ex.name!r} gives no inputs to compute it")
    h = claim.head - 1
    if not 0 <= h < len(att.heads):
        raise ClaimError(f"{claim.quantity}: head={claim.head} but the example has "
                         f"{len(att.heads)} head(s)")
    head = att.heads[h]
    if name == "scale":
        return att.scale
    if name == "sink_weight":
        if head.sink_weight is None:
            raise ClaimError(f"{claim.quantity}: example {ex.name!r} has no sinks")
        _check_index(claim.quantity, idx[0] - 1, head.sink_weight.rows, "row")
        return head.sink_weight[idx[0] - 1, 0]
    if name in ("weight_sum", "gap"):
        import sympy as sp

        w = head.weights if name == "weight_sum" else head.scaled
        r = idx[0] - 1
        _check_index(claim.quantity, r, w.rows, "row")
        row = [w[r, j] for j in range(w.cols)]
        if name == "weight_sum":
            return sp.Add(*row)
        # gap: the top scaled score minus the runner-up (certified ordering)
        finite = [e for e in row if e != -sp.oo]
        if len(finite) < 2:
            raise ClaimError(f"{claim.quantity}: the row has fewer than two unmasked scores")
        from functools import cmp_to_key

        from ..exact.certified import certify

        def descending(a: Any, b: Any) -> int:
            return certify(b - a).sign()

        ordered = sorted(finite, key=cmp_to_key(descending))
        return ordered[0] - ordered[1]
    matrix = {
        "score": head.scores, "scaled_score": head.scaled, "weight": head.weights,
        "head_output": head.output, "concat": att.concat, "output": att.final()
        if att.concat is not None else None, "q": head.q, "k": head.k, "v": head.v,
        "bias": head.bias,
    }[name]
    if matrix is None:
        raise ClaimError(f"{claim.quantity}: example {ex.name!r} does not give what this needs")
    r = idx[0] - 1
    _check_index(claim.quantity, r, matrix.rows, "row")
    if len(idx) == 2:
        c = idx[1] - 1
        _check_index(claim.quantity, c, matrix.cols, "column")
        return matrix[r, c]
    return tuple(matrix[r, c] for c in range(matrix.cols))


def _check_index(q: str, i: int, n: int, what: str) -> None:
    if not 0 <= i < n:
        raise ClaimError(f"{q}: {what} {i + 1} is out of range 1..{n}")


def _count(x: Any) -> Any:
    if x is None:
        raise ClaimError("the example does not state this size")
    return x


def _param(spec: Any, part: str) -> Any:
    from ..exact.params import parameter_count

    if spec.d_model is None or spec.d_k is None or spec.d_v is None:
        raise ClaimError("parameter counts need d_model (and heads, or d_k and d_v): "
                         "the example does not state them")
    pc = parameter_count(spec)
    by = {n: c for n, _, c in pc.parts}
    table = {
        "total": pc.total, "weights": pc.weights, "biases": pc.biases,
        "w_q": by["W^Q"], "w_k": by["W^K"], "w_v": by["W^V"], "w_o": by["W^O"],
        "w_q_head": spec.d_model * spec.d_k, "w_k_head": spec.kdim * spec.d_k,
        "w_v_head": spec.vdim * spec.d_v, "qkv": by["W^Q"] + by["W^K"] + by["W^V"],
    }
    return table[part]
