"""Tier 2 by rows: the double-double tier for a few rows of float32-representable
inputs, without slicing the head's keys and values (docs/oracle.md §3.5a).

Rounding to float32 or narrower, tier 1 leaves a handful of rows per head undecided
(typically 1% of them).  The sliced tier 2 (:mod:`.dd_attention`) then spends most of
its time cutting the head's whole ``K`` and ``V`` into BLAS slices for those few rows.
When every query, key and value entry is a float32 value (the inputs of a float32,
float16 or bfloat16 kernel, widened), the same double-double accuracy comes without
slicing:

1. **Scores.** ``q_l·k_jl`` is exact in binary64 (24 + 24 significant bits, exponent
   >= -298, magnitude <= 2**256), so ``g_j = Σ_l q_l k_jl`` is a sum of exact terms;
   Sum2 (a TwoSum chain, Ogita–Rump–Oishi 2005) gives ``gh + gl`` with
   ``|gh + gl - g_j| <= γ_E² Σ_l |q_l k_jl| <= γ_E² ||q|| ||k_j||``.
2. The scale, mask, row maxima and weights are the sliced tier's
   (:func:`.dd_attention.scale_and_mask`, ``exp_dd``).
3. **Sums.** Each weight's high word is split (Veltkamp) into two halves of <= 26
   bits, so ``w1·v`` and ``w2·v`` are exact for a float32 ``v`` (up to underflow, at
   most ``η/2`` each); Sum2 over the keys accumulates them, the low words' products
   ``fl(wl·v)`` join the low-order sum.  ``D = Σ_j (wh_j + wl_j)`` likewise.
4. ``y = N/D`` and the error assembly are the sliced tier's
   (:func:`.dd_attention.tier2_from_scores`).

The cost is ``rows × S × (E + 2·Ev)`` compensated operations and no per-head setup
beyond one pass over ``K`` and ``V``; compiled, it is faster than the sliced tier for
one row and for a whole head alike.  :func:`rows_path_pays` chooses.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arith.constants import ETA, UP, U, gamma
from ..arith.jit import numba_active, row_dots_k, row_sums
from ..arith.products import norm_up
from ..conventions import Block, DDScale
from .dd import Tier2, scale_and_mask, tier2_from_scores

Array = np.ndarray[Any, Any]


def float32_valued(x: Array) -> bool:
    """Whether every entry of the float64 array ``x`` is a float32 value (so it has at
    most 24 significant bits and exponent >= -149).  Non-finite entries answer False."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.array_equal(x.astype(np.float32).astype(np.float64), x)
                    and np.isfinite(x).all())


#: dtypes (numpy, ml_dtypes, torch and JAX spell them alike) whose every value is a
#: float32 value
FLOAT32_SUBSET = frozenset({"float32", "float16", "bfloat16", "float8_e4m3fn",
                            "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


def float32_dtype(x: Any) -> bool:
    """Whether the array-like ``x`` has a dtype whose values are all float32 values
    (no element needs checking).

    >>> float32_dtype(np.zeros(2, np.float16)), float32_dtype(np.zeros(2)), float32_dtype([1.0])
    (True, False, False)
    """
    name = str(getattr(x, "dtype", ""))
    return name.removeprefix("torch.") in FLOAT32_SUBSET


def rows_path_pays(rows: int) -> bool:
    """Whether the compensated row path should take ``rows`` rows of one head: with the
    compiled kernels it is faster than the sliced tier at every size measured (1 to 256
    rows, 256 to 4096 keys: bench/RESULTS.md, issue 11); the numpy twins loop over the
    keys in Python, so without numba the sliced tier runs."""
    return rows > 0 and numba_active()


@dataclass
class KVrows:
    """Keys ``k`` (S, E) and values ``v`` (S, Ev) of one stack element, float32 values
    held as float64 (check with :func:`float32_valued`) or float32 arrays (the kernels
    widen as they read: exact), with what every block reuses:
    ``kc`` and ``vc`` C-contiguous (the dot kernel transposes a few keys at a time in
    cache: no transposed copy of the head), ``kmax`` >= max_j ||k_j||, ``colmax`` >=
    max_j |v_jl|."""

    k: Array
    v: Array
    #: max_j of :func:`norm_up` (k_j) and max_j |v_jl|, when tier 1 already has them
    #: (the same values: :class:`.fast.KV`), else computed here
    known: tuple[float, Array] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.S, self.E = self.k.shape
        self.Ev = self.v.shape[1]
        self.kc = np.ascontiguousarray(self.k)
        self.vc = np.ascontiguousarray(self.v)
        if self.known is not None and self.S:
            self.kmax = self.known[0]
            self.colmax = self.known[1] * UP
        else:       # (in float64: the keys and values may be float32 arrays)
            k64, v64 = (np.asarray(x, dtype=np.float64) for x in (self.k, self.v))
            self.kmax = float(np.max(norm_up(k64))) if self.S else 0.0
            self.colmax = (np.max(np.abs(v64), axis=0) * UP if self.S
                           else np.zeros(self.Ev))
        self.known = None

    def keys(self, j0: int, j1: int) -> KVrows:
        """The keys ``j0:j1`` only, for a block whose other keys are all masked (issue
        29): views of the keys and values (rows of C-contiguous arrays: contiguous);
        the head's ``kmax`` and ``colmax`` kept (upper bounds of the range's, so the
        bounds of :func:`tier2_rows` hold, with the range's key count: a masked key has
        weight 0 exactly and adds nothing)."""
        if j0 == 0 and j1 == self.S:
            return self
        sub = copy.copy(self)
        sub.k, sub.v, sub.vc = self.k[j0:j1], self.v[j0:j1], self.vc[j0:j1]
        sub.kc = self.kc[j0:j1]
        sub.S = j1 - j0
        return sub


class RowsBatch:
    """The heads a block of rows reads: row ``i`` attends to ``heads[hidx[i]]`` (all
    with the same S, E, Ev).  Duck-typed for :func:`.dd_attention.tier2_from_scores`:
    ``colmax`` per row (R, Ev); the values are not scaled (``Fv = 0``: float32 values
    are far from the underflow range); no radii.  One block may take the undecided
    rows of every head at once: the per-block work in numpy is then paid once, not
    once per head."""

    def __init__(self, heads: list[KVrows], hidx: Array) -> None:
        self.heads = heads
        self.hidx = np.ascontiguousarray(hidx, dtype=np.int64)
        self.S, self.E, self.Ev = heads[0].S, heads[0].E, heads[0].Ev
        self.kmax = np.array([h.kmax for h in heads])[self.hidx]
        self.colmax = (np.stack([h.colmax for h in heads])[self.hidx] if self.hidx.size
                       else np.zeros((0, self.Ev)))
        self.Fv = np.zeros(self.Ev, dtype=np.int64)
        self.vr2 = None

    def weighted_sums(self, wh: Array, wl: Array, keep: Array | None, want_n: bool
                      ) -> tuple[Array, Array, Array, Array | None, Array | None,
                                 Array | None]:
        """(Dh, Dl, eD, Nh, Nl, eN) as :func:`.dd_attention._weighted_sums`:
        ``D~ = Σ_j (wh_j + wl_j)`` and ``N~ = Σ_j keep_j (wh_j + wl_j) v_j`` within
        ``eD`` (r,) and ``eN`` (r, Ev).

        The kernel (jit.row_sums) runs, per row, Sum2 over the keys: D's chain adds the
        exact ``wh_j`` (TwoSum) and puts each TwoSum error and ``wl_j`` into the plain
        low-order sum ``cd`` (2S terms); N's chain adds the products ``w1_j v_jl`` and
        ``w2_j v_jl`` (``wh = w1 + w2``, Veltkamp, 26 bits each: exact, or within η/2
        when they underflow) and puts the two TwoSum errors and ``fl(wl_j v_jl)`` into
        ``cn`` (3S terms).  TwoSum is exact; the chain's value is
        ``s + Σ e`` exactly, and the recursive sum ``cd`` (``cn``) of m terms errs by
        ``<= γ_m Σ|terms|``.  Each TwoSum error is ``<= u|partial sum|``, and a
        recursive sum of k terms has every partial sum ``<= (1 + γ_k) Σ|terms|``; the
        terms are ``wh_j`` (D) and ``w1_j v``, ``w2_j v`` with ``|w1| + |w2| <=
        (1 + 2**-25)|wh|`` (N).  With ``Aw = Σ_j |wh_j|`` and ``Al = Σ_j |wl_j|`` (the
        kernel sums ``|wh|`` and ``|wl|`` too; fl(Σ) >= (1 - γ_S)·Σ is inverted by
        dividing by 1 - γ_S):

        * ``eD = γ_2S (S u (1 + γ_2S) Aw + Al)``;
        * ``eN_l = γ_3S (2S u (1 + γ_2S) 1.01 Aw + (1 + u) Al) colmax_l + u Al colmax_l
          + (γ_3S + 2) S η``: the N chain's TwoSum errors, ``fl(wl v)`` (relative u
          and ``η/2`` each) and the products' underflow (``η/2`` each, two per key).

        The final (hi, lo) are renormalised by TwoSum (exact)."""
        S = wh.shape[1]
        Dh, Dl, Nh, Nl, aw, al = row_sums(wh, wl, keep, [h.vc for h in self.heads],
                                                  self.hidx, want_n)
        with np.errstate(over="ignore", invalid="ignore"):
            g1 = gamma(max(S, 1))
            Aw = aw / (1.0 - g1) * UP
            Al = al / (1.0 - g1) * UP
            g2 = gamma(max(2 * S, 1))
            g3 = gamma(max(3 * S, 1))
            eD = g2 * (S * U * (1.0 + g2) * Aw + Al) * UP
            if not want_n:
                return Dh, Dl, eD, None, None, None
            col = self.colmax
            eN = ((g3 * (2 * S * U * (1.0 + g2) * 1.01 * Aw + (1.0 + U) * Al)[:, None] * col
                   + U * Al[:, None] * col + (g3 + 2.0) * S * ETA) * UP)
        return Dh, Dl, eD, Nh, Nl, eN


def tier2_rows(q: Array, kv: KVrows | RowsBatch, blk: Block, cs: DDScale,
               dropout: tuple[float, float, float] | None = None,
               kind: str = "output") -> Tier2:
    """Tier 2 for the rows ``q`` (r, E; float32 values) against ``kv`` (one head, or a
    :class:`RowsBatch` naming each row's head): the result and bound of
    :func:`.dd_attention.tier2_block` for the same rows, computed by compensated dot
    products instead of slices.

    >>> import numpy as np
    >>> from mha_symbolic.oracle.conventions import Block, dd_scale
    >>> kv = KVrows(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[2.0], [4.0]]))
    >>> t = tier2_rows(np.array([[0.0, 0.0]]), kv, Block(None, None, None, None),
    ...                dd_scale(None, 2))
    >>> float(t.hi[0, 0]), bool(t.err[0, 0] < 2.0**-70), bool(t.ok[0])
    (3.0, True, True)
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        r, E = q.shape
        if isinstance(kv, KVrows):
            kv = RowsBatch([kv], np.zeros(r, dtype=np.int64))
        S = kv.S
        bad = np.zeros(r, dtype=bool)
        if E and S:
            gh, gl = row_dots_k(np.ascontiguousarray(q), [h.kc for h in kv.heads], kv.hidx)
            qn = norm_up(q)
            # Sum2 of E exact products (1.): |gh + gl - g| <= γ_E² Σ|q_l k_jl| (Cauchy–Schwarz)
            gE = gamma(E)
            g_err = gE * gE * qn * kv.kmax * UP
            gmax = (qn * kv.kmax + g_err) * UP
        else:
            gh = np.zeros((r, S))
            gl = np.zeros((r, S))
            g_err = np.zeros(r)
            gmax = np.zeros(r)
        P = np.full(r, cs.e, dtype=np.int64)  # the scores in true units: 2**P = 2**e_c
        sc = scale_and_mask(gh, gl, g_err, gmax, P, np.zeros(r), bad, blk, cs, None)
        return tier2_from_scores(sc.sh, sc.sl, sc.m, sc.e_t, kv, sc.notallowed,  # type: ignore[arg-type]
                                 blk.keep, sc.has_key, dropout, kind, sc.bad)
