"""Gradients that are linear functionals of dS: the attention sinks' logits, ALiBi
slopes, a relative-position bias table, a float mask seen through a variant
(docs/gradients.md §11).

Each such parameter θ enters the scores additively, s_ij = … + a_ij(θ), with
∂s_ij/∂θ_c an integer coefficient w_ij (a sink's logit: 1 on its key; an ALiBi
slope: −|j − (i + off)|; a table entry: 1 where clip(d_ij) selects it; a mask entry:
1), so by the chain rule

    ∂L/∂θ_c = Σ_{problems, i, j: bin(i, j) = c} w_ij dS_ij,

dS = P ∘ (dP − D) the gradient of the (final) scores, summed over every problem
that shares θ.  A functional names, for each problem and its rows, the bin and the
coefficient of every (i, j) (:class:`ScoreFunctional`); this module sums them in
each tier, with a bound:

* tier 1 (:func:`tier1_part`): t = fl(w·dS~) (|w| < 2**53 an integer, one
  rounding: u|t~| + η), |w|e_dS, and the float bin sums of n terms: (H1)
  γ_n Σ|t~| for the values, (H2) for the sums of nonnegative bounds;
* tier 2 (:func:`dd_part`): w·dS_h exactly by TwoProduct, w·dS_l with one rounding,
  the bins summed by a pairwise TwoSum tree (exact) whose error words add up in
  floats: γ_m Σ|e| (H1) — :func:`bin_sum_dd`;
* tier 3 (:func:`arb_part`) in Arb; exact ties (:func:`exact_part`) through
  :meth:`.exact.ExactProblem.add_ds` with the coefficients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ...errors import ShapeError
from ..arith.constants import ETA, FLOOR, UP, U, gamma
from ..arith.dd import two_prod, two_sum

__all__ = ["ScoreFunctional", "arb_part", "bin_sum_dd", "broadcast_target", "dd_part",
           "distance_functional", "exact_part", "relative_distances", "tier1_part"]

Arr = np.ndarray[Any, Any]


@dataclass
class ScoreFunctional:
    """A gradient Σ w_ij dS_ij into bins: user ``shape``, flat layout (n, R, C);
    ``target[e]`` the flat index n of problem e; ``rowwise``: R = L and output row r
    collects dS row r only (else R = 1 and every row contributes); ``index(e, rows)``
    gives (col (r, S'), w (r, S')) with col in [0, C) or -1 (not counted), w
    integer-valued doubles."""

    name: str
    shape: tuple[int, ...]
    n: int
    R: int
    C: int
    target: Arr
    rowwise: bool
    index: Callable[[int, Arr], tuple[Arr, Arr]]

    def bins(self, e: int, rows: Arr) -> tuple[Arr, Arr]:
        """(bin (r, S') into the flat R·C of the output rows asked for — local row
        position for rowwise, 0 otherwise — or -1, w)."""
        col, w = self.index(e, rows)
        col = np.asarray(col, dtype=np.int64)
        if self.rowwise:
            local = np.arange(rows.size, dtype=np.int64)[:, None] * self.C
            b = np.where(col >= 0, local + col, -1)
        else:
            b = col
        return b, np.asarray(w, dtype=np.float64)


def broadcast_target(shape: tuple[int, ...], lead: tuple[int, ...], name: str) -> Arr:
    """For every flat problem over ``lead``, the flat index of a parameter of ``shape``
    broadcast against it (a parameter shared by broadcast copies sums their terms)."""
    idx = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    try:
        return np.broadcast_to(idx, lead).reshape(-1).copy()
    except ValueError:
        raise ShapeError(f"{name}.shape={shape} does not broadcast to (batch..., heads) = "
                         f"{lead}") from None


def relative_distances(n_keys: int, rows: Arr, offset: int) -> Arr:
    """d = j - (i + offset) for the rows, over every key column (the sink's included)."""
    return np.arange(n_keys)[None, :] - (rows[:, None] + offset)


def distance_functional(name: str, slopes: Arr, offset: Any, geo: Any,
                     flat_lead: tuple[int, ...], n_keys: int) -> ScoreFunctional:
    """Σ −|j − (i + off)| dS_ij per flat problem into a parameter of ``slopes``' shape
    (ALiBi's slopes, a slope score_mod's: ∂s_ij/∂slope = −|j − (i + off)|); ``offset``
    one for the call or an array of each outer batch element's own offset (a KV
    cache's); a (n_outer, H) parameter takes each flat problem's own entry."""
    S, H = geo.S, geo.heads
    cols = np.arange(n_keys)
    if slopes.ndim == 2 and slopes.shape == (geo.n_outer, H):
        # (batch, heads) over the flattened outer dimensions, as the forward
        target = np.arange(geo.B, dtype=np.int64)
    else:
        target = broadcast_target(tuple(slopes.shape), flat_lead, name)

    def index(e: int, rows: Arr) -> tuple[Any, Any]:
        d = relative_distances(n_keys, rows, int(offset[e // H]) if np.ndim(offset) else offset)
        return (np.broadcast_to(np.where(cols < S, 0, -1), d.shape),
                -np.abs(d).astype(np.float64))

    return ScoreFunctional(f"grad_{name}", tuple(slopes.shape), int(slopes.size), 1, 1,
                           target, False, index)


def tier1_part(fn: ScoreFunctional, e: int, ds: Arr, e_ds: Arr, live_rows: Arr
               ) -> tuple[Arr, Arr, Arr]:
    """(value (R, C), bound (R, C), live (R, C)) of problem e's contribution from its
    tier-1 dS (L, S') with bounds; rows outside ``live_rows`` contribute exactly 0."""
    L = ds.shape[0]
    rows = np.arange(L)
    b, w = fn.bins(e, rows)
    # keys off the live set (masked, uniform rows) have dS = 0 and e_dS = 0 exactly
    sel = (b >= 0) & (w != 0) & live_rows[:, None] & (e_ds > 0)
    nb = (L if fn.rowwise else 1) * fn.C
    bi = b[sel]
    t = w[sel] * ds[sel]
    # fl(w·dS~) errs by <= u|t~|(1 + 2u) + η; w·dS errs by |w| e_dS more
    et = np.abs(w[sel]) * e_ds[sel] + U * np.abs(t) * (1 + 2 * U) + ETA
    val = np.bincount(bi, weights=t, minlength=nb)
    mag = np.bincount(bi, weights=np.abs(t), minlength=nb)
    err = np.bincount(bi, weights=et, minlength=nb)
    cnt = np.bincount(bi, minlength=nb)
    g = np.array([gamma(int(c)) if c > 1 else 0.0 for c in cnt]) if nb <= 4096 else (
        cnt * U / (1.0 - cnt * U))
    bound = ((err + g * mag) / (1.0 - g) * UP + FLOOR) * (cnt > 0)
    shape = (L if fn.rowwise else 1, fn.C)
    return val.reshape(shape), bound.reshape(shape), (cnt > 0).reshape(shape)


def bin_sum_dd(terms: list[Arr], bins: Arr, nb: int) -> tuple[Arr, Arr, Arr]:
    """Σ of exact doubles into ``nb`` bins as a double-double (hi, lo) with the bound
    of the summation (exact terms in, so the only error is this one): every term of
    a bin in one row of a zero-padded matrix, a pairwise TwoSum tree (each step
    a + b = s + e exactly), the error words summed in floats — |fl(Σe) − Σe| <=
    γ_m Σ|e| (H1), Σ|e| bounded by (H2) — and a final TwoSum (exact)."""
    vals = np.concatenate([t.ravel() for t in terms]) if terms else np.zeros(0)
    bb = np.concatenate([bins.ravel()] * len(terms)) if terms else np.zeros(0, np.int64)
    keep = vals != 0
    vals, bb = vals[keep], bb[keep]
    hi = np.zeros(nb)
    lo = np.zeros(nb)
    err = np.zeros(nb)
    if vals.size == 0:
        return hi, lo, err
    order = np.argsort(bb, kind="stable")
    vals, bb = vals[order], bb[order]
    cnt = np.bincount(bb, minlength=nb)
    width = int(cnt.max())
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    pos = np.arange(vals.size) - start[bb]
    used = np.flatnonzero(cnt)
    row_of = np.full(nb, -1, dtype=np.int64)
    row_of[used] = np.arange(used.size)
    x = np.zeros((used.size, width))
    x[row_of[bb], pos] = vals
    errs: list[Arr] = []
    while x.shape[1] > 1:
        if x.shape[1] % 2:
            x = np.concatenate([x, np.zeros((x.shape[0], 1))], axis=1)
        s, e = two_sum(x[:, 0::2], x[:, 1::2])
        errs.append(e)
        x = s
    h = x[:, 0]
    if errs:
        e_all = np.concatenate(errs, axis=1)
        m = e_all.shape[1]
        g = gamma(m)
        low = np.sum(e_all, axis=1)
        bound = g * np.sum(np.abs(e_all), axis=1) / (1.0 - g) * UP
        h, low = two_sum(h, low)
    else:
        low = np.zeros_like(h)
        bound = np.zeros_like(h)
    hi[used], lo[used], err[used] = h, low, bound
    return hi, lo, err


def dd_part(fn: ScoreFunctional, e: int, ds: tuple[Arr, Arr, Arr, Arr], rows: Arr
            ) -> tuple[Arr, Arr, Arr, Arr]:
    """(hi, lo, err, ok) of problem e's contribution to the output rows (``rows`` for
    rowwise, else the one row) from double-double dS rows (hi, lo, err, ok) of the
    source rows (the same rows, or every row): w·dS_h = p + q exactly (TwoProduct, w
    an integer), fl(w·dS_l) within u|·| + η, |w| e_dS; the sums by :func:`bin_sum_dd`
    and, for the bounds, float sums of nonnegative terms (H2)."""
    dh, dl, de, ok = ds
    src = np.arange(dh.shape[0]) if not fn.rowwise else rows
    b, w = fn.bins(e, src)
    sel = b >= 0
    bsel = b[sel]
    p, q = two_prod(w[sel], dh[sel])
    lw = w[sel] * dl[sel]
    et = np.abs(w[sel]) * de[sel] + U * np.abs(lw) * (1 + 2 * U) + ETA
    R = rows.size if fn.rowwise else 1
    nb = R * fn.C
    hi, lo, err = bin_sum_dd([p, q, lw], bsel, nb)
    cnt = np.bincount(bsel, minlength=nb)
    g = np.array([gamma(int(c)) for c in np.maximum(cnt, 1)])
    e_sum = np.bincount(bsel, weights=et, minlength=nb) / (1.0 - g) * UP
    ok_out = np.full(R, bool(np.all(ok))) if not fn.rowwise else np.asarray(ok, dtype=bool)
    return (hi.reshape(R, fn.C), lo.reshape(R, fn.C), (err + e_sum).reshape(R, fn.C) + FLOOR,
            ok_out)


def arb_part(fn: ScoreFunctional, e: int, ds_rows: list[list[Any]], rows: list[int]
             ) -> list[list[Any]]:
    """Problem e's contribution in Arb from the dS balls of the source rows (``rows``
    for rowwise, else every row)."""
    from flint import arb

    R = len(rows) if fn.rowwise else 1
    out = [[arb(0)] * fn.C for _ in range(R)]
    src = np.asarray(rows if fn.rowwise else range(len(ds_rows)), dtype=np.int64)
    b, w = fn.bins(e, src)
    for n, i_row in enumerate(ds_rows):
        for j in np.flatnonzero(b[n] >= 0).tolist():
            wt = float(w[n, j])
            if wt == 0:
                continue
            r_, c_ = divmod(int(b[n, j]), fn.C)
            out[r_][c_] = out[r_][c_] + i_row[j] * wt
    return out


def exact_part(fn: ScoreFunctional, e: int, ex: Any, acc: Any, r: int, col: int, L: int
               ) -> None:
    """Add problem e's terms of element (r, col) to the exact accumulator: w_ij times
    dS_ij for every (i, j) in that bin (rowwise: row r only)."""
    src = np.array([r] if fn.rowwise else list(range(L)), dtype=np.int64)
    b, w = fn.bins(e, src)
    for n, i in enumerate(src.tolist()):
        for j in np.flatnonzero(b[n] == col).tolist():
            wt = Fraction(float(w[n, j]))
            if wt:
                ex.add_ds(acc, i, j, (wt, Fraction(0)))
