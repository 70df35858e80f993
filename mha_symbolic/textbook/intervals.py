"""Inputs printed rounded: a claim judged against every input inside its printed interval.

A tutorial prints Q, K and V to 4 decimals (``0.3367``) but computes with the
unrounded tensors; its answers are then what *some* inputs within half a unit of
each printed last digit give, not necessarily what the printed digits give.  With
``inputs = "printed"`` an example takes each decimal input entry x as the interval
[x − u/2, x + u/2] (u the unit of its last printed digit; integers and entries from
files stay exact), and a claim the printed digits do not reproduce is judged again:

consistent (proved)
    the claimed entry c is reached inside the box of intervals.  The entry f is a
    continuous function of the inputs; at the printed inputs (the box's centre m)
    f(m) is on one side of c, and at a corner b chosen by the sign of each partial
    derivative (estimated with Arb at m) an Arb enclosure of f(b) lies on the other
    side of c or within the claim's rounding interval.  On the segment from m to b
    (inside the box) f therefore takes the value c (intermediate value theorem), and
    c rounds to the claim.  Each wrong entry is shown so separately.
inconsistent (proved)
    an Arb enclosure of f over the whole box (interval evaluation: every input a
    ball) lies outside the claim's rounding interval: no inputs that print as given
    produce the claim.
undetermined
    neither: the claim stays wrong, with a note.

Consistency is per entry (each entry of a tuple or tensor has its own witness); the
verdict says so.  No slip is diagnosed for a claim that input rounding explains.

>>> from mha_symbolic.textbook import check_examples, load_examples
>>> text = '''
... [[example]]
... name = "printed"
... inputs = "printed"
... scale = 1
... scores = [[0.51, 0]]
... [[example.claim]]
... quantity = "weight[1,1]"
... claimed = "0.6236"
... '''
>>> (r,) = check_examples(load_examples(text=text)).records
>>> r.verdict, r.ok
('consistent with the inputs as printed', True)
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .claims import PrintedAnswer
from .quantities import parse_quantity
from .reports import CONSISTENT

if TYPE_CHECKING:
    from .examples import Claim, WorkedExample

__all__ = ["consistent_with_printed"]

BITS = 128
_INPUTS = ("scores", "query", "key", "value", "x", "x_kv", "w_q", "w_k", "w_v", "w_o",
           "b_q", "b_k", "b_v", "b_o")


def _unit(entry: Any) -> Fraction | None:
    """The unit of an input entry's last printed digit (None: exact, not an interval)."""
    if isinstance(entry, (bool, int, Fraction)):
        return None
    text = repr(entry) if isinstance(entry, float) else entry if isinstance(entry, str) else None
    if text is None:
        return None
    from .claims import parse_printed

    try:
        p = parse_printed(text)
    except Exception:  # an exact expression such as 'sqrt(2)' is not a rounded decimal
        return None
    if p.kind != "decimal" or p.unit is None or (p.unit >= 1 and "." not in text):
        return None
    return p.unit


def _printed_value(text: str) -> Fraction:
    """The value of a decimal input entry written as a string (its unit is known)."""
    from .claims import parse_printed

    value = parse_printed(text).value
    assert value is not None  # _unit found a decimal
    return value


def _leaves(value: Any, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Any]]:
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            out.extend(_leaves(v, (*path, i)))
        return out
    return [(path, value)]


def _printed_inputs(kwargs: dict[str, Any]) -> list[tuple[str, tuple[int, ...], Fraction, Fraction]]:
    """(key, path, printed value, half unit) of every rounded decimal input entry.

    TOML keeps no trailing zeros of a float (0.6380 arrives as 0.638), and torch and numpy
    print a whole tensor with one number of decimals, so the float entries of one input
    take the finest unit among them; a string entry ("0.6380") states its own."""
    out = []
    for key in _INPUTS:
        if kwargs.get(key) is None:
            continue
        leaves = _leaves(kwargs[key])
        units = {path: _unit(entry) for path, entry in leaves}
        floats: list[Fraction] = [u for path, entry in leaves
                                  if isinstance(entry, float) and (u := units[path]) is not None]
        finest = min(floats) if floats else None
        for path, entry in leaves:
            u = units[path]
            if u is None:
                continue
            if isinstance(entry, float) and finest is not None:
                u = finest
            # the value as the grammar of printed answers reads it ("70%" is 7/10)
            v = Fraction(repr(entry)) if isinstance(entry, float) else _printed_value(entry)
            out.append((key, path, v, u / 2))
    return out


def input_decimals(kwargs: dict[str, Any]) -> str:
    """'4' or '2, 4': the decimals the printed inputs show."""
    places = sorted({len(str((2 * h).denominator)) - 1 for *_, h in _printed_inputs(kwargs)})
    return ", ".join(str(d) for d in places)


def consistent_with_printed(ex: WorkedExample, claim: Claim, value: Any, p: PrintedAnswer,
                            judgements: list[Any]) -> tuple[str | None, str | None]:
    """(CONSISTENT, note) when every wrong entry is reached by inputs inside their printed
    intervals; (None, note) when that is disproved or undetermined; (None, None) when
    the claim is not of a kind this covers."""
    name, _, _ = parse_quantity(claim.quantity)
    if name not in ("score", "scaled_score", "weight", "head_output", "concat", "output", "q",
                    "k", "v", "weight_sum"):
        return None, None
    kwargs = ex.engine_inputs()[claim.batch - 1]
    printed = _printed_inputs(kwargs)
    if not printed:
        return None, None
    parts = p.entries
    wrong = [i for i, j in enumerate(judgements) if not j.ok]
    if any(parts[i].kind != "decimal" for i in wrong):
        return None, None
    from flint import ctx

    old = ctx.prec
    ctx.prec = BITS
    try:
        model = _Model(ex, claim, kwargs, printed)
        shown: list[int] = []
        disproved: list[int] = []
        for i in wrong:
            outcome = model.reach(i, parts[i])
            (shown if outcome == "consistent" else disproved if outcome == "inconsistent"
             else []).append(i)
    except Exception:  # anything the ball model cannot evaluate leaves the claim as it was
        return None, None
    finally:
        ctx.prec = old
    digits = input_decimals(kwargs)
    if len(shown) == len(wrong):
        missed = ("it" if len(parts) == 1 else "the entry the printed digits miss"
                  if len(wrong) == 1 else f"each of the {len(wrong)} entries the printed digits "
                  "miss (a witness per entry)")
        return CONSISTENT, (f"the inputs are printed to {digits} decimals; inputs within half a "
                            f"unit of their last printed digit give {missed}, so the text "
                            "computed with unrounded inputs (not a slip)")
    if disproved:
        return None, (f"no inputs inside their printed intervals ({digits} decimals) give "
                      + ("it" if len(parts) == 1 else f"{len(disproved)} of the entries"))
    return None, f"undetermined whether inputs inside their printed intervals ({digits} decimals) give it"


class _Model:
    """The claimed entries as Arb functions of the printed inputs."""

    def __init__(self, ex: WorkedExample, claim: Claim, kwargs: dict[str, Any],
                 printed: list[tuple[str, tuple[int, ...], Fraction, Fraction]]) -> None:
        self.ex, self.claim, self.kwargs, self.printed = ex, claim, kwargs, printed
        self.name, _, self.idx = parse_quantity(claim.quantity)

    def values(self, env: dict[tuple[str, tuple[int, ...]], Any]) -> list[Any]:
        """The claimed entries (row-major) with printed inputs replaced by ``env`` balls."""
        from .balls import ball_attention

        att = ball_attention(self.kwargs, env)
        h = self.claim.head - 1
        m = {"score": att.scores[h] if att.scores else None, "scaled_score": att.scaled[h],
             "weight": att.weights[h], "head_output": att.outputs[h] if att.outputs else None,
             "concat": att.concat, "output": att.output if att.output is not None else att.concat,
             "q": att.q[h] if att.q else None, "k": att.k[h] if att.k else None,
             "v": att.v[h] if att.v else None}.get(self.name)
        if self.name == "weight_sum":
            from flint import arb

            row = att.weights[h][self.idx[0] - 1]
            return [sum(row, arb(0))]
        if m is None:
            raise ValueError("not modelled")
        rows = range(len(m)) if not self.idx else [self.idx[0] - 1]
        out: list[Any] = []
        for r in rows:
            out.extend(m[r] if len(self.idx) < 2 else [m[r][self.idx[1] - 1]])
        return out

    def point(self, shift: dict[int, int] | None = None) -> dict[tuple[str, tuple[int, ...]], Any]:
        """Exact balls at the printed values, moved by ±half a unit where ``shift`` says."""
        from flint import arb, fmpq

        env = {}
        for n, (key, path, v, half) in enumerate(self.printed):
            x = v + (shift or {}).get(n, 0) * half
            env[(key, path)] = arb(fmpq(x.numerator, x.denominator))
        return env

    def box(self) -> dict[tuple[str, tuple[int, ...]], Any]:
        from flint import arb, fmpq

        return {(key, path): arb(fmpq(v.numerator, v.denominator), fmpq(h.numerator, h.denominator))
                for key, path, v, h in self.printed}

    def reach(self, i: int, part: PrintedAnswer) -> str:
        from flint import arb, fmpq

        assert part.value is not None and part.unit is not None
        lo_f, hi_f = part.value - part.unit / 2, part.value + part.unit / 2
        lo, hi = arb(fmpq(lo_f.numerator, lo_f.denominator)), arb(fmpq(hi_f.numerator, hi_f.denominator))
        target = arb(fmpq(part.value.numerator, part.value.denominator))
        centre = self.values(self.point())[i]
        whole = self.values(self.box())[i]
        if whole < lo or whole > hi:
            return "inconsistent"
        up = centre < target  # move toward larger values
        if not up and not centre > target:
            return "undetermined"
        # the sign of each partial derivative at the centre (finite difference, Arb)
        shift: dict[int, int] = {}
        for n in range(len(self.printed)):
            plus = self.values(self.point({n: 1}))[i]
            minus = self.values(self.point({n: -1}))[i]
            slope = plus - minus
            if slope > 0:
                shift[n] = 1 if up else -1
            elif slope < 0:
                shift[n] = -1 if up else 1
        corner = self.values(self.point(shift))[i]
        crossed = corner >= target if up else corner <= target
        inside = corner >= lo and corner <= hi
        return "consistent" if crossed or inside else "undetermined"
