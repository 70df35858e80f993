"""The numba kernels of :mod:`.model_jit` (imported only when numba is installed).

Each kernel makes, per (row, key) element, the IEEE 754 operations of its numpy twin
in :mod:`.model` in the same order (numba compiles without fast-math: nothing is
reassociated or contracted into an FMA); the row maxima do not depend on the order
(NaN propagates as in ``np.max``); the row sums are numpy's own pairwise summation
(:func:`pairwise`, the algorithm of numpy's ``pairwise_sum`` for a contiguous row,
started from 0 as ``np.add.reduce`` does).  So the arrays are bit-identical to the
numpy steps' (tests/testing/forward/test_model_jit.py)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

Array = np.ndarray[Any, Any]

njit = numba.njit(cache=True, nogil=True, error_model="numpy")

_FMAX = float(np.finfo(np.float64).max)     # frozen into the compiled code
_TWO_M52 = 2.0**-52


@njit
def _block(a: Array, lo: int, n: int, neg0: Any = -0.0) -> Any:
    """numpy's pairwise sum of a[lo:lo + n] for n <= 128: 8 accumulators (fewer than 8
    terms: one, from -0.0); in a's dtype (``neg0``: −0.0 in it, np.float32(−0.0) for
    float32 rows: numpy sums float32 in float32)."""
    if n < 8:
        res = neg0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    m = n - (n % 8)
    while i < m:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit
def pairwise(a: Array, lo: int, n: int, stack: Array, vals: Array) -> float:
    """numpy's pairwise sum of a[lo:lo + n]: blocks of <= 128 terms (:func:`_block`),
    above that sum(first n2) + sum(rest), n2 = n/2 rounded down to a multiple of 8.
    The recursion unrolled on ``stack`` (int64 (64, 3): lo, n, state) and ``vals``
    ((64,) the left halves' sums): numba's on-disk cache does not keep recursive
    functions (a cached recursive kernel crashed)."""
    if n <= 128:
        return _block(a, lo, n)
    top = 0
    stack[0, 0], stack[0, 1], stack[0, 2] = lo, n, 0
    ret = 0.0
    while True:
        m = stack[top, 1]
        if stack[top, 2] == 0 and m > 128:          # split: the left half first
            stack[top, 2] = 1
            h = m // 2
            h -= h % 8
            stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = stack[top, 0], h, 0
            top += 1
            continue
        ret = _block(a, stack[top, 0], m)           # a leaf
        top -= 1
        while top >= 0:                             # hand the sum up
            if stack[top, 2] == 1:                  # left half done: the right one next
                vals[top] = ret
                stack[top, 2] = 2
                h = stack[top, 1] // 2
                h -= h % 8
                stack[top + 1, 0] = stack[top, 0] + h
                stack[top + 1, 1] = stack[top, 1] - h
                stack[top + 1, 2] = 0
                top += 1
                break
            ret = vals[top] + ret                   # both halves: their sum
            top -= 1
        if top < 0:
            return ret


@njit
def row_sums(a: Array) -> Array:
    """np.sum(a, axis=-1) of a C-contiguous (R, S) array."""
    R, S = a.shape
    out = np.empty(R)
    stack, vals = np.empty((64, 3), np.int64), np.empty(64)
    for i in range(R):
        out[i] = 0.0 + pairwise(a[i], 0, S, stack, vals)
    return out


@njit
def _mx(m: float, x: float) -> float:
    """One step of np.max: NaN wins."""
    return x if (x > m or x != x) else m


@njit
def weight_errors(spread: Array, arg_rel: Array, ua: float, c0: float, s_nw: float,
                  sq_nw: float, g_theta_w: Array, r: Array, r1: Array, var_w: Array,
                  F: Array) -> None:
    """model._weight_errors' per-key arrays (its formulas, operation by operation)."""
    R, S = spread.shape
    a2 = 2.0 * ua
    c1 = 1.0 + c0
    for i in range(R):
        gt = 1.0 + g_theta_w[i]
        for j in range(S):
            sp = spread[i, j]
            rr = c0 + arg_rel[i, j] * c1
            r[i, j] = rr
            r1[i, j] = s_nw + a2 * sp
            t = ua * sp
            var_w[i, j] = 2.0 * (t * t) + sq_nw
            F[i, j] = (1.0 + rr) * gt - 1.0


@njit
def probabilistic(p: Array, N: Array, var_s: Array, var_w: Array, r: Array, r1: Array,
                  ex: Array, F: Array, D: Array, sh: Array, allowed: Array,
                  g_theta_p: Array, ww: Array, stats: Array) -> None:
    """model._probabilistic's passes over the keys: ww = on(N p p (σS + σW)) and, per
    row (``stats`` (8, R)): max D, max Sh, Σ on(p r), Σ on(N p p σW), max on(ex + (1 +
    ex) F), max F, max ex, max on(max(Fp − F1, 0)), with Fp = (1 + r)(1 + g_θp) − 1 and
    F1 = r1 + g_θp; masked keys count 0 in the maxima (model._rowmax)."""
    R, S = p.shape
    b1 = np.empty(S)
    b2 = np.empty(S)
    stack, vals = np.empty((64, 3), np.int64), np.empty(64)
    for i in range(R):
        g = g_theta_p[i]
        g1 = 1.0 + g
        mD = mS = mfx = mF = mex = m3 = 0.0
        for j in range(S):
            if allowed[i, j]:
                pj = p[i, j]
                npp = N[i, j] * pj * pj
                vw = var_w[i, j]
                ww[i, j] = npp * (var_s[i, j] + vw)
                b1[j] = pj * r[i, j]
                b2[j] = npp * vw
                e = ex[i, j]
                f = F[i, j]
                dd = D[i, j]
                ss = sh[i, j]
                fxv = e + (1.0 + e) * f
                d3 = ((1.0 + r[i, j]) * g1 - 1.0) - (r1[i, j] + g)
                d3 = d3 if (d3 >= 0.0 or d3 != d3) else 0.0
            else:
                ww[i, j] = 0.0
                b1[j] = 0.0
                b2[j] = 0.0
                dd = ss = fxv = f = e = d3 = 0.0
            if j == 0:
                mD, mS, mfx, mF, mex, m3 = dd, ss, fxv, f, e, d3
            else:
                mD = _mx(mD, dd)
                mS = _mx(mS, ss)
                mfx = _mx(mfx, fxv)
                mF = _mx(mF, f)
                mex = _mx(mex, e)
                m3 = _mx(m3, d3)
        stats[0, i] = mD
        stats[1, i] = mS
        stats[2, i] = 0.0 + pairwise(b1, 0, S, stack, vals)
        stats[3, i] = 0.0 + pairwise(b2, 0, S, stack, vals)
        stats[4, i] = mfx
        stats[5, i] = mF
        stats[6, i] = mex
        stats[7, i] = m3


@njit
def score_errors(t: Array, A: Array, t_top: Array, allowed: Array, ua: float, gE: float,
                 n_dot: float, eta_a: float, c4: float, g_eval: float, sh: Array,
                 var_s: Array, D: Array, d_eval_row: Array) -> None:
    """model._score_errors and _finish_score_errors on their plain path (a fused
    kernel without stores, mask values, input errors or variant extras; scores
    centred at the top key): Sh = u_a|t − t_top| (FMAX where not finite, 0 where
    masked), σS = n_dot (u_a A (1 + γ_E))² + (u_a t)², I = γ_E A + u_a|t| + η_a,
    d_eval = g_eval A + 2^-52 |t|, D = on((Sh + I) c4 + 2 d_eval) (FMAX/4 where not
    finite) and the row maxima of d_eval (masked keys 0)."""
    R, S = t.shape
    g1 = 1.0 + gE
    for i in range(R):
        tt = t_top[i]
        m = 0.0
        for j in range(S):
            tj = t[i, j]
            aj = A[i, j]
            s0 = abs(tj - tt) * ua
            at = abs(tj)
            x = ua * aj * g1
            y = ua * tj
            var_s[i, j] = n_dot * (x * x) + y * y
            ind = (gE * aj + ua * at) + eta_a
            de = g_eval * aj + _TWO_M52 * at
            if allowed[i, j]:
                if not np.isfinite(s0):
                    s0 = _FMAX
                dd = (s0 + ind) * c4 + 2.0 * de
                if not np.isfinite(dd):
                    dd = _FMAX / 4
                dv = de
            else:
                s0 = 0.0
                dd = 0.0
                dv = 0.0
            sh[i, j] = s0
            D[i, j] = dd
            m = dv if j == 0 else _mx(m, dv)
        d_eval_row[i] = m


@njit
def log_weights(s: Array, lse: Array, D: Array, allowed: Array, logp: Array, ld: Array,
                stats: Array) -> None:
    """model._log_perturbation's first passes: logp = on(s − lse, −inf), ld = on(logp +
    D, −inf) and per row (``stats`` (2, R)) max ld and max(0, max on(|s|, 0))."""
    R, S = s.shape
    for i in range(R):
        li = lse[i]
        m = -np.inf
        mag = 0.0
        for j in range(S):
            if allowed[i, j]:
                sj = s[i, j]
                lp = sj - li
                x = lp + D[i, j]
                a = abs(sj)
            else:
                lp = -np.inf
                x = -np.inf
                a = 0.0
            logp[i, j] = lp
            ld[i, j] = x
            m = x if j == 0 else _mx(m, x)
            mag = _mx(mag, a)
        stats[0, i] = m
        stats[1, i] = mag


@njit
def shifted_scores(s: Array, allowed: Array, a2ua: float, cap: float, d: Array,
                   spread: Array, arg: Array, smax: Array, top: Array) -> None:
    """model._exact_weights' passes before the exp and _weight_errors' before the
    expm1: the row maximum m of on(s, −inf) (0 when not finite), d = on(s, −inf) − m,
    spread = on(m − s, 0), arg = min(2u_a spread, cap) (np.minimum: NaN kept), and
    _score_errors' top key np.argmax(on(s, −inf)) (numpy's rule: the first maximum,
    the first NaN if any)."""
    R, S = s.shape
    for i in range(R):
        m = -np.inf
        bm = -np.inf
        ti = 0
        done = False
        for j in range(S):
            x = s[i, j] if allowed[i, j] else -np.inf
            m = x if j == 0 else _mx(m, x)
            if j == 0:
                bm = x
                done = x != x
            elif not done and not (x <= bm):
                bm = x
                ti = j
                done = x != x
        top[i] = ti
        if not np.isfinite(m):
            m = 0.0
        smax[i] = m
        for j in range(S):
            if allowed[i, j]:
                sj = s[i, j]
                d[i, j] = sj - m
                sp = m - sj
            else:
                d[i, j] = -np.inf - m
                sp = 0.0
            spread[i, j] = sp
            a = a2ua * sp
            arg[i, j] = a if (a <= cap or a != a) else cap


@njit
def level_errors(o: Array, m: Array, a: Array, all_pos: bool, ok_any: Array,
                 res: Array) -> None:
    """One emulation's pass of emulated.DtypeLevel._tolerance, (N, Ev) arrays: fin =
    o and m finite, err = |o − m| (0 where not fin), rel = err / a (all a > 0) or err
    / a where fin and a > 0, else 0; ``ok_any`` (N,) |= every element fin or m NaN, and
    not every o NaN; ``res`` = (max err, max rel: NaN when some rel is, as np.max)."""
    N, Ev = o.shape
    emax = -np.inf
    rmax = -np.inf
    rnan = False
    for i in range(N):
        all_ok = True
        all_nan = True
        for j in range(Ev):
            oi = o[i, j]
            mi = m[i, j]
            f = np.isfinite(oi) and np.isfinite(mi)
            e = abs(oi - mi) if f else 0.0
            if all_pos:
                rel = e / a[i, j]
            else:
                ai = a[i, j]
                rel = e / ai if (f and ai > 0) else 0.0
            if e > emax:
                emax = e
            if rel != rel:
                rnan = True
            elif rel > rmax:
                rmax = rel
            all_ok = all_ok and (f or mi != mi)
            all_nan = all_nan and oi != oi
        if all_ok and not all_nan:
            ok_any[i] = True
    res[0] = emax
    res[1] = np.nan if rnan else rmax


@njit
def _min1(v: float) -> float:
    """np.minimum(v, 1.0) (NaN kept)."""
    return v if (v <= 1.0 or v != v) else 1.0


@njit
def perturbed_weights(rows: Array, allowed: Array, p: Array, ex: Array, x: Array,
                      F: Array, cap: float, dps: Array, ptil: Array, dpw: Array) -> bool:
    """model._perturbed_weights for the rows ``rows`` when no allowed key has p = 0 or
    x >= cap (returns False, the arrays unfinished, when one has: the log-space
    branch is numpy's): dps = min(p ex, 1), p̃ = min(p (1 + ex), 1) (NaN → 1), dpw =
    min(p̃ F, 1); masked keys 0."""
    n = rows.shape[0]
    S = p.shape[1]
    for a in range(n):
        i = rows[a]
        for j in range(S):
            if allowed[i, j]:
                pj = p[i, j]
                if not (pj > 0 and x[i, j] < cap):
                    return False
                e = ex[i, j]
                d = _min1(pj * e)
                t = _min1(pj * (1.0 + e))
                d = 1.0 if d != d else d
                t = 1.0 if t != t else t
                dps[a, j] = d
                ptil[a, j] = t
                dpw[a, j] = _min1(t * F[i, j])
            else:
                dps[a, j] = 0.0
                ptil[a, j] = 0.0
                dpw[a, j] = 0.0
    return True


@njit
def verdict_pass(a: Array, lower: Array, upper: Array, tol: Array, mid: Array, vac: Array,
                 hull: Array, has_hull: bool, tiny: float, ulp_scale: float, bad: Array,
                 counts: Array, where: Array, vals: Array) -> None:
    """testing.verdict._verdict's elementwise pass over flat arrays: ``bad``, and
    counts = (bad, vacuous not bad, non-finite, missing NaN, outside the hull),
    where = (first non-finite, worst ratio, largest error; -1 for none), vals = (the
    largest ulp count over the counted elements, NaN for none), with the
    definitions, maxima and first-index argmaxima of the numpy code."""
    n = a.shape[0]
    n_bad = n_vac = n_nf = n_miss = n_hull = 0
    first_nf = worst_i = maxe_i = -1
    best_r = -1.0
    best_e = -1.0
    max_u = -np.inf
    any_counted = False
    for i in range(n):
        x = a[i]
        lo = lower[i]
        hi = upper[i]
        m = mid[i]
        exact_nan = lo != lo or hi != hi
        xfin = np.isfinite(x)
        nonfinite = (not xfin) and not exact_nan
        missing = exact_nan and x == x
        finite = xfin and not exact_nan
        judged = finite and not vac[i]
        err = abs(x - m)
        b = nonfinite or missing
        if judged:
            d1 = x - hi
            d2 = lo - x
            d = d1 if (d1 >= d2 or d1 != d1) else d2
            d = d if (d >= 0.0 or d != d) else 0.0
            t = tol[i]
            if d > t:
                b = True
            r = err / (t if t > 0 else 0.0) if err > 0 else 0.0
            if r != r:
                r = np.inf
            if r > best_r:
                best_r = r
                worst_i = i
        if has_hull and hull[i] and finite:
            b = True
            n_hull += 1
        bad[i] = b
        if b:
            n_bad += 1
        elif finite and vac[i]:
            n_vac += 1
        if nonfinite:
            n_nf += 1
            if first_nf < 0:
                first_nf = i
        if missing:
            n_miss += 1
        if finite:
            if err > best_e or maxe_i < 0:
                best_e = err
                maxe_i = i
            if abs(m) >= tiny:
                _fr, ex = math.frexp(abs(m))
                u = err / (math.ldexp(1.0, ex - 1) * ulp_scale)
                any_counted = True
                if u > max_u or u != u:
                    max_u = u
    counts[0], counts[1], counts[2], counts[3], counts[4] = n_bad, n_vac, n_nf, n_miss, n_hull
    where[0], where[1], where[2] = first_nf, worst_i, maxe_i
    vals[0] = max_u if any_counted else np.nan


@njit
def level_tolerance(a: Array, a2: Array, has_a2: bool, m: Array, ok_any: Array,
                    covered: Array, flush_t: Array, has_flush: bool, rows_per_b: int,
                    c1: float, c2: float,
                    tiny: float, ulp_lo: float, ulp_scale: float, tol: Array,
                    und: Array) -> None:
    """emulated.DtypeLevel._tolerance after its emulations' pass, (N, Ev) arrays: t =
    c1 a (+ c2 a2) (+ the flushing term of the row's batch element), bad scale = t not
    finite or a = 0 ≠ m (m not NaN), und = row not run or t ≥ a > 0 or bad scale, tol =
    0 where bad scale, rows outside every group 0 / decided, plus ulp(m) (tolerance.ulp:
    2^⌊log2|m|⌋ clamped at 2^emin ``tiny``, ``ulp_lo`` for inf and NaN, times 2^(1−p))."""
    N, Ev = a.shape
    for i in range(N):
        ft = flush_t[i // rows_per_b]
        run = ok_any[i]
        cov = covered[i]
        for j in range(Ev):
            aj = a[i, j]
            mj = m[i, j]
            t = c1 * aj
            if has_a2:
                t = t + c2 * a2[i, j]
            if has_flush:
                t = t + ft
            bad_scale = (not np.isfinite(t)) or (aj == 0 and mj != 0 and mj == mj)
            u = (not run) or (t >= aj and aj > 0) or bad_scale
            x = 0.0 if bad_scale else t
            if not cov:
                x = 0.0
                u = False
            am = abs(mj)
            if not np.isfinite(am):
                pw = ulp_lo
            else:
                if am >= 2.0**-1022:
                    _fr, ex = math.frexp(am)
                    pw = math.ldexp(1.0, ex - 1)
                else:
                    pw = 0.0
                if pw < tiny:
                    pw = tiny
            tol[i, j] = x + pw * ulp_scale
            und[i, j] = u



_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)     # Fibonacci hashing of the score's bits
_EMPTY = np.uint64(0x7FF8DEADBEEF0001)        # a NaN's bits: never a key (NaNs are skipped)


@njit
def _slot(table: Array, b: Any, shift: Any, mask: int) -> int:
    """The slot of bits ``b`` in the open-addressing ``table``: b's, or the empty one
    where b would go (linear probing)."""
    h = np.int64(((b ^ (b >> np.uint64(29))) * _HASH_MUL) >> shift)
    while table[h] != _EMPTY and table[h] != b:
        h = (h + 1) & mask
    return h


@njit
def _fill(bits: Array, s: Array, allowed: Array, i: int, table: Array, cnt: Array,
          used: Array, shift: Any, mask: int, count: bool) -> tuple[int, bool]:
    """Row i's allowed non-NaN scores into ``table`` (their bits, −0 as +0; ``cnt`` the
    multiplicities when ``count``, else stopping at the first repeat): (slots used,
    whether a score repeated)."""
    n = 0
    dup = False
    for j in range(s.shape[1]):
        x = s[i, j]
        if not allowed[i, j] or x != x:
            continue
        b = bits[i, j] if x != 0.0 else np.uint64(0)
        h = _slot(table, b, shift, mask)
        if table[h] == b:
            dup = True
            if not count:
                break
            cnt[h] += 1
        else:
            table[h] = b
            cnt[h] = 1
            used[n] = h
            n += 1
    return n, dup


@njit
def tie_counts(s: Array, bits: Array, allowed: Array, out: Array) -> None:
    """moments._tie_counts: ``out`` (R, S), preset to 1 by the caller, gets for each
    allowed key the number of allowed keys of its row with exactly its score (``==`` of
    float64: −0 equals +0, NaN equals nothing, so a NaN score counts 1); ``bits`` is
    ``s`` viewed as uint64.  Per row a hash table (>= 8S slots, only the used ones
    reset) finds whether a score repeats; only such rows are counted (a second pass)."""
    R, S = s.shape
    size = 16
    lg = 4
    while size < 8 * S:
        size *= 2
        lg += 1
    shift = np.uint64(64 - lg)
    mask = size - 1
    table = np.full(size, _EMPTY, np.uint64)
    cnt = np.zeros(size, np.int64)
    used = np.empty(S, np.int64)
    for i in range(R):
        n, dup = _fill(bits, s, allowed, i, table, cnt, used, shift, mask, False)
        for m in range(n):
            table[used[m]] = _EMPTY
        if not dup:
            continue
        n, dup = _fill(bits, s, allowed, i, table, cnt, used, shift, mask, True)
        for j in range(S):
            x = s[i, j]
            if allowed[i, j] and x == x:
                b = bits[i, j] if x != 0.0 else np.uint64(0)
                out[i, j] = float(cnt[_slot(table, b, shift, mask)])
        for m in range(n):
            table[used[m]] = _EMPTY


# --------------------------------------------------------------------------------------
# The dtype level's online order (emulated._online): one key block's passes in float32


@njit
def online_scores(s: Array, allowed: Array, madd: Array, has_madd: bool, c2: Any,
                  m: Array, m_new: Array, safe: Array, p: Array) -> None:
    """The block's passes before its exp2 (float32, ``s`` the block's q kᵀ): s·c2 (+
    the mask's scaled terms), −inf where masked, m_new = np.maximum(m, row max) (NaN
    propagates), safe = m_new where finite else 0, p = s − safe."""
    R, n = s.shape
    ninf = np.float32(-np.inf)
    zero = np.float32(0.0)
    for i in range(R):
        mx = ninf
        for j in range(n):
            x = s[i, j] * c2
            if has_madd:
                x = x + madd[i, j]
            if not allowed[i, j]:
                x = ninf
            s[i, j] = x
            mx = x if j == 0 else _mx(mx, x)
        mi = m[i]
        mn = mi if (mi != mi or not (mx > mi or mx != mx) or n == 0) else mx
        m_new[i] = mn
        sf = mn if np.isfinite(mn) else zero
        safe[i] = sf
        for j in range(n):
            p[i, j] = s[i, j] - sf


@njit
def online_weights(p: Array, allowed: Array, lsum: Array, alpha: Array, kappa: Array,
                   has_kappa: bool) -> None:
    """The block's passes after its exp2 (float32): 0 where masked, lsum = lsum·alpha +
    the row's pairwise sum (numpy's float32 np.sum), then p·κ (dropout)."""
    R, n = p.shape
    zero = np.float32(0.0)
    for i in range(R):
        for j in range(n):
            if not allowed[i, j]:
                p[i, j] = zero
        lsum[i] = lsum[i] * alpha[i] + (zero + _block(p[i], 0, n, np.float32(-0.0)))
        if has_kappa:
            for j in range(n):
                p[i, j] = p[i, j] * kappa[i, j]
