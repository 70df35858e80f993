"""The quantities a claim can name (``weight[1,2]``, ``shape.w_q``, ``params.total``
…) and their exact values for a worked example.

A matrix quantity takes ``[row,column]`` (one number), ``[row]`` (a row, claimed as a
tuple or a printed row) or no index (the whole matrix, claimed as a printed tensor).
Indices are 1-based; the claim's ``head`` and ``batch`` keys pick the head and the
batch element.

>>> parse_quantity("weight[2,1]"), parse_quantity("weight")
(('weight', None, (2, 1)), ('weight', None, ()))
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .._text import echo, int_text
from ..errors import ClaimError
from .intermediates import INTERMEDIATES, intermediate, weighted_value

if TYPE_CHECKING:
    from .examples import Claim, WorkedExample


MATRIX_QUANTITIES = {
    **INTERMEDIATES,
    "score": "scores Q_i K_i^T",
    "scaled_score": "scaled scores",
    "weight": "softmax weights",
    "head_output": "head output A_i V_i",
    "concat": "concatenated heads",
    "output": "block output",
    "q": "queries", "k": "keys", "v": "values",
    # the backward pass against the example's grad_output (exact/backward.py)
    "grad_query": "gradient of the head's queries, c·dS K",
    "grad_key": "gradient of the head's keys, c·dSᵀ Q",
    "grad_value": "gradient of the head's values, Pᵀ dO",
    "grad_score": "gradient of the scaled scores, dS = P ∘ (dP − D)",
    "bias": "ALiBi bias -slope·|j - (i + off)|",
}
_SHAPE_NAMES = ("x", "x_heads", "x_kv", "w_q", "w_k", "w_v", "q", "k", "v", "scores", "weights", "head",
                "concat", "w_o", "output", "w_q_stacked", "w_k_stacked", "w_v_stacked", "w_qkv",
                "b_q", "b_k", "b_v", "b_o", "b_qkv")
#: Shapes that exist once per head (a 4-size claim is batch × heads × rows × columns).
PER_HEAD_SHAPES = ("x_heads", "q", "k", "v", "scores", "weights", "head")
#: Weight shapes (printed (out, in) when the example's layout is torch's).
WEIGHT_SHAPES = ("w_q", "w_k", "w_v", "w_o", "w_q_stacked", "w_k_stacked", "w_v_stacked", "w_qkv")
_DIM_NAMES = ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim",
              "concat_width", "batch")
_PARAM_NAMES = ("total", "weights", "biases", "w_q", "w_k", "w_v", "w_o", "w_q_head", "w_k_head",
                "w_v_head", "qkv")
#: Longest quantity name read (``scaled_score[12,34]`` is 19 characters).
MAX_QUANTITY_LENGTH = 100
_QUANTITY = re.compile(r"^(?P<name>[a-z_]+)(?:\.(?P<sub>[a-z_]+))?(?:\[(?P<idx>[0-9,]*)\])?$")
#: Whitespace of any kind (spaces, tabs, newlines) is allowed around the punctuation of a
#: quantity, never inside a number (``weight[1 1]`` is not ``weight[11]``).
_AROUND_PUNCTUATION = re.compile(r"\s*([\[\],.])\s*")


#: Axis names a claim's ``axes`` may use, with the spellings read for each.
AXIS_NAMES = {"batch": "batch", "b": "batch", "heads": "heads", "head": "heads", "h": "heads",
              "rows": "rows", "row": "rows", "columns": "columns", "column": "columns",
              "cols": "columns"}

def parse_axes(value: Any) -> tuple[str, ...]:
    """A claim's ``axes``: a string ``"heads × rows × columns"`` (``×``, ``x``, ``,`` or
    spaces between) or a list of names; each of batch, heads, rows, columns at most once."""
    if isinstance(value, str):
        names = [n for n in re.split(r"[\s×,*]+|(?<=\w)x(?=\s)", value.strip()) if n]
    elif isinstance(value, list) and all(isinstance(n, str) for n in value):
        names = [n.strip() for n in value]
    else:
        raise ClaimError("axes must be a string such as \"heads × rows × columns\" or a list "
                         "of axis names")
    if not 1 <= len(names) <= 4:
        raise ClaimError(f"axes names {len(names)} axes: a shape has one to four")
    out = []
    for n in names:
        axis = AXIS_NAMES.get(n.lower())
        if axis is None:
            raise ClaimError(f"axes: unknown axis {n[:40]!r} (use batch, heads, rows, columns)")
        if axis in out:
            raise ClaimError(f"axes: {axis} named twice")
        out.append(axis)
    return tuple(out)



#: One token's vector across all heads: ``q_token[i]`` is the h × d_k matrix whose row g
#: is head g's query of token i (``q.view(n, h, d_k)[i]``, or concatenated, the h·d_k
#: row ``q[i]`` of the all-heads projection); ``k_token``, ``v_token`` over the
#: kv_heads key/value heads.
TOKEN_QUANTITIES = {"q_token": "q", "k_token": "k", "v_token": "v"}


def _known() -> list[str]:
    return sorted([*MATRIX_QUANTITIES, *TOKEN_QUANTITIES, "weight_sum", "gap", "scale", "expr",
                   *(f"shape.{n}" for n in _SHAPE_NAMES), *(f"dim.{n}" for n in _DIM_NAMES),
                   *(f"params.{n}" for n in _PARAM_NAMES)])


def did_you_mean(word: str) -> str:
    """" (did you mean 'x'?)" for a near miss of a quantity's name, else ""."""
    import difflib

    base = word.split("[", 1)[0].replace(" ", "")
    close = difflib.get_close_matches(base, _known(), n=1, cutoff=0.6)
    if not close:
        return ""
    suffix = word[len(word.split("[", 1)[0]):] if "[" in word else ""
    if close[0] == base:  # the name is right; the fault is elsewhere (the index)
        return ""
    return f" (did you mean {close[0] + suffix!r}?)"


def parse_quantity(q: str) -> tuple[str, str | None, tuple[int, ...]]:
    if len(q) > MAX_QUANTITY_LENGTH:
        raise ClaimError(f"quantity={echo(q, 40)} is longer than {MAX_QUANTITY_LENGTH} "
                         "characters")
    m = _QUANTITY.match(_AROUND_PUNCTUATION.sub(r"\1", q.strip()))
    if not m:
        raise ClaimError(f"quantity={echo(q)} is not of the form name, name[i], name[i,j] or "
                         f"shape.name / dim.name / params.name{did_you_mean(q)}")
    name, sub, idx = m.group("name"), m.group("sub"), m.group("idx")
    if idx and any(len(i) > 9 for i in idx.split(",")):
        raise ClaimError(f"quantity={echo(q)}: an index beyond 999999999 is out of range")
    indices = tuple(int(i) for i in idx.split(",") if i) if idx else ()
    if any(i < 1 for i in indices):
        shifted = "[" + ",".join(str(i + 1) for i in indices) + "]"
        raise ClaimError(f"quantity={echo(q)}: indices are 1-based (did you mean {name}{shifted}?)")
    if name in MATRIX_QUANTITIES:
        if sub or len(indices) not in (0, 1, 2):
            raise ClaimError(f"quantity={echo(q)}: {name} takes [row], [row,column] or no index "
                             "(the whole matrix)")
    elif name == "weight_sum":
        if sub or len(indices) > 1:
            raise ClaimError(f"quantity={echo(q)}: {name} takes [row], or no index (every row's "
                             "sum: the row-sum vector)")
    elif name in ("gap", "sink_weight", *TOKEN_QUANTITIES):
        if sub or len(indices) != 1:
            raise ClaimError(f"quantity={echo(q)}: {name} needs [row]")
    elif name in ("expr", "scale"):
        if sub or indices:
            raise ClaimError(f"quantity={echo(q)}: {name} takes no index")
    elif name in ("shape", "dim", "params"):
        allowed = {"shape": _SHAPE_NAMES, "dim": _DIM_NAMES, "params": _PARAM_NAMES}[name]
        # shape.NAME[i]: one row of a matrix (a vector's shape, torch.Size([d]))
        row = name == "shape" and len(indices) == 1 and not (sub or "").startswith("b_")
        if sub not in allowed or (indices and not row):
            raise ClaimError(f"quantity={echo(q)}: {name}.NAME with NAME one of {', '.join(allowed)}"
                             f"{did_you_mean(q)}")
    else:
        raise ClaimError(f"unknown quantity={echo(q)}{did_you_mean(q)}; known: "
                         + ", ".join(sorted([*MATRIX_QUANTITIES, *TOKEN_QUANTITIES, "weight_sum",
                                             "gap", "sink_weight",
                                             "scale", "expr",
                                             "shape.*", "dim.*", "params.*"])))
    return name, sub, indices


#: What each matrix quantity needs from the example, when it is missing.
_NEEDS = {
    "head_output": "`value` (or x with w_v)", "concat": "`value` (or x with w_v)",
    "output": "`value` (or x with w_v)", "v": "`value` (or x with w_v)",
    "q": "`query` (or x with w_q)", "k": "`key` (or x with w_k)",
    "bias": "`alibi_slopes`",
}


def quantity_value(ex: WorkedExample, claim: Claim, att: Any = None) -> Any:
    """The exact value of a claim's quantity: a SymPy scalar, a tuple (a row), a tuple of
    rows (a whole matrix), a Shape or an int."""
    name, sub, idx = parse_quantity(claim.quantity)
    if name == "expr":
        from ..exact.grammar import parse_number

        if claim.expr is None:  # an unreadable claim reaching here (a derivation's claims)
            raise ClaimError(f"{claim.quantity}: quantity 'expr' needs expr = \"...\"")
        return parse_number(claim.expr)
    if name == "shape":
        return _shape(ex, sub or "")
    if name == "dim":
        if sub == "batch":
            return ex.batch_size
        spec = ex.spec
        if sub == "concat_width":
            return _count(spec.heads, "heads and d_v") * _count(spec.d_v, "d_v")
        return _count(getattr(spec, sub or ""), sub or "")
    if name == "params":
        return _param(ex.spec, sub or "")
    if att is None and name == "scale" and not ex.has_attention:
        import sympy as sp

        from ..exact.engine import exact_number

        given = ex.options.get("scale")
        return exact_number(given, "scale") if given is not None else sp.sympify(
            ex.spec.resolved_scale())
    if att is None:
        if not ex.has_attention:
            raise ClaimError(f"{claim.quantity}: example {echo(ex.name, 40)} gives no inputs to compute it "
                             "(it needs scores, query and key, or x with w_q, w_k, w_v)")
        b = claim.batch - 1
        if not 0 <= b < ex.batch_size:
            raise ClaimError(f"{claim.quantity}: batch={int_text(claim.batch)} but the example has "
                             f"{ex.batch_size} batch element(s)")
        att = ex.attention(b)
    h = claim.head - 1
    if not 0 <= h < len(att.heads):
        raise ClaimError(f"{claim.quantity}: head={int_text(claim.head)} but the example has "
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
        if not idx:  # the row-sum vector, weights.sum(dim=-1)
            return tuple(sp.Add(*[w[r, j] for j in range(w.cols)]) for r in range(w.rows))
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
    if name in TOKEN_QUANTITIES:
        return token_vectors(att, name, idx[0] - 1, claim.quantity)
    if name == "weighted_value":
        if len(idx) != 2:
            raise ClaimError(f"{claim.quantity}: weighted_value needs [i,j] (the vector w_ij·v_j)")
        return weighted_value(att, h, idx[0] - 1, idx[1] - 1)
    if name.startswith("grad_"):
        matrix = _gradient(ex, claim.quantity, name, h)
    elif name in INTERMEDIATES:
        matrix = intermediate(ex, att, name, claim.batch - 1, h)
    else:
        matrix = matrix_of(att, name, head)
    if matrix is None:
        raise ClaimError(f"{claim.quantity}: example {echo(ex.name, 40)} gives no {_NEEDS.get(name, name)}, "
                         f"which {name} needs")
    if not idx:
        return tuple(tuple(matrix[r, c] for c in range(matrix.cols)) for r in range(matrix.rows))
    r = idx[0] - 1
    _check_index(claim.quantity, r, matrix.rows, "row")
    if len(idx) == 2:
        c = idx[1] - 1
        _check_index(claim.quantity, c, matrix.cols, "column")
        return matrix[r, c]
    return tuple(matrix[r, c] for c in range(matrix.cols))


def token_vectors(att: Any, name: str, r: int, quantity: str) -> tuple[tuple[Any, ...], ...]:
    """One token's query (key, value) in every head: row g is head g's (for keys and
    values, key/value head g's: the query heads that share it show it once)."""
    which = TOKEN_QUANTITIES[name]
    spec = att.spec
    if which == "q":
        heads = list(att.heads)
    else:  # the first query head of each key/value group carries that group's k, v
        first: dict[int, Any] = {}
        for h, head in enumerate(att.heads):
            first.setdefault(spec.kv_head_of(h), head)
        heads = [first[g] for g in sorted(first)]
    mats = [getattr(head, which) for head in heads]
    if any(m is None for m in mats):
        raise ClaimError(f"{quantity}: the example gives no {_NEEDS[which]}, which {name} needs")
    _check_index(quantity, r, mats[0].rows, "token")
    return tuple(tuple(m[r, c] for c in range(m.cols)) for m in mats)


def _gradient(ex: WorkedExample, quantity: str, name: str, h: int) -> Any:
    """One head's gradient matrix against the example's grad_output."""
    grads = ex.gradients()
    if grads is None:
        raise ClaimError(f"{quantity}: example {ex.name!r} gives no grad_output")
    g = grads[h]
    matrix = {"grad_query": g.dq, "grad_key": g.dk, "grad_value": g.dv, "grad_score": g.ds}[name]
    if matrix is None:
        raise ClaimError(f"{quantity}: example {ex.name!r} gives no queries and keys to "
                         "differentiate (scores only)")
    return matrix


def matrix_of(att: Any, name: str, head: Any) -> Any:
    """The SymPy matrix a matrix quantity names (None when the inputs do not give it)."""
    # gradient quantities (grad_*) need the example's grad_output: not from att alone
    return {
        "score": head.scores, "scaled_score": head.scaled, "weight": head.weights,
        "head_output": head.output, "concat": att.concat, "output": att.final()
        if att.concat is not None else None, "q": head.q, "k": head.k, "v": head.v,
        "bias": head.bias,
    }.get(name)


def _shape(ex: WorkedExample, sub: str) -> Any:
    """The shape of an intermediate (per head where it applies); stacked projections
    for all heads; (out, in) under layout = "torch"."""
    from ..exact.shapes import Shape, attention_shapes

    spec = ex.spec
    if sub.startswith("b_"):  # a bias: a vector as long as its nn.Linear's output
        source = {"b_q": "w_q_stacked", "b_k": "w_k_stacked", "b_v": "w_v_stacked",
                  "b_qkv": "w_qkv", "b_o": "w_o"}[sub]
        full = _shape(ex, source)
        out = full.rows if source in WEIGHT_SHAPES and ex.options.get("layout") == "torch" \
            else full.cols
        return Shape(1, out)
    if sub == "x_heads":  # the input repeated per head (x.repeat(h, 1, 1)): X per head
        return _shape(ex, "x")
    if sub in ("w_q_stacked", "w_k_stacked", "w_v_stacked", "w_qkv"):
        _count(spec.d_model, "d_model")
        h, g = spec.heads, spec.kv_heads
        shape = {"w_q_stacked": Shape(spec.d_model, h * spec.d_k),
                 "w_k_stacked": Shape(spec.kdim, g * spec.d_k),
                 "w_v_stacked": Shape(spec.vdim, g * spec.d_v),
                 "w_qkv": Shape(spec.d_model, h * spec.d_k + g * spec.d_k + g * spec.d_v)}[sub]
    else:
        shape = attention_shapes(spec)[sub].shape
        att = ex.attention() if ex.has_attention else None
        if att is not None and att.output is not None and sub in ("w_o", "output"):
            # W^O as given: torch's out_proj may map h·d_v to any width, not only d_model
            width = att.output.cols
            shape = Shape(shape.rows, width)
    if sub in WEIGHT_SHAPES and ex.options.get("layout") == "torch":
        return shape.T
    return shape


def _check_index(q: str, i: int, n: int, what: str) -> None:
    if not 0 <= i < n:
        raise ClaimError(f"{q}: {what} {i + 1} is out of range 1..{n}")


def _count(x: Any, what: str = "this size") -> Any:
    if x is None:
        raise ClaimError(f"the example does not state {what}")
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
