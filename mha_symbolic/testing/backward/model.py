"""The rounding-error model of the attention backward pass: how far may a correct
kernel's dQ, dK, dV (and mask gradient) lie from the exact gradients?

The kernel (FlashAttention-2, Dao 2023, Algorithm 2; and the autograd "MATH"
formulation) works in a dtype of unit roundoff u, storing tensors in it, with products
accumulated in u_a (float32 for fp16/bf16 kernels by default)::

    S = c·Q Kᵀ + M;  P = exp(S − lse);  dV = Wᵀ dO (W = f·keep∘P, dropout);
    dP = f·keep∘(dO Vᵀ);  D = rowsum(dO ∘ O) (FA) or rowsum(P ∘ dP) (MATH);
    dS = P ∘ (dP − D);  dQ = c·dS K;  dK = c·dSᵀ Q

Error sources, each bounded (A_ij = |c| Σ_e |q_ie||k_je| the natural size of a score;
γ̃_n the factor of a sum of n terms under the check's
:class:`~mha_symbolic.testing.tolerance.ErrorModel`, :meth:`ErrorModel.gamma_sum`:
the finite worst case γ(n) = (1 − u)^−n − 1, or in the probabilistic model the smaller
of it and Higham & Mary's γ̃_n(λ)):

==========  ===================================================  ==================
source      bound                                                structure
==========  ===================================================  ==================
score       σs_ij = γ̃_E A_ij + (K_SCORE u_a + u)(|c q·k| + |M|)  one per (i, j)
P           ρ P_ij, ρ = K_EXP u_a + u (exp, store)               one per (i, j)
dP          σp_ij = γ̃_Ev (|dO||V|ᵀ)_ij + (u + u_a)|dP_ij|        one per (i, j)
dS          σd_ij = (u + u_a)|dS_ij| (store)                     one per (i, j)
D           σD_i (FA: Σ_l |dO_il| δO_il + γ̃_Ev Σ|dO||O|; MATH:   one per row
            the sum's own errors); δO the forward model's bound
q, k        u relative (q, k pre-scaled by √c in the dtype)      one per element,
                                                                 shared by a row
                                                                 (q) or column (k)
sums        γ̃_n Σ|terms| for the accumulated products            per output
stores      u|x| for each stored gradient (2 for dQ, dK)         per output
==========  ===================================================  ==================

**Two bounds**, the error models of every check (:mod:`.tolerance`, the same
defaults and λ as the forward's).  ``"worst_case"`` (``"worst"`` is accepted): every
error at its bound with the worst sign, propagated to first order plus the exp's
convexity (it holds for any rounding, but it adds n errors coherently and grows like
n·u: for bf16 with long rows it exceeds the gradient itself, i.e. it is vacuous there).
``"probabilistic"`` (default; elementwise the smaller of it and the worst-case
propagation): the model
of Higham & Mary (SIAM J. Sci. Comput. 41(5), 2019) — every rounding error an
independent random variable of mean zero, bounded as above — propagated to first
order through the exact sensitivities of the formulas (∂dS_ij/∂S_ij' =
P_ij(δ_jj' − P_ij')Y_ij − P_ij dS_ij', Y = dP − D, and the like; docs/gradients.md §8
derives each), summed as

    tol = additive + λ·sqrt(Σ_sources (sensitivity · bound)²) · (1 + second order)

(Hoeffding: a sum of independent mean-zero terms |t_k| <= b_k exceeds
λ·sqrt(Σ b_k²) with probability <= 2 exp(−λ²/2)), with the λs of
:meth:`ErrorModel.with_events` such that the probability that any element of the check
exceeds its bound or any sum its γ̃ is at most
:data:`~mha_symbolic.testing.tolerance.FALSE_ALARM_PROBABILITY` = 1e-9 (union bound:
half the budget for the Hoeffding bounds, half for the sums).  Correlated errors (the row's D, a
query's pre-scaled entries shared by the row's scores, a key's shared by every row,
copies summed over GQA groups and broadcast dimensions) are combined coherently;
sums accumulated by the kernel take γ̃ (also probabilistic); the final stores are
added in full.  Sensitivities are bounded with Cauchy–Schwarz where an exact
evaluation would need a third-order tensor.

**Softcap** (s⁰ = c q·k, t = tanh(s⁰/C), s′ = C t + M, dS⁰ = dS′ ∘ (1 − t²) before
dQ, dK; :class:`~.bugs_backward.PlainBackward` ``cap``): the worst-case propagation
only, with the cap's errors — e_t = (σ⁰ + u_a(|s⁰| + σ⁰))/C + (K_TANH u_a + u)|t| (tanh
1-Lipschitz), the capped score's σ_s = C e_t + (K_SCORE u_a + u)(|s′| + |M|), the
factor's (2|t| + e_t) e_t + 2u_a + u, and D's forward bound widened by
(e^{2 max σ_s} − 1) Σ_j P|v| (docs/gradients.md §11.6).

**Huge scores** (issue 30: queries of 1e100–1e300, σ ≈ 1e84–1e284): where the
relative weight bound P(e^{σ+δ} − 1) admits any weight, the gap form of
:func:`_gap_weight_error` (the others' weights below e^{−(gap − 4σ)}, the top key's
error from the row sum's log) replaces it, and the forward error inside D is formed
from the same weight bounds (docs/testing.md, "Scores of 1e100–1e300").

**Vacuity** (:func:`natural_scales`): the natural size of a gradient element (the sum
of the absolute values of the terms it adds, down to the inputs: for dQ
``|c| Σ_j P_ij(N_ij + Σ_j' P_ij' N_ij')|k_j|`` with ``N = |dO||V|ᵀ``, and so on).  A
tolerance that reaches it, where it stands above the bound's absolute underflow floor,
says nothing; nor does one that admits an all-zero gradient where the exact one is not
zero (testing/backward.py).  The comparison then refuses a verdict
(:class:`~mha_symbolic.errors.ToleranceError`) rather than pass.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...errors import SpecError
from ..forward.model import attention_error_bound
from ..tolerance import (
    ERROR_MODELS,
    K_EXP,
    K_SCALE,
    K_SCORE,
    K_SOFTMAX,
    K_TANH,
    ErrorModel,
    format_of,
)
from .bugs import PlainBackward, reduce_to

__all__ = [
    "BACKWARD_KERNEL",
    "ERROR_MODELS",
    "backward_error_bound",
    "backward_events",
    "batched_attention_error_bound",
    "natural_scales",
]

#: How reports name the kernel the backward model describes.
BACKWARD_KERNEL = "FlashAttention-2 / autograd backward"

Arr = np.ndarray


def backward_events(pb: PlainBackward, n_elements: float) -> tuple[float, float]:
    """The probabilistic events of one backward check (for :meth:`ErrorModel.with_events`):
    the bounded elements (``n_elements`` gradients, and the forward output whose error
    enters D), and the terms of every sum the kernel accumulates: per problem and
    (query, key) pair, the score and dP dot products (E + E_v), its terms of dQ, dK
    (E each) and dV (E_v), of D and of the softmax sum; the copies summed over GQA
    groups and broadcast axes are counted once more each (at most every element)."""
    E, Ev = pb.q.shape[-1], pb.v.shape[-1]
    n_pairs = float(np.prod(pb.p.shape))
    per_pair = 3 * E + 2 * Ev + 2
    return n_elements + float(np.prod(pb.out.shape)), n_pairs * per_pair + 2 * n_elements


def _mm(a: Arr, b: Arr) -> Arr:
    # contiguous operands: numpy's stacked matmul falls back to a slow loop otherwise
    return np.matmul(np.ascontiguousarray(a, dtype=np.float64),
                     np.ascontiguousarray(b, dtype=np.float64))


def _t(a: Arr) -> Arr:
    return np.swapaxes(a, -1, -2)


def _rs(a: Arr) -> Arr:
    """Row sums, kept as a column."""
    return np.sum(a, axis=-1, keepdims=True)


class _Parts:
    """Per-problem error magnitudes shared by both bounds (``model``'s λs set)."""

    def __init__(self, pb: PlainBackward, model: ErrorModel, score_extra: Arr | None = None
                 ) -> None:
        u, ua = model.u, model.ua
        self.u, self.ua, self.eta = u, ua, model.eta
        q, k, v, do = pb.q, pb.k, pb.v, pb.do
        self.c = abs(pb.scale)
        Ev = v.shape[-1]
        self.L, self.S = q.shape[-2], k.shape[-2]
        allowed = pb.allowed
        self.gam = model.gamma_sum
        self.aq, self.ak, self.ado = np.abs(q), np.abs(k), np.abs(do)
        A = self.c * _mm(self.aq, _t(self.ak))
        qk = pb.scale * _mm(q, _t(k))
        self.sig_s, self.e_t = self._score_errors(pb, model, A, qk)
        if score_extra is not None:
            # a variant's own bound on each score's error (rotary: the kernel's rotation)
            self.sig_s = self.sig_s + np.where(allowed, score_extra, 0.0)
            if self.e_t is not None and pb.cap is not None:
                # a softcap: its argument s⁰/C errs by that much more (tanh 1-Lipschitz)
                self.e_t = self.e_t + np.where(allowed, score_extra, 0.0) / abs(float(pb.cap))
        self.rho = K_EXP * ua + u
        self.p, self.w = pb.p, pb.w
        self.keep_f = (np.where(pb.w > 0, pb.w / np.where(pb.p > 0, pb.p, 1.0), 0.0)
                       if pb.f != 1.0 else None)
        self.dP_w = _weight_error(pb, self.sig_s, model)
        self.dW = self.dP_w if self.keep_f is None else self.keep_f * self.dP_w + (ua + u) * pb.w
        self.dp, self.d, self.ds = pb.dp, pb.d, pb.ds
        self.y = pb.dp - pb.d
        base = self.gam(Ev) * _mm(self.ado, _t(np.abs(v)))
        self.sig_p = ((base if self.keep_f is None else self.keep_f * base)
                      + (u + ua) * np.abs(pb.dp))
        self.sig_ds = (u + ua) * np.abs(pb.ds)
        # D: the kernel's own forward output error (FA) or the row sum's errors (MATH)
        fwd = self._forward_error(pb, model, qk, score_extra is not None)
        self.d_fa = (_rs(self.ado * fwd) + self.gam(Ev) * _rs(self.ado * (np.abs(pb.out) + fwd)))
        self.pb = pb
        # the weights that may be non-zero: the exact ones, and where the weight bound
        # admits a kernel's weight above an exact one that underflowed to 0
        self.live = allowed & ((pb.p > 0) | (self.dP_w > 0))


    def _score_errors(self, pb: PlainBackward, model: ErrorModel, A: Arr, qk: Arr
                      ) -> tuple[Arr, Arr | None]:
        """σ_s, the bound on each score's error, and (softcap) e_t, on its tanh's."""
        u, ua, allowed = model.u, model.ua, pb.allowed
        E = pb.q.shape[-1]
        e_t: Arr | None = None
        if pb.cap is None:
            size = np.abs(qk) if pb.mask_add is None else np.abs(qk) + np.abs(pb.mask_add)
            sig_s = np.where(allowed, self.gam(E) * A + (K_SCORE * ua + u) * size, 0.0)
        else:
            # softcap t = tanh(s0/C), s' = C t (+ mask): s0 = c q·k errs by σ0; the
            # division by C adds u_a|s0/C|, tanh is 1-Lipschitz and its evaluation errs
            # by K_TANH u_a|t|, the store u|t|; then C·t and the mask as a score
            cap = abs(float(pb.cap))
            assert pb.cap_t is not None and pb.capped is not None
            sig0 = self.gam(E) * A + (K_SCORE * ua + u) * np.abs(qk)
            e_t = ((sig0 + ua * (np.abs(qk) + sig0)) / cap
                   + (K_TANH * ua + u) * np.abs(pb.cap_t))
            size = np.abs(pb.capped) if pb.mask_add is None \
                else np.abs(pb.capped) + np.abs(pb.mask_add)
            sig_s = np.where(allowed, cap * e_t + (K_SCORE * ua + u) * size, 0.0)
        return sig_s, e_t

    def _forward_error(self, pb: PlainBackward, model: ErrorModel, qk: Arr, extra: bool
                       ) -> Arr:
        """A bound on the kernel's own forward output error |Õ − O| (finite: the value
        hull and the gap form where the model's e^(score error) overflows)."""
        q, k, v, allowed, ua, u = pb.q, pb.k, pb.v, pb.allowed, model.ua, model.u
        madd = pb.mask_add
        if pb.capped is not None:
            # the forward's scores are the capped ones: the plain bound of q·k plus the
            # difference s' − c q·k as an additive part, and the cap's own errors (sig_s:
            # each weight moves by at most a factor e^{±2 max_j sig_s_ij}) on Σ_j P|v|
            madd = pb.capped - qk + (0.0 if pb.mask_add is None else pb.mask_add)
        fwd = batched_attention_error_bound(q, k, v, np.where(allowed, pb.p, 0.0),
                                            scale=pb.scale, allowed=allowed, mask_add=madd,
                                            out=pb.out, model=model)
        if pb.cap is not None or extra:
            with np.errstate(over="ignore"):
                spread = np.expm1(np.minimum(2.0 * np.max(self.sig_s, axis=-1, keepdims=True,
                                                          initial=0.0), 700.0))
            fwd = fwd + spread * _mm(np.where(allowed, pb.p, 0.0), np.abs(v))
        # a kernel's output row is a rounded convex combination of the value rows, so
        # |Õ − O| <= 2 max_j |v_j| (1 + γ) (times the dropout factor f, whose weights sum
        # to at most f): the bound where the model's own (e^(score
        # error)) leaves float64 for huge scores (issue 30: queries of 1e300)
        vtop = np.max(np.abs(v), axis=-2, keepdims=True, initial=0.0)
        with np.errstate(over="ignore"):
            hull = (2.0 * max(1.0, abs(float(pb.f))) * vtop
                    * (1.0 + 2.0 * self.gam(max(self.S, 1)) + 4.0 * ua) + model.eta)
        fwd = np.where(np.isfinite(fwd), fwd, np.inf)
        # where the forward model reaches the hull (its e^(score error) overflowed), the
        # output's error in the weights' own bound: |Õ − O| <= Σ_j (ΔW + γ̃ (W + ΔW))|v_j|
        # (accumulated in u_a, divided, stored), finite in the gap form at any score
        with np.errstate(over="ignore", invalid="ignore"):
            gap_fwd = (_mm(self.dW + (self.gam(max(self.S, 1)) + 2.0 * ua + u)
                           * (np.abs(pb.w) + self.dW), np.abs(v))
                       + model.eta * (self.S * vtop + 1.0))
            fwd = np.where(fwd < hull, fwd, np.minimum(hull, gap_fwd))
        fwd = np.where(np.isfinite(fwd), fwd, 0.0)
        return fwd


def _weight_error(pb: PlainBackward, sig_s: Arr, model: ErrorModel) -> Arr:
    """A bound on |P̃_ij − P_ij|, a kernel's weight against the exact one, for every
    (query, key): the relative form where it says something, the gap form of
    :func:`_gap_weight_error` where it does not (or is smaller, for the other keys).

    Relative form: the scores err by σ_ij and the row's shift (its max or the lse the
    forward stored, itself of error u_a|lse| and the sum's (n + K_SOFTMAX) u_a) by
    δ_i = max_j σ_ij + …, so P̃_ij / P_ij ∈ e^{±(σ_ij + δ_i)} (1 ± ρ): |ΔP| <= P ρ_ij,
    ρ_ij = e^{σ_ij + δ_i} − 1 + ρ, capped at 1.  Where σ + δ reaches 700 (e^700 is near
    float64's top: queries of 1e100 give σ ≈ 1e84) it is taken as 1 (it says nothing,
    and P ρ with an underflowed P would not bound it)."""
    ua = model.ua
    allowed = pb.allowed
    S = allowed.shape[-1]
    sig_max = np.max(sig_s, axis=-1, keepdims=True, initial=0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        s_all = np.where(allowed, _scores(pb), -np.inf)
        smax = np.max(s_all, axis=-1, keepdims=True) if S else np.zeros((*s_all.shape[:-1], 1))
        smax = np.where(np.isfinite(smax), smax, 0.0)
        n_row = _rs(allowed.astype(np.float64))
        lse = smax + np.log(np.maximum(n_row, 1))
        d_lse = sig_max + (n_row + K_SOFTMAX) * ua + ua * np.abs(lse)
        expo = sig_s + d_lse
        rho = np.expm1(np.minimum(expo, 700.0)) + (K_EXP * ua + model.u)
    p = pb.p
    rel = np.where(allowed | (p > 0), np.minimum(p * rho, 1.0), 0.0)
    rel = np.where(allowed & (expo >= 700.0), 1.0, rel)
    if not S or not np.any(allowed & (rel >= 1.0)):
        return rel
    top, gap = _gap_weight_error(s_all, sig_s, n_row, model)
    # the other keys: the smaller bound (both hold); the top key: the gap form only
    # where the relative one admits any weight (its assumption, below, is needed there)
    return np.where(allowed & ~top, np.minimum(rel, gap),
                    np.where(allowed & top & (rel >= 1.0), np.minimum(gap, 1.0), rel))


def _gap_weight_error(s_all: Arr, sig_s: Arr, n_row: Arr, model: ErrorModel
                      ) -> tuple[Arr, Arr]:
    """(the top key of each row, a bound on |P̃_ij − P_ij|) in the gap form, for rows
    whose scores are far apart (issue 30: queries of 1e100–1e300, σ ≈ 1e84–1e284,
    gaps ≈ 1e100–1e300), never forming e^(+large).

    With * the row's largest float64 score ŝ_* and ĝ_j = ŝ_* − ŝ_j >= 0, every
    exponent a weight takes is at most −(ĝ_j − 4(σ_j + σ_*)) =: −x_j: the exact
    P_j <= e^{s_j − s_*}, the kernel's P̃_j <= e^{s̃_j − s̃_*}(1 + ρ) (its shift, the
    computed max or an lse above it, is at least s̃_*), and 4σ covers the kernel's
    score errors (σ_j + σ_*), the float64 scores' own (at most σ each) and the
    subtractions' roundings (u|ŝ_* − ŝ_j| <= σ_j + σ_*).  So for j != *

        |P̃_j − P_j| <= max(P̃_j, P_j) <= G_j (1 + 3ρ) + η,   G_j = e^{−max(x_j, 0)}

    (η at least the least double),

    which holds whatever scores the backward recomputes.  For the top key, P_* and the
    weight Q_* = softmax(s̃)_* both lie in [1/(1 + X), 1] with X = Σ_{j≠*} G_j; the
    kernel's P̃_* = e^{s̃_* − shift}(1 ± ρ) with a shift above s̃_* by at most 2x̃, x̃ the
    computed log of the row sum l̃ <= (1 + X)(1 + ρ)(1 + γ̃_n) (log(1 + a) <= a; an lse
    m + x̃ rounded to nearest errs by at most x̃, the float m being a candidate), so

        |P̃_* − P_*| <= X + 2.01 x̄ + 2ρ,   x̄ = (X + ρ + γ̃_n + (n + K_SOFTMAX) u_a)(1 + K_SOFTMAX u_a).

    A backward that recomputes the top score need not get the forward's: torch's CPU
    flash backward differs by several ulps (review of 2026-12-03: q, k ~ N(0, 1000²),
    E = 8, a correct dV failed at 1e4× when this term was left out), and a
    recomputation that differs by up to 2σ_* moves P̃_* (at most 1 + ρ) by a factor
    e^{±2σ_*}: (1 + ρ)·expm1(2σ_*) more.  Where σ_* is large (huge scores) the top
    key's bound is then the natural one, 1, and the verdict needs the rows' other
    structure; the bound is used only where the relative form admits any weight
    (:func:`_weight_error`)."""
    ua, rho = model.ua, K_EXP * model.ua + model.u
    idx = np.argmax(s_all, axis=-1)[..., None]
    top = np.arange(s_all.shape[-1]) == idx
    s_top = np.take_along_axis(s_all, idx, axis=-1)
    sig_top = np.take_along_axis(sig_s, idx, axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        x = (s_top - s_all) - 4.0 * (sig_s + sig_top)
        g = np.where(np.isfinite(s_all) & ~top, np.exp(-np.maximum(np.nan_to_num(x), 0.0)), 0.0)
        big_x = np.minimum(_rs(g), 1.0)
        xbar = (big_x + rho + model.gamma_sum(np.maximum(n_row, 1.0)) + (n_row + K_SOFTMAX) * ua) \
            * (1.0 + K_SOFTMAX * ua)
    # (+ the least double: e^{-x} underflows to 0 while the weight itself need not)
    floor = max(model.eta, math.ulp(0.0))
    recompute = (1.0 + rho) * np.expm1(np.minimum(2.0 * sig_top, 700.0))
    err = np.where(top, big_x + 2.01 * xbar + 2.0 * rho + recompute,
                   g * (1.0 + 3.0 * rho) + floor)
    return top, err


def backward_error_bound(pb: PlainBackward, model: ErrorModel, *,
                         shapes: dict[str, tuple[int, ...]],
                         events: tuple[float, float] | None = None,
                         score_extra: Arr | None = None) -> dict[str, Arr]:
    """The model's bound on |kernel − exact| for each gradient, at the inputs' shapes
    (``shapes``: "dq", "dk", "dv" and, for a float mask, "d_attn_mask"); ``model`` as
    :func:`~mha_symbolic.testing.tolerance.error_model` makes it for the gradients'
    dtype (its λs are set here for the whole check, whose events are ``events``, by
    default :func:`backward_events` of these gradients).  ``score_extra`` (shaped like
    the scores): a further bound on each score's error, added to σs (and, as the
    softcap's, to D's forward bound); the worst-case propagation then.

    >>> import numpy as np
    >>> from mha_symbolic.testing.backward.bugs import plain_backward
    >>> from mha_symbolic.testing.call import AttentionCall
    >>> from mha_symbolic.testing.tolerance import error_model
    >>> x = AttentionCall(*(np.eye(2)[None] for _ in range(3)), do=np.eye(2)[None])
    >>> b = backward_error_bound(plain_backward(x), error_model("bfloat16"),
    ...                          shapes={"dq": (1, 2, 2), "dk": (1, 2, 2), "dv": (1, 2, 2)})
    >>> bool(all(np.all(np.isfinite(t)) and np.all(t < 0.1) for t in b.values()))
    True
    """
    n_el = float(sum(math.prod(s) for s in shapes.values()))
    model = model.with_events(*(events if events is not None
                                else backward_events(pb, max(n_el, 1.0))))
    parts = _Parts(pb, model, score_extra)
    if model.kind == "worst_case" or pb.cap is not None or score_extra is not None:
        # a softcap: the worst-case propagation (its sensitivities are those of plain
        # attention with dS' ∘ (1 − t²); the probabilistic ones are not derived for it)
        per = _worst(parts)
        return {name: _reduce(name, per, pb, shapes, model) for name in shapes}
    # the worst-case propagation holds for every rounding of its ingredients, so the
    # smaller of the two is a bound with the probabilistic one's probability
    per = _probabilistic(parts, model.lam)
    worst = _worst(parts)
    # (fmin: where the probabilistic bound is NaN, e.g. its e^(score error) terms at
    # scores of 1e300 giving inf · 0, the worst-case one stands alone; issue 30)
    # (where the worst-case bound is below 2^-440 the probabilistic one's squared terms,
    # (sensitivity · bound)² < 2^-880, reach float64's subnormals and are lost: a dk of
    # 1e-161 from weights of e^-370 (queries × 1e3) got 1/150 of its rounding error
    # from them; the worst-case bound, linear in every term, stands alone there)
    per = {key: (val, np.where(worst[key][1] < _SQUARES_UNDERFLOW, worst[key][1],
                               np.fmin(err, worst[key][1])))
           for key, (val, err) in per.items()}
    return {name: _reduce(name, per, pb, shapes, model) for name in shapes}


#: below this a bound's squared terms leave float64's normal range (see above)
_SQUARES_UNDERFLOW = 2.0 ** -440


def _copies(name: str, pb: PlainBackward, shape: tuple[int, ...], size: int
            ) -> tuple[int, str, int]:
    """(GQA group size, reduction mode, number of copies) of a gradient."""
    rep = pb.rep if name in ("dk", "dv") else 1
    mode = pb.gqa_reduce if name in ("dk", "dv") else "sum"
    return rep, mode, max(1, round(size / max(math.prod(shape), 1)))


def _reduce(name: str, per: dict[str, tuple[Arr, Arr]], pb: PlainBackward,
            shapes: dict[str, tuple[int, ...]], model: ErrorModel) -> Arr:
    """Sum per-copy bounds over the copies of an input (GQA groups, broadcast axes):
    coherently (the copies share their inputs' roundings), plus the kernel's own sum
    of the copies, γ̃_n(u)·Σ|values| (it may add per-head gradients in its dtype)."""
    key = "dmask" if name == "d_attn_mask" else name
    val, err = per[key]
    shape = shapes[name]
    rep, mode, n_copies = _copies(name, pb, shape, val.size)
    e = reduce_to(err, shape, rep, mode)
    if n_copies > 1:
        e = e + model.gamma_sum(n_copies, model.u) * reduce_to(np.abs(val), shape, rep, mode)
    return np.asarray(e, dtype=np.float64)


def natural_scales(pb: PlainBackward, shapes: dict[str, tuple[int, ...]], eta: float
                   ) -> dict[str, tuple[Arr, Arr]]:
    """For each gradient, (natural size, absolute floor) at the inputs' shapes: the
    sum of the absolute values of every term the exact gradient adds, down to the
    inputs — dP_ij = f keep_ij Σ_l dO_il V_jl is of size ``N_ij = f (|dO||V|ᵀ)_ij``,
    D_i of size at most Σ_j P_ij N_ij, dS_ij = P_ij(dP_ij − D_i) of size
    ``P_ij (N_ij + Σ_j' P_ij' N_ij')``, dQ = c dS K of size |c| (that) |K|, and so on —
    and the underflow floor ``eta`` (the model's η) times the terms of the sum.  A
    tolerance at least the natural size where that stands above 4 × the floor is
    vacuous (see the module docstring).

    >>> import numpy as np
    >>> from mha_symbolic.testing.backward.bugs import plain_backward
    >>> from mha_symbolic.testing.call import AttentionCall
    >>> x = AttentionCall(*(np.eye(2)[None] for _ in range(3)), do=np.eye(2)[None])
    >>> nat = natural_scales(plain_backward(x), {"dv": (1, 2, 2)}, 2.0**-150)
    >>> bool(np.all(nat["dv"][0] > 0))
    True
    """
    P = np.where(pb.allowed, pb.p, 0.0)
    aq, ak, ado = np.abs(pb.q), np.abs(pb.k), np.abs(pb.do)
    ndp = max(abs(pb.f), 1.0) * _mm(ado, _t(np.abs(pb.v)))
    nds = P * (ndp + _rs(P * ndp))
    # a softcap's factor 1 − t² multiplies dS before dQ and dK: its terms are 1 and t²
    nds0 = nds if pb.cap_t is None else nds * (1.0 + pb.cap_t * pb.cap_t)
    L, S = P.shape[-2], P.shape[-1]
    cq, ck = abs(pb.dq_scale), abs(pb.dk_scale)
    per = {
        "dq": (cq * _mm(nds0, ak), eta * ((cq + 1.0) * S * np.max(ak, initial=0.0) + 1.0)),
        "dk": (ck * _mm(_t(nds0), aq), eta * ((ck + 1.0) * L * np.max(aq, initial=0.0) + 1.0)),
        "dv": (_mm(_t(np.abs(pb.w)), ado), eta * (L * np.max(ado, initial=0.0) + 1.0)),
        "d_attn_mask": (nds, eta),
    }
    out = {}
    for name, shape in shapes.items():
        nat, floor = per[name]
        rep, mode, n_copies = _copies(name, pb, shape, nat.size)
        out[name] = (np.asarray(reduce_to(nat, shape, rep, mode), dtype=np.float64),
                     np.full(shape, float(np.max(floor, initial=0.0)) * n_copies))
    return out


def _structure(pt: _Parts) -> tuple[Any, Any, Arr, Arr, Arr]:
    """The variant's transposes and scales: (t_q, t_k, dq, dk, dv) float64 values."""
    pb = pt.pb
    t_q = _t if pb.ds_transposed else (lambda a: a)
    t_k = (lambda a: a) if pb.ds_transposed else _t
    dq = pb.dq_scale * _mm(t_q(pb.ds), pb.k)
    dk = pb.dk_scale * _mm(t_k(pb.ds), pb.q)
    tw = _t if pb.dv_p_transposed else (lambda a: a)
    dv = _mm(tw(pt.w), pb.do)
    return t_q, t_k, dq, dk, dv


def _worst(pt: _Parts) -> dict[str, tuple[Arr, Arr]]:
    """Every error at its bound, coherently (first order, exp convexity kept)."""
    pb = pt.pb
    u, ua, eta = pt.u, pt.ua, pt.eta
    L, S = pt.L, pt.S
    allowed = pb.allowed
    p, w, dP_w, dW = pt.p, pt.w, pt.dP_w, pt.dW
    t_q, t_k, dq, dk, dv = _structure(pt)
    tw = _t if pb.dv_p_transposed else (lambda a: a)
    e_dv = _mm(tw(dW + pt.gam(L) * (w + dW)), pt.ado) + u * np.abs(dv)
    e_dv = e_dv + eta * (L * np.max(pt.ado, initial=0.0) + 1.0)
    pp = p + dP_w
    d_math = _rs(dP_w * np.abs(pt.dp) + pp * pt.sig_p) + pt.gam(S) * _rs(pp * (np.abs(pt.dp) + pt.sig_p))
    e_d = np.maximum(pt.d_fa, d_math) + ua * np.abs(pt.d)
    e_y = pt.sig_p + e_d + ua * (np.abs(pt.y) + pt.sig_p + e_d)
    pre = np.where(pt.live, dP_w * np.abs(pt.y) + pp * e_y, 0.0)
    ds_pre = pt.ds if pb.ds_pre is None else pb.ds_pre      # P ∘ (dP − D)
    e_ds = pre + (ua + u) * (np.abs(ds_pre) + pre) + np.where(pt.live, eta, 0.0)
    e_mask = e_ds
    if pt.e_t is not None and pb.cap_t is not None and pb.cap_factor:
        # dS0 = dS' ∘ g, g = 1 − t²: |Δg| <= (2|t| + e_t) e_t + 2u_a + u (t², the
        # difference, a store); the product and its store (u_a + u)|dS0|
        t_abs = np.abs(pb.cap_t)
        e_g = (2.0 * t_abs + pt.e_t) * pt.e_t + 2.0 * ua + u
        g = np.abs(1.0 - pb.cap_t * pb.cap_t)
        e_ds = (g * e_ds + (np.abs(ds_pre) + e_ds) * e_g + (ua + u) * np.abs(pt.ds)
                + np.where(pt.live, eta, 0.0))
    abs_ds = np.abs(pt.ds) + e_ds
    kscale = K_SCALE * (u + ua)
    cq, ck = abs(pb.dq_scale), abs(pb.dk_scale)
    e_dq = cq * (_mm(t_q(e_ds), pt.ak) + (pt.gam(S) + kscale) * _mm(t_q(abs_ds), pt.ak)) \
        + 2 * u * np.abs(dq) + eta * (S * np.max(pt.ak, initial=0.0) + 1.0)
    e_dk = ck * (_mm(t_k(e_ds), pt.aq) + (pt.gam(L) + kscale) * _mm(t_k(abs_ds), pt.aq)) \
        + 2 * u * np.abs(dk) + eta * (L * np.max(pt.aq, initial=0.0) + 1.0)
    return {"dq": (dq, e_dq), "dk": (dk, e_dk), "dv": (dv, e_dv),
            "dmask": (np.where(allowed, ds_pre, 0.0), e_mask), "softmax_d": (pt.d, e_d),
            "softmax_d_math": (pt.d, d_math + ua * np.abs(pt.d))}


def _scores(pb: PlainBackward) -> Arr:
    s = pb.scale * _mm(pb.q, _t(pb.k)) if pb.capped is None else pb.capped
    return s if pb.mask_add is None else s + pb.mask_add


# largest L·S·E² (summed over the problems) for which the correlated pre-scale terms
# are evaluated exactly (a third-order tensor); beyond, Cauchy–Schwarz bounds them
EXACT_TENSOR_BUDGET = 1 << 27


def _weighted_tensor_sq(a: Arr, x: Arr, y: Arr, wt: Arr, extra: Any = None) -> Arr:
    """Σ_l wt_il (Σ_j a_ij x_jc y_jl + extra(i, c, l))² for every (i, c), exactly:
    the tensor T_icl = Σ_j a_ij x_jc y_jl is formed per problem ((L, S) @ (S, E·E))."""
    lead = a.shape[:-2]
    n_i, n_j = a.shape[-2:]
    n_c, n_l = x.shape[-1], y.shape[-1]
    a3 = np.ascontiguousarray(np.broadcast_to(a, (*lead, n_i, n_j))).reshape(-1, n_i, n_j)
    x3 = np.ascontiguousarray(np.broadcast_to(x, (*lead, n_j, n_c))).reshape(-1, n_j, n_c)
    y3 = np.ascontiguousarray(np.broadcast_to(y, (*lead, n_j, n_l))).reshape(-1, n_j, n_l)
    w3 = np.ascontiguousarray(np.broadcast_to(wt, (*lead, n_i, n_l))).reshape(-1, n_i, n_l)
    out = np.empty((a3.shape[0], n_i, n_c))
    for b in range(a3.shape[0]):
        xy = (x3[b][:, :, None] * y3[b][:, None, :]).reshape(n_j, n_c * n_l)
        t = (a3[b] @ xy).reshape(n_i, n_c, n_l)
        if extra is not None:
            t = extra(b, t)
        out[b] = np.einsum("icl,il->ic", t * t, w3[b])
    return out.reshape(*lead, n_i, n_c)


def _probabilistic(pt: _Parts, lam: float) -> dict[str, tuple[Arr, Arr]]:
    """First-order propagation of independent errors; see the module docstring and
    docs/gradients.md §8 for each sensitivity.  Returns (value, bound) per problem."""
    s = _sensitivities(pt, lam)
    e_dq, e_dk = _prob_dq(pt, s, lam), _prob_dk(pt, s, lam)
    e_dv, e_m = _prob_dv(pt, s, lam), _prob_dmask(pt, s, lam)
    dq, dk, dv, dS, pb = s.dq, s.dk, s.dv, s.dS, s.pb
    # second order: the linearisation of exp and of products; every relative
    # perturbation is below σs + ρ, so the first-order terms are off by at most that
    # factor (bounded once per row)
    with np.errstate(invalid="ignore"):
        second = np.expm1(np.minimum(np.max(pt.sig_s, axis=-1, keepdims=True, initial=0.0)
                                     + pt.rho, 700.0))
    second_q = 1.0 + 2.0 * second
    second_k = 1.0 + 2.0 * np.max(second, axis=-2, keepdims=True)
    return {"dq": (dq, e_dq * second_q), "dk": (dk, e_dk * second_k),
            "dv": (dv, e_dv * second_k),
            "dmask": (np.where(pb.allowed, dS, 0.0), e_m * second_q)}


def _sensitivities(pt: _Parts, lam: float) -> SimpleNamespace:
    """The terms every gradient's probabilistic bound shares (see _probabilistic)."""
    pb = pt.pb
    u, ua, eta = pt.u, pt.ua, pt.eta
    L, S = pt.L, pt.S
    c = pt.c
    q, k, do = pb.q, pb.k, pb.do
    P, W, Y, dP, dS = pt.p, pt.w, pt.y, pt.dp, pt.ds
    P2, Y2, dS2 = P * P, Y * Y, dS * dS
    q2, k2, do2 = q * q, k * k, do * do
    s2 = pt.sig_s ** 2
    sp2 = pt.sig_p ** 2
    sd2 = pt.sig_ds ** 2
    rho2 = pt.rho ** 2
    dq, dk, dv = _structure(pt)[2:]
    kbar = _mm(P, k)                       # Σ_j P_ij k_j
    M = _mm(dS, k)                         # dq / c
    w_qk = _mm(q2, _t(k2))                 # Σ_l q_il² k_jl²
    # V_ij = Σ_l q_il² (k_jl − k̄_il)²  (>= 0; rounding can make it slightly negative)
    V = np.maximum(w_qk - 2 * _mm(q2 * kbar, _t(k)) + _rs(q2 * kbar * kbar), 0.0)
    X = _rs(q2 * M * M)                    # Σ_l q_il² M_il²
    Z = _rs(q2 * kbar * kbar)              # Σ_l q_il² k̄_il²
    kcol = np.sum(k2, axis=-2, keepdims=True)   # ||k_:l||² (1 × E)
    qcol = np.sum(q2, axis=-2, keepdims=True)   # ||q_:l||²
    KQ = _rs(k2 * qcol)                    # κ_j = Σ_l k_jl² ||q_:l||²  (S × 1)
    t1, t2 = _rs(P2 * s2), _rs(dS2 * s2)
    t3, t4 = _rs(P2 * dP * dP * rho2), _rs(P2 * sp2)
    # D_i: one variable per row.  FA takes rowsum(dO ∘ O) from the forward's O, whose
    # errors reach D as Σ_j dS_ij δs_ij (scores: ∂D/∂S_ij = dS_ij), Σ_j P_ij dP_ij ε_ij
    # (exp and stores), Σ_l dO_il δ_il (O stored) and the sums' own γ̃; MATH takes
    # rowsum(P ∘ dP) of the stored P and dP.  Both are covered (docs/gradients.md §8).
    out = pb.out
    r2_d = (_rs(dS2 * (s2 + c * c * u * u * w_qk + rho2)) + _rs(P2 * dP * dP * rho2)
            + _rs(P2 * sp2) + u * u * c * c * X + u * u * _rs(do2 * out * out))
    sD = (lam * np.sqrt(r2_d) + pt.gam(S) * _rs(P * _mm(pt.ado, _t(np.abs(pb.v))))
          + pt.gam(pb.v.shape[-1]) * _rs(pt.ado * np.abs(out)) + ua * np.abs(pt.d))
    kb2 = kbar * kbar

    exact = pb.ds.size * k.shape[-1] ** 2 <= EXACT_TENSOR_BUDGET
    return SimpleNamespace(exact=exact, pb=pb, c=c, s2=s2, sp2=sp2, sd2=sd2, rho2=rho2, kbar=kbar,
                           M=M, w_qk=w_qk, V=V, X=X, Z=Z, kcol=kcol, qcol=qcol, KQ=KQ,
                           out=out, r2_d=r2_d, sD=sD, kb2=kb2, u=u, ua=ua, eta=eta, L=L,
                           S=S, q=q, k=k, do=do, P=P, W=W, Y=Y, dP=dP, dS=dS, P2=P2,
                           Y2=Y2, dS2=dS2, q2=q2, k2=k2, do2=do2, dq=dq, dk=dk, dv=dv,
                           t1=t1, t2=t2, t3=t3, t4=t4)


def _prob_dq(pt: _Parts, s: SimpleNamespace, lam: float) -> Arr:
    """The probabilistic bound of dQ_ic: sums over the keys j of row i (see _probabilistic)."""
    pb, c, s2, sp2, sd2, rho2 = s.pb, s.c, s.s2, s.sp2, s.sd2, s.rho2
    kbar, M, w_qk, X, Z, kcol = s.kbar, s.M, s.w_qk, s.X, s.Z, s.kcol
    sD, kb2, u, ua, eta, S = s.sD, s.kb2, s.u, s.ua, s.eta, s.S
    k, dP, dS, P2, Y2, dS2 = s.k, s.dP, s.dS, s.P2, s.Y2, s.dS2
    q2, k2, dq = s.q2, s.k2, s.dq
    r_s = 3 * (c * c * _mm(dS2 * s2, k2) + c * c * kb2 * _rs(dS2 * s2) + dq * dq * _rs(P2 * s2))
    r_p = 2 * c * c * rho2 * (_mm(P2 * Y2, k2) + kb2 * _rs(P2 * dP * dP))
    r_dp = 2 * c * c * (_mm(P2 * sp2, k2) + kb2 * _rs(P2 * sp2))
    r_ds = c * c * _mm(sd2, k2)
    kp2 = c * c * u * u * w_qk             # k pre-scaled: independent over the keys of a row
    # (a + b)² <= 2a² + 2b²: through the scores, and k itself in dQ = dS k
    r_kpre = 6 * (c * c * _mm(dS2 * kp2, k2) + c * c * kb2 * _rs(dS2 * kp2) + dq * dq * _rs(P2 * kp2)) \
        + 2 * c * c * u * u * _mm(dS2, k2)
    exact = pb.ds.size * k.shape[-1] ** 2 <= EXACT_TENSOR_BUDGET
    if exact:
        # Σ_j g_ijc k_jl exactly, g the signed sensitivity of dQ_ic to S_ij: MATH
        # c T − c k̄_ic M_il − dq_ic k̄_il; FlashAttention c T − dq_ic k̄_il (the larger)
        kb3 = kbar.reshape(-1, *kbar.shape[-2:])
        m3, dq3 = M.reshape(kb3.shape), dq.reshape(kb3.shape)

        def g_math(b: int, t: Arr) -> Arr:
            return c * t - c * kb3[b][:, :, None] * m3[b][:, None, :] \
                - dq3[b][:, :, None] * kb3[b][:, None, :]

        def g_fa(b: int, t: Arr) -> Arr:
            return c * t - dq3[b][:, :, None] * kb3[b][:, None, :]

        r_qpre = u * u * c * c * np.maximum(_weighted_tensor_sq(dS, k, k, q2, g_math),
                                            _weighted_tensor_sq(dS, k, k, q2, g_fa))
    else:
        r_qpre = 3 * u * u * c * c * (c * c * _mm(dS2, k2) * _rs(q2 * kcol) + c * c * kb2 * X
                                      + dq * dq * Z)
    r2_dq = r_s + r_p + r_dp + r_ds + r_kpre + r_qpre
    add_dq = (c * np.abs(kbar) * sD + pt.gam(S) * c * _mm(np.abs(dS), pt.ak)
              + (2 * u + K_SCALE * ua) * np.abs(dq) + eta * (S * np.max(pt.ak, initial=0.0) + 1.0))
    if pb.ds_transposed or pb.dq_scale != pb.scale:
        # a buggy structure: the worst-case bound of that variant (diagnosis only)
        e_dq = _worst(pt)["dq"][1]
    else:
        e_dq = add_dq + lam * np.sqrt(r2_dq)
    return e_dq


def _prob_dk(pt: _Parts, s: SimpleNamespace, lam: float) -> Arr:
    """The probabilistic bound of dK_jc: sums over the rows i (see _probabilistic)."""
    exact = s.exact
    pb, c, s2, sp2, sd2, rho2 = s.pb, s.c, s.s2, s.sp2, s.sd2, s.rho2
    V, X, KQ, sD, u, ua = s.V, s.X, s.KQ, s.sD, s.u, s.ua
    eta, L, q, P, Y, dS = s.eta, s.L, s.q, s.P, s.Y, s.dS
    P2, Y2, dS2, q2, k2, dk = s.P2, s.Y2, s.dS2, s.q2, s.k2, s.dk
    t1, t2, t3, t4 = s.t1, s.t2, s.t3, s.t4
    r_s = c * c * _mm(_t(2 * P2 * Y2 * s2 + 4 * P2 * (Y2 * t1 + t2)), q2)
    r_p = 2 * c * c * _mm(_t(rho2 * P2 * Y2 + P2 * t3), q2)
    r_dp = 2 * c * c * _mm(_t(P2 * sp2 + P2 * t4), q2)
    r_ds = c * c * _mm(_t(sd2), q2)
    r_D = c * c * _mm(_t(P2 * sD * sD), q2)
    r_qpre = 2 * u * u * (c ** 4 * _mm(_t(P2 * (2 * Y2 * V + 2 * X)), q2) + c * c * _mm(_t(dS2), q2))
    # k pre-scaled: δk_jl moves S_ij of every row; the own key j' = j exactly when
    # affordable (∂dS_ij/∂S_ij = P Y (1 − 2P) for MATH, P Y (1 − P) for FA), the
    # normalisation coupling j' != j by Cauchy–Schwarz
    coupling = 2 * _mm(_t(P2 * (Y2 * _rs(P2 * _t(KQ)) + _rs(dS2 * _t(KQ)))), q2)
    if exact:
        own = np.maximum(
            _weighted_tensor_sq(_t(P * Y * (1 - 2 * P)), q, q, k2),
            _weighted_tensor_sq(_t(P * Y * (1 - P)), q, q, k2))
        r_kpre = c ** 4 * u * u * (2 * own + 2 * coupling)
    else:
        a_jj = P * np.abs(Y) * (1 + P) + P * np.abs(dS)
        r_kpre = c ** 4 * u * u * (KQ * _mm(_t(a_jj * a_jj), q2) + coupling)
    r2_dk = r_s + r_p + r_dp + r_ds + r_D + r_qpre + r_kpre
    add_dk = (pt.gam(L) * c * _mm(_t(np.abs(dS)), pt.aq) + (2 * u + K_SCALE * ua) * np.abs(dk)
              + eta * (L * np.max(pt.aq, initial=0.0) + 1.0))
    if pb.ds_transposed or pb.dk_scale != pb.scale:
        e_dk = _worst(pt)["dk"][1]
    else:
        e_dk = add_dk + lam * np.sqrt(r2_dk)
    return e_dk


def _prob_dv(pt: _Parts, s: SimpleNamespace, lam: float) -> Arr:
    """The probabilistic bound of dV_jc: sums over the rows i of W_ij dO_ic (see _probabilistic)."""
    exact = s.exact
    pb, c, s2, rho2, V, KQ = s.pb, s.c, s.s2, s.rho2, s.V, s.KQ
    u, eta, L, q, k, do = s.u, s.eta, s.L, s.q, s.k, s.do
    P, W, P2, k2, do2, dv = s.P, s.W, s.P2, s.k2, s.do2, s.dv
    t1 = s.t1
    W2 = W * W
    r_s = 2 * _mm(_t(W2 * (s2 + t1)), do2)
    r_p = rho2 * _mm(_t(W2), do2)
    r_qpre = u * u * c * c * _mm(_t(W2 * V), do2)
    coupling_v = _mm(_t(W2 * _rs(P2 * _t(KQ))), do2)
    if exact and W.size * do.shape[-1] * k.shape[-1] <= EXACT_TENSOR_BUDGET:
        own_v = _weighted_tensor_sq(_t(W * (1 - P)), do, q, k2)
        r_kpre = c * c * u * u * (2 * own_v + 2 * coupling_v)
    else:
        r_kpre = c * c * u * u * (KQ * _mm(_t(W2 * (1 - P) ** 2), do2) + coupling_v)
    r2_dv = r_s + r_p + r_qpre + r_kpre
    add_dv = (pt.gam(L) * _mm(_t(W), pt.ado) + u * np.abs(dv)
              + eta * (L * np.max(pt.ado, initial=0.0) + 1.0))
    e_dv = add_dv + lam * np.sqrt(r2_dv) if pb.dv_p_transposed else _worst(pt)["dv"][1]
    return e_dv


def _prob_dmask(pt: _Parts, s: SimpleNamespace, lam: float) -> Arr:
    """The probabilistic bound of d(mask)_ij = dS_ij (see _probabilistic)."""
    c, s2, sp2, sd2, rho2, w_qk = s.c, s.s2, s.sp2, s.sd2, s.rho2, s.w_qk
    V, X, sD, u, eta, dS = s.V, s.X, s.sD, s.u, s.eta, s.dS
    P2, Y2, dS2, t1, t2, t3 = s.P2, s.Y2, s.dS2, s.t1, s.t2, s.t3
    t4 = s.t4
    r2_m = (2 * P2 * Y2 * s2 + 4 * P2 * (Y2 * t1 + t2) + 2 * rho2 * (P2 * Y2) + 2 * P2 * t3
            + 2 * (P2 * sp2 + P2 * t4) + sd2 + P2 * sD * sD
            + 2 * u * u * c * c * P2 * (2 * Y2 * V + 2 * X)
            + c * c * u * u * (2 * P2 * Y2 * w_qk + 4 * P2 * (Y2 * _rs(P2 * w_qk) + _rs(dS2 * w_qk))))
    e_m = np.where(pt.live, lam * np.sqrt(r2_m) + u * np.abs(dS) + eta, 0.0)
    return e_m


def batched_attention_error_bound(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, p: np.ndarray | None = None, *,
    scale: float, allowed: np.ndarray, mask_add: np.ndarray | None = None,
    out: np.ndarray | None = None, fmt: Any = None, acc: Any = None,
    model: ErrorModel | None = None, dq: np.ndarray | None = None,
    dk: np.ndarray | None = None, dv: np.ndarray | None = None, softmax_axis: int = -1,
) -> np.ndarray:
    """The forward bound (:func:`~mha_symbolic.testing.forward.model.attention_error_bound`,
    one head's rows) on whole arrays
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

