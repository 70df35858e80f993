"""Numeric screening of diagnosis variants: Arb first, SymPy only for the one that fits.

A wrong claim is diagnosed by redoing the computation with a classic slip (scaled by
1/d_k, not scaled, multiplied by sqrt(d_k), softmax over the query axis) and asking
whether the slip's value holds at the claim's precision.  Building every variant's
n × n symbolic attention costs seconds at n = 64, so each variant's claimed entries
are first *enclosed* with Arb ball arithmetic (64-bit balls, from the exact inputs of
the example's own attention), and a variant is dropped only when its enclosure
proves that it cannot give the printed answer.  A variant that survives is then built
and judged exactly, as before: the screen can only skip work, never make a verdict.

The variant's scaled scores come from the example's own ones: a kept entry
t = scale·s + m (m the additive mask) becomes t' = t + (scale' − scale)·s; a removed
entry (−∞) stays removed; an entry replaced by ``mask_fill`` keeps its fill (times
scale'/scale when the fill replaced the raw score).  Weights are
e^(t'_j − c) / Σ_k e^(t'_k − c) with c the row's (or column's) largest midpoint.

>>> from mha_symbolic.textbook.examples import load_examples
>>> from mha_symbolic.textbook.claims import parse_printed
>>> ex = load_examples(text="[[example]]\\nname='A'\\nd_k=4\\nscores=[[8, 0]]\\n")[0]
>>> from mha_symbolic.textbook.examples import Claim
>>> c = Claim("weight[1,1]", "0.9820")
>>> import sympy as sp
>>> [may_hold(ex, c, parse_printed("0.9820"), {"scale": s}) for s in (1, sp.Rational(1, 2))]
[False, True]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .claims import PrintedAnswer
from .quantities import parse_quantity

if TYPE_CHECKING:
    from .examples import Claim, WorkedExample

__all__ = ["may_hold"]

BITS = 64


def may_hold(ex: WorkedExample, claim: Claim, p: PrintedAnswer, changes: dict[str, Any]) -> bool:
    """False only when the variant ``changes`` provably cannot give the printed answer:
    Arb proves it, or the printout spans the batch or heads axis (3 or 4 dimensions,
    no index) while the variant's value is one batch element's and one head's matrix,
    which :func:`verdicts.holds` can never pair with it."""
    _, _, idx = parse_quantity(claim.quantity)
    if p.kind == "array" and len(p.shape) > 2 and not idx:
        return False
    try:
        values = _variant_values(ex, claim, changes)
    except Exception:  # the screen never decides: when in doubt, build the variant
        return True
    if values is None:
        return True
    parts = p.entries
    if len(parts) != len(values):
        return True
    return all(_possible(v, part) for v, part in zip(values, parts, strict=True))


def _possible(ball: Any, part: PrintedAnswer) -> bool:
    """Whether a value in ``ball`` could make ``part`` hold (decimals only are screened)."""
    if ball is None or part.kind != "decimal" or part.value is None or part.unit is None:
        return True
    from flint import arb, fmpq

    if not ball.is_finite():
        return True
    lo = arb(fmpq((part.value - part.unit / 2).numerator, (part.value - part.unit / 2).denominator))
    hi = arb(fmpq((part.value + part.unit / 2).numerator, (part.value + part.unit / 2).denominator))
    return not (ball > hi or ball < lo)


def _variant_values(ex: WorkedExample, claim: Claim, changes: dict[str, Any]) -> list[Any] | None:
    """Arb balls of the claimed entries under the variant, or None (not screened)."""
    keys = set(changes)
    if not keys <= {"scale", "softmax_over"}:
        return None
    name, _, idx = parse_quantity(claim.quantity)
    if name not in ("scaled_score", "weight", "weight_sum", "head_output", "concat", "output"):
        return None
    att = ex.attention(claim.batch - 1)
    from flint import ctx

    old = ctx.prec
    ctx.prec = BITS
    try:
        screen = _Screen(ex, att, changes)
        if name in ("concat", "output"):
            return screen.block(name, idx)
        return screen.per_head(name, claim.head - 1, idx)
    finally:
        ctx.prec = old


class _Screen:
    def __init__(self, ex: WorkedExample, att: Any, changes: dict[str, Any]) -> None:
        import sympy as sp

        from ..exact.certified import to_arb

        self.ex, self.att = ex, att
        self.axis = changes.get("softmax_over", "keys")
        new_scale = changes.get("scale", att.scale)
        self.delta = to_arb(sp.sympify(new_scale) - att.scale, BITS)
        self.ratio = (to_arb(sp.sympify(new_scale) / att.scale, BITS)
                      if att.scale != 0 else None)
        self.fill = ex.options.get("mask_fill")
        self.raw_fill = ex.options.get("mask_fill_stage", "scaled") == "raw"
        self._cache: dict[Any, Any] = {}

    def ball(self, key: Any, expr: Any) -> Any:
        if key not in self._cache:
            from ..exact.certified import to_arb

            self._cache[key] = to_arb(expr, BITS)
        return self._cache[key]

    def t(self, h: int, r: int, j: int) -> Any:
        """The variant's scaled score (None for a removed key)."""
        import sympy as sp

        head = self.att.heads[h]
        t = head.scaled[r, j]
        if t == -sp.oo:
            return None
        tb = self.ball(("t", h, r, j), t)
        if self.fill is not None and not self.att.spec.takes_part(r, j, h):
            if self.raw_fill:
                if self.ratio is None:
                    raise ValueError("scale 0")
                return tb * self.ratio
            return tb
        return tb + self.delta * self.ball(("s", h, r, j), head.scores[r, j])

    def weight_row(self, h: int, r: int) -> list[Any]:
        from flint import arb

        head = self.att.heads[h]
        n_q, n_k = head.scaled.shape
        if self.axis == "keys":
            ts = [self.t(h, r, j) for j in range(n_k)]
            live = [x for x in ts if x is not None]
            if not live:
                raise ValueError("a fully masked row")
            c = max(x.mid() for x in live)
            exps = [None if x is None else (x - c).exp() for x in ts]
            total = sum((e for e in exps if e is not None), arb(0))
            return [arb(0) if e is None else e / total for e in exps]
        out = []
        for j in range(n_k):
            col = [self.t(h, i, j) for i in range(n_q)]
            live = [x for x in col if x is not None]
            if col[r] is None:
                out.append(arb(0))
                continue
            c = max(x.mid() for x in live)
            total = sum(((x - c).exp() for x in live), arb(0))
            out.append((col[r] - c).exp() / total)
        return out

    def out_row(self, h: int, r: int) -> list[Any]:
        from flint import arb

        head = self.att.heads[h]
        if head.v is None:
            raise ValueError("no values")
        w = self.weight_row(h, r)
        v = head.v
        g = self.att.spec.kv_head_of(h)
        return [sum((w[j] * self.ball(("v", g, j, c), v[j, c]) for j in range(v.rows)), arb(0))
                for c in range(v.cols)]

    def per_head(self, name: str, h: int, idx: tuple[int, ...]) -> list[Any] | None:
        head = self.att.heads[h]
        rows = range(head.scaled.rows) if not idx else [idx[0] - 1]
        out: list[Any] = []
        for r in rows:
            if name == "scaled_score":
                row = [self.t(h, r, j) for j in range(head.scaled.cols)]
                if any(x is None for x in row):
                    return None
            elif name in ("weight", "weight_sum"):
                row = self.weight_row(h, r)
                if name == "weight_sum":
                    from flint import arb

                    row = [sum(row, arb(0))]
            else:
                row = self.out_row(h, r)
            out.extend(row if len(idx) < 2 else [row[idx[1] - 1]])
        return out

    def block(self, name: str, idx: tuple[int, ...]) -> list[Any] | None:
        from flint import arb

        heads = len(self.att.heads)
        n_q = self.att.heads[0].scaled.rows
        rows = range(n_q) if not idx else [idx[0] - 1]
        out: list[Any] = []
        for r in rows:
            concat = [x for h in range(heads) for x in self.out_row(h, r)]
            row = concat
            if name == "output" and self.att.output is not None:
                kwargs = self.ex.engine_inputs()[0]
                from ..exact.engine import exact_matrix

                wo = exact_matrix(kwargs["w_o"], "w_o")
                bo = exact_matrix(kwargs["b_o"], "b_o") if kwargs.get("b_o") is not None else None
                row = []
                for c in range(wo.cols):
                    acc = sum((concat[i] * self.ball(("wo", i, c), wo[i, c]) for i in range(wo.rows)),
                              arb(0))
                    if bo is not None:
                        acc += self.ball(("bo", c), bo[0, c])
                    row.append(acc)
            out.extend(row if len(idx) < 2 else [row[idx[1] - 1]])
        return out
