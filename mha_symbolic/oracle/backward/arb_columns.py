"""Tier 3 of dK and dV by key columns: O(L·E) Arb work per key, not O(L·S·E).

A dK or dV element of key j needs, per query row i, only the weight P_ij and the
row statistic D_i (notation of :mod:`.arb`)::

    P_ij = exp(s_ij − m_i) / l_i,      l_i = Σ_{j' allowed} exp(s_ij' − m_i),
    dS_ij = P_ij (f·keep_ij·X_ij − D_i),   X = dO Vᵀ,   W_ij = f·keep_ij·P_ij,
    dK_j = c Σ_i dS_ij q_i,            dV_j = Σ_i W_ij dO_i,

for any shift m_i (a double here, so s − m is formed without loss).  The row
statistics (m_i, l_i, D_i) do not depend on the key asked for: they are formed once
per problem (:class:`RowBalls`) and each key column then costs its own scores
(exact products, :func:`..arith.balls.exact_score_rows`), L exponentials and the two
column products.  Two sources of statistics:

* **tier 2** (:func:`tier2_balls`): the double-double statistics pass of
  :class:`.dd.HeadTier2` carries proved bounds — its shift m (a double), D~ = Dh + Dl
  with |Σ w~ − D~| <= eD and |Σ w / Σ w~ − 1| <= tau_d (docs/oracle.md §3.5), so
  l ∈ (D~ ± eD)(1 ± tau_d); and D_i = Σ_j P_ij dP_ij within Dde (:meth:`.dd.HeadTier2._row_d`).
  Balls about 2**-84 wide, for no Arb exponential at all; D_i sharpened for a dK key
  they leave undecided (:func:`tier2_sharp_d`: shifted by tier 2's D, narrower where |D|
  is large against the spread of dP);
* **Arb** (:func:`arb_balls`): every row's exponentials at the precision asked for
  (no shift: Arb does not overflow; the row's largest float64 score where it is
  beyond ±10**4), once per problem and precision.

Rows with no allowed key contribute 0; ``uniform`` rows have P_ij = 1/S and dS = 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..arith.balls import EXP_FLOOR, Prec, scale_arb, to_arb_mat
from ..arith.constants import UP
from ..arith.formats import FloatFormat
from ..conventions import Block
from ..enclosure import _decide_balls
from .dd import _chain, normaliser_factor, row_sums_dd

__all__ = ["ColumnProblem", "ColumnTier3", "RowBalls", "arb_balls", "column_gradients",
           "tier2_balls", "tier2_sharp_d", "undecided_rows"]

Arr = np.ndarray[Any, Any]
CHUNK = 1 << 16     # score entries per block of rows in :func:`arb_balls`
EXTRA_BITS = 64     # the scores' products c·g at prec + EXTRA_BITS


@dataclass
class RowBalls:
    """Row statistics of one problem: shift ``m`` (L doubles), ``l`` and ``d`` (L balls:
    the normaliser Σ exp(s − m) and D_i) for the live rows (``live``: a key allowed,
    not uniform); ``prec`` the precision they were formed at (0 for tier 2's)."""

    m: Arr
    l: list[Any]
    d: list[Any]
    live: Arr
    prec: int
    has_d: bool = True   # False: ``d`` not formed (statistics for dV only)


def _fmpq_arb(x: Fraction) -> Any:
    from flint import arb, fmpq

    return arb(fmpq(x.numerator, x.denominator))


class ColumnProblem:
    """One problem's inputs (exact doubles q (L, E), k (S, E), v (S, Ev), do (L, Ev)),
    its score model ``blk`` over every row, the scale (exact or None for 1/sqrt(E)),
    the exact dropout factor ``f`` and ``g_prec`` (:func:`..arith.balls.exact_prec`
    of q and k); the exact arb_mats of q and dO kept.  ``ok``: the float64 scores of
    the live rows are finite and below 2**40 in magnitude (else the caller keeps the
    whole-problem path); ``m`` the shift of Arb's statistics (0, or the row's largest
    float64 score where that is beyond ±10**4)."""

    def __init__(self, q: Arr, k: Arr, v: Arr, do: Arr, blk: Block, scale: Fraction | None,
                 E: int, f: Fraction, g_prec: int) -> None:
        self.q, self.k, self.v, self.do = q, k, v, do
        self.L, self.S, self.Ev = q.shape[0], k.shape[0], v.shape[1]
        self.scale, self.E, self.f, self.g_prec = scale, E, f, g_prec
        L, S = self.L, self.S
        self.allowed: Arr = (np.ones((L, S), dtype=bool) if blk.allowed is None
                             else np.asarray(blk.allowed, dtype=bool))
        self.madd: Arr | None = (None if blk.madd is None else
                                 np.where(self.allowed, np.broadcast_to(blk.madd, (L, S)), 0.0))
        self.keep: Arr | None = None if blk.keep is None else np.asarray(blk.keep, dtype=bool)
        self.uniform: Arr = (np.zeros(L, dtype=bool) if blk.uniform is None
                             else np.asarray(blk.uniform, dtype=bool))
        has_key = self.allowed.any(axis=-1) if S else np.zeros(L, dtype=bool)
        self.live: Arr = has_key & ~self.uniform
        self.c_f = float(scale) if scale is not None else (1.0 / np.sqrt(E) if E else 0.0)
        self.m = np.zeros(L)
        self.ok = True
        step = max(1, CHUNK // max(S, 1))
        with np.errstate(over="ignore", invalid="ignore"):
            for i0 in range(0, L, step):
                rr = np.arange(i0, min(L, i0 + step))
                t = self.approx(rr, np.arange(S), np.zeros(L))
                t = np.where(self.allowed[rr], t, -np.inf)
                top = t.max(axis=-1) if S else np.zeros(rr.size)
                big = np.abs(np.where(self.allowed[rr], t, 0.0)).max(axis=-1) if S else top
                live = self.live[rr]
                if not np.all(np.isfinite(big[live]) & (big[live] <= 2.0**40)):
                    self.ok = False
                # Arb has no overflow: a shift only where exponents could reach EXP_FLOOR
                self.m[rr] = np.where(live & (np.abs(top) >= 1e4), top, 0.0)
        self.qm = to_arb_mat(q)
        self.dom = to_arb_mat(do)
        self._kmT: Any = None

    @property
    def kmT(self) -> Any:
        """The exact arb_mat Kᵀ (E × S)."""
        if self._kmT is None:
            self._kmT = to_arb_mat(self.k).transpose()
        return self._kmT

    def approx(self, rows: Arr, keys: Arr, m: Arr) -> Arr:
        """The shifted scores c·q·k + M − m in float64 (to choose shifts and to find the
        exponents that may fall below EXP_FLOOR; never part of a result)."""
        t = self.c_f * (self.q[rows] @ self.k[keys].T) - m[rows][:, None]
        if self.madd is not None:
            t = t + self.madd[np.ix_(rows, keys)]
        return np.asarray(t)

    def weights(self, rows: Arr, keys: Arr, m: Arr, prec: int) -> list[Any]:
        """exp(t_ij) for t_ij = c·q_i·k_j + M_ij − m_i (rows × keys, row-major; 0 on
        keys not allowed): the exact products q·k, then c·g, −m and M added at
        ``prec + EXTRA_BITS`` bits (|s| <= 2**40: the sum errs by <= 2**(-prec-20)),
        the exponential at ``prec``; arguments below EXP_FLOOR give [0, e**EXP_FLOOR]."""
        from flint import arb, ctx

        r, nk = rows.size, keys.size
        if r == 0 or nk == 0:
            return []
        kmT = (self.kmT if nk == self.S and bool(np.all(keys == np.arange(self.S)))
               else to_arb_mat(np.ascontiguousarray(self.k[keys])).transpose())
        qm = self.qm if r == self.L else to_arb_mat(np.ascontiguousarray(self.q[rows]))
        old = ctx.prec
        try:
            ctx.prec = self.g_prec
            g = qm * kmT   # exact: g_prec holds every q·k
            ctx.prec = prec + EXTRA_BITS
            t = g * scale_arb(self.scale, self.E)
            if bool(np.any(m[rows] != 0)):
                t = t - to_arb_mat(np.ascontiguousarray(np.broadcast_to(m[rows][:, None],
                                                                        (r, nk))))
            if self.madd is not None:
                t = t + to_arb_mat(np.ascontiguousarray(self.madd[np.ix_(rows, keys)]))
            ents = t.entries()
            ctx.prec = prec
            zero = arb(0)
            w_tiny = (arb(EXP_FLOOR).exp() * arb(0.5, 0.5)).nonnegative_part()
            allowed = self.allowed[np.ix_(rows, keys)].reshape(-1).tolist()
            with np.errstate(over="ignore", invalid="ignore"):
                low = ~(self.approx(rows, keys, m) > -1e5)
            if not low.any():
                return [x.exp() if a else zero for x, a in zip(ents, allowed, strict=True)]
            lows = low.reshape(-1).tolist()
            return [zero if not a else (w_tiny if lo and x.upper() < EXP_FLOOR else x.exp())
                    for x, a, lo in zip(ents, allowed, lows, strict=True)]
        finally:
            ctx.prec = old


def _ones(n: int) -> Any:
    from flint import arb_mat

    one = arb_mat(n, 1)
    for j in range(n):
        one[j, 0] = 1
    return one


def tier2_balls(cp: ColumnProblem, t2: Any) -> RowBalls | None:
    """The row statistics from tier 2's (``t2``: a :class:`.dd.HeadTier2` whose statistics
    pass covered every row) as balls, or None where a live row's are not certified:
    l ∈ (D~ ± eD)(1 ± tau_d), D ∈ Dd~ ± Dde (module docstring)."""
    from flint import arb

    st = getattr(t2, "st", None)
    if st is None or not bool(st.done.all()):
        return None
    live = cp.live
    cols = (st.m, st.Dh, st.Dl, st.eD, st.tau_d, st.Ddh, st.Ddl, st.Dde)
    if not (bool(np.all(st.ok[live]))
            and all(bool(np.all(np.isfinite(a[live]))) for a in cols)
            and bool(np.all(st.eD[live] >= 0)) and bool(np.all(st.tau_d[live] >= 0))
            and bool(np.all(st.Dde[live] >= 0))):
        return None
    one, zero = arb(1), arb(0)
    ls: list[Any] = [one] * cp.L
    ds: list[Any] = [zero] * cp.L
    for i in np.flatnonzero(live).tolist():
        li = (arb(float(st.Dh[i])) + arb(float(st.Dl[i])) + arb(0, float(st.eD[i]))) * (
            1 + arb(0, float(st.tau_d[i])))
        if not li > 0:
            return None
        ls[i] = li
        ds[i] = arb(float(st.Ddh[i])) + arb(float(st.Ddl[i])) + arb(0, float(st.Dde[i]))
    return RowBalls(np.asarray(st.m, dtype=np.float64).copy(), ls, ds, live.copy(), 0)


def tier2_sharp_d(cp: ColumnProblem, t2: Any, rb: RowBalls) -> RowBalls | None:
    """``rb`` (tier 2's statistics) with D_i sharpened in double-double, or None where a
    row's values are not certified.  Σ_j P_ij = 1 over the allowed keys of a live row,
    so D_i = a_i + Σ_j P_ij (dP_ij − a_i) for the exact double-double a_i = D̃d_i; the
    terms are tier 2's dS with D replaced by a_i (:func:`.dd._chain` with e_D = 0: its
    bound is then |dS~ − P(dP − a)| without the loose bound of D̃d), summed by
    :class:`.dd.DDSum` (its bound adds the terms' bounds).  The row's normaliser is a
    common factor: P_ij = c_i·P̂_ij with P̂ = w/D~ (bounded by weights_dd with
    eD = tau_d = 0: the exponentials' and the division's errors only) and
    c_i = D~/Σ_j w_ij, |c_i − 1| <= γ_i (:func:`.dd.normaliser_factor`); so
    D_i − a_i = c_i Σ_j P̂_ij (dP_ij − a_i) ∈ c_i (Σ~ ± e_Σ) and
    D_i ∈ a_i + Σ~ ± (e_Σ + γ_i (|Σ~| + e_Σ)): the normaliser's uncertainty is
    charged to the small Σ~ only, not to every term."""
    from flint import arb

    st = t2.st
    rows_all = np.flatnonzero(cp.live)
    ds = list(rb.d)
    step = max(1, t2.chunk // max(cp.S, 1))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        for s0 in range(0, rows_all.size, step):
            rr = rows_all[s0:s0 + step]
            blk, p, ok_r = t2._weights_at(rr, np.arange(cp.S), normaliser=False)
            gam = normaliser_factor(st.eD[rr], st.d_low[rr], st.tau_d[rr])
            x, ex = t2._x(rr, None)
            a = (st.Ddh[rr], st.Ddl[rr], np.zeros(rr.size))
            ch = _chain(p, x, a, t2._live(blk, rr.size, cp.S), blk.keep, t2.fac)
            if not (bool(ok_r.all()) and ex and ch.ok):
                return None
            h, lo, err = row_sums_dd(ch.sh, ch.sl, ch.se)
            err = (err + gam * (np.abs(h) + np.abs(lo) + err)) * UP
            if not bool(np.all(np.isfinite(h) & np.isfinite(lo) & np.isfinite(err))):
                return None
            for n, i in enumerate(rr.tolist()):
                ds[i] = (arb(float(st.Ddh[i])) + arb(float(st.Ddl[i])) + arb(float(h[n]))
                         + arb(float(lo[n])) + arb(0, float(err[n])))
    return RowBalls(rb.m, rb.l, ds, rb.live, 0)


def arb_balls(cp: ColumnProblem, prec: int, want_d: bool = True) -> RowBalls:
    """The row statistics in Arb at ``prec`` bits: every live row's weights w_ij =
    exp(s_ij − m_i) (m_i = 0, or its largest float64 score beyond ±10**4), l_i = Σ_j w_ij and
    (``want_d``; dV does not read it) D_i = f·dO_i·(Σ_j keep_ij w_ij v_j)/l_i =
    Σ_j P_ij dP_ij; blocks of rows."""
    from flint import arb, arb_mat, ctx

    L, S, Ev = cp.L, cp.S, cp.Ev
    one, zero = arb(1), arb(0)
    ls: list[Any] = [one] * L
    ds: list[Any] = [zero] * L
    rows_all = np.flatnonzero(cp.live)
    keys = np.arange(S)
    step = max(1, CHUNK // max(S, 1))
    old = ctx.prec
    try:
        ctx.prec = prec
        vm = to_arb_mat(cp.v)
        ones = _ones(S)
        fa = _fmpq_arb(cp.f)
        for s0 in range(0, rows_all.size, step):
            rr = rows_all[s0:s0 + step]
            ws = cp.weights(rr, keys, cp.m, prec)
            ctx.prec = prec
            wm = arb_mat([ws[n * S:(n + 1) * S] for n in range(rr.size)])
            lsum = (wm * ones).entries()
            if not want_d:
                for n, i in enumerate(rr.tolist()):
                    ls[i] = lsum[n]
                continue
            if cp.keep is not None:
                for n, j in zip(*np.nonzero(~cp.keep[rr]), strict=True):
                    wm[int(n), int(j)] = 0
            nv = (wm * vm).entries() if Ev else []
            for n, i in enumerate(rr.tolist()):
                acc = sum((nv[n * Ev + col] * cp.dom[i, col] for col in range(Ev)), zero)
                ls[i] = lsum[n]
                ds[i] = fa * acc / lsum[n]
    finally:
        ctx.prec = old
    return RowBalls(cp.m, ls, ds, cp.live.copy(), prec, want_d)


def column_gradients(cp: ColumnProblem, keys: list[int], prec: int, rb: RowBalls,
                     kind: str) -> list[list[Any]]:
    """dK (kind "dk") or dV ("dv") rows of the keys ``keys`` at ``prec`` bits from the
    row statistics ``rb``: the module docstring's formulas, one column per key."""
    from flint import arb, arb_mat, ctx

    L, S, Ev, E = cp.L, cp.S, cp.Ev, cp.E
    assert rb.has_d or kind == "dv"
    nk = len(keys)
    n_out = E if kind == "dk" else Ev
    old = ctx.prec
    try:
        ctx.prec = prec
        zero = arb(0)
        if nk == 0 or L == 0 or n_out == 0:
            return [[zero] * n_out for _ in range(nk)]
        kk = np.asarray(keys, dtype=np.int64)
        rows = np.flatnonzero(rb.live)
        ws = cp.weights(rows, kk, rb.m, prec)
        ctx.prec = prec
        fa = _fmpq_arb(cp.f) if cp.f != 1 else None
        keep = None if cp.keep is None else cp.keep[:, kk]
        allowed = cp.allowed[:, kk]
        cols: list[list[Any]] = [[zero] * L for _ in range(nk)]   # (key, row): dS or W
        if kind == "dk":
            x = (cp.dom * to_arb_mat(np.ascontiguousarray(cp.v[kk].T))).entries() if Ev else \
                [zero] * (L * nk)
        for n, i in enumerate(rows.tolist()):
            inv = 1 / rb.l[i]
            d_i = rb.d[i]
            for m_ in range(nk):
                if not allowed[i, m_]:
                    continue
                p = ws[n * nk + m_] * inv
                kept = keep is None or bool(keep[i, m_])
                if kind == "dk":
                    dp = (x[i * nk + m_] if fa is None else x[i * nk + m_] * fa) if kept \
                        else zero
                    cols[m_][i] = p * (dp - d_i)
                elif kept:
                    cols[m_][i] = p if fa is None else p * fa
        if kind == "dv" and cp.uniform.any():
            w_u = (arb(1) if fa is None else fa) / S
            for i in np.flatnonzero(cp.uniform).tolist():
                for m_ in range(nk):
                    if keep is None or keep[i, m_]:
                        cols[m_][i] = w_u
        if kind == "dk":
            ents = ((arb_mat(cols) * cp.qm) * scale_arb(cp.scale, E)).entries()
        else:
            ents = (arb_mat(cols) * cp.dom).entries()
        return [ents[m_ * n_out:(m_ + 1) * n_out] for m_ in range(nk)]
    finally:
        ctx.prec = old


class ColumnTier3:
    """The column path over the problems of one gradient call: ``make(e)`` gives problem
    e's :class:`ColumnProblem` (None where the path does not apply), ``tier2(e)`` its
    :class:`.dd.HeadTier2` (or None).  Kept: the last problems' inputs and every row
    statistics formed (O(L) balls each) — tier 2's at up to T2_MAX_PREC bits, Arb's
    at the precision asked for beyond that (or where tier 2's are not certified)."""

    T2_MAX_PREC = 128
    KEEP = 2   # a problem holds its (L, S) mask arrays: only the last few are kept

    def __init__(self, make: Callable[[int], ColumnProblem | None],
                 tier2: Callable[[int], Any]) -> None:
        self.make, self.tier2 = make, tier2
        self._problems: dict[int, ColumnProblem | None] = {}
        self._balls: dict[tuple[int, int], RowBalls | None] = {}

    def problem(self, e: int) -> ColumnProblem | None:
        if e not in self._problems:
            while len(self._problems) >= self.KEEP:
                del self._problems[next(iter(self._problems))]
            cp = self.make(e)
            self._problems[e] = cp if cp is not None and cp.ok else None
        return self._problems[e]

    def balls(self, e: int, cp: ColumnProblem, prec: int, tier2: int = 1,
              kind: str = "dk") -> RowBalls:
        """Problem e's row statistics for ``prec`` bits: tier 2's (``tier2`` 1; 2: with
        D sharpened, :func:`tier2_sharp_d`), at up to T2_MAX_PREC bits and where
        certified, else Arb's at ``prec`` (without D for ``kind`` "dv", unless formed)."""
        if tier2 and prec <= self.T2_MAX_PREC:
            if (e, 0) not in self._balls:
                self._balls[(e, 0)] = tier2_balls(cp, self.tier2(e))
            got = self._balls[(e, 0)]
            if got is not None and tier2 == 2:
                if (e, 1) not in self._balls:
                    self._balls[(e, 1)] = tier2_sharp_d(cp, self.tier2(e), got)
                got = self._balls[(e, 1)]
            if got is not None:
                return got
        if len(self._balls) > 1 << 10:
            self._balls.clear()
        if kind == "dv" and (e, prec) not in self._balls:
            if (e, -prec) not in self._balls:
                self._balls[(e, -prec)] = arb_balls(cp, prec, want_d=False)
            got = self._balls[(e, -prec)]
        else:
            if (e, prec) not in self._balls:
                self._balls[(e, prec)] = arb_balls(cp, prec)
            got = self._balls[(e, prec)]
        assert got is not None
        return got

    def summed(self, es: list[int], keys: list[int], prec: int, kind: str,
               fmt: FloatFormat | None, cols: list[int] | None) -> list[list[Any]] | None:
        """dK or dV rows of ``keys`` at ``prec`` bits summed over the problems ``es``
        (an input's copies), or None where the column path does not apply to one of
        them (the caller's whole-problem path then).  With tier 2's statistics, the
        keys whose row (columns ``cols``, all when None) does not decide the rounding
        to ``fmt`` are formed again from Arb's statistics at ``prec``: the balls at
        ``prec`` are never wider than Arb's own at ``prec`` (Ziv's loop unchanged)."""
        cps = [self.problem(e) for e in es]
        if any(cp is None for cp in cps):
            return None
        n_out = cps[0].E if kind == "dk" else cps[0].Ev   # type: ignore[union-attr]
        out, used_t2 = self._sum(es, cps, keys, prec, kind, n_out, 1)
        # dV does not read D: its second try is Arb's statistics at once
        for source in ((2, 0) if kind == "dk" else (0,)):
            if not used_t2 or fmt is None or not keys:
                return out
            bad = undecided_rows(out, cols, fmt, prec)
            redo = [j for j, b in zip(keys, bad, strict=True) if b]
            if not redo:
                return out
            again, used_t2 = self._sum(es, cps, redo, prec, kind, n_out, source)
            pos = {j: n for n, j in enumerate(keys)}
            for j, row in zip(redo, again, strict=True):
                out[pos[j]] = row
        return out

    def _sum(self, es: list[int], cps: list[Any], keys: list[int], prec: int, kind: str,
             n_out: int, tier2: int) -> tuple[list[list[Any]], bool]:
        from flint import arb

        out: list[list[Any]] = [[arb(0)] * n_out for _ in keys]
        used_t2 = False
        for e, cp in zip(es, cps, strict=True):
            rb = self.balls(e, cp, prec, tier2, kind)
            used_t2 |= rb.prec == 0
            got = column_gradients(cp, keys, prec, rb, kind)
            out = [[a + x for a, x in zip(r, g, strict=True)] for r, g in zip(out, got, strict=True)]
        return out, used_t2


def undecided_rows(rows: list[list[Any]], cols: list[int] | None, fmt: FloatFormat,
                   prec: int) -> list[bool]:
    """Per row of balls: whether one of its columns ``cols`` (all when None) does not
    decide its rounding to ``fmt`` (the Arb tier's own test, at 2·prec bits)."""
    if not rows:
        return []
    need = list(range(len(rows[0]))) if cols is None else cols
    if not need:
        return [False] * len(rows)
    balls = [r[c] for r in rows for c in need]
    with Prec(2 * prec):
        ok, _ = _decide_balls(balls, fmt)
    good: Arr = np.asarray(np.asarray(ok, dtype=bool).reshape(len(rows), len(need)).all(axis=1))
    return [not bool(g) for g in good.tolist()]
