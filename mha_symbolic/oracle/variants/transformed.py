"""Attention whose scores pass through a softcap (or carry a bias that is not a
double): a proved fast path by perturbation, and an Arb fallback with ``tanh``.

**Fast path.**  Compute float64 scores s̃_ij of the exact scores s_ij with a proved
per-row bound δ_i >= max_j |s̃_ij - s_ij| (steps in :func:`_float_scores`).  The
s̃_ij are doubles, so *plain attention of the scores s̃* is an exact problem that the
plain fast path (:func:`.fast.tier1_block`, given s̃ as an exact additive mask on
zero-width queries and keys) encloses: ỹ ± err.  Then the perturbation lemma:

    if |s_j - s̃_j| <= δ for every kept key (the sink included, with v = 0), write
    D = Σ_k e^{s_k}, D̃ = Σ_k e^{s̃_k}.  Since Σ_j e^{s̃_j}(v_j - ỹ) = 0,
    D(y - ỹ) = Σ_j e^{s_j}(v_j - ỹ) = Σ_j e^{s̃_j}(e^{s_j - s̃_j} - 1)(v_j - ỹ), so
    |y - ỹ| <= (e^δ - 1)(D̃/D) Σ_j p̃_j |v_j - ỹ| <= (e^δ - 1) e^δ (Σ_j p̃_j |v_j| + |ỹ|);
    and p_j/p̃_j = e^{s_j - s̃_j} D̃/D ∈ [e^{-2δ}, e^{2δ}]: |p_j - p̃_j| <= (e^{2δ} - 1) p̃_j,

with e^x - 1 <= x(1 + x) for 0 <= x <= 1.  Rows with δ > 2^-10 go to Arb.

**Arb fallback** (:class:`TransformedProblem`): the exact scores as balls — q·k in
ball arithmetic, the scale, ``C · tanh(s / C)`` with Arb's ``tanh``, the exact
biases, the float mask — then the shifted softmax and weighted sum of
:func:`.arb.arb_attention_rows`; precision raised until the rounding is decided.
Exact ties: keys with equal (q·k, biases, mask) have equal scores (the pipeline is a
function of them), so each row's keys are grouped by those exact rationals; a value
equal to every group's mean value is then the output exactly (sufficient, not
necessary — with a softcap the scores are transcendental and the
Lindemann–Weierstrass argument of :mod:`.forward` is not available), and the side
of a rounding boundary is decided from the groups as in :mod:`.forward`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ..arith.balls import EXP_FLOOR, Prec, exact_prec, exact_score_rows, to_arb_mat
from ..arith.constants import CHUNK_ELEMS, ETA, UP, U, gamma
from ..arith.dd import dd_add_d, dd_div, dd_mul_d, two_prod
from ..arith.products import norm_up
from ..arith.tanh import (
    _R,
    ABS_TANH,
    ABS_TANH_DD,
    REL_TANH_LARGE,
    REL_TANH_SMALL,
    TANH_SMALL,
    _mul_factor,
    _rowmax,
    _sech2_dd_err,
    _tanh_dd,
    sech2_proved,
    softcap_array,
    softcap_rows,
)
from ..conventions import Block, dd_scale, exact_scale, masked_rows_of
from ..enclosure import Enclosure, Problem
from ..forward.dd import KVdd, Scores, dd_scores, tier2_from_scores
from ..forward.fast import KV, tier1_block
from .semantics import Bias, Cap, Geometry

__all__ = ["TransformedProblem", "transformed_attention"]

def _float_scores(q: np.ndarray[Any, Any], k: np.ndarray[Any, Any],
                  allowed: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None,
                  ops: tuple[Cap | Bias, ...], geo: Geometry, flat: range, c_f: float,
                  rho_c: float, rows: slice | None = None, want_factor: bool = False,
                  extra: np.ndarray[Any, Any] | None = None
                  ) -> tuple[np.ndarray[Any, Any], ...]:
    """(s̃ (C, L, S) float64, δ (C, L)) with |s̃_ij - s_ij| <= δ_i on every kept key;
    ``rows``: q holds those query rows only (the biases follow); ``want_factor``: also
    (Φ̃, e_Φ) (C, L, S) with |Φ - Φ̃| <= e_Φ for the derivative Φ = ∂s/∂(c q·k), the
    product over the softcaps of sech²(x) at each cap's argument x (step 5).

    Error steps (each a bound on a row maximum, adding up; |fl(x)| <= |x|(1 + u) + ETA
    lets the row maximum of a rounded product be bounded from its factor's):
    1. G = fl(q kᵀ): gamma_E ||q_i|| max_j ||k_j|| + E·ETA (as :func:`.fast.tier1_block`),
       plus ``extra`` (C, L) when q, k are float approximations of the exact vectors
       whose products are wanted (rotary: :meth:`.rotary.Rotation.float_chunk`).
    2. s = fl(c_f·G): rho_c |G| + (|c_f| + rho_c)·err_G + _R|s| + ETA.
    3. Cap C: x = fl(s/C), t = tanh_proved(x), s' = fl(C·t).  C·tanh(·/C) is
       1-Lipschitz, so the incoming error passes unchanged; fl(s/C) moves the
       argument by <= _R|s|/C + ETA, i.e. the result by <= _R|s| + C·ETA; the tanh
       errs by <= C·(|t|·REL + ABS_TANH) = |s'|·REL + C·ABS_TANH, REL = REL_TANH_SMALL
       when every |x| of the row is <= TANH_SMALL (checked on the bound
       max|s|(1 + 2u)/C), else REL_TANH_LARGE; the product rounds by _R|s'| + ETA.
    4. Bias b: fl(b) is exact or errs by <= _R|fl(b)| + ETA; the sum rounds by
       _R|s'| + ETA.  The float mask (exact doubles) adds one rounding likewise.
    5. Factor: at a cap, x~ = fl(s~/C) is within e_x = err/C + _R|x~| + ETA of the
       exact argument (err the row's bound before the cap); :func:`sech2_proved` gives
       sech²(x~) with its bound for every x within e_x; factors of several caps
       multiply: |AB - fl(a~b~)| <= e_a(b~ + e_b) + a~ e_b + u|fl(a~b~)| + η.
    """
    E = q.shape[-1]
    al = None if allowed.all() else allowed
    G = np.matmul(q, np.swapaxes(k, -1, -2))
    nq, nk = norm_up(q), norm_up(k)
    err = gamma(max(E, 1)) * nq * np.max(nk, axis=-1, initial=0.0)[:, None] + E * ETA
    if extra is not None:  # q, k themselves within a bound of exact ones (rotary), per row
        err = err + extra
    op0 = ops[0] if ops else None
    capped = None
    phi: np.ndarray[Any, Any] | None = None
    e_phi: np.ndarray[Any, Any] | None = None
    if isinstance(op0, Cap):
        # the scale and the first softcap in one pass, with both row maxima
        with np.errstate(over="ignore", invalid="ignore"):
            capped, gmax, cap_max = softcap_rows(G, c_f, op0.C, al)
        s = capped
    else:
        gmax = _rowmax(G, al)
        s = G
        s *= c_f
    smax = abs(c_f) * gmax * (1.0 + 2.0 * U) + ETA  # >= max |fl(c_f G)| of the row
    err = rho_c * gmax + (abs(c_f) + rho_c) * err + _R * smax + ETA
    for n_op, op in enumerate(ops):
        if isinstance(op, Cap):
            C = op.C
            if want_factor:
                with np.errstate(over="ignore", invalid="ignore"):
                    s_in = G * c_f if (n_op == 0 and capped is not None) else s
                    x = s_in / C
                    e_x = ((err / C)[..., None] + _R * np.abs(x) + ETA) * UP
                    f, e_f = sech2_proved(x, e_x)
                if phi is None or e_phi is None:
                    phi, e_phi = f, e_f
                else:
                    p2 = phi * f
                    e_phi = (e_phi * (f + e_f) + phi * e_f + U * p2 + ETA) * UP
                    phi = p2
            if not (n_op == 0 and capped is not None):
                with np.errstate(over="ignore", invalid="ignore"):
                    s = softcap_array(s, C)
            small = smax * (1.0 + 2.0 * U) / C + ETA <= TANH_SMALL
            rel = np.where(small, REL_TANH_SMALL, REL_TANH_LARGE)
            new_max = cap_max if (n_op == 0 and capped is not None) else _rowmax(s, al)
            err = (err + _R * smax + C * ETA + new_max * rel + C * ABS_TANH
                   + _R * new_max + ETA)
            smax = new_max
        else:
            vals, exact = op.floats(geo, flat, rows)
            if not exact:
                err = err + _R * _rowmax(vals, al) + ETA
            s = s + vals
            smax = _rowmax(s, al)
            err = err + _R * smax + ETA
    if madd is not None:
        s = s + madd
        smax = _rowmax(s, al)
        err = err + _R * smax + ETA
    if not want_factor:
        return s, err * UP
    if phi is None or e_phi is None:
        phi, e_phi = np.ones_like(s), np.zeros_like(s)
    return s, err * UP, phi, e_phi


def _softmax_rows_arb(scores: list[list[Any]], allowed: np.ndarray[Any, Any], vm: Any,
                      kind: str) -> list[list[Any]]:
    """Rows of attention from score balls at the current precision: shifted by the
    exact midpoint of a near-maximal kept score (softmax(s) = softmax(s - m) for every
    real m), exponentials below EXP_FLOOR enclosed in [0, e^EXP_FLOOR] (Arb's exp of
    such arguments can be the whole real line).  kind "output": Σ_j w_j v_j / Σ_j w_j
    per row (vm the values wanted); "weights": w_j / Σ_k w_k."""
    from flint import arb, arb_mat

    r = len(scores)
    S = allowed.shape[1]
    zero = arb(0)
    tiny = (arb(EXP_FLOOR).exp() * arb(0.5, 0.5)).nonnegative_part()
    w_rows = []
    for i in range(r):
        idx = np.flatnonzero(allowed[i]).tolist()
        shift = scores[i][max(idx, key=lambda j: scores[i][j].mid())].mid()
        row = [zero] * S
        for j in idx:
            t = scores[i][j] - shift
            row[j] = tiny if t.upper() < EXP_FLOOR else t.exp()
        w_rows.append(row)
    wm = arb_mat(w_rows) if r and S else arb_mat(r, S)
    ones = arb_mat(S, 1)
    for j in range(S):
        ones[j, 0] = 1
    d = (wm * ones).entries() if S else [arb(0)] * r
    if kind == "weights":
        return [[w_rows[i][j] / d[i] for j in range(S)] for i in range(r)]
    Ev = vm.ncols()
    if Ev == 0:
        return [[] for _ in range(r)]
    nm = (wm * vm).entries()
    return [[nm[i * Ev + col] / d[i] for col in range(Ev)] for i in range(r)]


class TransformedProblem(Problem):
    """Rows of attention with a score pipeline, in Arb (see the module docstring)."""

    def __init__(self, q: Any, k: Any, v: Any, allowed: Any, madd: Any,
                 ops: tuple[Cap | Bias, ...], sinks: Any, scale: Fraction | None, E: int,
                 geo: Geometry, uniform: Any = None) -> None:
        self.uniform = uniform  # (B, L) rows of uniform weights (masked_rows="uniform")
        self._kvdd: tuple[int, Any] | None = None
        self.q, self.k, self.v = q, k, v
        self.allowed, self.madd, self.ops, self.sinks = allowed, madd, ops, sinks
        self.scale, self.E, self.geo = scale, E, geo
        self._km: dict[int, Any] = {}
        self._groups_cache: dict[tuple[int, int], dict[Any, list[int]]] = {}

    # -- exact pieces -------------------------------------------------------------
    def _scale_arb(self) -> Any:
        from flint import arb

        if self.scale is not None:
            return arb(self.scale.numerator) / arb(self.scale.denominator)
        return arb(0) if self.E == 0 else arb(self.E).rsqrt()

    def _pipeline(self, s: Any, biases: list[Fraction], m: Fraction) -> Any:
        """The score pipeline on one ball s = c·q·k, with the exact biases in order."""
        from flint import arb, fmpq

        it = iter(biases)
        for op in self.ops:
            if isinstance(op, Cap):
                c = arb(op.C)
                s = c * (s / c).tanh()
            else:
                bv = next(it)
                s = s + arb(fmpq(bv.numerator, bv.denominator))
        if m:
            s = s + arb(fmpq(m.numerator, m.denominator))
        return s

    def _score_row(self, b: int, i: int, keep: list[int], g: list[Any], c: Any,
                   factor: list[Any] | None = None) -> list[Any]:
        """The pipeline on the kept keys of one row, pass by pass (same mathematics as
        :meth:`_pipeline`, fewer Python calls); ``factor`` (a list of ones, one per kept
        key) is multiplied by sech²(x) at every cap's argument x: ∂s/∂(c q·k)."""
        from flint import arb

        row = [x * c for x in g]
        for op in self.ops:
            if isinstance(op, Cap):
                cc = arb(op.C)
                if factor is not None:
                    factor[:] = [f * (x / cc).sech() ** 2 for f, x in zip(factor, row,
                                                                         strict=True)]
                row = [cc * (x / cc).tanh() for x in row]
            elif op.kind == "alibi":
                slope = arb(float(op.data[b // self.geo.heads, b % self.geo.heads]))
                off = op.offset_of(b, self.geo.heads)
                row = [x - slope * abs(j - (i + off)) for x, j in zip(row, keep, strict=True)]
            else:
                row = [x + arb(float(op.exact(self.geo, b, i, j))) for x, j in zip(row, keep,
                                                                                 strict=True)]
        if self.madd is not None:
            row = [x + arb(float(self.madd[b, i, j])) for x, j in zip(row, keep, strict=True)]
        return row

    def _biases(self, b: int, i: int, j: int) -> list[Fraction]:
        return [op.exact(self.geo, b, i, j) for op in self.ops if isinstance(op, Bias)]

    def _m(self, b: int, i: int, j: int) -> Fraction:
        return Fraction(float(self.madd[b, i, j])) if self.madd is not None else Fraction(0)

    # -- the Problem interface ----------------------------------------------------
    def _dot_rows(self, b: int, rows: list[int], prec: int) -> list[list[Any]]:
        """The balls of q_i·k_j, i in ``rows``, every key j (exact here; a variant that
        changes q and k — rotary — overrides it)."""
        if b not in self._km:  # Kᵀ as an exact arb_mat, and the precision of exact dots
            self._km = {b: (to_arb_mat(self.k[b]).transpose(),
                            exact_prec(self.q[b], self.k[b], self.E))}
        kmT, k_prec = self._km[b]
        return exact_score_rows(np.asarray(self.q[b][rows]), kmT, k_prec)

    def _ident_score(self, b: int, i: int, ident: Any, js: list[int], c: Any) -> Any:
        """The score of a group of keys of row (b, i) from its identity (g, biases, m)."""
        from flint import arb, fmpq

        g, biases, m = ident
        return self._pipeline(c * arb(fmpq(g.numerator, g.denominator)), list(biases), m)

    def _arb_scores(self, b: int, rows: list[int], prec: int, want_factor: bool = True
                    ) -> tuple[list[list[Any]], list[list[Any]], np.ndarray[Any, Any]]:
        """(score balls, factor balls (ones without ``want_factor``), allowed) of ``rows``
        over the S keys and the sink's column (score σ, factor 1) at ``prec`` bits (call
        inside Prec(prec))."""
        from flint import arb

        S = self.k.shape[1]
        g_rows = self._dot_rows(b, rows, prec)
        c = self._scale_arb()
        zero, one = arb(0), arb(1)
        scores: list[list[Any]] = []
        factors: list[list[Any]] = []
        for r, i in enumerate(rows):
            keep = np.flatnonzero(self.allowed[b, i]).tolist()
            fac = [one] * len(keep)
            if self.uniform is not None and self.uniform[b, i]:
                kept = [zero] * len(keep)
            else:
                kept = self._score_row(b, i, keep, [g_rows[r][j] for j in keep], c,
                                       fac if want_factor else None)
            row = [zero] * S
            frow = [one] * S
            for j, x, f in zip(keep, kept, fac, strict=True):
                row[j], frow[j] = x, f
            if self.sinks is not None:
                row.append(arb(float(self.sinks[b])))
                frow.append(one)
            scores.append(row)
            factors.append(frow)
        allowed = np.asarray(self.allowed[b][rows])
        if self.sinks is not None:
            allowed = np.concatenate([allowed, np.ones((len(rows), 1), bool)], axis=1)
        return scores, factors, allowed

    def arb_rows(self, b: int, rows: list[int], prec: int, kind: str,
                 cols: list[int] | None = None) -> list[list[Any]]:
        S = self.k.shape[1]
        with Prec(prec):
            scores, _, allowed = self._arb_scores(b, rows, prec, want_factor=False)
            vb = self.v[b]
            if self.sinks is not None:
                vb = np.concatenate([vb, np.zeros((1, vb.shape[1]))], axis=0)
            if cols is not None and kind == "output":
                vb = vb[:, cols]
            out = _softmax_rows_arb(scores, allowed, to_arb_mat(vb), kind)
        if kind == "weights" and self.sinks is not None:
            out = [row[:S] for row in out]
        return out

    def arb_weights_factor(self, b: int, rows: list[int], prec: int
                           ) -> tuple[list[list[Any]], list[list[Any]]]:
        """Weights and factor balls of ``rows`` (all S keys, plus the sink's column
        with factor 1) at ``prec`` bits: the gradients' third tier."""
        with Prec(prec):
            scores, factors, allowed = self._arb_scores(b, rows, prec)
            weights = _softmax_rows_arb(scores, allowed, None, "weights")
        return weights, factors

    # -- tier 2 -------------------------------------------------------------------
    def refine(self, b: int, rows: np.ndarray[Any, Any], kind: str
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any],
                          np.ndarray[Any, Any]] | None:
        """Tier 2: the rows in double-double — the scores by :meth:`pipeline_dd` (exact
        dot products from BLAS slices, the scale as a double-double, the softcaps by
        :func:`_tanh_dd`, the biases exactly), then the plain tier 2's weights and sums
        (:func:`.dd_attention.tier2_from_scores`) with the score bound.  Rows the slices
        cannot take (scalings out of range) come back with ok = False."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return self._refine(b, np.asarray(rows), kind)

    def _kv(self, b: int) -> Any:
        """Keys and values of problem b sliced for exact products (cached for the last
        b); with sinks one more key and value, both 0 (its score is replaced by σ)."""

        if self._kvdd is None or self._kvdd[0] != b:
            k, v = self.k[b], self.v[b]
            if self.sinks is not None:
                k = np.concatenate([k, np.zeros((1, k.shape[1]))], axis=0)
                v = np.concatenate([v, np.zeros((1, v.shape[1]))], axis=0)
            self._kvdd = (b, KVdd(np.ascontiguousarray(k), np.ascontiguousarray(v)))
        return self._kvdd[1]

    def pipeline_dd(self, b: int, rows: np.ndarray[Any, Any],
                    keys: np.ndarray[Any, Any] | None = None, want_factor: bool = False
                    ) -> tuple[np.ndarray[Any, Any], ...]:
        """The scores of ``rows`` (at ``keys``, all when None) in double-double through
        the pipeline: (sh, sl, err (r, n) per key, bad (r,), and with ``want_factor``
        the derivative ∂s/∂(c·q·k) as (fh, fl, fe)).  Steps:

        1. c·q·k exactly from BLAS slices and the scale in double-double
           (:func:`.dd_attention.dd_scores`, no mask, shift 0): its bound
           e_t = alpha + u²(3000 + 2 max|c g|) covers |s~ - c·q·k| (docs/oracle.md §3.5).
        2. Each softcap by :func:`_tanh_dd` (1-Lipschitz: the incoming error passes;
           the division by C 2^-100, tanh rel·|t| + ABS_TANH_DD, the product by C
           4.02u²), each bias exactly (TwoProduct), the float mask by TwoSum.
        3. The factor: Π over the softcaps of sech²(x_k), x_k the cap's argument, by
           :func:`_sech2_dd` (proof there)."""

        r = rows.size
        if keys is None:
            kvq = self._kv(b)
            n = self.k.shape[1]
        else:

            kk = np.ascontiguousarray(self.k[b][keys])
            kvq = KVdd(kk, np.zeros((kk.shape[0], 0)))
            n = kk.shape[0]
        cs = dd_scale(self.scale, self.E)
        sc = dd_scores(np.ascontiguousarray(self.q[b][rows]), None, None, kvq,
                       Block(None, None, None, None), cs, np.zeros(r))
        sh, sl = sc.sh[:, :n], sc.sl[:, :n]
        err = np.broadcast_to(sc.e_t[:, None], (r, n)).copy()
        bad = sc.bad.copy()
        fac: tuple[np.ndarray[Any, Any], ...] | None = None
        for op in self.ops:
            if isinstance(op, Cap):
                C = op.C
                xh, xl = dd_div(sh, sl, np.full_like(sh, C), np.zeros_like(sh))
                if want_factor:
                    # the argument's error: err/C + the division's 2^-100|x|
                    e_x = (err / C + 2.0**-100 * (np.abs(xh) + np.abs(xl)) + 4 * ETA) * UP
                    th, tl, rel, fh, fl = _tanh_dd(xh, xl, want_sech2=True)
                    fac = _mul_factor(fac, (fh, fl, _sech2_dd_err(fh, e_x)))
                else:
                    th, tl, rel = _tanh_dd(xh, xl)
                nh, nl = dd_mul_d(th, tl, np.full_like(th, C))
                t_abs = np.abs(th) + np.abs(tl)
                # 1-Lipschitz: err passes; the division: C·2^-100|x|; tanh: C·rel|t| + C·ABS;
                # the product by C: 4.02u²|s'|
                err = (err + 2.0**-100 * (np.abs(sh) + np.abs(sl)) + C * (rel * t_abs + ABS_TANH_DD)
                       + 4.02 * U * U * C * t_abs + 4 * ETA) * UP
                sh, sl = nh, nl
            else:
                ph, pl = self._bias_dd(op, b, rows, keys)
                s1h, s1l = dd_add_d(sh, sl, ph)
                err = err + U * (U * np.abs(s1h) + np.abs(sl))
                sh, sl = dd_add_d(s1h, s1l, pl)
                err = (err + U * (U * np.abs(sh) + np.abs(s1l))) * UP
        if self.madd is not None:
            m_rows = self.madd[b][rows]
            if keys is not None:
                m_rows = m_rows[:, keys]
            s1h, s1l = dd_add_d(sh, sl, m_rows)
            err = (err + U * (U * np.abs(s1h) + np.abs(sl))) * UP
            sh, sl = s1h, s1l
        if not want_factor:
            return sh, sl, err, bad
        if fac is None:
            fac = (np.ones((r, n)), np.zeros((r, n)), np.zeros((r, n)))
        return (sh, sl, err, bad, *fac)

    def scores_dd(self, b: int, rows: np.ndarray[Any, Any],
                  keys: np.ndarray[Any, Any] | None = None, m: np.ndarray[Any, Any] | None = None,
                  want_factor: bool = False) -> tuple[Any, tuple[np.ndarray[Any, Any], ...] | None]:
        """The scores of ``rows`` at ``keys`` (indices into the S keys and, with sinks,
        the sink's index S; None: all) as :class:`.dd_attention.Scores` — masked keys
        -inf, uniform rows 0, the shift ``m`` (given, else each row's maximum), the
        per-row bound e_t = max_j err_j + u²(3|m| + 3000 + 2 max|s|) of |t~ - t| for t =
        s - m (the shift inside the weights' pass, as the plain tier 2) — and with
        ``want_factor`` the factor (hi, lo, err) of :meth:`pipeline_dd` (1 on the sink)."""

        S = self.k.shape[1]
        r = rows.size
        n_all = S + (0 if self.sinks is None else 1)
        kk = np.arange(n_all) if keys is None else np.asarray(keys, dtype=np.int64)
        real = kk < S
        got = self.pipeline_dd(b, rows, None if keys is None else kk[real], want_factor)
        n = kk.size
        sh, sl, err = np.zeros((r, n)), np.zeros((r, n)), np.zeros((r, n))
        sh[:, real], sl[:, real], err[:, real] = got[0], got[1], got[2]
        bad = got[3]
        fac = None
        if want_factor:
            fac = (np.ones((r, n)), np.zeros((r, n)), np.zeros((r, n)))
            for a, x in zip(fac, got[4:], strict=True):
                a[:, real] = x
        if self.sinks is not None:
            sh[:, ~real] = float(self.sinks[b])
        allowed = np.array(self.allowed[b][rows], dtype=bool)
        if self.sinks is not None:
            allowed = np.concatenate([allowed, np.ones((r, 1), bool)], axis=1)
        allowed = allowed[:, kk]
        if self.uniform is not None:
            uni = np.asarray(self.uniform[b][rows])
            sh[uni], sl[uni], err[uni] = 0.0, 0.0, 0.0
        notallowed = None if allowed.all() else ~allowed
        has_key: np.ndarray[Any, Any] = np.asarray(allowed.any(axis=-1))
        err = np.where(allowed, err, 0.0)
        sm = np.where(allowed, sh, -np.inf)
        if m is None:
            m = np.where(has_key, np.max(sm, axis=-1, initial=-np.inf), 0.0)
        s_abs = np.max(np.where(allowed, np.abs(sh), 0.0), axis=-1, initial=0.0)
        e_t = (np.max(err, axis=-1, initial=0.0)
               + U * U * (3 * np.abs(m) + 3000.0 + 2 * s_abs)) * UP
        bad = bad | ~np.isfinite(e_t) | ~np.all(np.isfinite(sh) | ~allowed, axis=-1)
        sc = Scores(sm, np.where(allowed, sl, 0.0), m, np.where(np.isfinite(e_t), e_t, np.inf),
                    bad, has_key, notallowed)
        return sc, fac

    def _refine(self, b: int, rows: np.ndarray[Any, Any], kind: str
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any],
                           np.ndarray[Any, Any]] | None:

        S = self.k.shape[1]
        sc, _ = self.scores_dd(b, rows)
        allowed = sc.notallowed is None or ~sc.notallowed
        res = tier2_from_scores(np.where(allowed, sc.sh, 0.0), sc.sl, sc.m, sc.e_t, self._kv(b),
                                sc.notallowed, None, sc.has_key, None, kind, sc.bad)
        hi, lo, e_out = res.hi, res.lo, res.err
        if kind == "weights" and self.sinks is not None:
            hi, lo, e_out = hi[:, :S], lo[:, :S], e_out[:, :S]
        return hi, lo, e_out, res.ok

    def _bias_dd(self, op: Bias, b: int, rows: np.ndarray[Any, Any],
                 keys: np.ndarray[Any, Any] | None = None
                 ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The bias of ``rows`` (at ``keys``) exactly as hi + lo (ALiBi: TwoProduct of
        the slope and the integer distance; a table entry is a double)."""
        geo = self.geo
        cols = np.arange(geo.S) if keys is None else np.asarray(keys)
        d = cols[None, :] - (rows[:, None] + op.offset_of(b, geo.heads))
        h = b % geo.heads
        if op.kind == "alibi":
            slope = float(op.data[b // geo.heads, h])
            ph, pl = two_prod(np.full(d.shape, -slope), np.abs(d).astype(np.float64))
            return ph, pl
        w = (op.data.shape[-1] - 1) // 2
        tab = op.data[h if op.data.shape[0] > 1 else 0]
        return tab[np.clip(d, -w, w) + w].astype(np.float64), np.zeros(d.shape)

    def _groups(self, b: int, i: int) -> dict[Any, list[int]]:
        """Kept keys of row (b, i) by the exact rationals that fix their score; the
        sink (index -1) is a group of its own."""
        key = (b, i)
        if key not in self._groups_cache and self.uniform is not None and self.uniform[b, i]:
            self._groups_cache[key] = {("uniform",): list(range(self.k.shape[1]))}
        if key not in self._groups_cache:
            qrow = [Fraction(float(x)) for x in self.q[b][i]]
            groups: dict[Any, list[int]] = {}
            for j in np.flatnonzero(self.allowed[b, i]).tolist():
                g = sum((a * Fraction(float(x)) for a, x in zip(qrow, self.k[b][j],
                                                                strict=True)), Fraction(0))
                ident = (g, tuple(self._biases(b, i, j)), self._m(b, i, j))
                groups.setdefault(ident, []).append(j)
            if self.sinks is not None:
                groups[("sink",)] = [-1]
            if len(self._groups_cache) > 4096:
                self._groups_cache.clear()
            self._groups_cache[key] = groups
        return self._groups_cache[key]

    def _value_sum(self, b: int, js: list[int], col: int) -> Fraction:
        return sum((Fraction(float(self.v[b][j][col])) for j in js if j >= 0), Fraction(0))

    def rational_row(self, b: int, i: int, kind: str) -> list[Fraction | None] | None:
        """The exact row when every group has the same mean value (module docstring)."""
        groups = self._groups(b, i)
        if not groups:
            return None
        if kind == "weights":
            if len(groups) != 1 or self.sinks is not None:
                return None
            (js,) = groups.values()
            S = self.k.shape[1]
            return [Fraction(1, len(js)) if j in js else Fraction(0) for j in range(S)]
        out: list[Fraction | None] = []
        for col in range(self.v.shape[-1]):
            means = {self._value_sum(b, js, col) / len(js) for js in groups.values()}
            out.append(next(iter(means)) if len(means) == 1 else None)
        return out

    def boundary_sign(self, b: int, i: int, col: int, kind: str,
                      boundary: Fraction) -> int | None:
        """sign(y - T) from y - T = Σ_g e^{a_g}(V_g - n_g T) / Σ_g n_g e^{a_g}: 0 when
        every coefficient is 0, else decided in Arb (None if not within 2**16 bits)."""
        from flint import arb, fmpq

        groups = self._groups(b, i)
        coef = []
        for ident, js in groups.items():
            val = Fraction(1 if col in js else 0) if kind == "weights" else self._value_sum(b, js, col)
            coef.append((ident, val - len(js) * boundary))
        if all(cg == 0 for _, cg in coef):
            return 0
        prec = 256
        while prec <= 1 << 16:
            with Prec(prec):
                c = self._scale_arb()
                terms = []
                for ident, cg in coef:
                    if ident[0] == "sink":
                        a_g = arb(float(self.sinks[b]))
                    elif ident[0] == "uniform":
                        a_g = arb(0)
                    else:
                        a_g = self._ident_score(b, i, ident, groups[ident], c)
                    terms.append((a_g, cg))
                top = max(terms, key=lambda t: float(t[0].mid()))[0].mid()
                total = arb(0)
                for a_g, cg in terms:
                    if cg != 0:
                        total += (a_g - top).exp() * arb(fmpq(cg.numerator, cg.denominator))
                if total > 0:
                    return 1
                if total < 0:
                    return -1
            prec *= 4
        return None


class _Tier1Stack:
    """Tier 1 of a stack of C problems (arrays indexed [c, i, ...]); ``a_up`` >= the
    exact Σ_j p_j |v_j| of every row (the lemma's weighted magnitude)."""

    def __init__(self, y: np.ndarray[Any, Any], err_y: np.ndarray[Any, Any],
                 ok: np.ndarray[Any, Any], p: np.ndarray[Any, Any] | None,
                 err_p: np.ndarray[Any, Any] | None, a_up: np.ndarray[Any, Any]) -> None:
        self.y, self.err_y, self.ok, self.p, self.err_p = y, err_y, ok, p, err_p
        self.a_up = a_up


def _score_attention(v: np.ndarray[Any, Any], allowed: np.ndarray[Any, Any],
                     s: np.ndarray[Any, Any], want_weights: bool) -> _Tier1Stack:
    """Plain attention of C stacked problems whose scores are the exact doubles ``s``
    (C, L, S) on the ``allowed`` keys, values v (C, S, Ev): :func:`.fast.tier1_block`
    per problem with zero-width queries and keys, the scale 0 and ``s`` as the
    additive mask (so every score is s exactly), with ``want_abs`` for Σ p |v|."""
    C, L, S = s.shape
    Ev = v.shape[2]
    y = np.zeros((C, L, Ev))
    err = np.zeros((C, L, Ev))
    a_up = np.zeros((C, L, Ev))
    ok = np.zeros((C, L), dtype=bool)
    p = np.zeros((C, L, S)) if want_weights else None
    err_p = np.zeros((C, L, S)) if want_weights else None
    if not (L and S):
        return _Tier1Stack(y, err, ok, p, err_p, a_up)
    q0, k0 = np.zeros((L, 0)), np.zeros((S, 0))
    for c in range(C):
        kv = KV(k0, np.ascontiguousarray(v[c]))
        al = np.asarray(allowed[c], dtype=bool)
        blk = Block(None if al.all() else al, s[c], None, None)
        res = tier1_block(q0, None, kv, blk, 0.0, 0.0, want_weights=want_weights,
                          want_abs=True)
        assert res.a_up is not None
        y[c], err[c], ok[c], a_up[c] = res.y, res.err, res.ok, res.a_up
        if want_weights:
            assert p is not None and err_p is not None
            p[c], err_p[c] = res.p, res.err_p
    return _Tier1Stack(y, err, ok, p, err_p, a_up)


def transformed_attention(
    q64: np.ndarray[Any, Any], k64: np.ndarray[Any, Any], v64: np.ndarray[Any, Any], *,
    lead: tuple[int, ...], group: int, geo: Geometry, allowed: np.ndarray[Any, Any],
    madd: np.ndarray[Any, Any] | None, ops: tuple[Cap | Bias, ...],
    sinks: np.ndarray[Any, Any] | None, scale: Any, masked_rows: str, return_weights: bool,
    rotation: Any = None,
) -> Enclosure:
    """The enclosure of attention with a score pipeline (module docstring); ``rotation``
    (a :class:`.rotary.Rotation`): q and k rotated before the scores."""

    if group > 1:
        k64 = np.repeat(k64, group, axis=-3)
        v64 = np.repeat(v64, group, axis=-3)
    L, E = q64.shape[-2:]
    S, Ev = v64.shape[-2:]
    B = geo.B
    qf = np.broadcast_to(q64, (*lead, L, E)).reshape(B, L, E)
    kf = np.broadcast_to(k64, (*lead, S, E)).reshape(B, S, E)
    vf = np.broadcast_to(v64, (*lead, S, Ev)).reshape(B, S, Ev)
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    has_key = allowed.any(axis=-1) if S else np.zeros((B, L), dtype=bool)
    empty: np.ndarray[Any, Any] = (np.asarray(~has_key) if sinks is None
                                   else np.zeros((B, L), dtype=bool))
    rows = masked_rows_of(masked_rows, empty, S, lead, what="")
    uniform = None
    if rows.uniform.any():
        # JAX's policy: a row with no key gets uniform weights over all keys (its
        # scores are taken as 0, so its output is the mean of the values)
        uniform = rows.uniform
        allowed = np.array(allowed, copy=True)
        allowed[uniform] = True
    zero_rows, nan_rows = rows.zero, rows.nan

    y = np.zeros((B, L, Ev))
    err_y = np.zeros((B, L, Ev))
    ok = np.zeros((B, L), dtype=bool)
    p = np.zeros((B, L, S)) if return_weights else None
    err_p = np.zeros((B, L, S)) if return_weights else None
    n_sink = 0 if sinks is None else 1
    if B and L and (S or n_sink):
        step = max(1, CHUNK_ELEMS // max(1, L * (S + n_sink)))
        for start in range(0, B, step):
            stop = min(B, start + step)
            sl = slice(start, stop)
            c = _chunk(qf[sl], kf[sl], vf[sl], np.ascontiguousarray(allowed[sl]),
                       None if madd is None else madd[sl], ops, geo, range(start, stop),
                       c_f, rho_c, None if sinks is None else sinks[sl],
                       None if uniform is None else uniform[sl], rotation, return_weights)
            y[sl], err_y[sl], ok[sl] = c[0], c[1], c[2]
            if return_weights:
                assert p is not None and err_p is not None
                p[sl], err_p[sl] = c[3], c[4]
    ok &= ~empty
    args = (qf, kf, vf, allowed, madd, ops, sinks, scale_exact, E, geo, uniform)
    problem = (TransformedProblem(*args) if rotation is None else rotation.problem(*args))
    out = Enclosure(problem, "output", (*lead, L, Ev), y, err_y, ok, zero_rows, nan_rows)
    if return_weights:
        assert p is not None and err_p is not None
        out.weights = Enclosure(problem, "weights", (*lead, L, S), p, err_p, ok, zero_rows,
                                nan_rows)
    return out


def _chunk(qc: np.ndarray[Any, Any], kc: np.ndarray[Any, Any], vv: np.ndarray[Any, Any],
           al: np.ndarray[Any, Any], madd: np.ndarray[Any, Any] | None,
           ops: tuple[Cap | Bias, ...], geo: Geometry, problems: range, c_f: float,
           rho_c: float, sinks: np.ndarray[Any, Any] | None,
           uniform: np.ndarray[Any, Any] | None, rotation: Any, return_weights: bool
           ) -> tuple[Any, ...]:
    """Tier 1 on the problems ``problems`` (their rows of every array given): the
    output, its error, the rows decided, and with ``return_weights`` the weights and
    their error."""
    n, L, S = al.shape
    Ev = vv.shape[-1]
    extra = None
    if rotation is not None:
        qc, kc, extra = rotation.float_chunk(qc, kc, problems, al)
    s, delta = _float_scores(qc, kc, al, madd, ops, geo, problems, c_f, rho_c, extra=extra)
    if not al.all():
        s = np.where(al, s, 0.0)
    if uniform is not None:
        s[uniform] = 0.0
        delta = np.where(uniform, 0.0, delta)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(sinks[:, None, None], (n, L, 1))], axis=-1)
        al = np.concatenate([al, np.ones((n, L, 1), bool)], axis=-1)
        vv = np.concatenate([vv, np.zeros((n, 1, Ev))], axis=1)
    fr = _score_attention(vv, al, np.ascontiguousarray(s), return_weights)
    with np.errstate(over="ignore", invalid="ignore"):
        # (e^δ - 1)e^δ <= δ(1 + δ)(1 + 2δ); e^{2δ} - 1 <= 2δ(1 + 2δ)
        factor = (delta * (1.0 + delta) * (1.0 + 2.0 * delta) * UP)[..., None]
        factor_p = (2.0 * delta * (1.0 + 2.0 * delta) * UP)[..., None]
        # Σ_j p̃_j |v_j| (p̃ the exact weights of the scores s̃) <= fr.a_up
        # (:func:`.fast.tier1_block`, want_abs)
        yy, ey = fr.y, fr.err_y
        err_y = (ey + factor * (fr.a_up + np.abs(yy) + ey)) * UP
        ok = fr.ok & (delta <= 2.0**-10) & np.all(np.isfinite(err_y), axis=-1)
        if not return_weights:
            return yy, err_y, ok
        assert fr.p is not None and fr.err_p is not None
        pw, ew = fr.p[..., :S], fr.err_p[..., :S]
        return yy, err_y, ok, pw, (ew + factor_p * (np.abs(pw) + ew)) * UP
