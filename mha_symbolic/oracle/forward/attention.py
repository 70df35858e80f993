"""Certified scaled dot-product attention: :func:`reference_attention`.

Method (proofs in docs/oracle.md and in the comments of each module):

1. :mod:`.fast` (tier 1) computes every output in float64 with a proved error
   bound, block by block over (batch, head, query rows): memory O(block).
2. Rows with an element whose enclosure does not round to a single value go to
   :mod:`.dd_attention` (tier 2, double-double, exact scores from BLAS).
3. What is still undecided is recomputed with Arb balls (:mod:`.arb`), raising the
   precision until the ball rounds to one value (Ziv's strategy, capped;
   :mod:`.enclosure`); exact ties and near-ties are decided by :mod:`.ties`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np

from ..arith import ties
from ..arith.balls import exact_prec, exact_score_rows, scale_arb, to_arb_mat
from ..arith.constants import CHUNK_ELEMS
from ..arith.jit import Workspace
from ..conventions import (
    Block,
    ScoreModel,
    check_dropout,
    check_options,
    check_sdpa_inputs,
    concat_blocks,
    dd_scale,
    exact_scale,
    masked_rows_of,
    rational_scale,
    restrict_keys,
)
from ..enclosure import Enclosure, Problem
from ..inputs import to_float64
from ..progress import Progress, expected_seconds
from .arb import attention_rows
from .dd import KVdd, tier2_block
from .fast import KV, tier1_block
from .rows import KVrows, RowsBatch, float32_dtype, float32_valued, rows_path_pays, tier2_rows

__all__ = ["plain_attention"]


def dropout_dd(factor: Fraction | None) -> tuple[float, float, float] | None:
    """(hi, lo, rho) with |factor - hi - lo| <= rho, or None."""
    if factor is None:
        return None
    hi = float(factor)
    lo = float(factor - Fraction(hi))
    rest = abs(factor - Fraction(hi) - Fraction(lo))
    return hi, lo, (float(rest) * 2 if rest else 0.0)


def dropout_f(factor: Fraction | None) -> tuple[float, float]:
    """(r_f, rho_r) with |factor - r_f| <= rho_r (float64)."""
    if factor is None:
        return 1.0, 0.0
    rf = float(factor)
    rest = abs(factor - Fraction(rf))
    return rf, (float(rest) * 2 if rest else 0.0)


class Stack:
    """The (B) flat stack of attention problems over broadcast inputs, without
    copying broadcast dimensions: query head g reads key/value head g // rep (GQA).
    ``k`` and ``v`` may be of any exact format: :meth:`qkv` hands them out in float64."""

    def __init__(self, q: Any, k: Any, v: Any, batch: tuple[int, ...], rep: int) -> None:
        self.batch = batch
        L, E = q.shape[-2:]
        S, Ev = v.shape[-2:]
        self.q = np.broadcast_to(q, (*batch, L, E))
        kvb = (*batch[:-1], batch[-1] // rep) if rep > 1 else batch
        self.k = np.broadcast_to(k, (*kvb, S, E))
        self.v = np.broadcast_to(v, (*kvb, S, Ev))
        self.rep = rep
        # keys and values widened to float64 one key/value head at a time, when first
        # asked for (issue 29, decode: no full-size float64 copy of a float32 KV cache)
        self._k64: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._v64: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        # per key/value head, from tier 1's set-up: max_j norm_up(k_j), max_j |v_jl|
        self.head_stats: dict[tuple[int, ...], tuple[float, Any]] = {}
        # the queries as (B, L, E) when that is a view (decode groups take theirs as one
        # slice), and each problem's key/value head as one integer (kv_ids)
        B = math.prod(batch)
        self.q_flat = (q.reshape(B, L, E) if q.shape[:-2] == batch and q.flags.c_contiguous
                       else None)
        self._kv_ids: list[int] | None = None

    def kv_ids(self) -> list[int]:
        """Per flat problem, the flat index of its key/value head (equal ids: the same
        head; problems of one GQA group or broadcast batch are consecutive)."""
        if self._kv_ids is None:
            B = math.prod(self.batch)
            if not self.batch:
                self._kv_ids = [0] * B
            else:
                at = list(np.unravel_index(np.arange(B), self.batch))
                kvb = list(self.batch)
                if self.rep > 1:
                    at[-1] = at[-1] // self.rep
                    kvb[-1] //= self.rep
                self._kv_ids = np.ravel_multi_index(tuple(at), tuple(kvb)).tolist()
        return self._kv_ids

    def queries(self, c: int, n: int) -> Any:
        """The query rows of problems c … c + n − 1 as one (n·L, E) array."""
        if self.q_flat is not None:
            return self.q_flat[c:c + n].reshape(-1, self.q_flat.shape[-1])
        return np.concatenate([self.q[self.index(g)[0]] for g in range(c, c + n)])

    def index(self, c: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(query index, key/value index) of flat problem c: ``np.unravel_index`` by
        hand (a decode step asks once per query head: issue 29, many small heads)."""
        if not self.batch:
            return (), ()
        at = [0] * len(self.batch)
        for d in range(len(self.batch) - 1, -1, -1):
            c, at[d] = divmod(c, self.batch[d])
        idx = tuple(at)
        kidx = idx if self.rep == 1 else (*idx[:-1], idx[-1] // self.rep)
        return idx, kidx

    @staticmethod
    def _wide(cache: OrderedDict[tuple[int, ...], Any], arr: Any, kidx: tuple[int, ...]) -> Any:
        """Head ``kidx`` of ``arr`` in float64 (the last two kept)."""
        got = cache.get(kidx)
        if got is None:
            got = cache[kidx] = to_float64(arr[kidx])
            if len(cache) > 2:
                cache.popitem(last=False)
        return got

    def qkv(self, c: int) -> tuple[Any, Any, Any, tuple[int, ...]]:
        idx, kidx = self.index(c)
        return (self.q[idx], self._wide(self._k64, self.k, kidx),
                self._wide(self._v64, self.v, kidx), kidx)

    def rows_kv(self, c: int) -> tuple[Any, Any]:
        """The keys and values of element c for tier 2 by rows: float32 heads as they
        are (its kernels widen each element as they read it: exact), else float64."""
        _, kidx = self.index(c)
        if self.k.dtype == np.float32 and self.v.dtype == np.float32:
            return self.k[kidx], self.v[kidx]
        return self._wide(self._k64, self.k, kidx), self._wide(self._v64, self.v, kidx)

    def tier1_qkv(self, c: int) -> tuple[Any, Any, Any, tuple[int, ...]]:
        """:meth:`qkv` for tier 1's set-up (:class:`.fast.KV`): float32 values as they
        are (the set-up reads them once, into its float64 [v', |v'|]: exact), not
        widened first."""
        idx, kidx = self.index(c)
        v = (self.v[kidx] if self.v.dtype == np.float32
             else self._wide(self._v64, self.v, kidx))
        return self.q[idx], self._wide(self._k64, self.k, kidx), v, kidx


class _AttentionProblem(Problem):
    def __init__(self, stack: Stack, model: ScoreModel, scale: Fraction | None, E: int,
                 narrow: bool = False) -> None:
        # narrow: the inputs came in a dtype whose values are all float32 values
        self.narrow = narrow
        self.stack = stack
        self.model = model
        self.scale = scale  # exact rational scale, or None for 1/sqrt(E)
        self.E = E
        self.cs = dd_scale(scale, E)
        self.factor = model.dropout_factor
        self._kv2: OrderedDict[tuple[int, ...], KVdd] = OrderedDict()
        self._kvr: OrderedDict[tuple[int, ...], KVrows] = OrderedDict()
        self._f32: dict[tuple[int, ...], bool] = {}  # keys and values all float32 values
        self._km: OrderedDict[tuple[int, ...], tuple[Any, Array]] = OrderedDict()
        self._kint: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._group_cache: dict[tuple[int, int], dict[Any, list[int]]] = {}

    @staticmethod
    def _cached(cache: OrderedDict[Any, Any], key: Any, make: Any, size: int = 4) -> Any:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        val = make()
        cache[key] = val
        if len(cache) > size:
            cache.popitem(last=False)
        return val

    # ---- tier 2
    def refine(self, b: int, rows: Array, kind: str) -> tuple[Array, Array, Array, Array]:
        q, k, v, kidx = self.stack.qkv(b)
        kv = self._cached(self._kv2, kidx, lambda: KVdd(np.ascontiguousarray(k),
                                                         np.ascontiguousarray(v)))
        S = kv.S
        step = max(1, CHUNK_ELEMS // max(1, S))
        ncols = v.shape[-1] if kind == "output" else S
        hi = np.zeros((rows.size, ncols))
        lo = np.zeros((rows.size, ncols))
        err = np.zeros((rows.size, ncols))
        ok = np.zeros(rows.size, dtype=bool)
        fac = dropout_dd(self.factor)
        for s0 in range(0, rows.size, step):
            sel = rows[s0:s0 + step]
            blk = self.model.block(b, sel)
            res = tier2_block(np.ascontiguousarray(q[sel]), None, None, kv, blk, self.cs, fac, kind)
            hi[s0:s0 + step], lo[s0:s0 + step], err[s0:s0 + step] = res.hi, res.lo, res.err
            ok[s0:s0 + step] = res.ok
        return hi, lo, err, ok

    def _kv_rows(self, b: int) -> KVrows | None:
        """The keys and values of element b for tier 2 by rows (a few cached per
        key/value head), or None when they are not all float32 values."""
        if not self._f32_kv(b):
            return None
        _, kidx = self.stack.index(b)
        if kidx in self._kvr:
            self._kvr.move_to_end(kidx)
            return self._kvr[kidx]
        k, v = self.stack.rows_kv(b)
        return self._cached(self._kvr, kidx, lambda: KVrows(k, v, self.stack.head_stats.get(kidx)),
                            size=8)

    def _f32_kv(self, b: int) -> bool:
        """Whether the keys and values of element b are all float32 values (cached)."""
        if self.narrow:
            return True
        _, kidx = self.stack.index(b)
        if kidx not in self._f32:
            _, k, v, _ = self.stack.qkv(b)
            self._f32[kidx] = float32_valued(np.asarray(k)) and float32_valued(np.asarray(v))
        return self._f32[kidx]

    def refine_many(self, items: list[tuple[int, Array]], kind: str
                    ) -> Iterator[tuple[int, tuple[Array, Array, Array, Array] | None]]:
        """Tier 2 for several (b, rows): the items whose query rows, keys and values are
        all float32 values by rows (:mod:`.dd_rows`), their rows joined across stack
        elements into blocks of at most CHUNK_ELEMS scores (the numpy work per block
        is then paid once, not once per head); the others by the sliced tier."""
        S = self.stack.k.shape[-2]
        by_rows = rows_path_pays(sum(int(rows.size) for _, rows in items))
        eligible: list[int] = []
        for n, (b, rows) in enumerate(items):
            if by_rows and self._f32_kv(b) and (self.narrow or float32_valued(
                    np.asarray(self.stack.q[self.stack.index(b)[0]][rows]))):
                eligible.append(n)
            else:
                yield n, self.refine(b, rows, kind)
        if not eligible:
            return
        step = max(1, CHUNK_ELEMS // max(1, S))
        fac = dropout_dd(self.factor)
        # (item, first row, last row) pieces, packed into blocks of <= step rows
        pieces: list[tuple[int, int, int]] = []
        used = 0
        outs: dict[int, tuple[list[Array], Array]] = {}
        for n in eligible:
            size = int(items[n][1].size)
            r0 = 0
            while r0 < size:
                take = min(size - r0, step - used)
                pieces.append((n, r0, r0 + take))
                used += take
                r0 += take
                if used == step:
                    yield from self._rows_block(items, pieces, kind, fac, outs)
                    pieces, used = [], 0
        if pieces:
            yield from self._rows_block(items, pieces, kind, fac, outs)

    def _rows_block(self, items: list[tuple[int, Array]], pieces: list[tuple[int, int, int]],
                    kind: str, fac: tuple[float, float, float] | None,
                    outs: dict[int, tuple[list[Array], Array]]
                    ) -> Iterator[tuple[int, tuple[Array, Array, Array, Array]]]:
        """One block of tier 2 by rows over ``pieces`` (item, row range); yields the
        items whose last rows it held (``outs`` collects an item's rows meanwhile)."""
        heads: list[KVrows] = []
        where: dict[tuple[int, ...], int] = {}
        qs, hidx, blocks, sizes = [], [], [], []
        for n, r0, r1 in pieces:
            b, rows = items[n]
            sel = rows[r0:r1]
            idx, kidx = self.stack.index(b)
            if kidx not in where:
                kv = self._kv_rows(b)
                assert kv is not None
                where[kidx] = len(heads)
                heads.append(kv)
            qs.append(self.stack.q[idx][sel])
            hidx.append(np.full(sel.size, where[kidx], dtype=np.int64))
            blocks.append(self.model.block(b, sel))
            sizes.append(int(sel.size))
        S = heads[0].S
        # only the keys some row of the block may see (as in tier 1)
        whole = concat_blocks(blocks, sizes, S)
        blk, j0, j1 = restrict_keys(whole, S)
        if j1 <= j0:
            blk, j0, j1 = whole, 0, S
        res = tier2_rows(np.ascontiguousarray(np.concatenate(qs)),
                         RowsBatch([h.keys(j0, j1) for h in heads], np.concatenate(hidx)),
                         blk, self.cs, fac, kind)
        if kind != "output" and (j0, j1) != (0, S):   # the weights of the other keys: 0
            for name in ("hi", "lo", "err"):
                part = getattr(res, name)
                wide = np.zeros((part.shape[0], S))
                wide[:, j0:j1] = part
                setattr(res, name, wide)
        ncols = res.hi.shape[1]
        at = 0
        for n, r0, r1 in pieces:
            size = int(items[n][1].size)
            if n not in outs:
                outs[n] = ([np.zeros((size, ncols)) for _ in range(3)],
                           np.zeros(size, dtype=bool))
            (hi, lo, err), ok = outs[n]
            m = r1 - r0
            hi[r0:r1], lo[r0:r1], err[r0:r1] = (res.hi[at:at + m], res.lo[at:at + m],
                                                 res.err[at:at + m])
            ok[r0:r1] = res.ok[at:at + m]
            at += m
            if r1 == size:
                del outs[n]
                yield n, (hi, lo, err, ok)

    # ---- tier 3
    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        q, k, v, kidx = self.stack.qkv(b)
        kmT, kabs = self._cached(self._km, kidx, lambda: (to_arb_mat(np.asarray(k)).transpose(),
                                                          np.asarray(k)))
        qr = np.asarray(q[rows])
        k_prec = exact_prec(qr, kabs, self.E)
        vv = (np.zeros((k.shape[0], 0)) if kind != "output" else
              np.asarray(v) if cols is None else np.asarray(v)[:, cols])
        blk = self.model.block(b, np.asarray(rows))
        g = exact_score_rows(qr, kmT, k_prec)
        return attention_rows(g, to_arb_mat(vv), k_prec, self.scale, self.E, blk, self.factor,
                              kind, prec)

    # ---- exact ties
    def _c_rat(self) -> Fraction | None:
        """The scale as an exact rational, or None when it is 1/sqrt(E) irrational."""
        return rational_scale(self.scale, self.E)

    def _row_block(self, b: int, i: int) -> Block:
        return self.model.block(b, np.array([i]))

    def _groups(self, b: int, i: int) -> dict[Any, list[int]]:
        """Allowed keys of row (b, i) grouped by exact score (ties.score_key)."""
        if (b, i) in self._group_cache:
            return self._group_cache[(b, i)]
        q, k, _, kidx = self.stack.qkv(b)
        blk = self._row_block(b, i)
        S = k.shape[0]
        allowed = np.ones(S, dtype=bool) if blk.allowed is None else blk.allowed[0]
        idx = np.flatnonzero(allowed).tolist()
        if blk.uniform is not None and blk.uniform[0]:
            groups = {Fraction(0): idx}
        else:
            kint = self._cached(self._kint, kidx, lambda: ties.int_matrix(np.asarray(k)))
            g = ties.exact_dots(np.asarray(q[i]), kint)
            c_rat = self._c_rat()
            madd = blk.madd[0] if blk.madd is not None else None
            groups = ties.group(
                (j, ties.score_key(g[j], Fraction(float(madd[j])) if madd is not None
                                   else Fraction(0), c_rat)) for j in idx)
        if len(self._group_cache) > 4096:
            self._group_cache.clear()
        self._group_cache[(b, i)] = groups
        return groups

    def _kappa(self, b: int, i: int) -> Any:
        """Per key, the factor of the numerator: keep·(1/(1-p)) with dropout, else 1."""
        if self.factor is None:
            return None
        blk = self._row_block(b, i)
        assert blk.keep is not None
        return [self.factor if kj else Fraction(0) for kj in blk.keep[0].tolist()]

    def _values(self, b: int, i: int, col: int, kind: str, js: list[int]) -> dict[int, Fraction]:
        _, _, v, _ = self.stack.qkv(b)
        kap = self._kappa(b, i)
        out = {}
        for j in js:
            base = Fraction(float(v[j][col])) if kind == "output" else Fraction(int(j == col))
            out[j] = base if kap is None else base * kap[j]
        return out

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        """The exact row where it is rational (ties module docstring), else None."""
        groups = self._groups(b, i)
        if not groups:
            return None
        js = [j for g in groups.values() for j in g]
        _, k, v, _ = self.stack.qkv(b)
        ncols = v.shape[-1] if kind == "output" else k.shape[0]
        out: list[Fraction | None] = []
        for col in range(ncols):
            if kind == "weights" and col not in js:
                out.append(Fraction(0))
                continue
            vals = self._values(b, i, col, kind, js)
            out.append(ties.rational_value(groups, vals))
        return out

    def boundary_sign(self, b: int, i: int, col: int, kind: str, boundary: Fraction) -> int | None:
        """sign(y - T) = sign(Σ_g e^{a_g}(V_g - n_g T)) (ties.sign_of_sum)."""
        groups = self._groups(b, i)
        js = [j for g in groups.values() for j in g]
        vals = self._values(b, i, col, kind, js)
        terms = [(key, sum((vals[j] for j in g), Fraction(0)) - len(g) * boundary)
                 for key, g in groups.items()]
        return ties.sign_of_sum(terms, lambda: scale_arb(self.scale, self.E))


Array = np.ndarray[Any, Any]


def value_hull(stack: Stack, B: int) -> tuple[Array, Array]:
    """Per stack element and feature, the least and greatest value over all keys:
    (B, Ev) each.

    Without dropout every row of plain attention (a softmax row, or JAX's uniform
    row) is a convex combination of the value rows, o_c = Σ_j p_j v_jc with p_j >= 0,
    Σ_j p_j = 1, so min_j v_jc <= o_c <= max_j v_jc: the hull of the kept keys, and so
    of all keys.  The ends are input values (float64, exact), finite for finite input:
    the clamp that keeps the enclosure finite and tight where the tiers' float64
    sums overflow (values near the float64 maximum; issue 30).  Rows with every key
    masked under "zero" or "nan" are set by the policy and not clamped (Enclosure);
    with dropout the weights sum to up to 1/(1 - p) and the hull does not hold."""
    lo = np.empty((B, stack.v.shape[-1]))
    hi = np.empty_like(lo)
    for c in range(B):
        _, _, vc, _ = stack.qkv(c)
        lo[c] = np.min(vc, axis=0)
        hi[c] = np.max(vc, axis=0)
    return lo, hi


class _Rows:
    """Tier 1's results for every flat problem (…, L, ·), filled block by block."""

    def __init__(self, B: int, L: int, S: int, Ev: int, weights: bool) -> None:
        self.y = np.zeros((B, L, Ev))
        self.err = np.zeros((B, L, Ev))
        self.ok = np.zeros((B, L), dtype=bool)
        self.p = np.zeros((B, L, S)) if weights else None
        self.err_p = np.zeros((B, L, S)) if weights else None
        # the value hull (value_hull), filled from each head's KV as tier 1 builds it
        self.hull: tuple[Array, Array] | None = None

    def store(self, c: int, n: int, rows: slice, j0: int, j1: int, res: Any) -> None:
        """Problems c … c + n − 1, rows ``rows``, keys j0 … j1 − 1 from one tier-1 block."""
        r, Ev = rows.stop - rows.start, self.y.shape[-1]
        self.y[c:c + n, rows] = res.y.reshape(n, r, Ev)
        self.err[c:c + n, rows] = res.err.reshape(n, r, Ev)
        self.ok[c:c + n, rows] = res.ok.reshape(n, r)
        if self.p is not None:
            assert self.err_p is not None and res.p is not None and res.err_p is not None
            self.p[c:c + n, rows, j0:j1] = res.p.reshape(n, r, j1 - j0)
            self.err_p[c:c + n, rows, j0:j1] = res.err_p.reshape(n, r, j1 - j0)


def _head_kv(cache: OrderedDict[tuple[int, ...], KV], kidx: tuple[int, ...], k: Array,
             v: Array, size: int = 2) -> KV:
    """Tier 1's set-up of key/value head ``kidx`` (the last ``size`` kept, least recently
    used out first); a new head builds its [v', |v'|] in the buffer of the head it
    evicts (no fresh pages per head: decode sets up one head per GQA group)."""
    kv = cache.get(kidx)
    if kv is not None:
        cache.move_to_end(kidx)
        return kv
    buf = cache.popitem(last=False)[1].vcat if len(cache) >= size else None
    kv = cache[kidx] = KV(np.ascontiguousarray(k), np.ascontiguousarray(v), buf=buf)
    return kv


def _decode_group(stack: Stack, c: int, B: int, L: int, step: int) -> list[int]:
    """Short rows (decode): the query heads that follow problem c on the same key/value
    head (a GQA group, a broadcast batch), as one tier-1 block of at most ``step`` rows;
    rows are independent, the per-head set-up shared."""
    if step < 2 * L:
        return [c]
    ids = stack.kv_ids()
    n, most = 1, min(B - c, step // L)
    while n < most and ids[c + n] == ids[c]:
        n += 1
    return list(range(c, c + n))


def _run_tier1(stack: Stack, model: ScoreModel, out: _Rows, c_f: float, rho_c: float,
               r_f: float, rho_r: float, prog: Progress) -> None:
    """Tier 1 over every flat problem, by blocks of query rows (or of decode heads)."""
    (B, L), S = out.ok.shape, stack.v.shape[-2]
    weights = out.p is not None
    step = max(1, CHUNK_ELEMS // S)
    bar = prog.bar(B * (-(-L // step)), "certified attention")
    kv_cache: OrderedDict[tuple[int, ...], KV] = OrderedDict()
    ws = Workspace()
    Ev = out.y.shape[-1]
    out.hull = (np.empty((B, Ev)), np.empty((B, Ev)))
    c = 0
    while c < B:
        qc, kc, vc, kidx = stack.tier1_qkv(c)
        kv = _head_kv(kv_cache, kidx, kc, vc)
        if kidx not in stack.head_stats:
            stack.head_stats[kidx] = (kv.kmax, np.maximum(np.abs(kv.vhi), np.abs(kv.vlo)))
        group = _decode_group(stack, c, B, L, step)
        out.hull[0][c:c + len(group)] = kv.vlo
        out.hull[1][c:c + len(group)] = kv.vhi
        if len(group) > 1:
            n = len(group)
            # (no mask nor dropout: every key of every row, without asking each head)
            blk, j0, j1 = (Block(None, None, None, None), 0, S) if model.trivial else \
                restrict_keys(concat_blocks([model.block(g, slice(0, L)) for g in group],
                                            [L] * n, S), S)
            if j1 > j0:
                out.store(c, n, slice(0, L), j0, j1, tier1_block(np.ascontiguousarray(
                    stack.queries(c, n)), None, kv.keys(j0, j1), blk, c_f, rho_c, r_f,
                    rho_r, weights, ws))
            if bar is not None:
                bar.update(n)
            c += n
            continue
        for i0 in range(0, L, step):
            i1 = min(L, i0 + step)
            # only the keys some row of the block may see (causal, window and
            # block-sparse masks: ScoreModel.block_keys); a block without any
            # key is left to the masked-row policy (ok = False, y = 0)
            blk, j0, j1 = model.block_keys(c, slice(i0, i1))
            if j1 > j0:
                out.store(c, 1, slice(i0, i1), j0, j1, tier1_block(
                    np.ascontiguousarray(qc[i0:i1]), None, kv.keys(j0, j1), blk, c_f, rho_c,
                    r_f, rho_r, weights, ws))
            if bar is not None:
                bar.update(1)
        c += 1
    if bar is not None:
        bar.close()


def plain_attention(
    query: Any, key: Any, value: Any, *,
    attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, causal_alignment: str = "top_left",
    masked_rows: str = "zero", return_weights: bool = False,
    dropout_p: float = 0.0, dropout_mask: Any = None, progress: bool | None = None,
) -> Enclosure:
    """Certified plain scaled dot-product attention (no variant): the tiers' driver
    behind :func:`mha_symbolic.reference_attention` (:mod:`..api`), which routes calls
    with variants to :mod:`..variants.forward`.  Same arguments and result."""
    check_options(masked_rows, causal_alignment)
    p_drop = check_dropout(dropout_p, dropout_mask)
    q, k, v, batch, rep = check_sdpa_inputs(query, key, value, enable_gqa)
    L, E = q.shape[-2:]
    S, Ev = v.shape[-2:]
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    model = ScoreModel(batch, L, S, attn_mask=attn_mask, is_causal=is_causal,
                       causal_alignment=causal_alignment, policy=masked_rows,
                       dropout_mask=dropout_mask, dropout_p=p_drop)
    B = math.prod(batch)
    stack = Stack(to_float64(q), k, v, batch, rep)  # k, v widened per head (Stack.qkv)

    rows = masked_rows_of(masked_rows, model.empty_rows(), S, batch)
    zero_rows, nan_rows = rows.zero, rows.nan  # uniform rows are computed (ScoreModel)

    prog = Progress(progress, expected_seconds(B * L * S * max(1, (E + Ev) // 64), "tier1"))
    res = _Rows(B, L, S, Ev, return_weights)
    r_f, rho_r = dropout_f(model.dropout_factor)
    if B and L and S:
        _run_tier1(stack, model, res, c_f, rho_c, r_f, rho_r, prog)
    y, err_y, ok, p, err_p = res.y, res.err, res.ok, res.p, res.err_p
    ok &= ~(zero_rows | nan_rows)
    problem = _AttentionProblem(stack, model, scale_exact, E,
                                narrow=all(float32_dtype(x) for x in (query, key, value)))
    out = Enclosure(problem, "output", (*batch, L, Ev), y, err_y, ok, zero_rows, nan_rows,
                    owned=True, hull=(res.hull or value_hull(stack, B)) if model.dropout_factor is None
                    and S else None,
                    progress=prog if prog.enabled else Progress(progress, expected_seconds(
                        B * L * S, "tier2")))
    if return_weights:
        assert p is not None and err_p is not None
        out.weights = Enclosure(problem, "weights", (*batch, L, S), p, err_p, ok,
                                zero_rows, nan_rows, progress=out._progress, owned=True)
    return out
