"""Dimension-only examples: the shape algebra and the parameter count."""

from __future__ import annotations

import re
from typing import Any

from ..._latex import latex_escape
from ...errors import MhaSymbolicError
from .model import Check, Display, Step, Table
from .numbers import _tex, group_digits, shape_latex, symbol_latex

# ---------------------------------------------------------------------------
# Dimension-only examples: shape algebra and parameter counts
# ---------------------------------------------------------------------------


def _shape_steps(spec: Any) -> tuple[list[Step], list[Check]]:
    from ...exact.shapes import Shape, attention_shapes, same_size

    table = attention_shapes(spec)
    sh = {e.name: e.shape for e in table.entries}

    def tex(s: Shape) -> str:
        return shape_latex(s)

    def prod(a: Shape, b: Shape, out: Shape) -> str:
        return rf"\left({tex(a)}\right) \cdot \left({tex(b)}\right) = {tex(out)}"

    cross = spec.is_cross
    src = "X_{kv}" if cross else "X"
    products = [
        ("Q_i = X W^{Q}_i", sh["x"], sh["w_q"], sh["q"]),
        (f"K_i = {src} W^{{K}}_i", sh["x_kv"], sh["w_k"], sh["k"]),
        (f"V_i = {src} W^{{V}}_i", Shape(sh["x_kv"].rows, spec.vdim), sh["w_v"], sh["v"]),
    ]
    rows = [f"{name} &: {prod(a, b, c)}" for name, a, b, c in products]
    steps = [Step(
        "Project",
        ("queries come from the query side (the decoder), keys and values from the other "
         "sequence (the encoder): " if cross else
         "queries, keys and values all come from the same tokens: ")
        + f"$Q_i \\in \\mathbb{{R}}^{{{tex(sh['q'])}}}$, "
        f"$K_i \\in \\mathbb{{R}}^{{{tex(sh['k'])}}}$, $V_i \\in \\mathbb{{R}}^{{{tex(sh['v'])}}}$.",
        (Display(tuple(rows)),))]
    steps.append(Step(
        "Scores $Q_i K_i^{\\top}$",
        "each query row is dotted with each key row: one row per query token, one column "
        "per key token" + (" (not square: the hallmark of cross-attention)." if cross else "."),
        (Display((f"Q_i K_i^{{\\top}} &: {prod(sh['q'], sh['k'].T, sh['scores'])}",)),)))
    steps.append(Step(
        "Softmax over the key axis",
        "each query distributes its attention over the keys; the softmax keeps the shape "
        "and makes each row sum to $1$.",
        (Display((f"A_i = \\mathrm{{softmax}}(Q_i K_i^{{\\top}} / \\sqrt{{d_k}}) &: "
                  f"{tex(sh['weights'])}",)),)))
    steps.append(Step(
        "Times $V_i$",
        "the inner dimension (the number of keys) cancels; the output length follows the "
        "query side.",
        (Display((f"\\mathrm{{head}}_i = A_i V_i &: {prod(sh['weights'], sh['v'], sh['head'])}",)),)))
    h = spec.heads
    steps.append(Step(
        "Concatenate and project",
        "the $h$ heads side by side give width $h \\cdot d_v$; $W^{O}$ maps it back to "
        "$d_{\\mathrm{model}}$.",
        (Display((
            f"\\mathrm{{Concat}} &: {tex(sh['concat'])} \\quad (h \\cdot d_v = "
            f"{_tex(h)} \\cdot {_tex(spec.d_v)} = {_tex(_simplify(h * spec.d_v))})",
            f"\\mathrm{{Concat}}\\, W^{{O}} &: {prod(sh['concat'], sh['w_o'], sh['output'])}",
        )),)))
    steps.append(Step(
        "All shapes at a glance",
        "every intermediate, in the order it is computed.",
        (Table(header=("Quantity", "Shape", "How it follows"),
               rows=tuple((f"${e.symbol}$", f"${tex(e.shape)}$", _how_markup(e.how))
                          for e in table.entries),
               align="lll"),)))
    # checks: recompute every product with the checker, independently of the table's order
    detail = []
    ok = True
    for name, a, b, c in [
        *products,
        ("Q_i K_i^T", sh["q"], sh["k"].T, sh["scores"]),
        ("A_i V_i", sh["weights"], sh["v"], sh["head"]),
        ("Concat W^O", sh["concat"], sh["w_o"], sh["output"]),
    ]:
        try:
            got = a.matmul(b)
            good = same_size(got.rows, c.rows) and same_size(got.cols, c.cols)
        except MhaSymbolicError:
            good = False
        ok = ok and good
        detail.append(_CHECK_NAMES.get(name, name.split(" =")[0]))
    checks = [Check(
        "shapes agree", ok,
        "inner sizes agree for " + ", ".join(f"${d}$" for d in detail)
        + " (shape checker: equal numbers or a proved symbolic identity).")]
    back = same_size(h * spec.d_v, spec.d_model)
    checks.append(Check(
        "heads rebuild d_model", bool(back),
        f"$h \\cdot d_v = {_tex(_simplify(h * spec.d_v))}$ "
        + ("equals" if back else "differs from") + f" $d_{{\\mathrm{{model}}}} = {_tex(spec.d_model)}$."))
    return steps, checks


_CHECK_NAMES = {"Q_i K_i^T": r"Q_i K_i^{\top}", "A_i V_i": "A_i V_i",
                "Concat W^O": r"\mathrm{Concat}\, W^{O}"}


def _simplify(x: Any) -> Any:
    if isinstance(x, int):
        return x
    import sympy as sp

    x = sp.simplify(x)
    return int(x) if x.is_Integer else x


def _count_steps(spec: Any) -> tuple[list[Step], list[Check]]:
    import sympy as sp

    from ...exact.params import parameter_count

    count = parameter_count(spec)
    h, g = spec.heads, spec.kv_heads
    steps: list[Step] = []
    widths = {"W^Q": (spec.d_model, h, spec.d_k), "W^K": (spec.kdim, g, spec.d_k),
              "W^V": (spec.vdim, g, spec.d_v)}
    rows = []
    proj_total: Any = 0
    for name, _shape_text, c in count.parts:
        if name not in widths:
            continue
        rows_in, n_heads, width = widths[name]
        per_head = _simplify(rows_in * width)
        lhs = _param_tex(name)
        rows.append(
            f"{lhs} &: {n_heads} \\times \\left({_tex(rows_in)} \\times {_tex(width)}\\right) = "
            f"{_tex(n_heads)} \\times {_tex(per_head)} = {_tex(c)}")
        proj_total = proj_total + c
    proj_total = _simplify(proj_total)
    rows.append(f"\\text{{together}} &= {_tex(proj_total)}")
    steps.append(Step(
        "Per-head projections",
        f"each head $i$ has its own $W^{{Q}}_i \\in \\mathbb{{R}}^{{{_tex(spec.d_model)} \\times "
        f"{_tex(spec.d_k)}}}$ (and likewise $W^{{K}}_i$, $W^{{V}}_i$); side by side the heads' "
        "matrices form one stacked projection.",
        (Display(tuple(rows)),)))
    for name, _shape_text, c in count.parts:
        if name == "W^O":
            steps.append(Step(
                "Output projection $W^{O}$",
                "$W^{O}$ maps the concatenated heads back to the model width.",
                (Display((f"W^{{O}} &: {_tex(_simplify(h * spec.d_v))} \\times "
                          f"{_tex(spec.d_model)} = {_tex(c)}",)),)))
    biases = [(n, c) for n, _, c in count.parts if not n.startswith("W")]
    if biases:
        steps.append(Step(
            "Biases",
            "one bias per output unit of each projection"
            + (" (and the learned extra key/value rows)" if spec.add_bias_kv else "") + ".",
            (Display(tuple(f"{_param_tex(n)} &: {_tex(c)}" for n, c in biases)),)))
    total = count.total
    d = spec.d_model
    table = Table(
        header=("Part", "Shape", "Parameters"),
        rows=tuple((f"${_param_tex(n)}$", f"${_shape_text_tex(shape)}$", f"${_tex(c)}$")
                   for n, shape, c in count.parts),
        align="lcr",
        total=("Total", "", f"${_tex(total)}$"))
    steps.append(Step("Total", "the block's learnable numbers are the sum of its parts.",
                      (table,)))
    # checks: an independent integer sum, and the 4 d_model^2 (+ 4 d_model) rule
    independent = sp.Add(*[sp.sympify(c) for _, _, c in count.parts])
    same = sp.simplify(independent - sp.sympify(total)) == 0
    checks = [Check("sum of the parts", bool(same),
                    f"adding the {len(count.parts)} parts again gives ${_tex(sp.expand(independent))}$"
                    f", {'equal to' if same else 'different from'} the total.")]
    if h == g and spec.kdim == d and spec.vdim == d and not spec.add_bias_kv:
        rule = 4 * sp.sympify(d) ** 2 + (4 * sp.sympify(d) if spec.bias else 0)
        holds = sp.simplify(sp.sympify(total) - rule) == 0
        rule_tex = r"4 d_{\mathrm{model}}^2" + (r" + 4 d_{\mathrm{model}}" if spec.bias else "")
        numbers = ""
        if isinstance(d, int):
            numbers = f" = 4 \\cdot {d}^2" + (f" + 4 \\cdot {d}" if spec.bias else "")
        value = _tex(sp.expand(rule))
        if isinstance(total, int) and total > 0 and total & (total - 1) == 0:
            value += f" = 2^{{{total.bit_length() - 1}}}"
        checks.append(Check(
            "rule of thumb", bool(holds),
            f"${rule_tex}{numbers} = {value}$, "
            + ("equal to" if holds else "different from") + " the total."))
    return steps, checks


def _how_markup(how: str) -> str:
    """The shape table's explanation (``'X W^Q_i = (3 × 512)·(512 × 64)'``) as markup:
    its math from the notes grammar, its words as plain text ("->" as an arrow)."""
    from .notes import pieces

    text = how.replace("->", "\u2192").replace("$", "")
    return "".join(f"${piece}$" if is_math else piece for is_math, piece in pieces(text))


def _shape_text_tex(text: str) -> str:
    """``'512 × 64'`` or ``'kdim × d'`` (the parameter count's shape text) as LaTeX:
    numbers grouped, names through :func:`symbol_latex`, anything else escaped."""
    out = []
    for part in text.split("×"):
        part = part.strip()
        if part.isdigit():
            out.append(group_digits(part))
        elif re.fullmatch(r"[A-Za-z]+(?:_[A-Za-z0-9]+)?", part):
            out.append(symbol_latex(part))
        else:
            out.append(rf"\text{{{latex_escape(part)}}}")
    return r" \times ".join(out)


def _param_tex(name: str) -> str:
    table = {"W^Q": "W^{Q}", "W^K": "W^{K}", "W^V": "W^{V}", "W^O": "W^{O}",
             "b^Q": "b^{Q}", "b^K": "b^{K}", "b^V": "b^{V}", "b^O": "b^{O}",
             "bias_k": r"\mathrm{bias}_k", "bias_v": r"\mathrm{bias}_v"}
    return table.get(name, rf"\mathrm{{{latex_escape(name)}}}")

