"""The certified log-sum-exp of attention's rows: :func:`reference_lse`.

For row i the kernels' ``softmax_lse`` is ``lse_i = log Σ_j exp(t_ij)`` over the keys
the row attends, ``t_ij = c·q_i·k_j + mask_ij`` the scaled, masked score (SDPA's
conventions, :mod:`.conventions`; dropout does not enter it).  ``base=2`` gives
``lse_i / ln 2`` (what FlashAttention-3 keeps internally with ``scale·log2 e``).  A
row with no key has ``Σ = 0``: ``masked="-inf"`` (log 0, FlexAttention) or
``"+inf"`` (FlashAttention's convention, so that ``exp(t - lse) = 0``).

Method, two tiers, every bound proved here:

1. **float64.**  g = fl(q·kᵀ) errs by at most γ_E·(|q|·|k|ᵀ) (any summation order,
   γ_n = nu/(1 - nu)); s = fl(g·c_f) with |c - c_f| <= ρ_c; t = fl(s + mask): the
   error of each t_j is bounded (``_score_error``).  The log-sum-exp is 1-Lipschitz
   in the sup norm (∂lse/∂t_j = softmax_j >= 0, summing to 1), so an error δ in every
   score moves lse by at most δ.  With m = max t̂: d_j = fl(t̂_j - m) errs by u|d_j|,
   ``expo.exp_double`` by ρ = 2**-48 relatively (keys below its cut, exp < e**-708,
   are bounded by [0, that]), the sum of S nonnegative terms by γ_S relatively; Σ >= 1
   (the top key gives exp(0) = 1 exactly).  So lse ∈ m + log[Σ_lo, Σ_hi] ± δ, whose
   two ends are evaluated per row in Arb (one log each) and rounded outward.
2. **Arb.**  Rows whose interval does not round to one value of the target format are
   recomputed from the exact inputs in ball arithmetic (exact products, the exact
   scale), raising the precision until the ball rounds (Ziv, capped: ``PrecisionError``
   beyond 4096 bits).  A row with one key has lse = t exactly: rational when the scale
   is, rounded exactly.

>>> import numpy as np
>>> r = reference_lse(np.zeros((1, 2, 4)), np.zeros((1, 3, 4)))
>>> r.rounded("float32").tolist() == [[np.float32(np.log(3.0))] * 2]
True
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import PrecisionError, SpecError
from .arith.constants import CHUNK_ELEMS, EXP1_CUT, RHO_EXP1, U
from .arith.expo import exp_double
from .arith.formats import decide_rounding, get_format, round_fraction
from .conventions import ScoreModel, check_options, check_sdpa_inputs, exact_scale
from .forward.attention import Stack
from .inputs import to_float64

__all__ = ["LSE_BASES", "LSE_MASKED", "LseEnclosure", "reference_lse"]

LSE_BASES = ("e", 2)
LSE_MASKED = ("-inf", "+inf")
_MAX_PREC = 4096

Array = np.ndarray[Any, Any]


def _gamma(n: int) -> float:
    return n * U / (1 - n * U)


def check_lse_options(base: Any, masked: Any) -> None:
    if base not in LSE_BASES or isinstance(base, bool):
        raise SpecError(f"lse_base={base!r}: expected 'e' (natural log, FlashAttention's "
                        "softmax_lse) or 2 (log2, as kernels keep it internally)")
    if masked not in LSE_MASKED:
        raise SpecError(f"lse_masked={masked!r}: expected '-inf' (log 0: FlexAttention) or "
                        "'+inf' (FlashAttention's fully-masked rows)")


class LseEnclosure:
    """The certified log-sum-exp of every row, shape (..., H_q, L): ``lower``,
    ``upper`` (float64, the exact value between them), ``midpoint``, ``rounded(dtype)``
    (correctly rounded, refined in Arb where needed), ``exact(index)`` (an Arb ball)."""

    def __init__(self, shape: tuple[int, ...], lo: Array, hi: Array, problem: _LseRows,
                 masked: Array, masked_value: float) -> None:
        self.shape = shape
        self._lo, self._hi = lo, hi
        self._p = problem
        self._masked = masked
        self._mval = masked_value
        self.base = problem.base

    @property
    def lower(self) -> Array:
        return np.where(self._masked, self._mval, self._lo).reshape(self.shape)

    @property
    def upper(self) -> Array:
        return np.where(self._masked, self._mval, self._hi).reshape(self.shape)

    @property
    def midpoint(self) -> Array:
        with np.errstate(invalid="ignore"):
            return np.where(self._masked, self._mval, 0.5 * (self._lo + self._hi)
                            ).reshape(self.shape)

    def __repr__(self) -> str:
        return f"LseEnclosure(shape={self.shape}, base={self.base!r})"

    def exact(self, index: Any, *, prec: int = 256) -> Any:
        """The row's lse as an Arb ball at ``prec`` bits (±inf for an empty row)."""
        idx = (int(index),) if isinstance(index, (int, np.integer)) else tuple(index)
        if len(idx) != len(self.shape) or not all(-n <= i < n for i, n in
                                                  zip(idx, self.shape, strict=True)):
            raise SpecError(f"index={idx} is out of range for shape={self.shape}")
        flat = int(np.ravel_multi_index(tuple(i % n for i, n in zip(idx, self.shape,
                                                                    strict=True)), self.shape))
        b, i = divmod(flat, self._p.L)
        if self._masked[b, i]:
            import flint

            return flint.arb(self._mval)
        return self._p.arb_row(b, i, prec)

    def rounded(self, dtype: Any = "float32") -> Array:
        """Every row's lse correctly rounded to ``dtype`` (round to nearest, ties to
        even); the empty rows' convention as it is."""
        fmt = get_format(dtype)
        mid = 0.5 * (self._lo + self._hi)
        rad = np.nextafter(np.maximum(self._hi - mid, mid - self._lo), np.inf)
        with np.errstate(invalid="ignore"):
            ok, val = decide_rounding(np.where(self._masked, 0.0, mid), np.zeros_like(mid),
                                      np.where(self._masked, 0.0, rad), fmt)
        out = np.where(self._masked, self._mval, val)
        for b, i in np.argwhere(~ok & ~self._masked).tolist():
            out[b, i] = self._p.round_row(b, i, fmt)
        return out.reshape(self.shape).astype(np.float64)


class _LseRows:
    """The flat stack of rows: the exact inputs, the score model, the scale."""

    def __init__(self, stack: Stack, model: ScoreModel, scale: Fraction | None, E: int,
                 L: int, base: Any) -> None:
        self.stack, self.model, self.scale, self.E, self.L = stack, model, scale, E, L
        self.base = base

    def _row(self, b: int, i: int) -> tuple[Array, Array, Array]:
        """(q_i, keys allowed, their additive mask) of row (b, i)."""
        q, k, _, _ = self.stack.qkv(b)
        blk = self.model.block(b, np.array([i]))
        S = k.shape[0]
        allowed = np.ones(S, bool) if blk.allowed is None else blk.allowed[0]
        madd = np.zeros(S) if blk.madd is None else blk.madd[0]
        js = np.flatnonzero(allowed)
        return np.asarray(q[i]), js, madd[js]

    def arb_row(self, b: int, i: int, prec: int) -> Any:
        import flint

        old = flint.ctx.prec
        try:
            flint.ctx.prec = prec
            q, js, madd = self._row(b, i)
            _, k, _, _ = self.stack.qkv(b)
            if self.scale is None:
                c = 1 / flint.arb(self.E).sqrt() if self.E else flint.arb(0)
            else:
                c = flint.arb(flint.fmpq(self.scale.numerator, self.scale.denominator))
            qa = [flint.arb(float(x)) for x in q]
            total = flint.arb(0)
            ts = []
            for j, a in zip(js.tolist(), madd.tolist(), strict=True):
                kr = k[j]
                dot = sum((qa[e] * float(kr[e]) for e in range(len(qa))), flint.arb(0))
                ts.append(c * dot + a)
            top = max((t.mid() for t in ts), key=float) if ts else flint.arb(0)
            for t in ts:
                total += (t - top).exp()
            val = top + total.log()
            return val / flint.arb(2).log() if self.base == 2 else val
        finally:
            flint.ctx.prec = old

    def round_row(self, b: int, i: int, fmt: Any) -> float:
        q, js, madd = self._row(b, i)
        if js.size == 1 and self.scale is not None and self.base == "e":
            _, k, _, _ = self.stack.qkv(b)      # lse = t exactly, rational
            dot = sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(q, k[js[0]],
                                                                              strict=True)),
                      Fraction(0))
            return round_fraction(self.scale * dot + Fraction(float(madd[0])), fmt)
        prec = 128
        while prec <= _MAX_PREC:
            ball = self.arb_row(b, i, prec)
            m = ball.mid()
            mf = float(m)
            rf = float(m - mf)     # m = mf + rf + (|.| <= ulp(rf)), exactly in Arb
            rad = np.nextafter(float(ball.rad()) + abs(rf) * 2.0**-52 + 2.0**-1074, np.inf)
            ok, val = decide_rounding(np.array([mf]), np.array([rf]), np.array([rad]), fmt)
            if ok[0]:
                return float(val[0])
            prec *= 2
        raise PrecisionError(f"the log-sum-exp of row {(b, i)} could not be rounded to "
                             f"{fmt.name} within {_MAX_PREC} bits (please report this)")


def _score_error(g: Array, G: Array, c_f: float, rho_c: float, E: int) -> Array:
    """A bound on |fl(fl(q·k)·c_f) - c·q·k| from g = fl(q·k) and G = |q|·|k|."""
    err_g = _gamma(E + 1) * G
    return abs(c_f) * err_g + rho_c * (np.abs(g) + err_g) + 2 * U * np.abs(g * c_f) + 1e-300


def reference_lse(query: Any, key: Any, *, attn_mask: Any = None, is_causal: bool = False,
                  scale: float | None = None, enable_gqa: bool = False,
                  causal_alignment: str = "top_left", base: Any = "e",
                  masked: str = "-inf") -> LseEnclosure:
    """The certified ``log Σ_j exp(t_ij)`` of every query row (module docstring), with
    SDPA's arguments (value is not needed); shape (..., H_q, L)."""
    check_lse_options(base, masked)
    check_options("zero", causal_alignment)
    q, k, _, batch, rep = check_sdpa_inputs(query, key, key, enable_gqa)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    scale_exact, c_f, rho_c = exact_scale(scale, E)
    model = ScoreModel(batch, L, S, attn_mask=attn_mask, is_causal=is_causal,
                       causal_alignment=causal_alignment, policy="zero")
    B = math.prod(batch)
    kf = to_float64(k)
    stack = Stack(to_float64(q), kf, kf, batch, rep)
    lo = np.zeros((B, L))
    hi = np.zeros((B, L))
    empty = np.asarray(model.empty_rows()).reshape(B, L) if B and L else np.zeros((B, L), bool)
    g_S = _gamma(max(S, 1) + 1)
    step = max(1, CHUNK_ELEMS // max(1, S))
    import flint

    ln2 = flint.arb(2).log()
    for cidx in range(B if S else 0):
        qc, kc, _, _ = stack.qkv(cidx)
        kc = np.asarray(kc)
        ka = np.abs(kc)
        for i0 in range(0, L, step):
            i1 = min(L, i0 + step)
            blk = model.block(cidx, slice(i0, i1))
            qq = np.asarray(qc[i0:i1])
            g = qq @ kc.T
            G = np.abs(qq) @ ka.T
            s = g * c_f
            err = _score_error(g, G, c_f, rho_c, E)
            allowed = np.ones(s.shape, bool) if blk.allowed is None else blk.allowed
            if blk.madd is not None:
                t = s + blk.madd
                err = err + U * np.abs(t) * 1.01
            else:
                t = s
            t = np.where(allowed, t, -np.inf)
            delta = np.max(np.where(allowed, err, 0.0), axis=1)
            m = np.max(t, axis=1)
            mm = np.where(np.isfinite(m), m, 0.0)
            with np.errstate(invalid="ignore"):
                d = np.where(allowed, t - mm[:, None], -np.inf)
            e = np.where(allowed, exp_double(np.where(allowed, d, 0.0)), 0.0)
            above = allowed & (d >= EXP1_CUT)
            r = RHO_EXP1 + 1.01 * U * np.abs(np.where(allowed, d, 0.0))
            rmax = np.max(np.where(above, r, 0.0), axis=1)
            s_all = np.sum(e, axis=1)
            s_above = np.sum(np.where(above, e, 0.0), axis=1)
            s_lo = s_above * (1 - 2 * g_S - 2.02 * rmax)
            s_hi = s_all * (1 + 2 * g_S + 2.02 * rmax)
            for n in range(i1 - i0):
                row = i0 + n
                if empty[cidx, row]:
                    continue
                a_lo = flint.arb(float(mm[n])) + flint.arb(float(s_lo[n])).log() \
                    - flint.arb(float(delta[n]))
                a_hi = flint.arb(float(mm[n])) + flint.arb(float(s_hi[n])).log() \
                    + flint.arb(float(delta[n]))
                if base == 2:
                    a_lo, a_hi = a_lo / ln2, a_hi / ln2
                lo[cidx, row] = np.nextafter(float(a_lo.lower()), -np.inf)
                hi[cidx, row] = np.nextafter(float(a_hi.upper()), np.inf)
    problem = _LseRows(stack, model, scale_exact, E, L, base)
    mval = -math.inf if masked == "-inf" else math.inf
    if S == 0:
        empty = np.ones((B, L), bool)
    return LseEnclosure((*batch, L), lo, hi, problem, empty, mval)
