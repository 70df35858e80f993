"""The Arb fallback: attention rows in ball arithmetic (python-flint), for the
elements the fast path leaves undecided.  Error-free dot products in numpy
(TwoProduct, TwoSum) seed the first precisions cheaply."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .constants import SPLIT, UP, gamma


def to_arb_mat(rows: np.ndarray[Any, Any]) -> Any:
    """An exact arb_mat of a 2-D float64 array (doubles are exact in Arb)."""
    from flint import arb_mat

    r, c = rows.shape
    if r == 0 or c == 0:
        return arb_mat(r, c)
    return arb_mat(rows.tolist())




def two_prod_err(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any],
                  ph: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """pl with a·b = ph + pl exactly, ph = fl(a·b) (Dekker's TwoProduct, Veltkamp split)."""
    ta = a * SPLIT
    ah = ta - (ta - a)
    al = a - ah
    tb = b * SPLIT
    bh = tb - (tb - b)
    bl = b - bh
    return ((ah * bh - ph) + ah * bl + al * bh) + al * bl


def dd_dot_balls(qr: np.ndarray[Any, Any], k: np.ndarray[Any, Any],
                  exact_products: bool = False) -> list[list[Any]] | None:
    """Arb balls for every q_i·k_j, from error-free transformations in numpy.

    Each product a·b = ph + pl exactly (Dekker's TwoProduct with Veltkamp's split;
    exact when no product or partial product under/overflows, guaranteed here by
    requiring every nonzero |x| in [2**-450, 2**450]).  (With fp32/fp16/bf16 inputs,
    significands of <= 24 bits, a·b is already exact: pl = 0 is skipped.)  The n
    terms are added by a pairwise tree of TwoSum (Knuth), each exact: Σ x = s + Σ e_i
    over fewer than n error terms, which are summed in floats:
    |fl(Σ e_i) - Σ e_i| <= gamma_n Σ|e_i| (Higham (H1)/(H2)).  So
    q_i·k_j lies in s + fl(Σ e_i) ± gamma_{n+1}·fl(Σ|e_i|)(1 + 2gamma_{n+1}), a ball of
    relative width ~n²u², enough for the first Arb precisions; returns None when
    the range guard fails (callers then convert the whole matrix to Arb)."""
    from flint import arb

    for x in (qr, k):
        ax = np.abs(x[x != 0])
        if ax.size and (ax.min() < 2.0**-450 or ax.max() > 2.0**450):
            return None
    r, E = qr.shape
    S = k.shape[0]
    a = np.broadcast_to(qr[:, None, :], (r, S, E))
    b = np.broadcast_to(k[None, :, :], (r, S, E))
    ph = a * b
    # significands of <= 26 bits (fp32/fp16/bf16): a·b is a double already
    terms = ph if exact_products else np.concatenate([ph, two_prod_err(a, b, ph)], axis=-1)
    n = terms.shape[-1]

    # pairwise TwoSum tree: every level is exact, x_a + x_b = s + e
    x = terms
    errs = []
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = np.concatenate([x, np.zeros((*x.shape[:-1], 1))], axis=-1)
        xa, xb = x[..., 0::2], x[..., 1::2]
        sm = xa + xb
        bb = sm - xa
        errs.append((xa - (sm - bb)) + (xb - bb))
        x = sm
    s = x[..., 0]
    if errs:
        e_all = np.concatenate(errs, axis=-1)  # fewer than n terms
        err = np.sum(e_all, axis=-1)
        rad = gamma(n + 1) * np.sum(np.abs(e_all), axis=-1) * (1.0 + 2.0 * gamma(n + 1)) * UP
    else:
        err = rad = np.zeros((r, S))
    out = []
    for si, ei, ri in zip(s.tolist(), err.tolist(), rad.tolist(), strict=True):
        out.append([arb(x_, z_) + y_ for x_, y_, z_ in zip(si, ei, ri, strict=True)])
    return out


def arb_attention_rows(
    qm: Any, km: Any, vm: Any, c: Any,
    allowed: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None,
    want: str, shift_idx: list[int] | None = None, g_rows: list[list[Any]] | None = None,
) -> list[list[Any]]:
    """Rows of attention in ball arithmetic at the current precision.

    qm (r×E), km (S×E), vm (S×Ev) arb_mat; c an arb; allowed (r×S) bool; madd (r×S)
    or None.  want = "output" -> r lists of Ev balls; "weights" -> r lists of S balls.
    Every row must have an allowed key.  Softmax is shifted by the exact midpoint of
    one score per row: ``shift_idx[i]`` (an allowed key with an approximately largest
    score, found in floats by the caller) or else the key with the largest midpoint.
    Any real shift gives the same softmax; a near-maximal one keeps exps <= ~1."""
    from flint import arb, arb_mat

    r, S = allowed.shape
    Ev = vm.ncols()
    zero = arb(0)
    if g_rows is not None:  # balls for q_i·k_j given by the caller: scale them
        g_rows = [[g * c for g in row] for row in g_rows]
    elif qm.ncols() == 0 or r == 0 or S == 0:
        g_rows = [[zero] * S for _ in range(r)]
    else:
        sc = (qm * km.transpose()) * c
        ents = sc.entries()
        g_rows = [ents[i * S:(i + 1) * S] for i in range(r)]
    w_rows: list[list[Any]] = []
    for i in range(r):
        row = g_rows[i]
        al = allowed[i]
        full = bool(al.all())
        if madd is not None:
            row = [x + arb(float(mj)) for x, mj in zip(row, madd[i].tolist(), strict=True)]
        if shift_idx is not None:
            shift = row[shift_idx[i]].mid()
        else:
            idx = np.flatnonzero(al).tolist()
            shift = row[max(idx, key=lambda j: float(row[j].mid()))].mid()
        if full:
            w_rows.append([(x - shift).exp() for x in row])
        else:
            w_rows.append([(x - shift).exp() if a_ else zero
                           for x, a_ in zip(row, al.tolist(), strict=True)])
    # one product gives the weighted sums and (last column) the normaliser D
    ones = arb_mat(S, 1)
    for j in range(S):
        ones[j, 0] = 1
    if want == "weights" or Ev == 0:
        dm = arb_mat(w_rows) * ones
        d_list = [dm[i, 0] for i in range(r)]
        if want == "weights":
            return [[wj / d for wj in wrow] for wrow, d in zip(w_rows, d_list, strict=True)]
        return [[] for _ in range(r)]
    vext = arb_mat(S, Ev + 1)
    for j in range(S):
        for l in range(Ev):
            vext[j, l] = vm[j, l]
        vext[j, Ev] = 1
    nm = arb_mat(w_rows) * vext
    ents = nm.entries()
    w1 = Ev + 1
    out = []
    for i in range(r):
        base = i * w1
        inv = 1 / ents[base + Ev]
        out.append([ents[base + l] * inv for l in range(Ev)])
    return out


class Prec:
    """Context manager setting python-flint's working precision (restored on exit).
    Arb endpoints (``x.lower()``) and differences are rounded to the *current*
    precision, so every inspection of a ball happens inside one of these."""

    def __init__(self, prec: int) -> None:
        self.prec = prec
        self.old = 0

    def __enter__(self) -> None:
        from flint import ctx

        self.old = ctx.prec
        ctx.prec = self.prec

    def __exit__(self, *exc: object) -> None:
        from flint import ctx

        ctx.prec = self.old


def ball_bounds(x: Any) -> tuple[float, float]:
    """Outward float64 bounds of an arb ball (call inside Prec)."""
    from flint import arb

    if not x.is_finite():
        return -math.inf, math.inf
    lo_x, hi_x = x.lower(), x.upper()
    lo, hi = float(lo_x), float(hi_x)
    if math.isfinite(lo) and arb(lo) > lo_x:
        lo = math.nextafter(lo, -math.inf)
    if math.isfinite(hi) and arb(hi) < hi_x:
        hi = math.nextafter(hi, math.inf)
    return lo, hi
