"""Input entries read exactly: numbers of every kind a user passes (ints, Fractions,
SymPy numbers, strings of the restricted grammar, floats as the decimal they print as,
mpmath ``mpf`` as the binary value they hold) and additive-mask entries."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .._text import echo, expr_text
from ..errors import InputValueError, ShapeError, SpecError
from .grammar import costly_power

if TYPE_CHECKING:
    import sympy

__all__ = ["MAX_ABS_MASK", "MAX_MPF_EXPONENT", "exact_matrix", "exact_number"]

#: Largest |entry| of an additive mask or a ``mask_fill`` value. Tutorials mask with
#: −1e4, −1e6, −1e9 or −9e15; such a key's contribution e^(−10^9) is never evaluated
#: at that many bits: it is bounded by magnitude analysis (exact/magnitude.py).
MAX_ABS_MASK = 10**30


def exact_number(x: Any, name: str = "value") -> sympy.Expr:
    """One input entry as an exact SymPy number (or symbol)."""
    import sympy as sp

    if isinstance(x, bool):
        raise SpecError(f"{name}={x!r} is a boolean, expected a number")
    if isinstance(x, sp.Basic):
        if x.has(sp.nan, sp.zoo) or (x.is_number and x.is_real is False):
            raise InputValueError(f"{name}={expr_text(x)} is not a real number")
        if x.has(sp.Float):
            raise InputValueError(
                f"{name}={x} holds a floating-point Float, which SymPy evaluates to 15 digits: "
                "pass a string such as '0.1' or a Rational so that the exact number is explicit"
            )
        if costly_power(x):
            raise InputValueError(
                f"{name}={expr_text(x)} holds a power a^y whose integer part a^⌊|y|⌋ is beyond "
                "the bounds on an exact power (SymPy expands a^(n + c) into a^n · a^c)")
        return x
    if isinstance(x, int):
        return sp.Integer(x)
    if isinstance(x, Fraction):
        return sp.Rational(x.numerator, x.denominator)
    if (type(x).__module__ or "").startswith("mpmath"):
        return _mpmath_number(x, name)
    if isinstance(x, str):
        from ..errors import ParseError
        from .grammar import parse_number

        try:
            return parse_number(x)
        except ParseError as exc:
            raise ParseError(f"{name}: {exc}") from None
    try:  # numpy scalars and Python floats
        import numbers

        if isinstance(x, numbers.Integral):
            return sp.Integer(int(x))
        if isinstance(x, numbers.Real):
            f = float(x)
            if f != f or f in (float("inf"), float("-inf")):
                raise InputValueError(f"{name}={expr_text(x)} is not a finite number")
            # A float typed by a person stands for the decimal it prints as.
            return sp.Rational(repr(f))
    except (TypeError, ValueError):
        pass
    raise SpecError(f"{name}={_entry_text(x)} ({type(x).__name__}) is not a number")


#: Largest binary exponent of an mpf entry read exactly (2^±100000 has ~30103 digits).
MAX_MPF_EXPONENT = 100_000


def _mpmath_number(x: Any, name: str) -> sympy.Expr:
    """An mpmath ``mpf`` as the exact dyadic rational it holds (sign · man · 2^exp);
    ``mpc`` and intervals refused, NaN/±inf refused."""
    import mpmath
    import sympy as sp

    kind = type(x).__name__
    if isinstance(x, mpmath.mpc) or kind in ("mpc", "ivmpc"):
        raise InputValueError(f"{name} is an mpmath {kind} (complex): expected a real number")
    if not isinstance(x, mpmath.mpf):
        raise SpecError(f"{name} is an mpmath {kind}: expected one exact number (an mpf), "
                        "not an interval or a matrix")
    if not mpmath.isfinite(x):
        raise InputValueError(f"{name}={x} is not a finite number")
    sign, man, exp, bc = x._mpf_
    if man and abs(int(exp) + int(bc)) > MAX_MPF_EXPONENT:
        raise InputValueError(f"{name} = {mpmath.nstr(x, 8)} is beyond 2^±{MAX_MPF_EXPONENT}")
    value = sp.Integer(int(man)) * sp.Integer(2) ** int(exp)
    return -value if sign else value


def _entry_text(x: Any) -> str:
    """An entry for a message: a string quoted and cut (:func:`echo`), a number short."""
    return echo(x) if isinstance(x, str) else expr_text(x)


def exact_matrix(rows: Any, name: str) -> sympy.Matrix:
    """A 2-D input as an exact SymPy Matrix (a vector is one row)."""
    import sympy as sp

    if isinstance(rows, sp.MatrixBase):
        return sp.Matrix(rows).applyfunc(lambda e: exact_number(e, name))
    if hasattr(rows, "dtype") and getattr(rows.dtype, "kind", "") == "f":
        # A floating array holds numbers typed by a person: each element stands for the
        # shortest decimal that prints as it *in its own dtype* (float32 0.1 is 1/10).
        import numpy as np

        def text(v: Any) -> str:
            return np.format_float_positional(v, unique=True, trim="0")

        rows = [[text(v) for v in row] for row in np.atleast_2d(rows)]
    if hasattr(rows, "tolist"):
        rows = rows.tolist()
    if not isinstance(rows, (list, tuple)) or not rows:
        raise SpecError(f"{name} must be a non-empty matrix (a list of rows)")
    if not isinstance(rows[0], (list, tuple)):
        rows = [rows]
    width = len(rows[0])
    if width == 0:
        raise SpecError(f"{name} has an empty row")
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)):
            raise SpecError(f"{name} row {i} is not a list")
        if len(row) != width:
            raise ShapeError(f"{name} row {i} has {len(row)} entries but row 0 has {width}")
    return sp.Matrix([[exact_number(e, f"{name}[{i}][{j}]") for j, e in enumerate(row)]
                      for i, row in enumerate(rows)])


def _shape(m: Any) -> str:
    return f"{m.rows} × {m.cols}"


def _finite_mask(mask: Any) -> bool:
    """Whether a mask (nested lists or an array) holds a finite non-zero additive entry;
    booleans, 0 and −inf (a key removed exactly) cost nothing more."""
    import sympy as sp

    if mask is None or isinstance(mask, str):
        return False
    if hasattr(mask, "tolist"):
        mask = mask.tolist()
    if isinstance(mask, sp.MatrixBase):
        mask = list(mask)
    stack = [mask]
    while stack:
        e = stack.pop()
        if isinstance(e, (list, tuple)):
            stack.extend(e)
        elif isinstance(e, bool) or e is None:
            continue
        elif isinstance(e, (int, float, Fraction)):
            if e != 0 and e != float("-inf"):
                return True
        elif isinstance(e, str):
            if e.strip().replace("\u2212", "-") not in ("-inf", "-oo", "-∞", "0"):
                return True
        elif isinstance(e, sp.Basic):
            if e != 0 and e != -sp.oo:
                return True
        else:
            return True  # numpy scalars and anything else: counted
    return False


def _mask_entry(e: Any, name: str = "mask") -> Any:
    """An additive-mask entry: a number, or -inf (float, string or -oo) to remove a key.

    Finite entries may be as large as MAX_ABS_MASK (−1e9 and −9e15 are common)."""
    import sympy as sp

    if isinstance(e, float) and e == float("-inf"):
        return -sp.oo
    if isinstance(e, str) and e.strip().replace("\u2212", "-") in ("-inf", "-oo", "-∞"):
        return -sp.oo
    if isinstance(e, sp.Basic) and e == -sp.oo:
        return e
    value = exact_number(e, name)
    if value.is_Rational and abs(value) > MAX_ABS_MASK:
        raise InputValueError(f"{name} entry {_entry_text(e)} is beyond ±{MAX_ABS_MASK:.0e}")
    if not value.is_Rational and not value.free_symbols:
        from .certified import to_arb

        ball = to_arb(value, 64)
        if not ball.is_finite() or abs(ball) > MAX_ABS_MASK:
            raise InputValueError(f"{name} entry {_entry_text(e)} is beyond ±{MAX_ABS_MASK:.0e}")
    return value
