"""Shape algebra of multi-head attention, with a checker that refuses mismatches.

SymPy accepts ``X*X`` for an ``L x d`` MatrixSymbol when the sizes are
symbolic; this module does not.  A product ``(a x b)·(c x d)`` is accepted only
when ``b == c`` is *proved* (identical numbers, or ``simplify(b - c) == 0``);
otherwise :class:`~mha_symbolic.errors.ShapeError` names both shapes.

>>> from mha_symbolic.exact.shapes import attention_shapes
>>> table = attention_shapes(n_q=3, n_k=5, d_model=512, heads=8)
>>> str(table["scores"].shape), str(table["head"].shape), str(table["output"].shape)
('3 × 5', '3 × 64', '3 × 512')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ShapeError
from .spec import AttentionSpec, Dim

__all__ = ["Shape", "ShapeEntry", "ShapeTable", "attention_shapes", "same_size"]


def same_size(a: Dim, b: Dim) -> bool:
    """Whether two sizes are provably equal (numbers, or a symbolic identity)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    import sympy as sp

    return bool(sp.simplify(sp.sympify(a) - sp.sympify(b)) == 0)


def _text(d: Dim) -> str:
    if isinstance(d, int):
        return str(d)
    text = str(d).replace("*", "·")
    return f"({text})" if any(op in text for op in "+-/") else text


@dataclass(frozen=True)
class Shape:
    """A matrix shape whose entries are ints or SymPy expressions."""

    rows: Dim
    cols: Dim

    def __str__(self) -> str:
        return f"{_text(self.rows)} × {_text(self.cols)}"

    @property
    def T(self) -> Shape:
        return Shape(self.cols, self.rows)

    def matmul(self, other: Shape, *, left: str = "left", right: str = "right") -> Shape:
        """The shape of ``left @ right``; refuses unless the inner sizes are provably equal."""
        if not same_size(self.cols, other.rows):
            raise ShapeError(
                f"cannot multiply {left} ({self}) by {right} ({other}): "
                f"inner sizes {_text(self.cols)} and {_text(other.rows)} "
                + ("differ" if isinstance(self.cols, int) and isinstance(other.rows, int)
                   else "are not provably equal")
            )
        return Shape(self.rows, other.cols)

    def __matmul__(self, other: Shape) -> Shape:
        return self.matmul(other)

    def latex(self) -> str:
        import sympy as sp

        return rf"{sp.latex(sp.sympify(self.rows))} \times {sp.latex(sp.sympify(self.cols))}"


@dataclass(frozen=True)
class ShapeEntry:
    name: str
    symbol: str  # LaTeX of the quantity
    shape: Shape
    how: str  # how the shape follows, in words


@dataclass(frozen=True)
class ShapeTable:
    """Every intermediate's shape, in the order attention computes them."""

    spec: AttentionSpec
    entries: tuple[ShapeEntry, ...]

    def __getitem__(self, name: str) -> ShapeEntry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def text(self) -> str:
        width = max(len(e.name) for e in self.entries)
        swidth = max(len(str(e.shape)) for e in self.entries)
        lines = [f"{e.name.ljust(width)}  {str(e.shape).ljust(swidth)}  {e.how}"
                 for e in self.entries]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {e.name: {"shape": [str(e.shape.rows), str(e.shape.cols)], "how": e.how}
                for e in self.entries}

    def latex(self) -> str:
        rows = [rf"{e.symbol} & {e.shape.latex()} \\" for e in self.entries]
        return "\\begin{array}{ll}\n" + "\n".join(rows) + "\n\\end{array}"

    def _repr_latex_(self) -> str:
        return f"$${self.latex()}$$"


def _sym(name: str) -> Any:
    import sympy as sp

    return sp.Symbol(name, integer=True, positive=True)


def attention_shapes(spec: AttentionSpec | None = None, **sizes: Any) -> ShapeTable:
    """Shapes of every intermediate of (multi-head, possibly cross-) attention.

    Give an :class:`AttentionSpec` or its sizes as keywords; sizes left out are
    symbols (``n_q``, ``n_k``, ``d_model``, ``h``, ``d_k``, ``d_v``).  Every
    product is checked: a mismatch raises :class:`ShapeError`.
    """
    if spec is None:
        defaults = {"n_q": "n_q", "d_model": "d_model", "heads": "h"}
        for key, value in defaults.items():
            if sizes.get(key) is None:
                sizes[key] = value
        if sizes.get("n_k") is None:
            sizes["n_k"] = "n_k" if sizes.get("cross") else sizes["n_q"]
        sizes.pop("cross", None)
        from .spec import dim

        d_model, heads = dim(sizes["d_model"], "d_model"), dim(sizes["heads"], "heads")
        symbolic = not (isinstance(d_model, int) and isinstance(heads, int))
        for key in ("d_k", "d_v"):
            if sizes.get(key) is None and symbolic:
                sizes[key] = key
        spec = AttentionSpec(**sizes)
    if spec.n_q is None:  # lengths not stated: keep them symbolic
        import dataclasses

        spec = dataclasses.replace(spec, n_q="n_q", n_k=spec.n_k if spec.n_k is not None
                                   else "n_q")
    s = spec
    if s.d_model is None:
        raise ShapeError("shape algebra needs d_model (a number or a symbol)")
    h = s.heads
    x = Shape(s.n_q, s.d_model)
    xk = Shape(s.n_k, s.kdim)
    xv = Shape(s.n_k, s.vdim)
    wq = Shape(s.d_model, s.d_k)
    wk = Shape(s.kdim, s.d_k)
    wv = Shape(s.vdim, s.d_v)
    q = x.matmul(wq, left="X", right="W^Q_i")
    k = xk.matmul(wk, left="X_kv", right="W^K_i")
    v = xv.matmul(wv, left="X_kv", right="W^V_i")
    scores = q.matmul(k.T, left="Q_i", right="K_i^T")
    head = scores.matmul(v, left="A_i", right="V_i")
    concat = Shape(s.n_q, h * s.d_v)
    wo = Shape(h * s.d_v, s.d_model)
    out = concat.matmul(wo, left="concat", right="W^O")
    entries = (
        ShapeEntry("x", "X", x, "query input: n_q tokens of width d_model"),
        ShapeEntry("x_kv", "X_{kv}", xk, "key/value input: n_k tokens (width kdim; vdim for values)"),
        ShapeEntry("w_q", "W^Q_i", wq, "per head: d_model -> d_k"),
        ShapeEntry("w_k", "W^K_i", wk, "per head: kdim -> d_k"),
        ShapeEntry("w_v", "W^V_i", wv, "per head: vdim -> d_v"),
        ShapeEntry("q", "Q_i", q, f"X W^Q_i = ({x})·({wq})"),
        ShapeEntry("k", "K_i", k, f"X_kv W^K_i = ({xk})·({wk})"),
        ShapeEntry("v", "V_i", v, f"X_kv W^V_i = ({xv})·({wv})"),
        ShapeEntry("scores", "Q_i K_i^{\\top}", scores, f"Q_i K_i^T = ({q})·({k.T})"),
        ShapeEntry("weights", "A_i", scores, "softmax over the key axis keeps the shape"),
        ShapeEntry("head", "\\mathrm{head}_i", head, f"A_i V_i = ({scores})·({v})"),
        ShapeEntry("concat", "\\mathrm{Concat}", concat, "the h heads side by side: n_q × h·d_v"),
        ShapeEntry("w_o", "W^O", wo, "h·d_v -> d_model"),
        ShapeEntry("output", "\\mathrm{Concat}\\,W^O", out, f"({concat})·({wo})"),
    )
    return ShapeTable(spec, entries)


def cli_shapes(args: Any) -> int:
    sizes = {k: getattr(args, k) for k in
             ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim")}
    table = attention_shapes(**{k: v for k, v in sizes.items() if v is not None})
    if args.format == "json":
        print(json.dumps(table.as_dict(), indent=2))
    elif args.format == "latex":
        print(table.latex())
    else:
        print(table.text())
    return 0
