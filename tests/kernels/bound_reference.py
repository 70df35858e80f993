"""The tolerance model of mha_symbolic/testing/forward/model.py evaluated plainly:
the one-function, unblocked evaluation as it stood before issue 29 (commit 3a46ba0),
kept verbatim as the reference that the fast, step-wise evaluation must reproduce
(tests/testing/forward/test_attention_bound_fast.py).  Not imported by the package."""

from __future__ import annotations

import math

import numpy as np

from mha_symbolic.testing.forward.model import (
    Bound,
    ScoreExtras,
    _is_pow2,
    _pow2_exponent,
    _rowmax,
    _tie_counts,
    _Values,
)
from mha_symbolic.testing.tolerance import (
    _EXP_CAP,
    _FMAX,
    K_EXP,
    ErrorModel,
    gamma,
    gamma_tilde,
    hoeffding_bound,
    underflow_eta,
)


def reference_attention_error_bound(
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
        # the float64 evaluation of Λ errs absolutely (issue 29's review: log of a sum
        # near 1), by at most (2n + 10)·2^-52·(1 + max|s| + |lse|)
        n_keys = float(s.shape[softmax_axis])
        smag = np.max(np.abs(np.where(allowed, s, 0.0)), axis=softmax_axis, keepdims=True,
                      initial=0.0)
        lam_s = lam_s + (2.0 * n_keys + 10.0) * 2.0**-52 * (1.0 + smag + np.abs(lse))
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


