"""Inputs as books give them, brought to the engine's one form.

A worked example states its inputs the way its source prints them; this module
turns them into the keyword arguments of :func:`mha_symbolic.exact.engine.exact_attention`,
one set per batch element.  What it undoes (each a documented example key):

``layout = "torch"``
    weights in ``torch.nn.Linear``'s (out, in) layout, ``y = x Wᵀ + b``; the engine
    multiplies row vectors by (in, out) matrices, so every weight is transposed.
``w_qkv`` (+ ``b_qkv``)
    one fused projection, split into W^Q, W^K, W^V: ``qkv_layout = "stacked"``
    ([Q | K | V], as ``nn.MultiheadAttention.in_proj_weight``) or ``"per_head"``
    ([q₁ k₁ v₁ | q₂ k₂ v₂ | …], as ``qkv.reshape(b, n, h, 3·d).chunk(3)``).
per-head weight lists
    ``w_q = [W₁, W₂, …]`` (one matrix per head, as ``nn.ModuleList`` of heads) are put
    side by side; per-head bias lists likewise.
a batch dimension
    ``x``, ``x_kv``, ``query``, ``key``, ``value`` with three dimensions, ``scores``
    with four (three when ``heads = 1``): one engine call per batch element, the
    weights shared.
``masked`` / ``valid_lens``
    ``masked``: a boolean matrix with **true = masked out** (``masked_fill``'s
    convention); ``valid_lens``: per batch element (or per batch element and query)
    the number of keys that take part (D2L's ``masked_softmax``).  Both become the
    engine's boolean mask (true = takes part).

>>> per_batch = engine_inputs({"x": [[[1, 0]], [[0, 1]]], "w_q": [[1, 0], [0, 1]],
...                            "w_k": [[1, 0], [0, 1]], "w_v": [[1, 0], [0, 1]]}, {})
>>> len(per_batch), per_batch[1]["x"]
(2, [[0, 1]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._text import echo, expr_text
from ..errors import ExampleFileError

__all__ = ["batch_size", "engine_inputs", "shape_of"]

_WEIGHTS = ("w_q", "w_k", "w_v", "w_o")
_BIASES = ("b_q", "b_k", "b_v", "b_o")
#: Inputs that may carry a leading batch dimension (their rank without it).
_BATCHED = {"x": 2, "x_kv": 2, "query": 2, "key": 2, "value": 2}


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of a nested list (checked rectangular by the loader)."""
    shape: list[int] = []
    v = value
    while isinstance(v, (list, tuple)):
        shape.append(len(v))
        if not v:
            break
        v = v[0]
    return tuple(shape)


def _transpose(m: list[list[Any]]) -> list[list[Any]]:
    if not isinstance(m, list) or not all(isinstance(row, list) for row in m) or len(
            {len(row) for row in m}) > 1:
        # a ragged matrix has no transpose (zip(strict=True) raised ValueError; fuzz run)
        raise ExampleFileError(f"a weight in torch layout must be a matrix of rows of equal "
                               f"length; its rows have {sorted({len(r) for r in m if isinstance(r, list)})} "
                               "entries")
    return [list(col) for col in zip(*m, strict=True)]


def _hstack(mats: Sequence[list[list[Any]]], name: str) -> list[list[Any]]:
    rows = {len(m) for m in mats}
    if len(rows) != 1:
        raise ExampleFileError(f"{name}: the per-head matrices have different numbers of rows "
                               f"({', '.join(str(len(m)) for m in mats)})")
    return [[x for m in mats for x in m[r]] for r in range(len(mats[0]))]


def _as_matrix(v: Any) -> list[list[Any]]:
    return v if v and isinstance(v[0], (list, tuple)) else [v]


def batch_size(inputs: dict[str, Any], heads: int) -> int:
    """The batch size the inputs state (1 when none has a batch dimension)."""
    sizes = set()
    for key, rank in _BATCHED.items():
        if key in inputs and len(shape_of(inputs[key])) == rank + 1:
            sizes.add(shape_of(inputs[key])[0])
    if "scores" in inputs:
        depth = len(shape_of(inputs["scores"]))
        if depth == 4 or (depth == 3 and heads == 1):
            sizes.add(shape_of(inputs["scores"])[0])
    if len(sizes) > 1:
        raise ExampleFileError(f"the inputs disagree on the batch size: {sorted(sizes)}")
    return sizes.pop() if sizes else 1


def engine_inputs(inputs: dict[str, Any], options: dict[str, Any]) -> list[dict[str, Any]]:
    """Per batch element, the keyword arguments of ``exact_attention`` (inputs and
    options merged)."""
    heads = int(options.get("heads", 1))
    kv = int(options.get("kv_heads") or heads)
    book = dict(inputs)
    opts = {k: v for k, v in options.items()
            if k not in ("layout", "qkv_layout", "masked", "valid_lens")}
    torch_layout = options.get("layout", "book") == "torch"

    # per-head weight lists, then the torch layout, then the fused projection
    for name in (*_WEIGHTS, "w_qkv"):
        if name in book:
            book[name] = _weight(book[name], name, torch_layout)
    for name in (*_BIASES, "b_qkv"):
        if name in book and len(shape_of(book[name])) == 2 and len(book[name]) > 1:
            book[name] = [[x for r in book[name] for x in r]]  # per-head bias lists
    if "w_qkv" in book:
        _split_fused(book, heads, kv, options.get("qkv_layout", "stacked"))

    b = batch_size(book, heads)
    mask_per_batch = _masks(book, options, b, heads)
    out = []
    for i in range(b):
        kwargs: dict[str, Any] = dict(opts)
        for key, value in book.items():
            kwargs[key] = _batch_item(key, value, i, b, heads)
        if mask_per_batch is not None:
            kwargs["mask"] = mask_per_batch[i]
        out.append(kwargs)
    return out


def _weight(value: Any, name: str, torch_layout: bool) -> list[list[Any]]:
    """A projection in the engine's (in, out) layout: per-head lists stacked side by side
    (W^O's per-head blocks one above the other), torch's (out, in) transposed."""
    depth = len(shape_of(value))
    if depth == 3:
        mats = [_transpose(m) if torch_layout else m for m in value]
        if name == "w_o":  # Concat · W^O: head i's rows i·d_v … (i+1)·d_v − 1
            return [row for m in mats for row in m]
        return _hstack(mats, name)
    m = _as_matrix(value)
    return _transpose(m) if torch_layout else m


def _split_fused(book: dict[str, Any], heads: int, kv: int, layout: str) -> None:
    """W^QKV (in, 3·h·d) → W^Q, W^K, W^V (and b_qkv likewise)."""
    for key in ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v"):
        if key in book:
            raise ExampleFileError(f"w_qkv is the fused projection: give it or {key}, not both")
    w = book.pop("w_qkv")
    bias = book.pop("b_qkv", None)
    width = len(w[0])
    if layout == "stacked":
        # [Q (h·d_k) | K (g·d_k) | V (g·d_v)] with d_v = d_k
        parts = heads + 2 * kv
        if width % parts:
            raise ExampleFileError(f"w_qkv has {width} columns, not a multiple of "
                                   f"heads + 2·kv_heads = {parts}")
        d = width // parts
        cuts = [(0, heads * d), (heads * d, (heads + kv) * d), ((heads + kv) * d, width)]
        columns = [list(range(a, b)) for a, b in cuts]
    elif layout == "per_head":
        if kv != heads:
            raise ExampleFileError("qkv_layout='per_head' needs kv_heads = heads")
        if width % (3 * heads):
            raise ExampleFileError(f"w_qkv has {width} columns, not a multiple of 3·heads = "
                                   f"{3 * heads}")
        d = width // (3 * heads)
        columns = [[h * 3 * d + part * d + c for h in range(heads) for c in range(d)]
                   for part in range(3)]
    else:
        raise ExampleFileError(f"qkv_layout={echo(layout)} must be 'stacked' or 'per_head'")
    for key, cols in zip(("w_q", "w_k", "w_v"), columns, strict=True):
        book[key] = [[row[c] for c in cols] for row in w]
    if bias is not None:
        vec = _as_matrix(bias)[0]
        if len(vec) != width:
            raise ExampleFileError(f"b_qkv has {len(vec)} entries; w_qkv has {width} columns")
        for key, cols in zip(("b_q", "b_k", "b_v"), columns, strict=True):
            book[key] = [vec[c] for c in cols]


def _batch_item(key: str, value: Any, i: int, b: int, heads: int) -> Any:
    if b == 1 and key not in _BATCHED and key != "scores":
        return value
    depth = len(shape_of(value))
    if key in _BATCHED and depth == _BATCHED[key] + 1:
        return value[i]
    if key == "scores" and (depth == 4 or (depth == 3 and heads == 1)):
        return value[i]
    return value


def _masks(book: dict[str, Any], options: dict[str, Any], b: int, heads: int
           ) -> list[Any] | None:
    """Per batch element, the engine's mask (None: leave ``mask`` as given)."""
    masked = options.get("masked")
    valid = options.get("valid_lens")
    mask = options.get("mask")
    if masked is not None and mask is not None:
        raise ExampleFileError("give mask (true = takes part) or masked (true = masked out), "
                               "not both")
    if valid is not None and (mask is not None or masked is not None):
        raise ExampleFileError("valid_lens is a mask: give it, mask or masked, not several")
    if masked is not None:
        return [_per_batch(_negate(masked), i, b, heads, "masked") for i in range(b)]
    if valid is not None:
        return [_valid_mask(valid, i, b, book) for i in range(b)]
    if mask is not None and not isinstance(mask, str):
        return [_per_batch(mask, i, b, heads, "mask") for i in range(b)]
    return None


def _shown(x: Any) -> str:
    """An entry for a message: quoted and cut when a string, short when a number."""
    return echo(x) if isinstance(x, str) else expr_text(x)


def _negate(m: Any) -> Any:
    if isinstance(m, list):
        return [_negate(x) for x in m]
    if not isinstance(m, bool):
        raise ExampleFileError(f"masked entries must be true or false, not {_shown(m)}")
    return not m


def _per_batch(mask: Any, i: int, b: int, heads: int, name: str) -> Any:
    """2-D: shared; 3-D: per head (heads > 1) or per batch element (heads = 1);
    4-D: batch × heads."""
    depth = len(shape_of(mask))
    if depth == 2:
        return mask
    if depth == 3:
        if heads > 1:
            return mask
        if len(mask) != b:
            raise ExampleFileError(f"{name} has {len(mask)} matrices but the batch has {b} elements")
        return mask[i]
    if depth == 4:
        if len(mask) != b:
            raise ExampleFileError(f"{name} has {len(mask)} batch entries but the batch has {b}")
        return mask[i]
    raise ExampleFileError(f"{name} must have 2, 3 or 4 dimensions")


def _valid_mask(valid: Any, i: int, b: int, book: dict[str, Any]) -> list[list[bool]]:
    """D2L's valid_lens: keys j ≥ valid length are masked (per row, or per batch element)."""
    n_q, n_k = _lengths(book, i, b)
    lens = valid if isinstance(valid, list) else [valid]
    if len(lens) != b:
        raise ExampleFileError(f"valid_lens has {len(lens)} entries but the batch has {b} elements")
    row = lens[i]
    per_query = row if isinstance(row, list) else [row] * n_q
    if len(per_query) != n_q:
        raise ExampleFileError(f"valid_lens[{i}] has {len(per_query)} entries but n_q={n_q}")
    for v in per_query:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= n_k:
            raise ExampleFileError(f"valid_lens entry {_shown(v)} must be an integer in 0..{n_k}")
    return [[j < v for j in range(n_k)] for v in per_query]


def _lengths(book: dict[str, Any], i: int, b: int) -> tuple[int, int]:
    """(n_q, n_k) of batch element ``i``, read off the inputs."""
    if "scores" in book:
        m = book["scores"]
        while len(shape_of(m)) > 2:
            m = m[0]
        return len(m), len(m[0])

    def rows(key: str) -> int | None:
        if key not in book:
            return None
        v = book[key]
        return len(v[i] if len(shape_of(v)) == 3 else v)

    n_q = rows("query") or rows("x") or 1
    n_k = rows("key") or rows("x_kv") or rows("x") or 1
    return n_q, n_k
