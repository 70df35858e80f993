"""The checks closing an attention example, computed: positive weights, rows summing
to 1, outputs inside the values, shapes."""

from __future__ import annotations

from typing import Any

from ...errors import MhaSymbolicError
from .model import Check
from .numbers import _certified, _has_symbols, _is_rational, _sign, _sub

# -- checks ----------------------------------------------------------------------------


def _over_sum(term: Any) -> tuple[Any, Any] | None:
    """(n, D) when ``term`` is literally n · D^(−1) with D a sum, else None."""
    import sympy as sp

    if term.is_Pow and term.exp == -1 and term.base.is_Add:
        return sp.Integer(1), term.base
    if term.is_Mul:
        inverse = [a for a in term.args if a.is_Pow and a.exp == -1 and a.base.is_Add]
        if len(inverse) == 1:
            rest = [a for a in term.args if a is not inverse[0]]
            return sp.Mul(*rest), inverse[0].base
    return None


def _sums_to_one(total: Any) -> bool:
    """Whether a row of weights provably sums to 1: structurally (every weight is
    nᵢ/D with one shared denominator D, and Σ nᵢ is D itself, as the engine builds a
    softmax row), else by certified evaluation with the exact-identity fallback.  No
    ``together``: it runs ``gcd_terms`` over the whole row, seconds for 13 keys."""
    import sympy as sp

    if total == 1:
        return True
    parts = [_over_sum(t) for t in sp.Add.make_args(total)]
    if all(p is not None for p in parts):
        dens = {d for _, d in parts}  # type: ignore[misc]
        if len(dens) == 1 and sp.Add(*[n for n, _ in parts]) == next(iter(dens)):  # type: ignore[misc]
            return True
    from ...exact.certified import certify

    try:  # an exact identity, proved without polynomial gcds (see certified.py)
        return certify(total - 1).sign() == 0
    except MhaSymbolicError:
        return False



def _attention_checks(att: Any) -> list[Check]:
    import sympy as sp

    from ...exact.shapes import Shape

    positive = zeros = undecided = negative = 0
    row_total = row_ok = row_empty = 0
    bad_rows: list[str] = []
    summed: set[tuple[int, int]] = set()  # (head, row) whose weights provably sum to 1
    for head in att.heads:
        w, t = head.weights, head.scaled
        for r in range(w.rows):
            kept = [j for j in range(w.cols) if t[r, j] != -sp.oo]
            for j in range(w.cols):
                e = w[r, j]
                if j not in kept:
                    if e == 0:
                        zeros += 1
                    elif e is not sp.nan:
                        negative += 1
                    continue
                if _has_symbols(e):
                    undecided += 1
                    continue
                sign = _sign(e)
                if sign > 0:
                    positive += 1
                else:
                    negative += 1
            row_total += 1
            if not kept:
                row_empty += 1
                continue
            sink_w = head.sink_weight[r, 0] if head.sink_weight is not None else 0
            if _sums_to_one(sp.Add(*[w[r, j] for j in range(w.cols)], sink_w)):
                row_ok += 1
                summed.add((head.index, r))
            else:
                bad_rows.append(f"head {head.index + 1} row {r + 1}")
    detail = (f"{positive} weights certified $> 0$ (signs decided on Arb enclosures)"
              + (f"; {zeros} masked weights exactly $0$" if zeros else "")
              + (f"; {undecided} symbolic weights left undecided" if undecided else "")
              + (f"; {negative} weights not positive" if negative else "") + ".")
    checks = [Check("weights positive", negative == 0 and undecided == 0, detail)]
    sinks = att.heads[0].sink is not None
    detail = (f"{row_ok} of {row_total - row_empty} rows: $\\sum_j w_{{rj}}"
              + (" + w_{r,\\text{sink}}" if sinks else "")
              + " - 1$ simplifies to exactly $0$ (SymPy)")
    if row_empty:
        detail += (f"; {row_empty} fully masked rows get weights "
                   f"'{att.spec.masked_rows}' by policy")
    if bad_rows:
        detail += "; not proved for " + ", ".join(bad_rows)
    checks.append(Check("rows sum to 1", not bad_rows, detail + "."))

    if att.heads[0].output is not None:
        inside = total = 0
        outside: list[str] = []
        for head in att.heads:
            w, v, out = head.weights, head.v, head.output
            if out.shape != (w.rows, v.cols):
                outside.append(f"head {head.index + 1} (its shape is not "
                               f"${_shape_tex((w.rows, v.cols))}$)")
                continue
            for r in range(out.rows):
                kept = [j for j in range(w.cols) if w[r, j] != 0]
                if (not kept or any(_has_symbols(x) for x in out.row(r))
                        or any(x is sp.nan for x in w.row(r))):
                    continue  # symbolic, or a fully masked row under the 'nan' policy
                for c in range(out.cols):
                    # a sink is a key whose value is 0: it joins the convex combination
                    col = [v[j, c] for j in kept] + ([sp.Integer(0)]
                                                     if head.sink is not None else [])
                    # min/max by float keys: a wrong pick only makes the test stricter
                    lo, hi = min(col, key=_sort_key), max(col, key=_sort_key)
                    total += 1
                    val = out[r, c]
                    if lo == hi and (head.index, r) in summed:
                        # every value is lo, so the output is lo · Σ_j w_rj = lo exactly
                        # (the row sum was proved to be 1 above): no enclosure needed
                        inside += 1
                        continue
                    ge = _sign(val - lo) >= 0
                    le = _sign(hi - val) >= 0
                    if ge and le:
                        inside += 1
                    else:
                        outside.append(f"head {head.index + 1}[{r + 1}, {c + 1}]")
        detail = (f"{inside} of {total} output coordinates certified to lie between the "
                  "smallest and largest value coordinate of the keys they attend to "
                  "(a convex combination cannot leave that range)")
        if outside:
            detail += "; outside: " + ", ".join(outside)
        checks.append(Check("outputs within the values", not outside, detail + "."))

    # shapes: each product's inner sizes agree and the results have the stated shapes
    problems: list[str] = []
    done: list[str] = []
    try:
        for head in att.heads:
            k = _sub(head.index)
            s_shape = Shape(*head.scores.shape)
            if head.q is not None:
                got = Shape(*head.q.shape).matmul(Shape(*head.k.T.shape),
                                                  left=f"Q_{k}", right=f"K_{k}^T")
                if got != s_shape:
                    problems.append(f"S_{k} is {s_shape}, expected {got}")
            if Shape(*head.weights.shape) != s_shape:
                problems.append(f"A_{k} is {Shape(*head.weights.shape)}, expected {s_shape}")
            if head.output is not None:
                got = s_shape.matmul(Shape(*head.v.shape), left=f"A_{k}", right=f"V_{k}")
                if got != Shape(*head.output.shape):
                    problems.append(f"head_{k} is {Shape(*head.output.shape)}, expected {got}")
        first = att.heads[0]
        done.append(f"$S_i$: ${_shape_tex(first.scores.shape)}$")
        if first.output is not None:
            done.append(f"$\\mathrm{{head}}_i$: ${_shape_tex(first.output.shape)}$")
        if att.concat is not None:
            width = sum(hd.output.cols for hd in att.heads)
            if att.concat.shape != (first.output.rows, width):
                problems.append("Concat has the wrong width")
            done.append(f"Concat: ${_shape_tex(att.concat.shape)}$")
        if att.output is not None:
            done.append(f"Output: ${_shape_tex(att.output.shape)}$")
    except MhaSymbolicError as exc:
        problems.append(str(exc))
    detail = ("every product's inner sizes agree (shape checker): " + ", ".join(done))
    if problems:
        detail += "; " + "; ".join(problems)
    checks.append(Check("shapes agree", not problems, detail + "."))
    return checks


def _sort_key(e: Any) -> Any:

    return _certified(e).to_float() if not _is_rational(e) else e


def _shape_tex(shape: tuple[int, int]) -> str:
    return f"{shape[0]} \\times {shape[1]}"

