"""The attention variants, exactly: sliding window, softcap, ALiBi and sinks in SymPy.

The same semantics as the oracle (:mod:`mha_symbolic.oracle.variants.semantics`, whose
docstring cites the sources), for worked examples: with ``off = 0``
(``causal_alignment="top_left"``) or ``n_k - n_q`` ("bottom_right", FlashAttention)::

    keep_ij  ⇔  -left <= j - (i + off) <= right          window = (left, right), -1 = unbounded
    t_ij     = cap · tanh(scale · s_ij / cap)             softcap = cap
               + M_ij                                     additive mask
               - slope_h · |j - (i + off)|                ALiBi
    w_ij     = e^{t_ij} / (Σ_{j' kept} e^{t_ij'} + e^{σ_h})     sinks = σ

Inputs are read exactly (``exact_number``: a TOML float stands for the decimal it
prints as).

>>> import sympy as sp
>>> window_keep(3, 3, (1, 0), "top_left")
[[True, False, False], [True, True, False], [False, True, True]]
>>> alibi_bias(sp.Rational(1, 2), 2, 3, "bottom_right")   # query i sits at i + 1
Matrix([
[-1/2,    0, -1/2],
[  -1, -1/2,    0]])
"""

from __future__ import annotations

from typing import Any

from .._text import echo, expr_text
from ..errors import ShapeError, SpecError
from .entries import exact_number
from .work import MAX_ABS_SCORE

__all__ = ["alibi_bias", "softcap", "validate_variants", "window_keep"]


def validate_variants(*, window: Any, softcap: Any, alibi_slopes: Any, sinks: Any,
                      heads: int) -> dict[str, Any]:
    """The variant options, checked and exact: {"window": (left|None, right|None) or
    None, "softcap": SymPy number or None, "alibi_slopes": [per head] or None,
    "sinks": [per head] or None}."""
    out: dict[str, Any] = {"window": None, "softcap": None, "alibi_slopes": None,
                           "sinks": None}
    if window is not None:
        if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
            raise SpecError(f"window={echo(repr(window))}: expected (left, right), integers "
                            ">= 0 or -1 for unbounded")
        sides = []
        for name, w in zip(("left", "right"), window, strict=True):
            if isinstance(w, bool) or not isinstance(w, int) or w < -1:
                raise SpecError(f"window: {name}={echo(w) if isinstance(w, str) else expr_text(w)}"
                                " must be an integer >= 0, or -1 for unbounded")
            sides.append(None if w == -1 else w)
        out["window"] = None if sides == [None, None] else (sides[0], sides[1])
    if softcap is not None:
        cap = exact_number(softcap, "softcap")
        if cap != 0 and _sign(cap, "softcap") <= 0:
            raise SpecError(f"softcap={echo(softcap) if isinstance(softcap, str) else expr_text(softcap)}"
                            " must be a positive number (0 = off)")
        out["softcap"] = None if cap == 0 else cap
    for key, value in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if value is None:
            continue
        vals = value if isinstance(value, (list, tuple)) else [value]
        if len(vals) != heads:
            raise ShapeError(f"{key} has {len(vals)} entries: expected one per head "
                             f"(heads={heads})")
        out[key] = [exact_number(x, f"{key}[{h}]") for h, x in enumerate(vals)]
    if out["sinks"] is not None:
        _check_sinks(out["sinks"])
    return out


def _sign(value: Any, name: str) -> int:
    """The certified sign of an exact number (Arb at rising precision: never SymPy's
    assumptions, which may run minimal_polynomial on a zero in disguise); a symbol's
    sign from its assumptions."""
    from ..errors import InputValueError, PrecisionError
    from .certified import certify

    if value.free_symbols:
        return 1 if value.is_positive else -1
    try:
        return certify(value).sign()
    except PrecisionError:
        raise InputValueError(f"{name}={expr_text(value, 40)}: its sign could not be decided "
                              "(a zero in disguise?)") from None


def _check_sinks(sinks: list[Any]) -> None:
    """Refuse a sink logit beyond ±MAX_ABS_SCORE before SymPy exponentiates it, as the
    engine refuses such scores: rational ones compared exactly (e^(10^1945) would be
    evaluated at that many bits), the others on an Arb ball (exp(k·log 2) would become
    the integer 2^k)."""
    from ..errors import InputValueError
    from .certified import to_arb

    for h, sg in enumerate(sinks):
        if sg.free_symbols:
            continue
        if sg.is_Rational:
            beyond = abs(sg) > MAX_ABS_SCORE
        else:
            ball = to_arb(sg, 64)
            beyond = not ball.is_finite() or abs(ball) > MAX_ABS_SCORE
        if beyond:
            raise InputValueError(f"sinks[{h}]={expr_text(sg, 40)} is beyond "
                                  f"±{MAX_ABS_SCORE}: too large to exponentiate exactly")


def window_keep(n_q: int, n_k: int, window: tuple[int | None, int | None] | None,
                alignment: str) -> list[list[bool]]:
    """keep[i][j]: key j lies in query i's window (FlashAttention's window_size)."""
    off = 0 if alignment == "top_left" else n_k - n_q
    left, right = window if window is not None else (None, None)
    return [[(left is None or j - (i + off) >= -left) and (right is None or j - (i + off) <= right)
             for j in range(n_k)] for i in range(n_q)]


def alibi_bias(slope: Any, n_q: int, n_k: int, alignment: str) -> Any:
    """The ALiBi bias matrix -slope·|j - (i + off)| (n_q × n_k)."""
    import sympy as sp

    off = 0 if alignment == "top_left" else n_k - n_q
    return sp.Matrix(n_q, n_k, lambda i, j: -slope * abs(j - (i + off)))


def softcap(t: Any, cap: Any) -> Any:
    """cap · tanh(t / cap), entrywise.  tanh of a non-rational argument is built
    unevaluated: SymPy's tanh() asks whether its argument is zero, and a score may be a
    zero in disguise (a question whose cost is not bounded)."""
    import sympy as sp

    def capped(x: Any) -> Any:
        arg = x / cap
        return cap * (sp.tanh(arg) if arg.is_Rational else sp.tanh(arg, evaluate=False))

    return t.applyfunc(capped)
