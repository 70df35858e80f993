"""Rounded inputs read as the intervals they print, decided with Arb (python-flint).

A formula f of decimal inputs x₁ … x_k (``e^{0.707}/(e^{0.707} + e^{0})``) and a printed
answer with its interval [p − u/2, p + u/2]:

* f over the whole box (each xᵢ the ball of its printed interval) in Arb: an enclosure E of
  f's range.  E finite proves every operation defined on the box (Arb returns NaN or an
  infinite radius for a division by a ball holding 0, a root or logarithm of a ball
  reaching below 0), hence f continuous there.  E disjoint from the printed interval:
  no input of the box gives the printed answer — *wrong*;
* f at the 2^k corners (each a tiny ball around an exact endpoint): a corner a with
  f(a) ≤ p + u/2 and a corner b with f(b) ≥ p − u/2, both certified, give a point of the
  segment [a, b] (inside the box) where f lies in the printed interval (intermediate
  value theorem; f continuous on the box) — *holds for the printed inputs*;
* anything else: undecided (None).

For a vector answer one corner must put every entry inside its interval at once (a
witness for all of them together), else undecided.  No float is trusted: every
comparison is an Arb comparison, true only when certain.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

from .latex_math import NotJudged, _exact

__all__ = ["consistent"]

#: Working precisions (bits), tried in turn.
PRECISIONS = (128, 256)


def _arb_of(x: Fraction) -> Any:
    import flint

    return flint.arb(flint.fmpq(x.numerator, x.denominator))


def _eval(node: Any, inputs: dict[int, Any], section: Any) -> list[Any]:
    """The entries of a tree as Arb balls (decimal inputs from ``inputs``, by their text)."""
    import flint

    kind = node[0]
    if kind == "num":
        if node[1] in inputs:  # every occurrence of a printed decimal is one input
            return [inputs[node[1]]]
        return [_arb_of(Fraction(node[1]))]
    if kind == "const":
        return [flint.arb.const_e() if node[1] == "e" else flint.arb.pi()]
    if kind == "sym":
        from ...exact.certified import to_arb

        value = _exact(*section.bindings[node[1]])
        return [to_arb(v, flint.ctx.prec) for v in _flat(value)]
    if kind == "neg":
        return [-x for x in _eval(node[1], inputs, section)]
    if kind == "pct":
        return [x / 100 for x in _eval(node[1], inputs, section)]
    if kind == "add":
        total: list[Any] | None = None
        for sign, term in node[1]:
            vals = [x if sign > 0 else -x for x in _eval(term, inputs, section)]
            total = vals if total is None else [a + b for a, b in zip(total, vals, strict=True)]
        assert total is not None
        return total
    if kind == "mul":
        acc = [flint.arb(1)]
        for factor in node[1]:
            vals = _eval(factor, inputs, section)
            acc = [a * vals[0] for a in acc] if len(vals) == 1 else [acc[0] * v for v in vals]
        return acc
    if kind == "div":
        den = _eval(node[2], inputs, section)[0]
        return [x / den for x in _eval(node[1], inputs, section)]
    if kind == "pow":
        base = _eval(node[1], inputs, section)[0]
        exp_node = node[2]
        if exp_node[0] == "num" and exp_node[1].isdigit() and exp_node[1] not in inputs:
            return [base ** int(exp_node[1])]
        return [base ** _eval(exp_node, inputs, section)[0]]
    if kind == "func":
        arg = _eval(node[2], inputs, section)[0]
        return [{"exp": arg.exp, "sqrt": arg.sqrt, "ln": arg.log, "tanh": arg.tanh}[node[1]]()]
    if kind == "root":
        deg = _eval(node[1], inputs, section)[0]
        arg = _eval(node[2], inputs, section)[0]
        return [arg ** (1 / deg)]
    if kind == "tuple":
        return [_eval(x, inputs, section)[0] for x in node[1]]
    if kind == "matrix":
        return [_eval(x, inputs, section)[0] for r in node[1] for x in r]
    raise NotJudged(f"unknown notation {kind}")  # pragma: no cover


def _flat(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def _targets(p: Any) -> list[tuple[Fraction, Fraction]]:
    """The printed interval of each entry ([v, v] for an exact claim; None p: [0, 0])."""
    if p is None:
        return [(Fraction(0), Fraction(0))]
    out = []
    for part in p.entries:
        if part.kind == "decimal" and part.value is not None and part.unit is not None:
            out.append((part.value - part.unit / 2, part.value + part.unit / 2))
        elif part.kind == "expression" and getattr(part.expr, "is_Rational", False):
            q = Fraction(int(part.expr.p), int(part.expr.q))
            out.append((q, q))
        else:
            raise NotJudged("a printed answer that is not a number")
    return out


def interval(text: str) -> tuple[Fraction, Fraction]:
    """The interval a printed decimal states: 0.707 → [0.7065, 0.7075]."""
    value = Fraction(text)
    places = len(text.split(".")[1])
    half = Fraction(1, 2 * 10**places)
    return value - half, value + half


def consistent(node: Any, inputs: list[Any], section: Any, p: Any) -> bool | None:
    """True: some input of the box gives the printed answer; False: none does; None: not
    decided (see the module's docstring)."""
    import flint

    targets = _targets(p)
    bounds = [interval(n[1]) for n in inputs]
    old = flint.ctx.prec
    try:
        for prec in PRECISIONS:
            flint.ctx.prec = prec
            lo_hi = [(_arb_of(lo), _arb_of(hi)) for lo, hi in bounds]
            box = {n[1]: a.union(b) for n, (a, b) in zip(inputs, lo_hi, strict=True)}
            whole = _eval(node, box, section)
            if len(whole) != len(targets):
                raise NotJudged("the sides have different shapes")
            if not all(x.is_finite() for x in whole):
                return None
            tarb = [(_arb_of(a), _arb_of(b)) for a, b in targets]
            if any(x < a or x > b for x, (a, b) in zip(whole, tarb, strict=True)):
                return False
            below = [False] * len(targets)
            above = [False] * len(targets)
            for corner in itertools.product(*lo_hi):
                vals = _eval(node, {n[1]: c for n, c in zip(inputs, corner, strict=True)},
                             section)
                inside = all(a <= x <= b for x, (a, b) in zip(vals, tarb, strict=True))
                if inside:
                    return True
                for i, (x, (a, b)) in enumerate(zip(vals, tarb, strict=True)):
                    below[i] = below[i] or bool(x <= b)
                    above[i] = above[i] or bool(x >= a)
            if len(targets) == 1 and below[0] and above[0]:
                return True
    finally:
        flint.ctx.prec = old
    return None
