r"""What a derivation prints for a claim's quantity and the checker's verdict: the
one place where the checker's internal names (``scaled_score[1,1]``,
``dim.concat_width``, ``params.w_q_head``, ``approximation`` / ``approximation
formula``) become a textbook's words.

A label is *markup* (plain text with ``$...$`` math), built here from the library's own
strings and from the quantity's indices after :func:`~..quantities.parse_quantity` has
read them as integers: nothing of a file's text reaches it.  A quantity that does not
parse (an unreadable claim) has no label, and the renderers print its name escaped.

>>> quantity_label("scaled_score[1,1]"), quantity_label("dim.concat_width")
('scaled score $t_{11}$', 'width of the concatenation, $h \\cdot d_v$')
>>> quantity_label("params.w_q_head"), quantity_label("weight[2]", head=2)
("parameters of one head's $W^{Q}_i$", 'weights of row 2, head 2')
>>> verdict_text("approximation", "approximation formula", "relative error 3.5e-5")
'a valid approximation formula: relative error 3.5e-5'
"""

from __future__ import annotations

from ...errors import MhaSymbolicError

__all__ = ["quantity_label", "verdict_text"]

#: Matrix quantities: (the entry's name in words, its symbol, the matrix's name in words).
#: The symbol takes the entry's row and column as a subscript (``w_{12}``); a row is
#: "<plural> of row r", the whole matrix the plural alone.
_MATRIX: dict[str, tuple[str, str, str]] = {
    "score": ("score", "s", "scores"),
    "scaled_score": ("scaled score", "t", "scaled scores"),
    "weight": ("weight", "w", "weights"),
    "head_output": ("head output", r"\mathrm{head}", "head outputs"),
    "concat": ("concatenation", r"\mathrm{Concat}", "concatenation"),
    "output": ("output", r"\mathrm{Output}", "outputs"),
    "q": ("query", "Q", "queries"),
    "k": ("key", "K", "keys"),
    "v": ("value", "V", "values"),
    "grad_query": (r"gradient $\partial L/\partial Q$", r"\partial Q", "gradient of the queries"),
    "grad_key": (r"gradient $\partial L/\partial K$", r"\partial K", "gradient of the keys"),
    "grad_value": (r"gradient $\partial L/\partial V$", r"\partial V", "gradient of the values"),
    "grad_score": (r"gradient $\partial L/\partial T$", r"\partial T",
                   "gradient of the scaled scores"),
    "bias": ("ALiBi bias", "b", "ALiBi biases"),
    # intermediates books print (textbook/intermediates.py)
    "x": ("input", "X", "inputs"),
    "mask": ("mask entry", "M", "mask"),
    "mask_out": ("masked-out entry", r"\bar{M}", "masked-out pattern"),
    "masked_score": ("masked raw score", r"\tilde{s}", "masked raw scores"),
    "weight_masked": ("weight masked after the softmax", r"\tilde{w}",
                      "weights masked after the softmax"),
    "k_t": ("transposed key", r"K^{\top}", "transposed keys"),
    "weighted_value": ("weighted value", r"(w v)", "weighted values"),
}
#: Entries named by a subscript (``w_{12}``); the others are "<name>, entry (r, c)".
_SUBSCRIPTED = ("score", "scaled_score", "weight", "bias", "masked_score", "weight_masked",
                "weighted_value")

_ROWS: dict[str, str] = {
    "weight_sum": "sum of the weights of row {r}",
    "gap": "score gap of row {r} (top score minus the next)",
    "sink_weight": "weight left on the sink, row {r}",
}
_PLAIN: dict[str, str] = {"scale": "scale factor", "expr": "value of the expression"}

_SHAPE: dict[str, str] = {
    "x": "shape of the tokens $X$", "x_heads": "shape of the tokens $X$ repeated per head",
    "x_kv": "shape of the key/value tokens $X_{kv}$",
    "w_q": "shape of $W^{Q}_i$", "w_k": "shape of $W^{K}_i$", "w_v": "shape of $W^{V}_i$",
    "q": "shape of $Q_i$", "k": "shape of $K_i$", "v": "shape of $V_i$",
    "scores": r"shape of the scores $Q_i K_i^{\top}$", "weights": "shape of the weights $A_i$",
    "head": r"shape of a head's output $\mathrm{head}_i$",
    "concat": r"shape of the concatenation $\mathrm{Concat}$", "w_o": "shape of $W^{O}$",
    "output": "shape of the output", "w_q_stacked": "shape of the stacked $W^{Q}$",
    "w_k_stacked": "shape of the stacked $W^{K}$", "w_v_stacked": "shape of the stacked $W^{V}$",
    "w_qkv": "shape of the fused $W^{QKV}$",
    "b_q": "shape of the bias $b^{Q}$", "b_k": "shape of the bias $b^{K}$",
    "b_v": "shape of the bias $b^{V}$", "b_o": "shape of the bias $b^{O}$",
    "b_qkv": "shape of the fused bias $b^{QKV}$",
}
_DIM: dict[str, str] = {
    "n_q": "number of queries $n_q$", "n_k": "number of keys $n_k$",
    "d_model": r"model width $d_{\mathrm{model}}$", "heads": "number of heads $h$",
    "kv_heads": "number of key/value heads", "d_k": "head width $d_k$",
    "d_v": "value width $d_v$", "kdim": r"key input width $\mathrm{kdim}$",
    "vdim": r"value input width $\mathrm{vdim}$",
    "concat_width": r"width of the concatenation, $h \cdot d_v$", "batch": "batch size",
}
_PARAMS: dict[str, str] = {
    "total": "parameters in all", "weights": "weight parameters",
    "biases": "bias parameters", "w_q": "parameters of $W^{Q}$",
    "w_k": "parameters of $W^{K}$", "w_v": "parameters of $W^{V}$",
    "w_o": "parameters of $W^{O}$", "w_q_head": "parameters of one head's $W^{Q}_i$",
    "w_k_head": "parameters of one head's $W^{K}_i$",
    "w_v_head": "parameters of one head's $W^{V}_i$",
    "qkv": "parameters of $W^{Q}$, $W^{K}$ and $W^{V}$ together",
}
_NAMED: dict[str, dict[str, str]] = {"shape": _SHAPE, "dim": _DIM, "params": _PARAMS}


def _pair(r: int, c: int) -> str:
    """A subscript of a row and a column: ``12`` (both one digit), else ``1,12``."""
    return f"{r}{c}" if r < 10 and c < 10 else f"{r},{c}"


def quantity_label(quantity: str, *, head: int = 1, batch: int = 1) -> str | None:
    """The quantity a claim names, in words and math (markup), or None when it does
    not parse or has no label here (the renderer then prints the name, escaped).
    ``head``/``batch``: the claim's head and batch element, named when not the first."""
    from ..quantities import parse_quantity

    try:
        name, sub, idx = parse_quantity(quantity)
    except MhaSymbolicError:
        return None
    text: str | None
    if name in _MATRIX:
        word, symbol, plural = _MATRIX[name]
        if len(idx) == 2 and name in _SUBSCRIPTED:
            text = f"{word} ${symbol}_{{{_pair(*idx)}}}$"
        elif len(idx) == 2:
            text = f"{word}, entry ({idx[0]}, {idx[1]})"
        elif len(idx) == 1:
            text = f"{plural} of row {idx[0]}"
        else:
            text = f"all the {plural}"
    elif name in _ROWS:
        text = _ROWS[name].format(r=idx[0]) if idx else "sums of the weights of every row"
    elif name in _PLAIN:
        text = _PLAIN[name]
    else:
        text = _NAMED.get(name, {}).get(sub or "")
    if text is None:
        return None
    extra = [f"head {head}"] * (head != 1) + [f"batch element {batch}"] * (batch != 1)
    return ", ".join([text, *extra])


def _to(precision: str) -> str:
    """The checker's precision words as the phrase after "correctly rounded" / "wrong"
    (``to 4 decimal places``, ``to a whole number``; "" for an exact claim or a shape)."""
    if precision == "units":
        return "to a whole number"
    if precision.startswith("multiples of"):
        return "to " + precision
    if precision in ("exact claim", "shape", ""):
        return ""
    return "to " + precision


def verdict_text(verdict: str, precision: str, error_units: str | None = None) -> str:
    """The checker's verdict as a phrase: ``exact``; ``correctly rounded to 4 decimal
    places``; ``a valid approximation formula: relative error 3.5e-5`` (never the
    checker's "approximation (approximation formula)"); ``wrong`` with what was claimed.
    Plain text: the renderers typeset its numbers (``3.5e-5``) by the notes grammar."""
    if verdict == "exact":
        return "exact"
    if verdict == "correctly rounded":
        to = _to(precision)
        return "correctly rounded" + (f" {to}" if to else "")
    if verdict == "approximation":
        what = "approximation formula" if precision == "approximation formula" else "approximation"
        return f"a valid {what}" + (f": {error_units}" if error_units else "")
    if verdict == "wrong":
        if precision == "approximation formula":
            return ("wrong: an approximation formula beyond its tolerance"
                    + (f" ({error_units})" if error_units else ""))
        if precision == "exact claim":
            return "wrong (claimed as exact)"
        to = _to(precision)
        return "wrong" + (f" (claimed {to})" if to else "")
    return verdict + (f" ({precision})" if precision and precision != "shape" else "")
