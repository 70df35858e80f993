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

import numpy as np

from ..tolerance import (
    _EXP_CAP,
    _FMAX,
    K_EXP,
    ErrorModel,
    gamma,
    gamma_tilde,
    hoeffding_bound,
)
from . import model_jit as jit
from .model_finish import _final_roundings, _finish, _underflow
from .moments import (
    Bound,
    HeadCache,
    KeyRange,
    ScoreExtras,
    _is_pow2,
    _Moments,
    _pow2_exponent,
    _rowmax,
    _tie_counts,
    _Values,
)

__all__ = ["Bound", "HeadCache", "ScoreExtras", "attention_error_bound"]


# --------------------------------------------------------------------------------------
# The bound for one chunk of rows of one head


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
    head: HeadCache | None = None,
    keys: slice | None = None,
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
    ``head``: a :class:`HeadCache` shared by the chunks of one head (same ``k``, ``v``).
    ``keys``: a range ``j0:j1`` outside which no row has a key (issue 29): ``allowed``,
    ``mask_add``, ``kappa`` hold its columns, ``k``, ``v``, ``dk``, ``dv`` the head's rows.
    Fully masked rows (no allowed key, not uniform) get the bound of an exact zero.

    >>> import numpy as np
    >>> from mha_symbolic.testing.tolerance import error_model
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
            softmax_axis=softmax_axis, extras=extras, head=head, keys=keys)


class _Work:
    """What the steps of one chunk's bound share, set step by step (the notation of the
    module docstring; ``*b`` arrays are in the scaled units of step 0)."""

    R: int
    E: int
    S: int
    Ev: int
    model: ErrorModel
    prob: bool              # the probabilistic model (rows normalised over the keys)
    centred: bool           # softmax over the keys: errors measured from the top key
    axis: int
    allowed: np.ndarray
    full: bool              # every key of every row takes part: masks select nothing
    alive: np.ndarray
    uniform: np.ndarray | None
    kappa: np.ndarray | None
    extras: ScoreExtras | None
    has_dq: bool
    n_terms: int | None     # the head's key count when the chunk holds a range of keys
    j0: int                 # ... starting at key j0
    # step 0: scaled operands and scores
    eq: int
    ek: int
    ev: int
    qb: np.ndarray
    kb: np.ndarray
    vb: np.ndarray
    c: float
    t: np.ndarray
    A: np.ndarray
    s: np.ndarray
    madd: np.ndarray | None
    vac_rows: np.ndarray
    # exact weights
    smax: np.ndarray
    tot: np.ndarray
    p: np.ndarray
    spread: np.ndarray
    arg_m: np.ndarray | None    # min(2 u_a spread, cap) when the fused loops made it
    top_fused: np.ndarray | None    # argmax(on(s, −inf)) when the fused loops made it
    n_ax: np.ndarray
    n_row: np.ndarray
    vals: _Values
    dvb: np.ndarray | None
    # step 1: score errors
    top: np.ndarray | None
    sh: np.ndarray
    var_s: np.ndarray
    D: np.ndarray
    d_eval_row: np.ndarray
    # step 3: weight errors
    r: np.ndarray
    r1: np.ndarray
    var_w: np.ndarray
    shared_n: int
    g_sum_w: np.ndarray
    F: np.ndarray
    # step 2: the exact perturbation in log space
    logp: np.ndarray
    x: np.ndarray
    ex: np.ndarray

    def on(self, a: np.ndarray, fill: float) -> np.ndarray:
        """``np.where(allowed, a, fill)`` for an (R, S) array ``a`` (``a`` itself when
        every key takes part: the same values without the pass)."""
        return a if self.full else np.where(self.allowed, a, fill)

    def key_sum(self, a: np.ndarray) -> np.ndarray:
        """Σ over the softmax axis (masked keys 0), for a chunk cut to a range of keys
        summed over the head's S keys by numpy's pairwise order, zeros put back: Λ (step
        2) is the log of a sum near 1, whose last bit the order would change ×2^13."""
        if self.n_terms is None or self.axis != -1:
            return np.asarray(np.sum(a, axis=self.axis, keepdims=True))
        full = np.zeros((a.shape[0], self.n_terms))
        full[:, self.j0:self.j0 + a.shape[1]] = a
        return np.asarray(np.sum(full, axis=-1, keepdims=True))

    def rowmax(self, a: np.ndarray) -> np.ndarray:
        """:func:`_rowmax` of an (R, S) array (one pass fewer when every key takes part;
        the same values: a row's maximum over all its keys, 0 for S = 0)."""
        if self.full and a.shape == self.allowed.shape and self.S:
            return np.asarray(np.max(a, axis=-1, keepdims=True))
        return _rowmax(a, self.allowed)


def _attention_error_bound(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, allowed: np.ndarray,
    model: ErrorModel, mask_add: np.ndarray | None, kappa: np.ndarray | None,
    uniform_rows: np.ndarray | None, dq: np.ndarray | None, dk: np.ndarray | None,
    dv: np.ndarray | None, softmax_axis: int, extras: ScoreExtras | None = None,
    head: HeadCache | None = None, keys: slice | None = None,
) -> Bound:
    """The steps of the module docstring, in order (each a function below)."""
    R = q.shape[0]
    Ev = v.shape[1]
    if R == 0 or Ev == 0:
        return Bound(np.zeros((R, Ev)), np.zeros((R, Ev), dtype=bool))
    hc: HeadCache | KeyRange = HeadCache() if head is None else head
    v_all, n_terms = v, None
    if keys is not None:            # the head's scalings and key count, the range's keys
        j0, j1 = keys.start, keys.stop
        hc, n_terms = KeyRange(head or HeadCache(), k, v, j0, j1), k.shape[0]
        k, v = k[j0:j1], v[j0:j1]
        dk, dv = (None if d is None else d[j0:j1] for d in (dk, dv))
    w = _setup(q, v, allowed, model, kappa, uniform_rows, softmax_axis, extras)
    w.n_terms, w.j0 = n_terms, 0 if keys is None else keys.start
    _scaled_scores(w, q, k, v, scale, mask_add, hc)
    _exact_weights(w, dv)
    errs = _score_errors(w, q, k, dq, dk)
    if errs is not None:        # None: done in one fused pass
        _finish_score_errors(w, *errs)
    _weight_errors(w)
    _log_perturbation(w)
    # outputs and natural scales (scaled units): one matmul per weight matrix
    Mp = w.vals.moments(w.p)
    assert Mp.li is not None and Mp.ab is not None
    if not w.prob:
        tolb, N = _worst(w, np.arange(R), Mp.li, Mp.ab), None
    else:
        tolb, N = _probabilistic(w, Mp)
    return _finish(w, tolb, _underflow(w, N), v_all, Mp.ab)


def _setup(q: np.ndarray, v: np.ndarray, allowed: np.ndarray, model: ErrorModel,
           kappa: np.ndarray | None, uniform_rows: np.ndarray | None, softmax_axis: int,
           extras: ScoreExtras | None) -> _Work:
    w = _Work()
    w.R, w.E = q.shape
    w.S, w.Ev = v.shape
    w.model = model
    w.prob = model.kind == "probabilistic" and softmax_axis == -1
    w.centred = softmax_axis == -1
    w.axis = softmax_axis
    allowed = np.asarray(allowed, dtype=bool)
    w.uniform = None
    if uniform_rows is not None and np.any(uniform_rows):
        # a fully masked row under masked_rows="uniform": every key, equal scores
        allowed = allowed | uniform_rows[:, None]
        w.uniform = uniform_rows[:, None]
    w.allowed = allowed
    w.full = bool(np.all(allowed))
    w.alive = np.any(allowed, axis=softmax_axis, keepdims=True)
    w.kappa, w.extras = kappa, extras
    w.has_dq = False
    return w


def _scaled_scores(w: _Work, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                   mask_add: np.ndarray | None, head: HeadCache | KeyRange) -> None:
    """Step 0: q = 2^eq q̄, k = 2^ek k̄, v = 2^ev v̄ (exact), σ = c 2^(eq+ek); products
    of scaled operands stay below E, and numpy's ldexp saturates to inf.  The scores t,
    their natural scales A, and the rows whose kernel would overflow (vacuous)."""
    model, extras, allowed = w.model, w.extras, w.allowed
    fmt, acc, ker = model.fmt, model.acc, model.kernel
    R, E, S = w.R, w.E, w.S
    eq = _pow2_exponent(q)
    ek, kb, akb = head.keys(k)
    ev, vb, w.vals = head.values(v)
    if w.kappa is not None:
        w.vals = _Values(vb, w.kappa, w.n_terms)
    w.eq, w.ek, w.ev = eq, ek, ev
    w.qb, w.kb, w.vb = qb, _, _ = np.ldexp(q, -eq), kb, vb
    c = w.c = float(scale)
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
    Ab = np.abs(qb) @ akb.T
    if abs(e2) < 900 and math.log2(E * max(1.0, abs(c))) + e2 < 1023 and (
            math.ldexp(E * max(1.0, abs(c)), e2) + mmax < hold / 2) and not (
            ker.scaled_query and float(np.max(np.abs(q), initial=0.0)) * abs(c) > fmt.max_finite / 2):
        # nothing can overflow (|q̄|, |k̄| < 1, so Σ|q̄||k̄| < E): plain products
        f2 = math.ldexp(1.0, e2)
        t = np.multiply(tb, c * f2, out=tb)
        A = np.multiply(Ab, abs(c) * f2, out=Ab)
        all_ok = True
        ok = np.ones((R, S), dtype=bool)
    else:
        # rows whose kernel would overflow: partial dot products (≤ Σ|q||k| unscaled,
        # ≤ A scaled) in the accumulation dtype, the stored scores in the dtype holding them
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
        all_ok = False
    if xs is not None:          # the final scores of a variant as the kernel holds them
        ok = ok & np.isfinite(xs) & (np.abs(xs) <= hold)
        all_ok = False
    if all_ok:                  # no overflow anywhere: nothing to zero
        w.vac_rows = np.zeros(R, dtype=bool)
    else:
        over = allowed & ~ok
        if w.uniform is not None:
            over &= ~w.uniform
        # normalised over the rows (axis -2): one overflow spoils every row
        w.vac_rows = np.any(over, axis=-1) if w.centred else np.full(R, bool(np.any(over)))
        if not np.all(ok):
            t = np.where(over | ~np.isfinite(t), 0.0, t)
            A = np.where(over | ~np.isfinite(A), 0.0, A)
            if madd is not None:
                madd = np.where(over, 0.0, madd)
            if xs is not None:
                xs = np.where(over, 0.0, xs)
    if w.uniform is not None:
        z = w.uniform
        t, A = np.where(z, 0.0, t), np.where(z, 0.0, A)
        madd = None if madd is None else np.where(z, 0.0, madd)
        xs = None if xs is None else np.where(z, 0.0, xs)
    w.t, w.A, w.madd = t, A, madd
    w.s = xs if xs is not None else (t if madd is None else t + madd)


def _exact_weights(w: _Work, dv: np.ndarray | None) -> None:
    """The exact weights p (float64), the row maxima and the spreads s_max − s_j."""
    ax, s = w.axis, w.s
    w.arg_m = w.top_fused = None
    fused = jit.shifted_scores(w)       # the passes before the exps fused, or None
    if fused is not None:
        e, smax = fused
    else:
        sm = w.on(s, -np.inf)
        smax = np.max(sm, axis=ax, keepdims=True) if sm.shape[ax] else sm
        smax = np.where(np.isfinite(smax), smax, 0.0)
        e = w.on(np.exp(sm - smax), 0.0)
    tot = w.key_sum(e)
    w.smax, w.tot = smax, tot
    pos = tot > 0
    if np.all(pos):             # the same values without the two selections
        w.p = np.divide(e, tot, out=e)
    else:
        w.p = np.where(pos, np.divide(e, np.where(pos, tot, 1.0), out=e), 0.0)
    if fused is None:
        w.spread = w.on(smax - s, 0.0)
    # key counts (exact in float64); along the keys the two counts are one array
    w.n_ax = (np.full(pos.shape, float(w.allowed.shape[ax])) if w.full else
              np.sum(w.allowed, axis=ax, keepdims=True).astype(np.float64))
    w.n_row = w.n_ax if ax in (-1, 1) else np.sum(
        w.allowed, axis=-1, keepdims=True).astype(np.float64)
    w.dvb = None if dv is None else np.ldexp(np.asarray(dv, dtype=np.float64), -w.ev)


def _score_errors(w: _Work, q: np.ndarray, k: np.ndarray, dq: np.ndarray | None,
                  dk: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Step 1, in score units: the shared errors Sh (the scale held in u_a, exact when
    representable; the scaled query rounded to u (eager_scaled_query; exact for a
    power-of-two scale); errors dq of a projected query), the independent ones I and
    their squares σS, our own float64 evaluation error.

    A shift common to every score of the row changes no weight, so a shared error d_j =
    c (δ∘q)·k_j counts only through c (δ∘q)·(k_j − k_top), k_top the row's top key:
    |·| ≤ |c| Σ_e |δ_e q_e||k_je − k_top,e| ≤ |c| ||δ∘q|| ||k_j − k_top|| (Cauchy–Schwarz;
    the norms by expansion, one matmul)."""
    model, ker, extras, allowed = w.model, w.model.kernel, w.extras, w.allowed
    w.has_dq = dq is not None
    u, ua, us, eta_u, eta_a = model.u, model.ua, model.us, model.eta, model.eta_a
    t, A, s, c, kb, qb, E, S = w.t, w.A, w.s, w.c, w.kb, w.qb, w.E, w.S
    shift_ok = extras is None or extras.centred
    need_dist = ((ker.scaled_query and not _is_pow2(c)) or dq is not None) and shift_ok
    w.top = None if not (w.centred and S) else (
        w.top_fused if w.top_fused is not None else np.argmax(w.on(s, -np.inf), axis=-1))
    if dq is None and dk is None and jit.score_errors(w):
        return None             # the plain path in one fused pass: the same values
    dist = None
    if w.centred and S and shift_ok:
        top = w.top
        assert top is not None
        t_top = np.take_along_axis(t, top[:, None], axis=-1)
        t_rel = np.abs(t - t_top)
        if need_dist:
            n2 = np.sum(kb * kb, axis=-1)
            kt = kb[top]                                   # (R, E) the top keys, scaled
            d2 = n2[None, :] - 2.0 * (kt @ kb.T) + n2[top][:, None]
            d2 = np.maximum(d2, 0.0) + 2.0**-40 * (n2[None, :] + n2[top][:, None])
            dist = np.ldexp(np.sqrt(d2), w.ek)             # ||k_j − k_top||
    else:
        t_rel = np.abs(t)
        need_dist = False
    # the scale as the kernel holds it: rounded in u_a even for a power of two, since
    # exp2 kernels fold log2(e) into it (FlashAttention: softmax_scale_log2); FP8
    # kernels multiply the descale factors into it (one rounding each)
    n_scale = 1 if extras is None else extras.scale_roundings
    sh = np.multiply(t_rel, n_scale * ua, out=t_rel)      # 0 + n ua |t − t_top|
    if ker.scaled_query and not _is_pow2(c):
        qs = u * (1.0 + ua) * A
        if dist is not None:
            qn = np.sqrt(np.sum(qb * qb, axis=-1))[:, None]
            qs = np.minimum(qs, u * (1.0 + ua) * abs(c) * np.ldexp(qn, w.eq) * dist
                            * (1.0 + 2.0**-40))
        sh = sh + qs
    if ker.scaled_query:                       # q·c underflowing in the output dtype
        sh = sh + eta_u * np.sum(np.abs(k), axis=-1)[None, :]
    if dq is not None:
        dqa = np.asarray(dq, dtype=np.float64)
        dqs = abs(c) * (dqa @ np.abs(k).T)
        if dist is not None:
            dqn = np.sqrt(np.sum(dqa * dqa, axis=-1))[:, None]
            dqs = np.minimum(dqs, abs(c) * dqn * dist * (1.0 + 2.0**-40))
        sh = sh + dqs
    fin = np.isfinite(sh)
    sh = np.where(allowed & fin, sh, np.where(allowed, _FMAX, 0.0)) if not (
        w.full and np.all(fin)) else sh
    w.sh = sh
    # independent per key: the dot product (E roundings in u_a, each ≤ u_a A (1 + γ)),
    # the product by c (fused, u_a), the stores of an eager kernel (u), the mask add
    gE = float(gamma(E, ua))
    ind = gE * A
    var_s = E * (ua * A * (1.0 + gE)) ** 2
    n_store = ker.score_stores
    at = np.abs(t)
    # the scalar product by c (ua, fused kernels) or the stores (n u): one term each (the
    # other's 0·|t| added nothing: |t| is finite, and D maps inf and NaN alike)
    ind = ind + (ua * at if n_store == 0 else n_store * u * at)
    var_s = var_s + ((ua * t) ** 2 if n_store == 0 else n_store * (u * t) ** 2)
    if w.madd is not None:
        add = us * (at + np.abs(w.madd))
        ind, var_s = ind + add, var_s + add * add
    ind = ind + (eta_u if n_store else eta_a) * (1 + n_store)
    if dk is not None:
        dkk = abs(c) * ((np.abs(q) + (0.0 if dq is None else np.asarray(dq))) @ np.asarray(dk).T)
        ind, var_s = ind + dkk, var_s + dkk * dkk
    if extras is not None:      # the variant's own roundings (softcaps, biases)
        ind = ind + np.where(allowed, extras.ind, 0.0)
        var_s = var_s + np.where(allowed, extras.var, 0.0)
    w.var_s = var_s
    # our own float64 evaluation of the scores errs by ≤ γ_{E+2}(2^-53) A_j + 2^-52 |s_j|:
    # counted as a score error (both the kernel's and the exact weights are then within
    # the perturbation bound of the float64 weights used below)
    d_eval = float(gamma(E + 2, 2.0**-53)) * A + 2.0**-52 * (at if s is t else np.abs(s))
    if extras is not None:
        d_eval = d_eval + np.where(allowed, extras.d_eval, 0.0)
    return sh, ind, d_eval


def _finish_score_errors(w: _Work, sh: np.ndarray, ind: np.ndarray, d_eval: np.ndarray
                         ) -> None:
    """D_j = (Sh_j + I_j)(1 + 4(u + u_a)) + 2 d_eval, and the row's evaluation error."""
    model = w.model
    D = w.on((sh + ind) * (1.0 + 4.0 * (model.u + model.ua)) + 2.0 * d_eval, 0.0)
    fin = np.isfinite(D)
    w.D = D if np.all(fin) else np.where(fin, D, _FMAX / 4)
    w.d_eval_row = w.rowmax(d_eval) if w.S else np.zeros((w.R, 1))


def _weight_errors(w: _Work) -> None:
    """Step 3: per-key weight errors (relative), and the shared θ: the argument ŝ_j −
    ŝ_max and its conversion to base 2 (exp2 kernels) are two roundings in u_a,
    e^{±2 u_a spread} − 1 ≤ 2 u_a spread e^{2 u_a spread} on the weight."""
    model, ua = w.model, w.model.ua
    n_w = [K_EXP * ua, ua, model.uw] + ([model.u] if w.kappa is not None else [])
    c0 = math.expm1(sum(math.log1p(x_) for x_ in n_w))     # Π(1 + x_i) − 1
    w.shared_n = 1 + (1 if w.kappa is not None else 0)      # reciprocal, dropout scale
    w.g_sum_w = gamma(2 * w.n_ax, ua)
    g_theta_w = (1.0 + w.g_sum_w) * (1.0 + float(gamma(w.shared_n, ua))) - 1.0
    if jit.weight_errors(w, c0, n_w, g_theta_w):
        return                  # the same values in one fused pass
    arg = 2.0 * ua * w.spread
    arg_rel = np.expm1(np.minimum(arg, _EXP_CAP))           # e^{2 u_a spread} − 1
    w.r = c0 + arg_rel * (1.0 + c0)                         # (1 + c0) e^{arg} − 1
    w.r1 = sum(n_w) + arg                                   # its first-order part
    w.var_w = 2.0 * (ua * w.spread) ** 2 + sum(x * x for x in n_w)
    w.F = (1.0 + w.r) * (1.0 + g_theta_w) - 1.0


def _log_perturbation(w: _Work) -> None:
    """Step 2 (exact): |p̃_j − p_j| ≤ p_j expm1(D_j + Λ), Λ = log Σ_k p_k e^{D_k},
    evaluated in log space (log p_j = s_j − lse): no underflow of p hides a large
    perturbation, and nothing is capped.  x_j = D_j + Λ and expm1(x_j)."""
    ax = w.axis
    lse = w.smax + np.log(np.where(w.tot > 0, w.tot, 1.0))
    fused = jit.log_weights(w, lse)     # the passes fused, or None
    smag = buf = None
    if fused is not None:
        mld, smag, ee = fused
        buf = ee                        # free once Λ is summed: expm1(x) goes there
    else:
        w.logp = logp = w.on(w.s - lse, -np.inf)
        ld = w.on(logp + w.D, -np.inf)
        mld = np.max(ld, axis=ax, keepdims=True) if ld.shape[ax] else ld
        mld = np.where(np.isfinite(mld), mld, 0.0)
        ee = np.exp(ld - mld)
    lam_s = mld + np.log(np.maximum(w.key_sum(ee), 1e-300))
    lam_s = np.maximum(lam_s, 0.0)                       # Λ ≥ 0 (Jensen: Σ p e^D ≥ 1)
    # Λ is near 0 but computed from terms near log p (lse, the shifted sum): its float64
    # evaluation errs absolutely, by at most (2n + 10)·2^-52·(1 + max|s| + |lse|) (the
    # sums' and logs' roundings, the ulps of the scores and of lse), not relatively
    n = float(w.n_terms if w.n_terms is not None else w.s.shape[ax])
    if smag is None:
        smag = np.max(np.abs(w.on(w.s, 0.0)), axis=ax, keepdims=True, initial=0.0)
    lam_s = lam_s + (2.0 * n + 10.0) * 2.0**-52 * (1.0 + smag + np.abs(lse))
    w.x = w.D + lam_s                                    # ≥ 0
    w.ex = np.expm1(np.minimum(w.x, _EXP_CAP), out=buf)


def _perturbed_weights(w: _Work, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the rows ``rows``: |p̃_j − p_j| ≤ p_j expm1(x_j), p̃_j ≤ p_j e^{x_j}, and the
    evaluation errors of the perturbed weights |p̂_j − p̃_j| ≤ p̃_j F_j, each capped at 1."""
    fused = jit.perturbed_weights(w, rows)  # one pass unless a key needs log space
    if fused is not None:
        return fused
    allowed = w.allowed[rows]
    p, ex, x = w.p[rows], w.ex[rows], w.x[rows]
    p_ok = (p > 0) & (x < _EXP_CAP)
    dps = np.where(allowed, np.minimum(p * ex, 1.0), 0.0)
    ptil = np.where(allowed, np.minimum(p * (1.0 + ex), 1.0), 0.0)
    far = np.flatnonzero((allowed & ~p_ok).ravel())
    if far.size:        # p underflowed or x ≥ 700: in log space, log expm1(x) = x +
        lp, xx = w.logp[rows].ravel()[far], x.ravel()[far]       # log1p(−e^{−x})
        lexm1 = np.where(xx > 0, xx + np.log1p(-np.exp(-np.maximum(xx, 1e-300))), -np.inf)
        dps.ravel()[far] = np.minimum(np.exp(lp + lexm1), 1.0)
        ptil.ravel()[far] = np.minimum(np.exp(lp + xx), 1.0)
    dps, ptil = (np.where(np.isnan(z), 1.0, z) for z in (dps, ptil))
    dpw = np.where(allowed, np.minimum(ptil * w.F[rows], 1.0), 0.0)
    if far.size:    # p̃ F in log space where F saturated (2 u_a spread > cap, issue 30)
        exc = 2.0 * w.model.ua * np.broadcast_to(w.spread, w.p.shape)[rows].ravel()[far] - _EXP_CAP
        at, sat = far[exc > 0], exc > 0             # F < (1 + F_cap) e^exc
        lpf = np.minimum(lp[sat] + xx[sat], 0.0) + np.log1p(w.F[rows].ravel()[at]) + exc[sat]
        dpw.ravel()[at] = np.minimum(np.exp(lpf), 1.0)
    return dps, ptil, dpw


def _worst(w: _Work, rows: np.ndarray, y_r: np.ndarray, pv_r: np.ndarray) -> np.ndarray:
    """Steps 2–4 at their bounds (the worst case) for the rows ``rows`` (scaled units;
    ``y_r``, ``pv_r`` their outputs and natural scales Σ p|ã|)."""
    ua, kappa, vb = w.model.ua, w.kappa, w.vb
    dps_r, _, dpw_r = _perturbed_weights(w, rows)
    ps = w.p[rows]
    vr = w.vals if kappa is None else _Values(vb, kappa[rows], w.n_terms)
    Md = vr.moments(dps_r)
    dpw_abs = vr.moments(dpw_r, li=False, sq=False).ab
    assert Md.ab is not None and dpw_abs is not None
    # Σ_j (p̃_j − p_j) w_j = Σ_{j≠top} (p̃_j − p_j)(ã_j − ã_top)  (Σ p̃ = Σ p = 1)
    if w.centred and w.S:
        assert w.top is not None
        top = w.top[rows]
        a_top = vb[top] if kappa is None else vb[top] * kappa[rows, top][:, None]
        Md_top = Md.without(dps_r[np.arange(len(rows)), top][:, None], a_top)
        term_s = np.minimum(Md.absdev(y_r), Md_top.absdev(a_top))
    else:
        term_s = Md.ab
    pv_hat = pv_r + Md.ab + dpw_abs
    acc_w = gamma(2.0 * w.n_row[rows], ua) * pv_hat
    dv_w = 0.0
    if w.dvb is not None:
        dphat = ps + dps_r + dpw_r
        dv_w = (dphat if kappa is None else dphat * kappa[rows]) @ w.dvb
    pre_w = term_s + dpw_abs + acc_w + dv_w
    fin = _final_roundings(w)
    return np.asarray(pre_w + fin * (np.abs(y_r) + pre_w))


def _probabilistic(w: _Work, Mp: _Moments) -> tuple[np.ndarray, np.ndarray]:
    """Shared (deterministic) + Hoeffding over key groups, and the worst case on the
    rows where it can win; returns (bound in scaled units, the tie counts N).

    Keys with equal scores round alike in the softmax; keys with equal products t_j
    (repeated key vectors) alike in the dot product, whatever their masks or biases:
    each key is charged with the larger of its two groups."""
    model, allowed, p, kappa = w.model, w.allowed, w.p, w.kappa
    ua, lam, ker = model.ua, model.lam, model.kernel
    vals = w.vals
    N = _tie_counts(w.s, allowed)
    if w.madd is not None or w.extras is not None:
        N = np.maximum(N, _tie_counts(w.t, allowed))
    y, pv = Mp.li, Mp.ab
    assert y is not None and pv is not None
    dev_p = Mp.absdev(y)                                 # Σ_j p_j |w_j|
    g_sum_p = np.minimum(w.g_sum_w, gamma_tilde(2 * w.n_ax, ua, model.lam_sums))
    g_theta_p = (1.0 + g_sum_p) * (1.0 + float(gamma(w.shared_n, ua))) - 1.0
    st = _prob_passes(w, N, g_theta_p)
    Dm = np.minimum(st["Dmax"], _EXP_CAP / 4)
    if ker.scaled_query or w.has_dq:
        sh_term = vals.moments(w.on(p * w.sh, 0.0)).absdev(y)
    else:                                  # small shared errors: max_j Sh_j Σ p|w|
        sh_term = st["shmax"] * dev_p
    hoef = hoeffding_bound(vals.moments(st["ww"], ab=False).quad(y), lam)
    common_det = st["pr_sum"]
    common_h = lam * np.sqrt(st["nvw_sum"])
    common = np.abs(y) * (np.minimum(common_det, common_h) + g_theta_p)
    rem1 = Dm * Dm * np.exp(2.0 * Dm) * dev_p
    # second order: (p̃ − p)·ρ and the products of the weights' own errors; the
    # perturbed weights: Σ_j (|p̃_j − p_j| + |p̂_j − p̃_j|)|ã_j| ≤ f pv, f the row's
    # largest expm1(x_j) + e^{x_j} F_j
    fx = st["fx"]
    rem2 = st["Fmax"] * st["exmax"] * pv
    rem3 = st["rem3"] * pv
    pv_hat = pv * (1.0 + fx)
    n_pv = 2.0 * w.n_row
    acc_p = np.minimum(gamma(n_pv, ua), gamma_tilde(n_pv, ua, model.lam_sums)) * pv_hat
    if w.dvb is None:
        dv_p = 0.0
    else:
        pk = p if kappa is None else p * kappa
        dv_p = lam * np.sqrt((N * pk * pk) @ (w.dvb * w.dvb)) + fx * (pk @ w.dvb)
    pre_p = sh_term + hoef + common + rem1 + rem2 + rem3 + acc_p + dv_p
    P = pre_p + _final_roundings(w) * (np.abs(y) + pre_p)
    # the linear forms above weigh with the float64 weights: the exact ones differ by
    # a factor within e^{±2δ}, δ the row's evaluation error
    d_eval_row = w.d_eval_row
    P = P * np.exp(np.minimum(2.0 * d_eval_row, _EXP_CAP))
    # W can only win on short rows (γ(2n) < γ̃(2n) while 2n < λ²) or where the
    # score errors are large (the remainders of P grow like D² e^{2D})
    need = ((w.n_row[:, 0] < 4.0 * model.lam_sums**2) | (Dm[:, 0] > 2.0**-8)
            | (d_eval_row[:, 0] > 2.0**-20) | ~np.all(np.isfinite(P), axis=-1))
    rows = np.flatnonzero(need)
    tolb = P
    if rows.size:
        tolb = P.copy()
        # fmin: where P is NaN (0·inf at scores of 1e100-1e300) the worst case alone
        tolb[rows] = np.fmin(_worst(w, rows, y[rows], pv[rows]), P[rows])
    return tolb, N


def _prob_passes(w: _Work, N: np.ndarray, g_theta_p: np.ndarray
                 ) -> dict[str, np.ndarray]:
    """The passes of :func:`_probabilistic` over the (R, S) arrays: ww = on(N p²(σS +
    σW)) and the row quantities ((R, 1) each) max D, max Sh, Σ p r, Σ N p² σW,
    max(ex + (1 + ex) F), max F, max ex, max(max(Fp − F1, 0)) (masked keys 0); one
    fused loop (model_jit) when numba is there, the same values."""
    p = w.p
    fused = jit.prob_passes(w, N, g_theta_p)
    if fused is not None:
        return fused
    F, ex, r = w.F, w.ex, w.r
    Npp = N * p * p
    F1 = w.r1 + g_theta_p
    Fp = (1.0 + r) * (1.0 + g_theta_p) - 1.0
    return dict(
        ww=w.on(Npp * (w.var_s + w.var_w), 0.0), Dmax=w.rowmax(w.D), shmax=w.rowmax(w.sh),
        pr_sum=np.sum(w.on(p * w.r, 0.0), axis=-1, keepdims=True),
        nvw_sum=np.sum(w.on(Npp * w.var_w, 0.0), axis=-1, keepdims=True),
        fx=w.rowmax(ex + (1.0 + ex) * F), Fmax=w.rowmax(F), exmax=w.rowmax(ex),
        rem3=w.rowmax(np.maximum(Fp - F1, 0.0)))
