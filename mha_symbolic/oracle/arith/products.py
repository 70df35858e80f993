"""Error-free matrix products from BLAS: row-aligned slices (Ozaki's scheme).

A matrix ``X`` (n × d) is written as ``X = X_1 + X_2 + ... + X_m + R`` where every
row ``i`` of slice ``X_s`` holds integer multiples of ``2**(a_i - s·β)`` of magnitude
at most ``2**(a_i - (s-1)·β)`` (``a_i`` an alignment exponent with
``max_l |x_il| <= 2**a_i``).  For two such matrices with ``d·2**(βa + βb) <= 2**53``
every partial sum of ``X_s[i] · Y_t[j]`` is an integer multiple of
``2**(a_i - sβa + b_j - tβb)`` below ``2**53`` of those units, so **any** BLAS
summation order computes ``X_s Y_tᵀ`` exactly (no rounding; units >= 2**-1074 are
guaranteed by clamping the alignments, see :func:`slice_rows`).
(Ozaki, Ogita, Oishi, Rump, "Error-free transformations of matrix multiplication
by using fast routines of matrix multiplication and its applications", Numer.
Algorithms 59, 2012.)

The exact pair products are accumulated in double-double by TwoSum; pairs whose
contribution is provably below ``2**-prune_bits`` of the row scale and the
truncation remainders ``R`` are *bounded*, not computed.  Every bound is returned
as a sum of rank-one terms ``row_vec ⊗ col_vec`` so that callers can take the
per-row maximum over keys at the cost of a vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .constants import ETA, UP, U
from .dd import pow2
from .jit import _kernels, slice_kernel
from .jit import accumulate as _accumulate

Array = np.ndarray[Any, Any]

A_MIN = -400  # alignment exponents are clamped here: units stay >= 2**(-400 - 5·27)


def beta_for(d: int) -> int:
    """Slice width for dot products of length d: 2β + ceil(log2 d) <= 53."""
    return (53 - max(0, math.ceil(math.log2(max(d, 1))))) // 2


def row_exponents(x: Array) -> Array:
    """Per row the smallest a with max |x_i| < 2**a (0 for zero rows), clamped to A_MIN."""
    m = np.max(np.abs(x), axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1])
    _, e = np.frexp(m)  # m = f·2**e, 0.5 <= f < 1 (e = 0 for m = 0)
    return np.maximum(e.astype(np.int64), A_MIN)


@dataclass
class Slices:
    """Row-aligned slices of a matrix: ``x = sum(parts) + rem`` exactly.

    ``parts[s]`` has per-row magnitude bound ``bounds[s]`` (<= 2**(a_i - sβ));
    ``rem_norm`` bounds the 2-norm of each row of the remainder; ``norm`` bounds
    the 2-norm of ``sum_s |parts[s]|`` row by row (used in accumulation bounds)."""

    parts: list[Array]
    bounds: list[Array]
    rem_norm: Array
    norm: Array
    beta: int
    zero_rem: bool = True
    nonzero: list[bool] = field(default_factory=list)


def norm_up(x: Array) -> Array:
    """Upper bound of the row 2-norms: the sum of n squares rounds by <= gamma_{n+1}
    relatively plus n·ETA (underflow); sqrt adds u; inflated by UP."""
    n = x.shape[-1]
    s = np.einsum("...i,...i->...", x, x)
    g = (n + 1) * U / (1 - (n + 1) * U)
    return np.sqrt(s * (1.0 + 2.0 * g) + n * ETA) * (1.0 + 2 * U) * UP


def slice_rows(x: Array, beta: int, max_slices: int, align: Array | None = None) -> Slices:
    """Slices of ``x`` (n × d, finite, |x| < 2**1000) with row alignments ``align``
    (default :func:`row_exponents`; any a_i with max|x_i| <= 2**a_i, >= A_MIN).

    Exactness of each step, for a double r and a unit ``w = 2**(a - sβ)``:
    ``q = w·rint(r/w)``: the scalings by powers of two are exact (no overflow;
    w >= 2**(A_MIN - max_slices·β) is normal), and ``r - q`` is exact: if |r| < w/2
    then q = 0; otherwise r and q are multiples of min(ulp(r), w) and
    |r - q| <= w/2 <= 2**52·ulp(r)."""
    n, d = x.shape
    a = row_exponents(x) if align is None else align
    parts: list[Array] = []
    bounds: list[Array] = []
    nonzero: list[bool] = []
    sq = math.sqrt(d) if d else 0.0
    extra = np.zeros(n)
    got = slice_kernel(x, pow2(beta - a), 2.0**beta, max_slices)
    if got is not None:  # compiled: all slices at once, then cut where the numpy loop stops
        allp, r, nz = got
        for s in range(1, max_slices + 1):
            q = allp[s - 1]
            parts.append(q)
            bounds.append(pow2(a - (s - 1) * beta).astype(np.float64))
            nonzero.append(bool(nz[s - 1]))
            extra += pow2(a - s * beta)
            if not nz[s:].any():   # the later slices and the remainder are all 0
                break
    else:
        r = np.array(x, dtype=np.float64, copy=True)
        for s in range(1, max_slices + 1):
            up = pow2(s * beta - a)[:, None]
            q = np.rint(r * up)
            q /= up
            r -= q
            parts.append(q)
            bounds.append(pow2(a - (s - 1) * beta).astype(np.float64))
            nonzero.append(bool(q.any()))
            extra += pow2(a - s * beta)  # rint adds at most half a unit per slice and entry
            if not r.any():
                break
    zero_rem = not (nz[max_slices] if got is not None else r.any())
    rem_norm = np.zeros(n) if zero_rem else norm_up(r)
    # sum_s |parts_s| <= |x| + sum_s unit_s (each rint moves by <= unit_s/2, twice)
    norm = (norm_up(x) + sq * extra) * UP
    return Slices(parts, bounds, rem_norm, norm, beta, zero_rem, nonzero)


@dataclass
class Product:
    """``hi + lo`` approximates ``A Bᵀ`` with ``|A Bᵀ - hi - lo| <= Σ_k outer(rows[k], cols[k])``."""

    hi: Array
    lo: Array
    rows: list[Array]
    cols: list[Array]

    def row_max_err(self) -> Array:
        """Per row, the maximum over columns of the bound."""
        out = np.zeros(self.hi.shape[0])
        for r, c in zip(self.rows, self.cols, strict=True):
            out += r * (np.max(c) if c.size else 0.0)
        return out * UP

    def err(self) -> Array:
        out = np.zeros(self.hi.shape)
        for r, c in zip(self.rows, self.cols, strict=True):
            out += r[:, None] * c[None, :]
        return out * UP


def accumulate(terms: list[Array]) -> tuple[Array, Array]:
    return _accumulate(terms)


def exact_product(A: Slices, B: Slices, prune_bits: int = 112,
                  plain: list[tuple[Array, Array]] | None = None,
                  plain_bounds: list[tuple[Array, Array]] | None = None) -> Product:
    """``A Bᵀ`` (n × m, dot length d) in double-double with a rigorous bound.

    Exact pair products ``A_s B_tᵀ`` (requires d·2**(βa + βb) <= 2**53) for all
    nonzero pairs except those with ``(s + t - 2)·β >= prune_bits`` (bounded by
    ``d·boundA_s ⊗ boundB_t``).  ``plain`` adds approximate float64 products
    ``X @ Yᵀ`` (for small low-order parts), each bounded by
    ``gamma_d·|X||Y|ᵀ + d·ETA`` <= ``gamma_d·||X_i||·||Y_j|| + d·ETA`` with the
    norms given in ``plain_bounds``.  Truncation remainders add
    ``remA_i·normB_j + normA_i·remB_j`` (Cauchy–Schwarz:
    A Bᵀ - (A - R_A)(B - R_B)ᵀ = R_A Bᵀ + (A - R_A) R_Bᵀ).

    Accumulation: K terms summed by TwoSum into ``hi`` with the errors summed in
    ``lo`` (then renormalised exactly): the exact sum is ``hi + Σ e_k``, |e_k| <=
    u·|partial sum| <= u(1 + γ_K)Σ|terms|, and fl(Σ e_k) errs by <= γ_K Σ|e_k|, so
    the error is <= K·u·γ_K·(1 + γ_K)·Σ|terms|, and Σ|terms| <= normA_i·normB_j
    (+ the plain terms' norms) by Cauchy–Schwarz."""
    n = A.parts[0].shape[0]
    m = B.parts[0].shape[0]
    d = A.parts[0].shape[1]
    beta = A.beta
    rows: list[Array] = []
    cols: list[Array] = []
    terms: list[Array] = []
    for s, (pa, ba, nza) in enumerate(zip(A.parts, A.bounds, A.nonzero, strict=True)):
        for t, (pb, bb, nzb) in enumerate(zip(B.parts, B.bounds, B.nonzero, strict=True)):
            if not (nza and nzb):
                continue
            if (s + t) * beta >= prune_bits:
                rows.append(d * ba)
                cols.append(bb)
                continue
            terms.append(pa @ pb.T)
    sum_rows = [A.norm]
    sum_cols = [B.norm]
    if plain:
        assert plain_bounds is not None
        gd = d * U / (1 - d * U) * UP
        for (x, y), (nx, ny) in zip(plain, plain_bounds, strict=True):
            terms.append(x @ y.T)
            rows.append(gd * nx)
            cols.append(ny)
            rows.append(np.full(n, d * ETA))
            cols.append(np.ones(m))
            sum_rows.append(nx)
            sum_cols.append(ny)
    if not A.zero_rem or not B.zero_rem:
        rows += [A.rem_norm, A.norm]
        cols += [B.norm, B.rem_norm]
    if not terms:
        hi = np.zeros((n, m))
        return Product(hi, np.zeros((n, m)), rows, cols)
    K = len(terms)
    if K == 1:
        return Product(terms[0], np.zeros_like(terms[0]), rows, cols)
    gK = K * U / (1 - K * U)
    f = K * U * gK * (1 + gK) * UP
    for r_, c_ in zip(sum_rows, sum_cols, strict=True):
        rows.append(f * r_)
        cols.append(c_)
    hi, lo = accumulate(terms)  # TwoSum chain, renormalised (jit, numpy twin)
    return Product(hi, lo, rows, cols)


def _np_w_slices(wh: Array, wl: Array) -> tuple[list[Array], list[bool], Array]:
    """Fixed-point slices of the weights' high words, aligned at 2**1 (22 bits each:
    W_s = 2**(1 - 22s)·rint(r·2**(22s - 1)), r -= W_s, exact), and the plain low part
    P = fl(wl + remainder) (P = wl when the remainder is 0)."""
    ws = slice_rows(wh, 22, 3, np.ones(wh.shape[0], dtype=np.int64))
    rw = wh - sum(ws.parts) if not ws.zero_rem else None  # exact (the slices are wh's bits)
    p = wl.copy() if rw is None else wl + rw
    return ws.parts, ws.nonzero, p


def w_slices(wh: Array, wl: Array) -> tuple[list[Array], list[bool], Array]:
    k = _kernels()
    if k is None or wh.size == 0:
        return _np_w_slices(wh, wl)
    w1 = np.empty_like(wh)
    w2 = np.empty_like(wh)
    w3 = np.empty_like(wh)
    rem = np.empty_like(wh)
    k.wsl(np.ascontiguousarray(wh), w1, w2, w3, rem)
    parts = [w1]
    nonzero = [bool(w1.any())]
    zero_rem = not rem.any()
    # the numpy twin stops slicing once the remainder is 0: drop the (zero) parts after
    if not zero_rem or w2.any() or w3.any():
        parts.append(w2)
        nonzero.append(bool(w2.any()))
        if not zero_rem or w3.any():
            parts.append(w3)
            nonzero.append(bool(w3.any()))
    p = wl.copy() if zero_rem else wl + rem
    return parts, nonzero, p
