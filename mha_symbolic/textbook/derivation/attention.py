"""The steps of an exact attention computation: projections, heads, scores, scaling,
softmax, weighted sum, concatenation and W^O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import MhaSymbolicError
from .matrices import _exp_tex, _matrix_chain, _operand_tex, _printed, _sum_rows, _vec_tex
from .model import LINE_CHARS, MATRIX_DIGITS, MAX_ENTRY_LINES, SHORT, WIDE, Block, Display, Paragraph, Step
from .numbers import _digits, _is_rational, _leaves, _sub, _tex, _tex_if_short, _tidy
from .variants import variant_note, variant_rows, variant_symbolic

# ---------------------------------------------------------------------------
# Derivation of an exact attention computation
# ---------------------------------------------------------------------------


def _given_matrices(given: dict[str, Any] | None) -> dict[str, Any]:
    """The example's stated weight matrices (W^Q, W^K, W^V, W^O, biases) as exact matrices.

    A stack of per-head matrices (``w_q`` of shape (h, d_model, d_k), as a wrapper of
    single-head modules states them) is not one matrix: it is left out of the display,
    and the heads' Q_i, K_i, V_i below show what it gave."""
    from ...exact.engine import exact_matrix

    out: dict[str, Any] = {}
    for key in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"):
        if given and given.get(key) is not None:
            try:
                out[key] = exact_matrix(given[key], key)
            except MhaSymbolicError:
                continue  # not a matrix (a per-head stack): the engine already read it
    return out


_W_TEX = {"w_q": "W^{Q}", "w_k": "W^{K}", "w_v": "W^{V}", "w_o": "W^{O}",
          "b_q": "b^{Q}", "b_k": "b^{K}", "b_v": "b^{V}", "b_o": "b^{O}"}


def _grouped_matrices(mats: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """``W^{Q} = W^{K} = W^{V} = [...]`` when they are equal, else one row each."""
    rows: list[str] = []
    done: set[str] = set()
    for key in keys:
        if key not in mats or key in done:
            continue
        same = [k for k in keys if k in mats and k not in done and mats[k] == mats[key]]
        done.update(same)
        lhs = " = ".join(_W_TEX[k] for k in same)
        rows += _matrix_chain(lhs, mats[key])
    return rows


def _attention_steps(att: Any, given: dict[str, Any] | None = None) -> list[Step]:
    steps: list[Step] = []
    mats = _given_matrices(given)
    spec = att.spec
    h = len(att.heads)
    first = att.heads[0]
    inputs = att.inputs
    raw_scores = first.q is None

    # -- inputs and projections ------------------------------------------------
    if "x" in inputs:
        cross = inputs["x_kv"] is not inputs["x"] and inputs["x_kv"] != inputs["x"]
        rows: list[str] = _matrix_chain("X", inputs["x"])
        if cross:
            rows += _matrix_chain("X_{kv}", inputs["x_kv"])
        src = "X_{kv}" if cross else "X"
        rows += _grouped_matrices(mats, ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v"))
        blocks: list[Block] = [Display(tuple(rows))]
        rows = []
        bias_q = " + b^{Q}" if "b_q" in mats else ""
        bias_k = " + b^{K}" if "b_k" in mats else ""
        bias_v = " + b^{V}" if "b_v" in mats else ""
        rows += _matrix_chain("Q", inputs["q"], symbolic="X W^{Q}" + bias_q)
        rows += _matrix_chain("K", inputs["k"], symbolic=f"{src} W^{{K}}" + bias_k)
        if "v" in inputs:
            rows += _matrix_chain("V", inputs["v"], symbolic=f"{src} W^{{V}}" + bias_v)
        blocks.append(Display(tuple(rows)))
        steps.append(Step(
            "Project the tokens",
            "each token's vector is mapped to a query (what it asks for), a key (what it "
            "offers) and a value (what it passes on), by $Q = XW^{Q}$, $K = XW^{K}$, $V = XW^{V}$.",
            tuple(blocks)))
    elif not raw_scores:
        rows = _matrix_chain("Q", inputs["q"]) + _matrix_chain("K", inputs["k"])
        if "v" in inputs:
            rows += _matrix_chain("V", inputs["v"])
        steps.append(Step(
            "Queries, keys and values",
            "the inputs, one row per token: row $r$ of $Q$ asks, row $j$ of $K$ answers, "
            "row $j$ of $V$ is what token $j$ passes on.",
            (Display(tuple(rows)),)))

    if h > 1 and not raw_scores:
        d_k = first.q.cols
        rows = []
        for head in att.heads:
            i = _sub(head.index)
            parts = [_matrix_chain(f"Q_{{{i}}}", head.q), _matrix_chain(f"K_{{{i}}}", head.k)]
            if head.v is not None:
                parts.append(_matrix_chain(f"V_{{{i}}}", head.v))
            if all(len(p) == 1 for p in parts) and sum(_printed(p[0]) for p in parts) <= 60:
                # small slices side by side: Q_i = [..], K_i = [..], V_i = [..]
                rows.append(r",\quad ".join(p[0].replace("&=", "=") if k else p[0]
                                            for k, p in enumerate(parts)))
            else:
                rows += [line for p in parts for line in p]
        kv = spec.kv_heads
        share = ("" if kv == h else
                 f" Here {h} query heads share {kv} key/value head"
                 f"{'s' if kv != 1 else ''}: head $i$ uses key/value head "
                 f"$\\lceil i / {h // kv} \\rceil$ (repeat-interleave).")
        steps.append(Step(
            "Split into heads",
            f"each of the $h = {h}$ heads works in its own slice of width $d_k = {d_k}$: "
            f"columns ${d_k}(i-1)+1$ to ${d_k} i$ of $Q$, $K$, $V$ belong to head $i$, so "
            "$h$ heads cost what one full-width head costs." + share,
            (Display(tuple(rows)),)))

    steps += _head_steps(att)

    if att.concat is not None and h > 1:
        joined = r" \mid ".join(rf"\mathrm{{head}}_{{{_sub(k.index)}}}" for k in att.heads)
        d_v = first.output.cols
        steps.append(Step(
            "Concatenate the heads",
            f"the $h = {h}$ outputs of width $d_v = {d_v}$ are placed side by side, "
            f"rebuilding rows of width $h \\cdot d_v = {h * d_v}$.",
            (Display(tuple(_matrix_chain(r"\mathrm{Concat}", att.concat,
                                         symbolic=rf"\left[{joined}\right]"))),)))
    if att.output is not None:
        concat = r"\mathrm{Concat}" if h > 1 else r"\mathrm{head}_{1}"
        rows = _grouped_matrices(mats, ("w_o", "b_o"))
        symbolic = f"{concat}\\, W^{{O}}" + (" + b^{O}" if "b_o" in mats else "")
        rows += _matrix_chain(r"\mathrm{Output}", att.output, symbolic=symbolic)
        steps.append(Step(
            "Apply the output projection $W^{O}$",
            "$W^{O}$ mixes the heads' outputs into the model's space; the identity would "
            "leave the concatenation unchanged.",
            (Display(tuple(rows)),)))
    return steps


def _head_steps(att: Any) -> list[Step]:
    """Scores, scaling, softmax and weighted sum: one step per stage, every head in it."""
    import sympy as sp

    steps: list[Step] = []
    heads = att.heads
    h = len(heads)
    each = " (each head)" if h > 1 else ""
    scale = att.scale
    spec = att.spec

    # -- scores -----------------------------------------------------------------
    if heads[0].q is not None:
        rows = []
        for head in heads:
            i = _sub(head.index)
            product = f"{_operand_tex(head.q)} {_operand_tex(head.k.T)}"
            symbolic = [f"Q_{{{i}}} K_{{{i}}}^{{\\top}}"]
            if len(product) <= WIDE:
                symbolic.append(product)
            rows += _matrix_chain(f"S_{{{i}}}", head.scores, symbolic=" = ".join(symbolic))
        name = "Q_i K_i^{\\top}" if h > 1 else "Q_{1} K_{1}^{\\top}"
        steps.append(Step(
            f"Scores ${name}$" + each,
            "the dot product of query $r$ with key $j$ measures how well they align: "
            "the raw 'how much should $r$ listen to $j$' number, one row per query, "
            "one column per key.",
            (Display(tuple(rows)),)))
    else:
        rows = []
        for head in heads:
            rows += _matrix_chain(f"S_{{{_sub(head.index)}}}", head.scores)
        steps.append(Step(
            "Scores" + each,
            "the scores are given: entry $(r, j)$ says how much query $r$ should listen to "
            "key $j$ (a plain number, possibly negative).",
            (Display(tuple(rows)),)))

    # -- scaling and mask ---------------------------------------------------------
    mask_note = ""
    if spec.mask is not None:
        mask_note = (" The mask $M$ adds $-\\infty$ where a key is masked"
                     + (" (and the stated values elsewhere)" if spec.additive_mask is not None
                        else " and $0$ elsewhere")
                     + ", so a masked key's weight will be exactly $0$"
                     + (" (causal: query $r$ sees keys $j \\le r$"
                        + (", bottom-right aligned" if spec.causal_alignment == "bottom_right"
                           else "") + ")" if spec.mask == "causal" else "") + ".")
    mask_sym = " + M" if spec.mask is not None else ""

    mask_note += variant_note(att)
    if att.variants.get("window") is not None and not mask_sym:
        mask_sym = " + M"
    if scale == 1:
        reason = ("no $d_k$ was stated, so the given scores are taken as already scaled "
                  "(scale $1$)" if spec.scale is None else
                  "the example states scale $1$: the scores go into the softmax as they are")
        rows = []
        for head in heads:
            i = _sub(head.index)
            if mask_note:
                rows += variant_rows(att, head)
                rows += _matrix_chain(f"T_{{{i}}}", head.scaled,
                                      symbolic=variant_symbolic(att, i, f"S_{{{i}}}") + mask_sym)
            else:
                rows.append(f"T_{{{i}}} &= S_{{{i}}}")
        steps.append(Step("Scaling", reason + "." + mask_note, (Display(tuple(rows)),)))
    else:
        if spec.scale is None:
            d_k = spec.d_k
            factor = rf"\frac{{1}}{{\sqrt{{d_k}}}} = \frac{{1}}{{\sqrt{{{_tex(d_k)}}}}}"
            why = ("dot products of $d_k$-dimensional vectors grow like $\\sqrt{d_k}$; "
                   "dividing by $\\sqrt{d_k}$ keeps the softmax out of its flat, nearly "
                   "one-hot regions where gradients vanish.")
        else:
            factor = r"\text{scale}"
            why = (f"the stated scale ${_tex(scale)}$ multiplies every score "
                   "(scale $0$ would give uniform weights; scale $1$ leaves them as they are).")
        forms = [factor]
        if getattr(scale, "is_Rational", False) and not scale.is_Integer:
            forms.append(sp.latex(scale))  # 1/8 as a fraction, then as the decimal
        forms.append(_tex(scale))
        d = None if _is_rational(scale) else _digits(scale)
        if d is not None:
            forms.append(d)
        rows = [r"\text{scale} &= " + " = ".join(forms)]
        for head in heads:
            i = _sub(head.index)
            rows += variant_rows(att, head)
            rows += _matrix_chain(f"T_{{{i}}}", head.scaled,
                                  symbolic=variant_symbolic(att, i, rf"\text{{scale}} \cdot "
                                                            rf"S_{{{i}}}") + mask_sym)
        steps.append(Step("Scale the scores", why + mask_note, (Display(tuple(rows)),)))

    # -- softmax --------------------------------------------------------------------
    n_q, n_k = heads[0].weights.shape
    blocks: list[Block] = []
    if n_k == 1:
        blocks.append(Paragraph(
            "With a single key each row has one score and "
            "$\\mathrm{softmax}(s) = e^{s}/e^{s} = 1$: attention is forced to be the identity."))
    rows = []
    for head in heads:
        i = _sub(head.index)
        tag = f"^{{({i})}}" if h > 1 else ""
        if n_q * n_k <= MAX_ENTRY_LINES:
            # every row of a head names its denominator D_r, or none does
            named = any(_names_denominator(head.scaled, r, head.sink) for r in range(n_q))
            for r in range(n_q):
                rows += _softmax_row_lines(head.scaled, head.weights, r, tag, n_q, head.sink,
                                           named=named)
        else:
            blocks.append(Paragraph(
                f"The {n_q} × {n_k} weights of head {i}, each $w_{{rj}} = e^{{t_{{rj}}}} / "
                f"\\sum_{{j'}} e^{{t_{{rj'}}}}$:"))
            blocks.append(Display(tuple(_matrix_chain(f"A_{{{i}}}", head.weights))))
    if rows:
        blocks.append(Display(tuple(rows)))
    steps.append(Step(
        "Softmax, row by row" + each,
        "the softmax turns each row of scores into positive weights that sum to $1$: the "
        "share of its attention query $r$ gives to each key."
        + (" Head $i$'s weights are written $w^{(i)}_{rj}$." if h > 1 else ""),
        tuple(blocks)))

    # -- weighted sum ---------------------------------------------------------------
    if heads[0].output is not None:
        rows = []
        for head in heads:
            i = _sub(head.index)
            tag = f"^{{({i})}}" if h > 1 else ""
            if n_q * n_k <= MAX_ENTRY_LINES:
                for r in range(n_q):
                    rows += _weighted_sum_lines(head.weights, head.v, head.output, r, i, tag)
            else:
                rows += _matrix_chain(rf"\mathrm{{head}}_{{{i}}}", head.output,
                                      symbolic=f"A_{{{i}}} V_{{{i}}}")
        steps.append(Step(
            "Weighted sum of the values" + each,
            "the output of query $r$ is the attention-weighted blend of the value rows "
            "$v_j$: $\\mathrm{head}[r] = \\sum_j w_{rj} v_j$.",
            (Display(tuple(rows)),)))
    return steps


def _row_exponentials(t: Any, r: int, sink: Any) -> tuple[list[int], list[str]]:
    """The keys a row keeps (not masked) and the terms e^{t_rj} of its denominator."""
    import sympy as sp

    kept = [j for j in range(t.cols) if t[r, j] != -sp.oo]
    exps = [_exp_tex(t[r, j]) for j in kept]
    if sink is not None:  # the sink's e^σ joins the denominator only
        exps.append(_exp_tex(sink))
    return kept, exps


def _names_denominator(t: Any, r: int, sink: Any = None) -> bool:
    """Whether row ``r``'s denominator is too long to write under each weight (more
    than three terms, or more than 70 characters): then it is named D_r."""
    kept, exps = _row_exponentials(t, r, sink)
    return bool(kept) and (len(kept) > 3 or len(" + ".join(exps)) > 70)


def _collected(terms: Sequence[Any], written: str) -> str | None:
    """The sum of ``terms`` as SymPy builds it -- equal terms collected (2e^{a}), e^{0}
    written 1, nothing else asked of SymPy -- when that differs from the sum as
    ``written`` and is short (its size counted before it is printed)."""
    import sympy as sp

    total = sp.Add(*terms)
    if len(sp.Add.make_args(total)) == len(terms) and all(t != 1 for t in terms):
        return None  # nothing collected: the same terms in SymPy's order say nothing new
    text = _tex_if_short(total, SHORT)
    return text if text is not None and text.replace(" ", "") != written.replace(" ", "") else None


def _softmax_row_lines(t: Any, w: Any, r: int, tag: str, n_q: int,
                       sink: Any = None, *, named: bool | None = None) -> list[str]:
    import sympy as sp

    n_k = w.cols
    kept = [j for j in range(n_k) if t[r, j] != -sp.oo]
    row = f"{r + 1}" if n_q > 1 else "1"
    if not kept:
        return [rf"w{tag}_{{{row} j}} &= {_tex(w[r, 0])} \quad \text{{for every }} j"
                + (r" \quad (\text{every key masked: the sink keeps all the weight})"
                   if sink is not None else r" \quad (\text{every key masked})")]
    lines: list[str] = []
    kept, exps = _row_exponentials(t, r, sink)
    denom_inline = " + ".join(exps)
    use_d = _names_denominator(t, r, sink) if named is None else named
    if use_d:
        lines += _sum_rows(f"D{tag}_{{{row}}}", exps)
        terms = [sp.exp(t[r, j]) for j in kept] + ([sp.exp(sink)] if sink is not None else [])
        collected = _collected(terms, denom_inline)
        if collected is not None:
            lines.append(f"&= {collected}")
        d_sum = sp.Add(*terms)
        dd = _digits(d_sum)
        if dd is not None:
            lines.append(f"&= {dd}")
    for j in range(n_k):
        lhs = (f"w{tag}_{{{row}{j + 1}}}" if n_k < 10 and n_q < 10
               else f"w{tag}_{{{row},{j + 1}}}")
        if j not in kept:
            lines.append(rf"{lhs} &= 0 \quad (\text{{masked}})")
            continue
        num = _exp_tex(t[r, j])
        frac = rf"\frac{{{num}}}{{D{tag}_{{{row}}}}}" if use_d else rf"\frac{{{num}}}{{{denom_inline}}}"
        chain = [frac]
        e = w[r, j]
        # the canonical form (every exponent >= 0, see canonical_softmax), when short
        exact = _tex(e) if _is_rational(e) else _tex_if_short(_tidy(e), len(frac))
        if exact is not None:
            chain.append(exact)  # SymPy's own form, when it says more in less space
        if not _is_rational(e):
            d = _digits(e)
            if d is not None:
                chain.append(d)
        lines.append(f"{lhs} &= " + " = ".join(chain))
    return lines


def _weighted_sum_lines(w: Any, v: Any, out: Any, r: int, i: str, tag: str = "") -> list[str]:
    import sympy as sp

    n_k = w.cols
    kept = [j for j in range(n_k) if w[r, j] != 0]
    lhs = rf"\mathrm{{head}}_{{{i}}}[{r + 1}]"
    if not kept or any(w[r, j] is sp.nan for j in range(n_k)):
        row = [_tex(out[r, c]) for c in range(out.cols)]
        return [f"{lhs} &= {_vec_tex(row) if len(row) > 1 else row[0]}"
                r" \quad (\text{every key masked})"]
    vec = [_vec_tex([_tex(v[j, c]) for c in range(v.cols)]) for j in range(v.rows)]
    times = " "
    if v.cols == 1:
        times = r" \cdot "
        vec = [_tex(v[j, 0]) if _is_rational(v[j, 0]) and v[j, 0] >= 0
               else rf"\left({_tex(v[j, 0])}\right)" for j in range(v.rows)]
    symbolic_terms = [f"w{tag}_{{{r + 1}{j + 1}}}{times}{vec[j]}" for j in kept]
    symbolic = " + ".join(symbolic_terms) if kept else "0"
    numeric_terms: list[str] = []
    for j in kept:
        d = _tex(w[r, j]) if _is_rational(w[r, j]) else _digits(w[r, j], MATRIX_DIGITS)
        if d is None:
            numeric_terms = []
            break
        sep = times if v.cols == 1 else r"\, "
        if r"\times" in d:  # scientific notation: a factor in parentheses
            d = rf"\left({d}\right)"
        numeric_terms.append(f"{d}{sep}{vec[j]}")
    rhs = [symbolic]
    numeric = ""
    if numeric_terms and len(kept) <= 4 and len(kept) > 1:
        numeric = " + ".join(numeric_terms)
        rhs.append(numeric)
    entries = [out[r, c] for c in range(out.cols)]
    tidy = [_tidy(e) for e in entries]
    if all(_is_rational(e) for e in tidy) or sum(_leaves(e, SHORT) for e in tidy) <= SHORT:
        exact = [_tex(e) for e in tidy]
        if all(_is_rational(e) for e in tidy) or sum(len(x) for x in exact) <= SHORT:
            rhs.append(_vec_tex(exact) if len(exact) > 1 else exact[0])
    if not all(_is_rational(e) for e in tidy):
        digits = [_digits(e) for e in tidy]
        if all(d is not None for d in digits):
            rhs.append(_vec_tex([str(d) for d in digits]) if len(digits) > 1 else str(digits[0]))
    # the weighted sum written out: broken over lines when long (many keys, wide values)
    rows = (_sum_rows(lhs, symbolic_terms) if len(symbolic) > LINE_CHARS + 20
            else [f"{lhs} &= {rhs[0]}"])
    for x in rhs[1:]:
        if x is numeric and len(x) > LINE_CHARS + 20:
            rows += _sum_rows("", numeric_terms)  # the weights written out: break long sums
        else:
            rows.append(f"&= {x}")
    return rows


