"""Parameter and FLOP counts of one multi-head attention block.

Layout (y = x W + b, the book's convention; torch stores W transposed):

=============  =====================  ===============================
part           shape                  count
=============  =====================  ===============================
W^Q            d_model × h·d_k        d_model·h·d_k
W^K            kdim × g·d_k           kdim·g·d_k        (g = kv_heads)
W^V            vdim × g·d_v           vdim·g·d_v
W^O            h·d_v × d_model        h·d_v·d_model
b^Q, b^K, b^V  h·d_k, g·d_k, g·d_v    (with bias)
b^O            d_model                (with bias)
bias_k, bias_v g·d_k, g·d_v           (add_bias_kv: torch's learned extra key/value row)
=============  =====================  ===============================

With g = h, kdim = vdim = d_model and d_k = d_v = d_model/h the weights total
4·d_model², the biases 4·d_model: ``torch.nn.MultiheadAttention(E, h)`` has
4E² + 4E parameters (REFERENCES.md §2).

FLOPs count one multiply-add as 2 FLOPs; the softmax is counted as n_q·n_k
exponentials, n_q·(n_k − 1) additions and n_q·n_k divisions per head (the
max-shift adds n_q·n_k subtractions and comparisons; not counted).

>>> parameter_count(d_model=512, heads=8, bias=False).total
1048576
>>> parameter_count(d_model="d", heads="h", bias=False).total
4*d**2
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from .spec import AttentionSpec

__all__ = ["FlopCount", "ParameterCount", "flop_count", "parameter_count"]


@dataclass(frozen=True, repr=False)
class ParameterCount:
    """Learnable numbers of one attention block, part by part."""

    spec: AttentionSpec
    parts: tuple[tuple[str, str, Any], ...]  # (name, shape text, count)

    @property
    def total(self) -> Any:
        total = sum((c for _, _, c in self.parts), 0)
        return _simplify(total)

    @property
    def weights(self) -> Any:
        return _simplify(sum((c for n, _, c in self.parts if n.startswith("W")), 0))

    @property
    def biases(self) -> Any:
        return _simplify(sum((c for n, _, c in self.parts if not n.startswith("W")), 0))

    def as_dict(self) -> dict[str, Any]:
        return {
            "parts": {n: {"shape": s, "count": _json_count(c)} for n, s, c in self.parts},
            "weights": _json_count(self.weights),
            "biases": _json_count(self.biases),
            "total": _json_count(self.total),
        }

    def text(self) -> str:
        lines = [f"{n:8s} {s:22s} {_text_count(c)}" for n, s, c in self.parts]
        lines.append(f"{'total':8s} {'':22s} {_text_count(self.total)}")
        total = self.total
        d = self.spec.d_model
        if isinstance(total, int) and isinstance(d, int) and total == 4 * d * d:
            lines.append(f"         = 4·d_model² = 4·{d}²")
        return "\n".join(lines)

    def latex(self) -> str:
        import sympy as sp

        terms = " + ".join(sp.latex(sp.sympify(c)) for _, _, c in self.parts)
        return rf"{terms} = {sp.latex(sp.sympify(self.total))}"

    # -- displays: a table (part, shape, count) and its total ----------------------
    def _rows(self) -> list[tuple[str, str, Any]]:
        return [*self.parts, ("total", "", self.total)]

    def __repr__(self) -> str:
        from .._text import sanitize

        rows = [(n, sh, _plain_count(c)) for n, sh, c in self._rows()]
        w0, w1 = (max(len(r[j]) for r in rows) for j in (0, 1))
        w2 = max(len(r[2]) for r in rows)
        lines = [f"{n:<{w0}}  {sh:<{w1}}  {c:>{w2}}" for n, sh, c in rows]
        return sanitize(f"ParameterCount ({self.spec.kind}):\n" + "\n".join(lines),
                        keep_newlines=True)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        from .._display import html_text

        def cell(x: Any, tag: str = "td", right: bool = False) -> str:
            style = ' style="text-align:right"' if right else ""
            return f"<{tag}{style}>{x}</{tag}>"

        rows = "".join(
            "<tr>" + cell(_html_math(n)) + cell(_html_math(sh)) + cell(_html_count(c), right=True)
            + "</tr>" for n, sh, c in self._rows())
        head = cell("part", "th") + cell("shape", "th") + cell("count", "th", right=True)
        caption = html_text(f"parameters of one attention block ({self.spec.kind})")
        return (f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
                f"<tbody>{rows}</tbody></table>")

    def _repr_markdown_(self) -> str:
        from .._display import markdown_table

        return markdown_table(("part", "shape", "count"),
                              [(n, sh, _plain_count(c)) for n, sh, c in self._rows()])


def _text_count(c: Any) -> str:
    """A count in the text table: an integer as it is, a symbolic one as a book writes it."""
    return str(c) if isinstance(c, int) or getattr(c, "is_Integer", False) else book_count(c)


def _plain_count(c: Any) -> str:
    """A count as text: an integer grouped in threes (thin spaces), a symbolic count
    with · for products and superscript powers (4·d_model·(d_model + 1))."""

    from .._display import thin_grouped

    if isinstance(c, int) or getattr(c, "is_Integer", False):
        return thin_grouped(int(c))
    return book_count(c)


_SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
#: The most terms a count is expanded to for printing (beyond: printed factored).
_BOOK_MAX_TERMS = 12


def book_count(c: Any) -> str:
    """A count as a book writes it: a polynomial expanded, highest degree first,
    coefficients before the letters, powers as superscripts, products with ``·``.

    >>> import sympy as sp
    >>> d = sp.Symbol("d_model")
    >>> book_count(4 * d * (d + 1)), book_count(d**2), book_count(4096 * (2 * d**2 + 1025 * d + 8190))
    ('4·d_model² + 4·d_model', 'd_model²', '8192·d_model² + 4198400·d_model + 33546240')
    >>> book_count(d / 4 + d**2 / 2)
    'd_model²/2 + d_model/4'
    """
    import re

    import sympy as sp

    if isinstance(c, int) or getattr(c, "is_Integer", False):
        return str(int(c))
    expr = sp.sympify(c) if not isinstance(c, sp.Basic) else c  # a count of ours, not user text
    gens = sorted(expr.free_symbols, key=lambda x: x.name)
    if gens and expr.is_polynomial(*gens):
        poly = sp.Poly(expr, *gens)
        if len(poly.terms()) <= _BOOK_MAX_TERMS:
            terms = sorted(poly.terms(), key=lambda t: (-sum(t[0]), [-k for k in t[0]]))
            out = ""
            for monomial, coeff in terms:
                letters = "·".join(g.name + (str(k).translate(_SUPERSCRIPTS) if k > 1 else "")
                                   for g, k in zip(gens, monomial, strict=True) if k)
                a = sp.Rational(abs(coeff))
                num, den = int(a.p), int(a.q)
                body = ((f"{num}·{letters}" if num != 1 else letters) if letters else str(num))
                body += f"/{den}" if den != 1 else ""
                out += (" − " if coeff < 0 else " + ") + body if out else ("−" if coeff < 0 else "") + body
            return out
    text = re.sub(r"\*\*(\d+)", lambda m: m.group(1).translate(_SUPERSCRIPTS), str(expr))
    return text.replace("*", "·")


def _html_math(text: str) -> str:
    """Escaped text with ``x^Q``/``d_k`` as super-/subscripts (multi-letter ones upright,
    as HTML shows every letter)."""
    import re

    from .._display import html_text

    out = html_text(text)
    out = re.sub(r"\^([A-Za-z0-9]+)", r"<sup>\1</sup>", out)
    return re.sub(r"(?<=[A-Za-z0-9])_([A-Za-z0-9]+)", r"<sub>\1</sub>", out)


def _html_count(c: Any) -> str:
    return _html_math(_plain_count(c))


def _json_count(c: Any) -> Any:
    """A count for JSON: an int when numeric, the symbolic form as a string otherwise."""
    if isinstance(c, int):
        return c
    if getattr(c, "is_Integer", False):
        return int(c)
    return str(c)


def _simplify(x: Any) -> Any:
    if isinstance(x, int):
        return x
    import sympy as sp

    x = sp.factor(sp.expand(x))
    return int(x) if x.is_Integer else x


def _shape(a: Any, b: Any) -> str:
    from .shapes import Shape

    return str(Shape(a, b))


def _size(x: Any) -> str:
    from .shapes import _text

    return _text(x)


def _need(spec: AttentionSpec, *names: str) -> None:
    missing = [n for n in names if getattr(spec, n) is None]
    if missing:
        raise SpecError(f"counting needs {', '.join(missing)} (a number or a symbol name)")


def parameter_count(spec: AttentionSpec | None = None, **sizes: Any) -> ParameterCount:
    """Parameters of one multi-head attention block (MHA, GQA, MQA, kdim/vdim).

    Sizes may be numbers or symbol names; ``bias`` and ``add_bias_kv`` follow
    ``torch.nn.MultiheadAttention``.
    """
    if spec is None:
        sizes.setdefault("d_model", "d_model")
        sizes.setdefault("heads", "h")
        spec = AttentionSpec(**sizes)
    s = spec
    _need(s, "d_model", "d_k", "d_v")
    h, g = s.heads, s.kv_heads
    parts: list[tuple[str, str, Any]] = [
        ("W^Q", _shape(s.d_model, h * s.d_k), s.d_model * h * s.d_k),
        ("W^K", _shape(s.kdim, g * s.d_k), s.kdim * g * s.d_k),
        ("W^V", _shape(s.vdim, g * s.d_v), s.vdim * g * s.d_v),
        ("W^O", _shape(h * s.d_v, s.d_model), h * s.d_v * s.d_model),
    ]
    on = s.bias_parts
    parts += [(n, _size(c), c) for n, part, c in (
        ("b^Q", "q", h * s.d_k), ("b^K", "k", g * s.d_k), ("b^V", "v", g * s.d_v),
        ("b^O", "o", s.d_model)) if on[part]]
    if s.add_bias_kv:
        parts += [
            ("bias_k", _size(g * s.d_k), g * s.d_k),
            ("bias_v", _size(g * s.d_v), g * s.d_v),
        ]
    return ParameterCount(s, tuple((n, sh, _simplify(c)) for n, sh, c in parts))


@dataclass(frozen=True)
class FlopCount:
    """Forward-pass FLOPs (multiply-add = 2) of one attention block, by stage."""

    parts: tuple[tuple[str, Any], ...]

    @property
    def total(self) -> Any:
        return _simplify(sum((c for _, c in self.parts), 0))

    def as_dict(self) -> dict[str, Any]:
        return {**{n: _json_count(c) for n, c in self.parts}, "total": _json_count(self.total)}

    def text(self) -> str:
        lines = [f"{n:22s} {_text_count(c)}" for n, c in self.parts]
        lines.append(f"{'total':22s} {_text_count(self.total)}")
        return "\n".join(lines)


def flop_count(spec: AttentionSpec | None = None, **sizes: Any) -> FlopCount:
    """Forward FLOPs: projections, scores, softmax, weighted sum, output projection.

    >>> flop_count(n_q=2, d_model=2, heads=1, bias=False).total
    110
    """
    if spec is None:
        sizes.setdefault("n_q", "n_q")
        sizes.setdefault("d_model", "d_model")
        sizes.setdefault("heads", "h")
        spec = AttentionSpec(**sizes)
    s = spec
    _need(s, "n_q", "d_model", "d_k", "d_v")
    h, g, nq, nk = s.heads, s.kv_heads, s.n_q, s.n_k
    on = {p: int(b) for p, b in s.bias_parts.items()}
    parts = (
        ("Q projection", 2 * nq * s.d_model * h * s.d_k + on["q"] * nq * h * s.d_k),
        ("K projection", 2 * nk * s.kdim * g * s.d_k + on["k"] * nk * g * s.d_k),
        ("V projection", 2 * nk * s.vdim * g * s.d_v + on["v"] * nk * g * s.d_v),
        ("scores Q K^T", 2 * h * nq * nk * s.d_k),
        ("scaling", h * nq * nk),
        ("softmax", h * nq * (3 * nk - 1)),
        ("weighted sum A V", 2 * h * nq * nk * s.d_v),
        ("output projection", 2 * nq * h * s.d_v * s.d_model + on["o"] * nq * s.d_model),
    )
    return FlopCount(tuple((n, _simplify(c)) for n, c in parts))


def cli_params(args: Any) -> int:
    sizes = {k: getattr(args, k) for k in
             ("d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim")}
    sizes = {k: v for k, v in sizes.items() if v is not None}
    spec_sizes = dict(sizes, bias=not args.no_bias, add_bias_kv=args.add_bias_kv)
    spec_sizes.setdefault("d_model", "d_model")
    spec_sizes.setdefault("heads", "h")
    if args.n_k is not None and args.n_q is None:
        raise SpecError("--n-k needs --n-q (FLOPs are counted for a query length)")
    if args.n_q is not None:
        spec_sizes["n_q"] = args.n_q
        if args.n_k is not None:
            spec_sizes["n_k"] = args.n_k
    spec = AttentionSpec(**spec_sizes)
    count = parameter_count(spec)
    flops = flop_count(spec) if args.n_q is not None else None
    if args.format == "json":
        out: dict[str, Any] = {"parameters": count.as_dict()}
        if flops is not None:
            out["flops"] = flops.as_dict()
        print(json.dumps(out, indent=2))
    elif args.format == "latex":
        print(count.latex())
    else:
        print(f"parameters ({spec.kind}, {'with' if spec.bias else 'no'} bias):")  # CLI: bool
        print(count.text())
        if flops is not None:
            print("\nforward FLOPs (multiply-add = 2):")
            print(flops.text())
    return 0
