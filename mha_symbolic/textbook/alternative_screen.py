"""Numeric screening of the other-input diagnosis: Arb first, SymPy only for survivors.

:func:`alternatives.other_input_diagnosis` tries up to :data:`~.alternatives.MAX_ALTERNATIVES`
alternative inputs X′ (and up to :data:`~.alternatives.MAX_EDITS` small edits) per wrong
claim, each an exact SymPy computation of the whole attention and a certified verdict
(issue 30: two thirds of the CPU of a fuzzed document).  Most alternatives are far from
the printed digits, so each is first evaluated in Arb ball arithmetic
(:func:`.balls.ball_attention`, 64-bit balls: every ball provably contains the exact
value), laid out by the same ``value_of`` as the exact value, and paired with the
printout by the same :func:`.verdicts.pairs`.  An alternative is dropped only when the
balls **prove** that the claim cannot hold for it:

* a decimal part holds only for a value within half a unit of its digits (ties
  included), or, for a value with negligible masked terms (``verdicts._judge_dominated``),
  for one whose main part is; the main part is within 10^−(places+3) of the value, so
  the screen's interval is the half unit widened by a hundredth of a unit;
* an exact expression (no ``≈``) holds only for a value equal to it;
* an approximate one (``≈``) only for a value within ``rtol`` of it, relatively, or with
  negligible masked terms e^(−huge) whose main part equals it: the screen uses the
  first only when it proves there are no such terms (:func:`_no_tiny_terms`);
* a special value (−∞, NaN) only for an entry removed or NaN, never a finite ball.

Anything else — a ball that is
not finite, a quantity or an option the ball evaluator does not model (ALiBi,
sinks, windows, the intermediates of :mod:`.intermediates`, gradients …), any error of
the screen itself — lets the alternative through to the exact computation.  So the
screen only skips work: the diagnoses stated are those of the exact path alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .claims import PrintedAnswer

__all__ = ["BITS", "SCREENED", "may_fit"]

BITS = 64
#: The claim quantities whose ball value the screen lays out (:func:`quantities.matrix_of`).
SCREENED = frozenset({"score", "scaled_score", "weight", "head_output", "concat", "output",
                      "q", "k", "v"})
#: ``exact_attention`` keywords that :func:`.balls.ball_attention` follows exactly; any
#: other one given (not None) leaves the alternative unscreened.
_MODELLED = frozenset({"scores", "query", "key", "value", "x", "x_kv", "w_q", "w_k", "w_v",
                       "w_o", "b_q", "b_k", "b_v", "b_o", "heads", "kv_heads", "d_k", "scale",
                       "mask", "causal_alignment", "mask_fill", "mask_fill_stage", "softcap"})
_DEFAULTS = {"masked_rows": "zero", "softmax_over": "keys"}


class _BallMatrix:
    """Rows of balls indexed as a SymPy matrix is (``m[r, c]``, ``rows``, ``cols``);
    None for a removed (−∞) entry."""

    __slots__ = ("_rows", "cols", "rows")

    def __init__(self, rows: list[list[Any]]) -> None:
        self._rows = rows
        self.rows = len(rows)
        self.cols = len(rows[0]) if rows else 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    def __getitem__(self, rc: tuple[int, int]) -> Any:
        r, c = rc
        return self._rows[r][c]


@dataclass(frozen=True)
class _BallHead:
    q: Any
    k: Any
    v: Any
    scores: Any
    scaled: Any
    weights: Any
    output: Any
    bias: Any = None
    sink_weight: Any = None


@dataclass(frozen=True)
class _BallAttentionView:
    """The attributes of :class:`~mha_symbolic.exact.engine.ExactAttention` that
    :func:`quantities.quantity_value` reads for the :data:`SCREENED` quantities."""

    heads: tuple[_BallHead, ...]
    concat: Any
    output: Any

    def final(self) -> Any:
        return self.output if self.output is not None else self.concat


def _modelled(kwargs: dict[str, Any]) -> bool:
    for k, v in kwargs.items():
        if k in _DEFAULTS:
            if v != _DEFAULTS[k]:
                return False
        elif v is not None and k not in _MODELLED:
            return False
    fill = kwargs.get("mask_fill")
    if isinstance(fill, str) and fill.strip() != "-inf":
        return False
    return not (isinstance(fill, float) and fill != fill)  # a NaN fill: not modelled


def _view(kwargs: dict[str, Any]) -> _BallAttentionView:
    from .balls import ball_attention

    att = ball_attention(kwargs, {})

    def mat(m: Any) -> Any:
        return None if m is None or not m else _BallMatrix(m)

    heads = tuple(_BallHead(
        q=mat(att.q[h]) if att.q else None, k=mat(att.k[h]) if att.k else None,
        v=mat(att.v[h]) if att.v else None, scores=mat(att.scores[h]),
        scaled=mat(att.scaled[h]), weights=mat(att.weights[h]),
        output=mat(att.outputs[h]) if att.outputs else None) for h in range(len(att.scores)))
    return _BallAttentionView(heads, mat(att.concat), mat(att.output))


def may_fit(name: str, kwargs_of: dict[int, dict[str, Any]],
            value_of: Callable[[Callable[[int], Any]], Any], p: PrintedAnswer,
            rtol: Fraction) -> bool:
    """False only when Arb proves that the claim (quantity ``name``, printout ``p``,
    tolerance ``rtol``) cannot hold for the attention of ``kwargs_of[b]`` (the
    ``exact_attention`` keywords of every batch element b the value spans), laid out by
    ``value_of`` (module text)."""
    if name not in SCREENED or not all(_modelled(kw) for kw in kwargs_of.values()):
        return True
    from flint import ctx

    old = ctx.prec
    ctx.prec = BITS
    try:
        views = {b: _view(kw) for b, kw in kwargs_of.items()}

        def att_of(b: int) -> Any:
            if b not in views:
                raise KeyError(b)
            return views[b]

        from .verdicts import pairs

        items = pairs(value_of(att_of), p)
        tame: list[bool] = []  # decided once, when an approximate expression asks

        def no_tiny() -> bool:
            if not tame:
                tame.append(_no_tiny_terms(kwargs_of, views))
            return tame[0]

        return all(_possible(v, part, rtol, no_tiny) for v, part in items)
    except Exception:  # the screen never decides: when in doubt, compute exactly
        return True
    finally:
        ctx.prec = old


def _possible(ball: Any, part: PrintedAnswer, rtol: Fraction, no_tiny: Callable[[], bool]
              ) -> bool:
    """Whether a value in ``ball`` could make ``part`` hold (module text)."""
    from flint import arb, fmpq

    if ball is None or not isinstance(ball, arb) or not ball.is_finite():
        return True
    if part.kind == "special":  # holds only for a value −∞ or NaN, never a finite one
        return False
    if part.kind == "decimal" and part.value is not None and part.unit is not None:
        half = part.unit / 2 + part.unit / 100
        lo, hi = part.value - half, part.value + half
        return not (ball > arb(fmpq(hi.numerator, hi.denominator))
                    or ball < arb(fmpq(lo.numerator, lo.denominator)))
    if part.kind != "expression" or part.expr is None:
        return True
    from ..exact.certified import to_arb

    e = to_arb(part.expr, BITS)
    if not e.is_finite():
        return True
    if not part.approx:  # holds only for a value equal to the expression
        return not (ball > e or ball < e)
    # holds for |value − e| ≤ rtol·|value|, or, with masked terms e^(−huge) in the value
    # (verdicts._judge_dominated), for a main part equal to e: ruled out by no_tiny
    if not (ball > 0 or ball < 0):
        return True
    rel = abs(ball - e) / abs(ball)
    return not (rel > arb(fmpq(rtol.numerator, rtol.denominator)) and no_tiny())


def _no_tiny_terms(kwargs_of: dict[int, dict[str, Any]], views: dict[int, Any]) -> bool:
    """Whether the exact value certainly holds no exponential e^(a) with a < −2000
    (magnitude.TINY_ARGUMENT): every input entry is built of numbers, sums, products
    and powers only (no function, no constant such as π or e, no i), so that SymPy's
    only exponentials are the softmax's e^(t − shift); and every kept scaled score has
    |t| < 1000 (work.SHIFT_THRESHOLD: no shift), so that an exponential's argument, or
    the sum of the two arguments of a weight over a denominator of one term, is above
    −2000."""
    import sympy as sp

    from ..exact.engine import exact_number

    def plain(leaf: Any, key: str) -> bool:
        if isinstance(leaf, bool) or leaf is None:
            return True
        if isinstance(leaf, str) and key == "mask" and leaf.strip() in ("-inf", "causal"):
            return True
        e = exact_number(leaf, key)
        return bool(e.is_Rational or (not e.atoms(sp.Function) and all(
            a.is_Rational for a in e.atoms() if a.is_Atom)))

    def leaves(v: Any) -> list[Any]:
        return [x for item in v for x in leaves(item)] if isinstance(v, (list, tuple)) else [v]

    for kw in kwargs_of.values():
        for key in ("scores", "query", "key", "value", "x", "x_kv", "w_q", "w_k", "w_v", "w_o",
                    "b_q", "b_k", "b_v", "b_o", "scale", "mask", "mask_fill"):
            if kw.get(key) is not None and not all(plain(x, key) for x in leaves(kw[key])):
                return False
    return all(t is None or abs(t) < 1000 for view in views.values() for head in view.heads
               for r in range(head.scaled.rows) for t in head.scaled._rows[r])
