"""The error bound of scaled-dot-product attention: how far may a correct kernel
be from the exact answer, element by element?

Built on the blocks of :mod:`mha_symbolic.testing.tolerance` (the :class:`ErrorModel`
of a check: formats, kernel, worst-case or probabilistic model, λ).

Notation (one row of one head; ``c`` the scale, ``n`` the unmasked keys,
``E`` the query/key width, ``κ_j`` the dropout multiplier keep_j/(1 − p), 1
without dropout)::

    t_j = c q·k_j,  s_j = t_j + m_j          exact scores (m: finite float mask)
    A_j = |c| Σ_e |q_e||k_je|                 natural scale of a score
    p_j = softmax(s)_j,  ã_j = κ_j v_j         exact weights, effective values
    y   = Σ_j p_j ã_j,   w_j = ã_j − y         exact output, centred values

**1. Scores.**  A kernel computes ŝ_j = s_j + d_j.  The rounding errors of d_j
split into *shared* ones, common to every key of the row (the rounded scale c, also
for a power of two since exp2 kernels fold log2(e) into it, the rounded scaled query of
an eager kernel), bounded by ``Sh_j`` and treated
deterministically, and *independent* ones, different for each key (the dot
product's additions, each ≤ u_a A_j; the rounding of the product by c, of the
mask addition and of each store of an eager kernel, each ≤ u|t_j| or u(|t_j| +
|m_j|)), bounded in the worst case by ``I_j``, with ``σS_j`` the sum of their
squared bounds.  ``D_j = Sh_j + I_j``.

**2. Through softmax, exactly.**  With p̃_j = p_j e^{d_j}/Σ_k p_k e^{d_k} and
``Λ = log Σ_k p_k e^{D_k}`` (Jensen): |p̃_j − p_j| ≤ p_j expm1(D_j + Λ).  Since
Σ p̃ = Σ p = 1, the output moves by ``Σ_j (p̃_j − p_j) w_j`` (centred values: a
common shift of the scores changes nothing).  For the probabilistic model the
same quantity is ``Σ_j p_j d_j w_j + R`` exactly, with e^x − 1 = x + ξ(x),
0 ≤ ξ(x) ≤ x² e^{|x|}/2 and |x| ≤ 2D (D = max_j D_j), and Σ_j p_j w_j = 0, so
``|R| ≤ D² e^{2D} Σ_j p_j |w_j|`` (subtract the constant D²e^{2D} from ξ).

**3. Evaluating softmax** (Blanchard, Higham & Higham, IMA J. Numer. Anal. 41(4),
2021, componentwise): per key, the argument ŝ_j − ŝ_max and its conversion to base 2
(two roundings: e^{2 u_a |s_j − s_max|} − 1), the exp (K_EXP u_a), the division
(u_a), the stored weight P (u), the dropout product (u): relative errors ``ρ_j``,
``|ρ_j| ≤ r_j``, squared bounds summed in ``σW_j``; shared by the row, the sum of the n
exponentials (2n roundings allowing the rescalings of an online softmax) and the
reciprocal: ``θ``, ``|θ| ≤ g_θ``.

**4. The weighted sum** of n terms in u_a (2n roundings allowing the online
rescalings), the final division (u_a) and store (u):
``γ(2n) Σ_j p̂_j |ã_j| + (u + u_a)|ŷ|``.  Underflow (|fl(x) − x| ≤ max(u|x|, η), η
half the smallest subnormal, or the smallest normal when subnormals are flushed):
η_u |ã_j| for each weight that can fall below the output dtype's normal range, 2η_u
for the final store, 4η_a (n(max|ã| + 1) + 1) in the accumulation dtype.

**Worst case** (always valid): the sum of 2–4 with each rounding at its bound,
γ(n) = (1 − u)^{−n} − 1 for n roundings (finite for every n, unlike
nu/(1 − nu)), every key's contribution capped at 1 × |value| (a computed weight
lies in [0, 1]).

**Probabilistic** (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019): the
independent first-order errors of all keys, Σ_j p_j (d_j + ρ_j) w_j, are a sum of
independent mean-zero terms, so by Hoeffding's inequality they are below
``λ sqrt(Σ_j N_j p_j² (σS_j + σW_j) w_j²)`` with probability ≥ 1 − 2e^{−λ²/2}.
Keys with *equal* scores have identical rounding errors: they are grouped, and
``N_j`` (the size of key j's group) charges the group in full (Cauchy–Schwarz).
Sums use γ̃_n(λ) = exp(λ√n u + nu²/(1 − u)) − 1 in place of γ(n) (Higham &
Mary, Theorem 3.1: it holds with probability ≥ 1 − 2n e^{−λ²(1−u)²/2}).  Shared
errors, the common part y Σ_j p_j ρ_j and the remainders beyond first order are
bounded deterministically.  λ is chosen by :func:`lambda_for` so that the union
bound over every probabilistic event of the check (one per output element and one
per term of every sum) gives a false-alarm probability ≤ 1e-9.  The tolerance is
the smaller of the two bounds, element by element.

**Variants** (:class:`ScoreExtras`, given by :mod:`.tolerance_variants`): a kernel
whose scores pass through softcaps and biases, with an attention sink, or with FP8
descale factors and weights, is bounded by the same steps: the final scores replace
``t_j + m_j`` for the weights, the variant's own roundings are added to the
independent score errors, a sink is one more key (k = v = 0, its logit as the
score), the weights' store is charged in the format they are stored in (an FP8
kernel stores the unnormalised e^{s_j − m} ≤ 1, so its underflow is relative to the
row's largest weight), and behind a softcap the shared errors are bounded per key
(u_a |t_j|: the cap is 1-Lipschitz) instead of from the top key.

Every bound is computed in float64 on operands scaled by powers of two, so that no
intermediate overflows; a row whose kernel would itself overflow (a score or a
partial dot product beyond the dtype's range) is marked *vacuous*, as is any
element whose tolerance reaches Σ_j p_j |ã_j| (a 100 % error of the natural
scale).  The derivation is repeated, with the constants, in docs/testing.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import SpecError
from ..tolerance import (
    _EXP_CAP,
    _FMAX,
    K_EXP,
    ErrorModel,
    FloatFormat,
    format_of,
    gamma,
    gamma_tilde,
    hoeffding_bound,
    underflow_eta,
)

__all__ = ["Bound", "ScoreExtras", "attention_error_bound"]


# --------------------------------------------------------------------------------------
# Helpers on (R, S) weight matrices against (S, Ev) values


def _pow2_exponent(a: np.ndarray) -> int:
    """e with max|a| < 2^e (0 for an empty or all-zero array)."""
    m = float(np.max(np.abs(a), initial=0.0))
    return int(math.frexp(m)[1]) if m > 0 and math.isfinite(m) else 0


@dataclass
class _Moments:
    """Row sums of a weight matrix a ≥ 0 against the effective values ã = κ v of a
    chunk: ``sa`` = Σ_j a_j, ``ab`` = Σ_j a_j |ã_j|, ``li`` = Σ_j a_j ã_j, ``sq`` =
    Σ_j a_j ã_j² (each (R, Ev); None when not needed), S the number of keys."""

    sa: np.ndarray
    ab: np.ndarray | None
    li: np.ndarray | None
    sq: np.ndarray | None
    S: int

    def without(self, w: np.ndarray, v_row: np.ndarray) -> _Moments:
        """The moments with one term per row removed (weight ``w`` (R, 1), effective
        value ``v_row`` (R, Ev)); the subtraction's float64 error, ≤ 2^-52 of the
        terms, is added back as slack so that the result stays an upper bound."""
        slack = 2.0**-51

        def sub(m: np.ndarray | None, t: np.ndarray) -> np.ndarray | None:
            return None if m is None else np.maximum(m - t, 0.0) + slack * np.abs(m)

        return _Moments(np.maximum(self.sa - w, 0.0) + slack * self.sa,
                        sub(self.ab, w * np.abs(v_row)),
                        None if self.li is None else self.li - w * v_row,
                        sub(self.sq, w * v_row * v_row), self.S)

    def quad(self, c: np.ndarray) -> np.ndarray:
        """Σ_j a_j (ã_j − c)², by expansion Σaã² − 2cΣaã + c²Σa; the float64 evaluation
        errs by ≤ γ_{S+3}(2^-53)(Σaã² + 2|c|Σa|ã| + c²Σa) ≤ 2γ_{S+3}(2^-53)(Σaã² + c²Σa)
        (2|c||ã| ≤ ã² + c²), added as slack."""
        assert self.sq is not None and self.li is not None
        c2 = c * c
        q = self.sq - 2.0 * c * self.li + c2 * self.sa
        return np.asarray(np.maximum(q, 0.0) + (self.S + 4) * 2.0**-51 * (self.sq + c2 * self.sa))

    def absdev(self, c: np.ndarray) -> np.ndarray:
        """A bound on Σ_j a_j |ã_j − c| (c any centre per row and column): the smaller
        of Σ a|ã| + |c| Σ a and sqrt(Σ a · Σ a (ã − c)²) (Cauchy–Schwarz)."""
        assert self.ab is not None
        opt1 = self.ab + np.abs(c) * self.sa
        opt2 = np.sqrt(self.sa * self.quad(c)) * (1.0 + 2.0**-40)
        return np.asarray(np.minimum(opt1, opt2))


class _Values:
    """The (S, Ev) values of a chunk, scaled by 2^-ev, with the row multipliers κ
    (dropout): the moments of a weight matrix by one matmul on stacked columns
    [|v|, v, v²] (two with dropout: a∘κ against [|v|, v], a∘κ² against v²)."""

    def __init__(self, v: np.ndarray, kappa: np.ndarray | None) -> None:
        self.v = v
        self.kappa = kappa
        self.Ev = v.shape[1]
        self.av = np.abs(v)
        self.v2 = v * v
        self.rhs = np.concatenate([self.av, v, self.v2], axis=1)

    def moments(self, a: np.ndarray, *, ab: bool = True, li: bool = True,
                sq: bool = True) -> _Moments:
        Ev, S = self.Ev, a.shape[-1]
        sa = np.sum(a, axis=-1, keepdims=True)
        parts: list[np.ndarray | None] = [None, None, None]
        want = [ab, li, sq]
        if self.kappa is None:
            lo, hi = want.index(True), 3 - want[::-1].index(True)
            m = a @ self.rhs[:, lo * Ev:hi * Ev]
            for i in range(lo, hi):
                parts[i] = m[:, (i - lo) * Ev:(i - lo + 1) * Ev]
        else:
            if ab or li:
                m = (a * self.kappa) @ self.rhs[:, :2 * Ev]
                parts[0], parts[1] = m[:, :Ev], m[:, Ev:]
            if sq:
                parts[2] = (a * (self.kappa * self.kappa)) @ self.v2
        ab_m, li_m, sq_m = (p if w else None for p, w in zip(parts, want, strict=True))
        return _Moments(sa, ab_m, li_m, sq_m, S)


def _rowmax(a: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """max over the allowed keys of each row, (R, 1); 0 for a row without one."""
    a = np.broadcast_to(a, allowed.shape)
    if allowed.shape[-1] == 0:
        return np.zeros((allowed.shape[0], 1))
    return np.asarray(np.max(np.where(allowed, a, 0.0), axis=-1, keepdims=True))


def _tie_counts(s: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """N_ij: how many allowed keys of row i have exactly the score s_ij (1 if unique).
    Rows are sorted once; only rows holding a repeated score are counted."""
    R, S = s.shape
    out = np.ones((R, S))
    if S <= 1 or R == 0:
        return out
    key = np.where(allowed, s, np.nan)             # masked keys: NaN, never equal
    srt = np.sort(key, axis=1)
    dup_rows = np.flatnonzero(np.any(srt[:, 1:] == srt[:, :-1], axis=1))
    if dup_rows.size == 0:
        return out
    kd = key[dup_rows]
    order = np.argsort(kd, axis=1)
    sd = np.take_along_axis(kd, order, axis=1)
    new = np.ones(sd.shape, dtype=bool)
    new[:, 1:] = ~(sd[:, 1:] == sd[:, :-1])
    run = np.cumsum(new, axis=1) - 1                # run id within the row
    n = sd.shape[0]
    flat = run + (np.arange(n) * S)[:, None]
    counts = np.bincount(flat.ravel(), minlength=n * S).reshape(n, S)
    n_sorted = np.take_along_axis(counts, run, axis=1).astype(np.float64)
    sub = np.empty((n, S))
    np.put_along_axis(sub, order, n_sorted, axis=1)
    out[dup_rows] = np.where(allowed[dup_rows], sub, 1.0)
    return out


def _scale_is_exact(c: float, fmt: FloatFormat) -> bool:
    """Is c a value of ``fmt`` (so that holding it in ``fmt`` loses nothing)?"""
    if c == 0.0 or not math.isfinite(c):
        return True
    m, e = math.frexp(abs(c))
    mant = int(math.ldexp(m, 53))
    bits = 53 - ((mant & -mant).bit_length() - 1)   # significant bits of c
    return bits <= fmt.p and fmt.emin - fmt.p + 1 <= e - 1 <= fmt.emax


def _is_pow2(c: float) -> bool:
    return c != 0.0 and math.isfinite(c) and math.frexp(abs(c))[0] == 0.5


# --------------------------------------------------------------------------------------
# The bound for one chunk of rows of one head


@dataclass(frozen=True)
class Bound:
    """The tolerance of a chunk: ``tol`` (R, Ev) float64, finite; ``vacuous`` (R, Ev)
    bool: elements for which the model gives no meaningful bound."""

    tol: np.ndarray
    vacuous: np.ndarray


@dataclass(frozen=True)
class ScoreExtras:
    """What a variant kernel does to the scores beyond ``c q·k_j`` (built by
    :mod:`.tolerance_variants`).

    ``scores`` (R, S): the final exact scores in float64 (softcaps, biases, a float
    mask, a sink's logit in its column), replacing ``t_j + m_j`` for the weights;
    ``ind`` (R, S): the worst-case bound of the variant's own independent roundings
    per key, ``var`` the sum of their squared bounds; ``d_eval`` (R, S): the float64
    evaluation error of ``scores`` beyond that of ``c q·k_j``; ``centred``: whether the
    shared errors may be measured from the row's top key (false behind a softcap:
    ``C tanh(·/C)`` is 1-Lipschitz, so a shared relative error δ of t_j moves the final
    score by at most |δ t_j|, but not by a common shift); ``scale_roundings``: the
    roundings of the scale shared by the row (3 with FP8 descale factors multiplied
    into it); ``final_roundings``: extra roundings of the output in u_a (1 for the
    v_descale product)."""

    scores: np.ndarray
    ind: np.ndarray | float = 0.0
    var: np.ndarray | float = 0.0
    d_eval: np.ndarray | float = 0.0
    centred: bool = True
    scale_roundings: int = 1
    final_roundings: int = 0


def attention_error_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    scale: float,
    allowed: np.ndarray,
    model: ErrorModel,
    mask_add: np.ndarray | None = None,
    kappa: np.ndarray | None = None,
    uniform_rows: np.ndarray | None = None,
    dq: np.ndarray | None = None,
    dk: np.ndarray | None = None,
    dv: np.ndarray | None = None,
    softmax_axis: int = -1,
    extras: ScoreExtras | None = None,
) -> Bound:
    """The model's bound on ``|ŷ − y|`` for the rows of one head.

    ``q (R, E)``, ``k (S, E)``, ``v (S, Ev)`` float64 (heads already matched);
    ``allowed (R, S)`` which keys take part; ``mask_add (R, S)`` the finite float mask
    or None; ``kappa (R, S)`` the dropout multipliers keep/(1 − p) or None;
    ``uniform_rows (R,)`` rows given uniform weights over all keys (fully masked rows
    under ``masked_rows="uniform"``); ``dq, dk, dv``: bounds on errors already in
    q, k, v (projections of a multi-head block).  ``softmax_axis=-2`` bounds the
    (buggy) variant normalising over the rows (the chunk must then hold every row).
    ``extras``: the score pipeline of an attention variant (:class:`ScoreExtras`;
    ``mask_add`` must then be None, the mask being part of its scores).
    Fully masked rows (no allowed key, not uniform) get the bound of an exact zero.

    >>> import numpy as np
    >>> q = k = v = np.eye(2)
    >>> b = attention_error_bound(q, k, v, scale=1.0, allowed=np.ones((2, 2), bool),
    ...                           model=error_model("float32"))
    >>> bool(np.all((b.tol > 0) & (b.tol < 1e-5))), bool(b.vacuous.any())
    (True, False)
    """
    # extreme inputs overflow and underflow inside on purpose (saturating arithmetic);
    # the result is checked finite below, so the warnings are noise
    with np.errstate(all="ignore"):
        return _attention_error_bound(
            q, k, v, scale=scale, allowed=allowed, model=model, mask_add=mask_add,
            kappa=kappa, uniform_rows=uniform_rows, dq=dq, dk=dk, dv=dv,
            softmax_axis=softmax_axis, extras=extras)


def _attention_error_bound(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, allowed: np.ndarray,
    model: ErrorModel, mask_add: np.ndarray | None, kappa: np.ndarray | None,
    uniform_rows: np.ndarray | None, dq: np.ndarray | None, dk: np.ndarray | None,
    dv: np.ndarray | None, softmax_axis: int, extras: ScoreExtras | None = None,
) -> Bound:
    R, E = q.shape
    S, Ev = v.shape
    if R == 0 or Ev == 0:
        return Bound(np.zeros((R, Ev)), np.zeros((R, Ev), dtype=bool))
    fmt, acc, ker = model.fmt, model.acc, model.kernel
    u, ua, us = model.u, model.ua, model.us
    lam = model.lam
    prob = model.kind == "probabilistic" and softmax_axis == -1
    centred = softmax_axis == -1
    eta_u, eta_a = model.eta, model.eta_a
    allowed = np.asarray(allowed, dtype=bool)
    if uniform_rows is not None and np.any(uniform_rows):
        # a fully masked row under masked_rows="uniform": every key, equal scores
        allowed = allowed | uniform_rows[:, None]
    alive = np.any(allowed, axis=softmax_axis, keepdims=True)

    # ---- scaled operands: q = 2^eq q̄, k = 2^ek k̄, v = 2^ev v̄ (exact), σ = c 2^(eq+ek);
    # products of scaled operands stay below E, and numpy's ldexp saturates to inf
    eq, ek, ev = _pow2_exponent(q), _pow2_exponent(k), _pow2_exponent(v)
    qb, kb, vb = np.ldexp(q, -eq), np.ldexp(k, -ek), np.ldexp(v, -ev)
    c = float(scale)
    e2 = eq + ek
    madd = None if mask_add is None else np.asarray(mask_add, dtype=np.float64)
    hold = min(acc.max_finite, fmt.max_finite if ker.score_stores else acc.max_finite)
    mmax = 0.0 if madd is None else float(np.max(np.abs(madd), initial=0.0))
    xs = None
    if extras is not None:
        assert madd is None, "a variant's mask is part of its scores"
        xs = np.where(allowed, np.asarray(extras.scores, dtype=np.float64), 0.0)
        mmax = float(np.max(np.where(np.isfinite(xs), np.abs(xs), np.inf), initial=0.0))
    tb = qb @ kb.T
    Ab = np.abs(qb) @ np.abs(kb).T
    if abs(e2) < 900 and math.ldexp(E * max(1.0, abs(c)), e2) + mmax < hold / 2 and not (
            ker.scaled_query and float(np.max(np.abs(q), initial=0.0)) * abs(c) > fmt.max_finite / 2):
        # nothing can overflow (|q̄|, |k̄| < 1, so Σ|q̄||k̄| < E): plain products
        f2 = math.ldexp(1.0, e2)
        t = tb * (c * f2)
        A = Ab * (abs(c) * f2)
        ok = np.ones((R, S), dtype=bool)
    else:
        # ---- rows whose kernel would overflow: partial dot products (≤ Σ|q||k|
        # unscaled, ≤ A scaled) in the accumulation dtype, the stored scores in the
        # dtype holding them
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            raw = np.ldexp(np.abs(tb), e2)             # |q·k| unscaled
            dot = np.ldexp(Ab, e2)                     # Σ_e |q_e||k_je| unscaled
            t = np.ldexp(tb * c, e2)
            A = np.ldexp(Ab * abs(c), e2)
            ssum = np.abs(t) if madd is None else np.abs(t) + np.abs(madd)
            ok = (np.maximum(A, dot) <= acc.max_finite) & (ssum <= acc.max_finite)
            if ker.score_stores:
                stored = np.maximum(np.abs(t), ssum)
                if not ker.scaled_query:
                    stored = np.maximum(stored, raw)
                ok &= stored <= fmt.max_finite
            if ker.scaled_query:
                ok &= np.all(np.abs(q) * abs(c) <= fmt.max_finite, axis=-1)[:, None]
    if xs is not None:          # the final scores of a variant as the kernel holds them
        ok = ok & np.isfinite(xs) & (np.abs(xs) <= hold)
    over = allowed & ~ok
    if uniform_rows is not None and np.any(uniform_rows):
        over &= ~uniform_rows[:, None]
    # normalised over the rows (axis -2): one overflow spoils every row
    vac_rows = np.any(over, axis=-1) if softmax_axis == -1 else np.full(R, bool(np.any(over)))
    if not np.all(ok):
        t = np.where(over | ~np.isfinite(t), 0.0, t)
        A = np.where(over | ~np.isfinite(A), 0.0, A)
        if madd is not None:
            madd = np.where(over, 0.0, madd)
        if xs is not None:
            xs = np.where(over, 0.0, xs)
    if uniform_rows is not None and np.any(uniform_rows):
        z = uniform_rows[:, None]
        t, A = np.where(z, 0.0, t), np.where(z, 0.0, A)
        madd = None if madd is None else np.where(z, 0.0, madd)
        xs = None if xs is None else np.where(z, 0.0, xs)
    s = xs if xs is not None else (t if madd is None else t + madd)

    # ---- exact weights (float64), row maxima, log-weights
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        sm = np.where(allowed, s, -np.inf)
        smax = np.max(sm, axis=softmax_axis, keepdims=True) if sm.shape[softmax_axis] else sm
        smax = np.where(np.isfinite(smax), smax, 0.0)
        e = np.where(allowed, np.exp(sm - smax), 0.0)
        tot = np.sum(e, axis=softmax_axis, keepdims=True)
        p = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
        spread = np.where(allowed, smax - s, 0.0)
    n_ax = np.sum(allowed, axis=softmax_axis, keepdims=True).astype(np.float64)
    n_row = np.sum(allowed, axis=-1, keepdims=True).astype(np.float64)
    vals = _Values(vb, kappa)
    dvb = None if dv is None else np.ldexp(np.asarray(dv, dtype=np.float64), -ev)

    # ---- step 1: score errors (in score units)
    # shared by the row: the scale held in u_a (exact when representable), the
    # scaled query rounded to u (eager_scaled_query; exact for a power-of-two scale),
    # errors dq of a projected query.  A shift common to every score of the row
    # changes no weight, so a shared error d_j = c (δ∘q)·k_j counts only through
    # c (δ∘q)·(k_j − k_top), k_top the row's top key: |·| ≤ |c| Σ_e |δ_e q_e||k_je − k_top,e|
    # ≤ |c| ||δ∘q|| ||k_j − k_top|| (Cauchy–Schwarz; the norms by expansion, one matmul)
    sh = np.zeros_like(A)
    shift_ok = extras is None or extras.centred
    need_dist = ((ker.scaled_query and not _is_pow2(c)) or dq is not None) and shift_ok
    if softmax_axis == -1 and S and shift_ok:
        with np.errstate(invalid="ignore"):
            top = np.argmax(np.where(allowed, s, -np.inf), axis=-1)
        t_top = np.take_along_axis(t, top[:, None], axis=-1)
        t_rel = np.abs(t - t_top)
        if need_dist:
            n2 = np.sum(kb * kb, axis=-1)
            kt = kb[top]                                   # (R, E) the top keys, scaled
            d2 = n2[None, :] - 2.0 * (kt @ kb.T) + n2[top][:, None]
            d2 = np.maximum(d2, 0.0) + 2.0**-40 * (n2[None, :] + n2[top][:, None])
            with np.errstate(over="ignore", under="ignore"):
                dist = np.ldexp(np.sqrt(d2), ek)           # ||k_j − k_top||
    else:
        t_rel = np.abs(t)
        need_dist = False
    # the scale as the kernel holds it: rounded in u_a even for a power of two, since
    # exp2 kernels fold log2(e) into it (FlashAttention: softmax_scale_log2); FP8
    # kernels multiply the descale factors into it (one rounding each)
    n_scale = 1 if extras is None else extras.scale_roundings
    sh = sh + n_scale * ua * t_rel
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if ker.scaled_query and not _is_pow2(c):
            qs = u * (1.0 + ua) * A
            if need_dist:
                qn = np.sqrt(np.sum(qb * qb, axis=-1))[:, None]
                qs = np.minimum(qs, u * (1.0 + ua) * abs(c) * np.ldexp(qn, eq) * dist
                                * (1.0 + 2.0**-40))
            sh = sh + qs
        if ker.scaled_query:                       # q·c underflowing in the output dtype
            sh = sh + eta_u * np.sum(np.abs(k), axis=-1)[None, :]
        if dq is not None:
            dqa = np.asarray(dq, dtype=np.float64)
            dqs = abs(c) * (dqa @ np.abs(k).T)
            if need_dist:
                dqn = np.sqrt(np.sum(dqa * dqa, axis=-1))[:, None]
                dqs = np.minimum(dqs, abs(c) * dqn * dist * (1.0 + 2.0**-40))
            sh = sh + dqs
    sh = np.where(allowed & np.isfinite(sh), sh, np.where(allowed, _FMAX, 0.0))
    # independent per key: the dot product (E roundings in u_a, each ≤ u_a A (1 + γ)),
    # the product by c (fused, u_a), the stores of an eager kernel (u), the mask add
    gE = float(gamma(E, ua))
    ind = gE * A
    var_s = E * (ua * A * (1.0 + gE)) ** 2
    n_store = ker.score_stores
    ind = ind + (ua if n_store == 0 else 0.0) * np.abs(t) + n_store * u * np.abs(t)
    var_s = var_s + ((ua * t) ** 2 if n_store == 0 else n_store * (u * t) ** 2)
    if madd is not None:
        add = us * (np.abs(t) + np.abs(madd))
        ind, var_s = ind + add, var_s + add * add
    ind = ind + (eta_u if n_store else eta_a) * (1 + n_store)
    if dk is not None:
        dkk = abs(c) * ((np.abs(q) + (0.0 if dq is None else np.asarray(dq))) @ np.asarray(dk).T)
        ind, var_s = ind + dkk, var_s + dkk * dkk
    if extras is not None:      # the variant's own roundings (softcaps, biases)
        ind = ind + np.where(allowed, extras.ind, 0.0)
        var_s = var_s + np.where(allowed, extras.var, 0.0)
    # our own float64 evaluation of the scores errs by ≤ γ_{E+2}(2^-53) A_j + 2^-52 |s_j|:
    # counted as a score error (both the kernel's and the exact weights are then within
    # the perturbation bound of the float64 weights used below)
    d_eval = float(gamma(E + 2, 2.0**-53)) * A + 2.0**-52 * np.abs(s)
    if extras is not None:
        d_eval = d_eval + np.where(allowed, extras.d_eval, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        D = np.where(allowed, (sh + ind) * (1.0 + 4.0 * (u + ua)) + 2.0 * d_eval, 0.0)
        D = np.where(np.isfinite(D), D, _FMAX / 4)
    d_eval_row = np.max(np.where(allowed, d_eval, 0.0), axis=-1, keepdims=True) if S \
        else np.zeros((R, 1))

    # ---- step 3: per-key weight errors (relative), and the shared θ: the argument
    # ŝ_j − ŝ_max and its conversion to base 2 (exp2 kernels) are two roundings in u_a,
    # e^{±2 u_a spread} − 1 ≤ 2 u_a spread e^{2 u_a spread} on the weight
    n_w = [K_EXP * ua, ua, model.uw] + ([u] if kappa is not None else [])
    c0 = math.expm1(sum(math.log1p(x_) for x_ in n_w))     # Π(1 + x_i) − 1
    arg = 2.0 * ua * spread
    arg_rel = np.expm1(np.minimum(arg, _EXP_CAP))           # e^{2 u_a spread} − 1
    r = c0 + arg_rel * (1.0 + c0)                           # (1 + c0) e^{arg} − 1
    r1 = sum(n_w) + arg                                     # its first-order part
    var_w = 2.0 * (ua * spread) ** 2 + sum(x * x for x in n_w)
    shared_n = 1 + (1 if kappa is not None else 0)           # reciprocal, dropout scale
    g_sum_w = gamma(2 * n_ax, ua)
    g_theta_w = (1.0 + g_sum_w) * (1.0 + float(gamma(shared_n, ua))) - 1.0
    F = (1.0 + r) * (1.0 + g_theta_w) - 1.0

    # ---- step 2 (exact): |p̃_j − p_j| ≤ p_j expm1(D_j + Λ), Λ = log Σ_k p_k e^{D_k},
    # evaluated in log space (log p_j = s_j − lse): no underflow of p hides a large
    # perturbation, and nothing is capped
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        lse = smax + np.log(np.where(tot > 0, tot, 1.0))
        logp = np.where(allowed, s - lse, -np.inf)
        ld = np.where(allowed, logp + D, -np.inf)
        mld = np.max(ld, axis=softmax_axis, keepdims=True) if ld.shape[softmax_axis] else ld
        mld = np.where(np.isfinite(mld), mld, 0.0)
        lam_s = mld + np.log(np.maximum(np.sum(np.exp(ld - mld), axis=softmax_axis,
                                               keepdims=True), 1e-300))
        lam_s = np.maximum(lam_s, 0.0)                       # Λ ≥ 0 (Jensen: Σ p e^D ≥ 1)
        x = D + lam_s                                        # ≥ 0
        ex = np.expm1(np.minimum(x, _EXP_CAP))
        p_ok = (p > 0) & (x < _EXP_CAP)
        dps = np.where(allowed, np.minimum(p * ex, 1.0), 0.0)
        ptil = np.where(allowed, np.minimum(p * (1.0 + ex), 1.0), 0.0)
        far = np.flatnonzero((allowed & ~p_ok).ravel())
        if far.size:        # p underflowed or x ≥ 700: in log space, log expm1(x) = x +
            lp, xx = logp.ravel()[far], x.ravel()[far]       # log1p(−e^{−x})
            lexm1 = np.where(xx > 0, xx + np.log1p(-np.exp(-np.maximum(xx, 1e-300))), -np.inf)
            dps.ravel()[far] = np.minimum(np.exp(lp + lexm1), 1.0)
            ptil.ravel()[far] = np.minimum(np.exp(lp + xx), 1.0)
    dps = np.where(np.isnan(dps), 1.0, dps)
    ptil = np.where(np.isnan(ptil), 1.0, ptil)
    dpw = np.where(allowed, np.minimum(ptil * F, 1.0), 0.0)
    if centred and S:
        top = np.argmax(np.where(allowed, s, -np.inf), axis=-1)
        kap_top = None if kappa is None else kappa[np.arange(R), top][:, None]
        a_top = vb[top] if kap_top is None else vb[top] * kap_top     # ã_top per row

    # ---- outputs and natural scales (scaled units): one matmul per weight matrix
    Mp = vals.moments(p)
    y, pv = Mp.li, Mp.ab
    assert y is not None and pv is not None
    n_pv = 2.0 * n_row
    n_fin = 2 + (0 if extras is None else extras.final_roundings)
    fin = float(gamma(n_fin, ua)) + u * (1.0 + float(gamma(n_fin, ua)))
    Dm = np.minimum(_rowmax(D, allowed), _EXP_CAP / 4)

    def worst(rows: np.ndarray) -> np.ndarray:
        """The worst-case bound W of the rows ``rows``."""
        ps, dps_r, dpw_r, y_r, pv_r = p[rows], dps[rows], dpw[rows], y[rows], pv[rows]
        vr = _Values(vb, None if kappa is None else kappa[rows])
        Md = vr.moments(dps_r)
        dpw_abs = vr.moments(dpw_r, li=False, sq=False).ab
        assert Md.ab is not None and dpw_abs is not None
        # Σ_j (p̃_j − p_j) w_j = Σ_{j≠top} (p̃_j − p_j)(ã_j − ã_top)  (Σ p̃ = Σ p = 1)
        if centred and S:
            Md_top = Md.without(dps_r[np.arange(len(rows)), top[rows]][:, None], a_top[rows])
            term_s = np.minimum(Md.absdev(y_r), Md_top.absdev(a_top[rows]))
        else:
            term_s = Md.ab
        pv_hat = pv_r + Md.ab + dpw_abs
        acc_w = gamma(n_pv[rows], ua) * pv_hat
        dv_w = 0.0
        if dvb is not None:
            dphat = ps + dps_r + dpw_r
            dv_w = (dphat if kappa is None else dphat * kappa[rows]) @ dvb
        pre_w = term_s + dpw_abs + acc_w + dv_w
        return np.asarray(pre_w + fin * (np.abs(y_r) + pre_w))

    if not prob:
        tolb = worst(np.arange(R))
    else:
        # ---- probabilistic: shared (deterministic) + Hoeffding over key groups
        # keys with equal scores round alike in the softmax; keys with equal products
        # t_j (repeated key vectors) alike in the dot product, whatever their masks or
        # biases: each key is charged with the larger of its two groups
        N = _tie_counts(s, allowed)
        if madd is not None or extras is not None:
            N = np.maximum(N, _tie_counts(t, allowed))
        dev_p = Mp.absdev(y)                                 # Σ_j p_j |w_j|
        if ker.scaled_query or dq is not None:
            sh_term = vals.moments(np.where(allowed, p * sh, 0.0)).absdev(y)
        else:                                  # small shared errors: max_j Sh_j Σ p|w|
            sh_term = _rowmax(sh, allowed) * dev_p
        ww = np.where(allowed, N * p * p * (var_s + var_w), 0.0)
        hoef = hoeffding_bound(vals.moments(ww, ab=False).quad(y), lam)
        common_det = np.sum(np.where(allowed, p * r, 0.0), axis=-1, keepdims=True)
        common_h = lam * np.sqrt(np.sum(np.where(allowed, N * p * p * var_w, 0.0), axis=-1,
                                        keepdims=True))
        g_sum_p = np.minimum(g_sum_w, gamma_tilde(2 * n_ax, ua, model.lam_sums))
        g_theta_p = (1.0 + g_sum_p) * (1.0 + float(gamma(shared_n, ua))) - 1.0
        common = np.abs(y) * (np.minimum(common_det, common_h) + g_theta_p)
        rem1 = Dm * Dm * np.exp(2.0 * Dm) * dev_p
        # second order: (p̃ − p)·ρ and the products of the weights' own errors; the
        # perturbed weights: Σ_j (|p̃_j − p_j| + |p̂_j − p̃_j|)|ã_j| ≤ f pv, f the row's
        # largest expm1(x_j) + e^{x_j} F_j
        F1 = r1 + g_theta_p
        Fp = (1.0 + r) * (1.0 + g_theta_p) - 1.0
        fx = _rowmax(ex + (1.0 + ex) * F, allowed)
        rem2 = _rowmax(F, allowed) * _rowmax(ex, allowed) * pv
        rem3 = _rowmax(np.maximum(Fp - F1, 0.0), allowed) * pv
        pv_hat = pv * (1.0 + fx)
        acc_p = np.minimum(gamma(n_pv, ua), gamma_tilde(n_pv, ua, model.lam_sums)) * pv_hat
        if dvb is None:
            dv_p = 0.0
        else:
            pk = p if kappa is None else p * kappa
            dv_p = lam * np.sqrt((N * pk * pk) @ (dvb * dvb)) + fx * (pk @ dvb)
        pre_p = sh_term + hoef + common + rem1 + rem2 + rem3 + acc_p + dv_p
        P = pre_p + fin * (np.abs(y) + pre_p)
        # the linear forms above weigh with the float64 weights: the exact ones differ by
        # a factor within e^{±2δ}, δ the row's evaluation error
        P = P * np.exp(np.minimum(2.0 * d_eval_row, _EXP_CAP))
        # W can only win on short rows (γ(2n) < γ̃(2n) while 2n < λ²) or where the
        # score errors are large (the remainders of P grow like D² e^{2D})
        need = ((n_row[:, 0] < 4.0 * model.lam_sums**2) | (Dm[:, 0] > 2.0**-8)
                | (d_eval_row[:, 0] > 2.0**-20) | ~np.all(np.isfinite(P), axis=-1))
        tolb = P
        rows = np.flatnonzero(need)
        if rows.size:
            tolb = P.copy()
            tolb[rows] = np.minimum(worst(rows), P[rows])
    # keys whose weight may fall below the output dtype's normal range when stored:
    # |fl(p) − p| ≤ max(u p, η_u), so η_u per such key on top of the relative terms
    wf = model.weights
    small = allowed & (p < 4.0 * math.ldexp(1.0, fmt.emin)) if wf is None else None
    eta_term: np.ndarray | float = 0.0
    if wf is not None:
        # weights stored unnormalised in the format wf (FP8 kernels): P̃_j = p_j / p_ref
        # ≤ 1, p_ref the row's largest weight; |fl(P̃) − P̃| ≤ max(u_w P̃, min(η_w, P̃)) (a
        # subnormal rounds by at most half a spacing, never by more than itself), so in
        # normalised weights min(η_w p_ref, p_j) per key that can fall below wf's normal
        # range, on top of the relative u_w charged above
        p_ref = _rowmax(p, allowed)
        eta_w = underflow_eta(wf)
        smallw = allowed & (p < 4.0 * math.ldexp(1.0, wf.emin) * p_ref)
        if np.any(smallw):
            a_eta = np.where(smallw, np.minimum(eta_w * p_ref, p), 0.0)
            Mw = vals.moments(a_eta, li=False, sq=False)
            assert Mw.ab is not None
            eta_s = Mw.ab
            if prob:
                nmax = _rowmax(N, allowed)
                sq2 = vals.moments(a_eta * a_eta, ab=False, li=False).sq
                assert sq2 is not None
                eta_s = np.minimum(eta_s, lam * np.sqrt(nmax * sq2))
            eta_term = np.ldexp(eta_s, ev) if abs(ev) < 2000 else eta_s * 2.0**ev
    elif small is not None and np.any(small):
        Ms = vals.moments(small.astype(np.float64), li=False)
        assert Ms.ab is not None and Ms.sq is not None
        n_w_u = 1.0 + (1.0 if kappa is not None else 0.0)       # the P store, dropout
        eta_s = n_w_u * Ms.ab                                     # Σ_small |ã_j|, scaled
        if prob:
            nmax = _rowmax(N, allowed)
            eta_s = np.minimum(eta_s, lam * np.sqrt(n_w_u * nmax * Ms.sq))
        eta_term = np.ldexp(eta_s, ev) * eta_u if abs(ev) < 2000 else eta_s * eta_u * 2.0**ev
    tolb = tolb * (1.0 + 2.0**-40)              # the float64 rounding of the bound itself
    # fully masked rows: an exact zero (or NaN) is expected
    tolb = np.where(alive if softmax_axis == -1 else True, tolb, 0.0)

    # ---- back to unscaled units, underflow, vacuity
    with np.errstate(over="ignore", invalid="ignore"):
        tol = np.ldexp(tolb, ev) if abs(ev) < 2000 else tolb * math.ldexp(1.0, ev)
        pv_u = np.ldexp(pv, ev)
        vmax = float(np.max(np.abs(v), initial=0.0)) * (
            1.0 if kappa is None else float(np.max(np.abs(kappa), initial=1.0)))
        # underflow, in absolute terms: the weights stored in the output dtype (and the
        # dropout product) err by η_u only where they fall below its normal range (the
        # keys `small`; above it the relative terms hold), the final store by η_u; in the
        # accumulation dtype every exp, product, rescaling and division may underflow
        tol_kernel = tol + 4.0 * eta_a * (n_row * (vmax + 1.0) + 1.0)
        tol = tol_kernel + eta_term + eta_u * 2.0
    vacuous = np.broadcast_to(vac_rows[:, None], tol.shape) | ~np.isfinite(tol)
    row_alive = np.any(allowed, axis=-1, keepdims=True)
    # vacuous: the kernel's own errors (relative terms, underflow or flushing in the
    # accumulation) reach the natural size Σ p|v|: every digit may be lost.  The output
    # format's underflow (the stores of P and O) is not counted: an answer whose natural
    # size is below it sits in the format's subnormal range, where even the correctly
    # rounded answer may be zero (a fp16 value of 2^-24 with one key was refused; found by
    # the property-based example)
    vacuous = vacuous | ((tol_kernel >= pv_u) & (pv_u > 0) & row_alive)
    tol = np.where(np.isfinite(tol), np.minimum(tol, _FMAX), _FMAX)
    return Bound(np.asarray(tol, dtype=np.float64), np.asarray(vacuous))


def batched_attention_error_bound(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, p: np.ndarray | None = None, *,
    scale: float, allowed: np.ndarray, mask_add: np.ndarray | None = None,
    out: np.ndarray | None = None, fmt: Any = None, acc: Any = None,
    model: ErrorModel | None = None, dq: np.ndarray | None = None,
    dk: np.ndarray | None = None, dv: np.ndarray | None = None, softmax_axis: int = -1,
) -> np.ndarray:
    """The bound of :func:`attention_error_bound` (one head's rows) on whole arrays
    ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)`` (heads matched;
    ``allowed``, ``mask_add`` broadcastable to (..., L, S)), as the backward
    model uses it: the worst-case model of ``fmt``/``acc`` unless ``model`` is given.
    ``p`` and ``out`` are accepted and ignored (the weights are recomputed).

    >>> import numpy as np
    >>> b = batched_attention_error_bound(np.eye(2)[None], np.eye(2)[None], np.eye(2)[None],
    ...                                   scale=1.0, allowed=np.ones((1, 2, 2), bool), fmt="float32")
    >>> b.shape, bool(np.all(b < 1e-5))
    ((1, 2, 2), True)
    """
    del p, out
    if model is None:
        if fmt is None:
            raise SpecError("batched_attention_error_bound needs model= or fmt= (and acc=)")
        model = ErrorModel(format_of(fmt), format_of(acc if acc is not None else fmt),
                           kind="worst_case")
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    L, S, Ev = q.shape[-2], k.shape[-2], v.shape[-1]
    qb, kb, vb = (np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in (q, k, v))
    al = np.broadcast_to(allowed, (*lead, L, S))
    ma = None if mask_add is None else np.broadcast_to(mask_add, (*lead, L, S))
    dqb = None if dq is None else np.broadcast_to(dq, qb.shape)
    dkb = None if dk is None else np.broadcast_to(dk, kb.shape)
    dvb = None if dv is None else np.broadcast_to(dv, vb.shape)
    res = np.zeros((*lead, L, Ev))
    for idx in np.ndindex(*lead):
        res[idx] = attention_error_bound(
            np.asarray(qb[idx], float), np.asarray(kb[idx], float), np.asarray(vb[idx], float),
            scale=scale, allowed=np.asarray(al[idx]), model=model,
            mask_add=None if ma is None else np.asarray(ma[idx], float),
            dq=None if dqb is None else np.asarray(dqb[idx], float),
            dk=None if dkb is None else np.asarray(dkb[idx], float),
            dv=None if dvb is None else np.asarray(dvb[idx], float),
            softmax_axis=softmax_axis).tol
    return res


# --------------------------------------------------------------------------------------
# Linear maps (the projections of a multi-head block)
