"""Symbols and numerical helpers shared by the theorem modules.

Conventions: scores ``s_j`` and values ``v_j`` are real; indices run from 1;
``n`` (number of keys) is a positive integer symbol, so every indexed sum
``Sum(f(j), (j, 1, n))`` is a statement for all sizes.  Softmax weights are
``w_i = e^{s_i} / sum_j e^{s_j}``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import sympy as sp
from flint import arb, fmpq

n = sp.Symbol("n", integer=True, positive=True)
i, j, k, l = sp.symbols("i j k l", integer=True, positive=True)
s = sp.IndexedBase("s", real=True)
v = sp.IndexedBase("v", real=True)

PREC = 192  # bits for the Arb cross-checks


def softmax_denominator(scores: Any, upper: Any = n, dummy: Any = j) -> Any:
    """``sum_{dummy=1}^{upper} e^{scores[dummy]}`` (unevaluated)."""
    return sp.Sum(sp.exp(scores[dummy]), (dummy, 1, upper))


def arb_precision(bits: int = PREC) -> AbstractContextManager[None]:
    """Run the body with python-flint's working precision set to ``bits``."""
    from mha_symbolic.exact.certified import _precision

    return _precision(bits)


def random_rational(rng: random.Random, lo: int = -8, hi: int = 8, den: int = 16) -> fmpq:
    """A random rational in ``[lo, hi]`` with denominator dividing ``den``."""
    return fmpq(rng.randint(lo * den, hi * den), den)


def random_scores(rng: random.Random, size: int, **kw: int) -> list[fmpq]:
    return [random_rational(rng, **kw) for _ in range(size)]


def arb_softmax(scores: Sequence[Any]) -> list[arb]:
    """Softmax from the definition, ``e^{s_i} / sum_j e^{s_j}``, with Arb balls."""
    exps = [arb(x).exp() for x in scores]
    total = sum(exps, arb(0))
    return [e / total for e in exps]


def arb_dot(weights: Sequence[arb], values: Sequence[Any]) -> arb:
    return sum((w * arb(x) for w, x in zip(weights, values, strict=True)), arb(0))


def show(x: arb, digits: int = 12) -> str:
    """A ball printed with ``digits`` significant digits and its radius."""
    return str(x.str(digits, radius=True))


# --- small Arb matrix helpers (python-flint arb_mat) -------------------------


def random_arb_mat(rng: random.Random, rows: int, cols: int, lo: int = -4, hi: int = 4) -> Any:
    """A ``rows x cols`` arb_mat of random rationals (exact balls at enough precision)."""
    from flint import arb_mat

    return arb_mat([[arb(random_rational(rng, lo, hi)) for _ in range(cols)]
                    for _ in range(rows)])


def softmax_rows(S: Any) -> Any:
    """Row-wise softmax of an arb_mat, from the definition."""
    from flint import arb_mat

    out = arb_mat(S.nrows(), S.ncols())
    for r in range(S.nrows()):
        w = arb_softmax([S[r, c] for c in range(S.ncols())])
        for c, x in enumerate(w):
            out[r, c] = x
    return out


def attention(Q: Any, K: Any, V: Any, scale: Any) -> Any:
    """softmax(scale * Q K^T) V with Arb balls."""
    return softmax_rows((Q * K.transpose()) * arb(scale)) * V


def columns(M: Any, start: int, stop: int) -> Any:
    """Columns ``start:stop`` of an arb_mat."""
    from flint import arb_mat

    return arb_mat([[M[r, c] for c in range(start, stop)] for r in range(M.nrows())])


def hstack(mats: Sequence[Any]) -> Any:
    """Matrices side by side (same number of rows)."""
    from flint import arb_mat

    rows = mats[0].nrows()
    return arb_mat([[M[r, c] for M in mats for c in range(M.ncols())] for r in range(rows)])


def max_abs_diff(A: Any, B: Any) -> arb:
    """The largest |A_rc - B_rc| (an arb ball); shapes must agree."""
    if (A.nrows(), A.ncols()) != (B.nrows(), B.ncols()):
        raise ValueError(f"shapes {(A.nrows(), A.ncols())} and {(B.nrows(), B.ncols())} differ")
    best = arb(0)
    for r in range(A.nrows()):
        for c in range(A.ncols()):
            best = best.max(abs(A[r, c] - B[r, c]))
    return best
