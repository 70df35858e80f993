"""The backward check of a call whose variant rotates q and k (rotary embeddings): the reference and tolerance
:func:`~mha_symbolic.testing.backward.compare.compare_attention_backward` judges it by
(:func:`rotated_check`).

A kernel computes the plain backward at its rotated q̂' = R q, k̂' = R k (in its
dtype), then dQ = Rᵀ dQ̂', dK = Rᵀ dK̂' (autograd through
``q * cos + rotate_half(q) * sin``; FlashAttention's rotary backward).  Its error is
bounded, per flat problem, by (worst-case propagation, :mod:`.model`):

* the plain backward's tolerance at the float64-rotated inputs, with each score's
  error widened by the rotation's (the variant's ``error`` hook: the kernel's angles,
  rotation and store, :class:`~mha_symbolic.oracle.variants.rotary.KernelRotation`);
* the rotated rows' own errors in dQ' = c·dS K' and dK' = c·dSᵀ Q': c·|dS|·ΔK' and
  c·|dS|ᵀ·ΔQ' (|dS| <= P∘(|dP| + |D|), inflated by 1.05 for second-order terms);
* then |Rᵀ| applied to that bound, plus the backward rotation's own errors
  (:meth:`~mha_symbolic.oracle.variants.rotary.KernelRotation.bounds` of Rᵀ dQ'),

summed over the query heads of a GQA group and broadcast copies as the plain model
sums them.  dV is the plain one's (the rotation only moves P, through the scores).
Under the probabilistic model, for kernels of 16 bits or fewer, also the probabilistic
reading of the rotation's roundings (:func:`_probabilistic`: their first-order effect
through the softmax's Jacobian, λ·sd) and the smaller bound kept — the worst case is
vacuous there.  The rest of the scores lower as plain attention's (:func:`_lowered`):
a softcap first, the additive parts (float mask, ALiBi, bias tables) as one mask, a
sink as one more key with k' = 0, v = 0 (its rows are not the kernel's, dropped).
The diagnosis names ``rotation_not_transposed`` (dQ', dK' returned without Rᵀ) and
``rotation_missing`` (the gradients of unrotated attention) once checked: every
gradient within that variant's tolerance, not within the truth's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...errors import ShapeError, SpecError
from ...oracle.api import reference_attention_backward
from ...oracle.variants.forward import (
    lowered,
    lowered_after_cap,
    require_lowerable,
    summed_biases,
)
from ...oracle.variants.protocol import VariantOptions
from ...oracle.variants.registry import plain_rotation
from ...oracle.variants.rotary import KernelRotation
from ...oracle.variants.transformed import Cap
from ..call import AttentionCall
from ..forward.bugs import _fits
from ..tolerance import format_of
from ..verdict import Diagnosis, _as_array, _f64
from .bugs import PlainBackward, plain_backward, reduce_to
from .model import backward_error_bound, backward_events, natural_scales

__all__ = ["RotatedCheck", "rotated_check"]

Arr = np.ndarray

_BUGS = (("rotation_not_transposed", "rotary: dQ', dK' (the gradients of the rotated q', "
          "k') returned without the transposed rotation Rᵀ"),
         ("rotation_missing", "rotary: the gradients of attention without the rotation"))


def _abs_rt(rot: Any, t: Arr, pos: Arr) -> Arr:
    """|Rᵀ| t for a nonnegative t (n, E) at positions pos: per pair
    (|c| t_a + |s| t_b, |c| t_b + |s| t_a), |c|, |s| the float64 angles within 2^-52
    (widened by 2^-50)."""
    c, s, _, _ = rot.spec.float_tables(rot.npos, rot.r)
    cp, sp = np.abs(c[pos]) * (1 + 2.0**-50), np.abs(s[pos]) * (1 + 2.0**-50)
    ta, tb = t[..., rot.ia], t[..., rot.ib]
    out = np.array(t, dtype=np.float64, copy=True)
    out[..., rot.ia] = cp * ta + sp * tb
    out[..., rot.ib] = cp * tb + sp * ta
    return out


def _rt(rot: Any, x: Arr, pos: Arr) -> Arr:
    c, s, ec, es = rot.spec.float_tables(rot.npos, rot.r)
    return np.asarray(rot.float_rotate(x, pos, (c, -s, ec, es))[0])


def _lowered(prep: Any) -> tuple[float | None, Arr, Arr | None]:
    """(softcap C or None, value, mask) of the plain problem the rest of a rotated
    call's scores lower to (as :func:`~mha_symbolic.oracle.variants.forward.lowered`,
    whose exact sum of the additive parts a rotary call's Prepared leaves out: the
    rotation counts as transcendental there)."""
    if any(isinstance(op, Cap) for op in prep.ops):
        cap, _, v64, mask = lowered_after_cap(prep)
        return cap, v64, mask
    total, exact = summed_biases(prep, prep.ops)
    low = replace(prep, total=total, lowerable=exact)
    require_lowerable(low)
    _, v64, mask = lowered(low)
    return None, v64, mask


class _Flat:
    """The call as B flat problems (heads matched), rotated in float64."""

    def __init__(self, prep: Any, variant: Any, grad_output: Any, scale: Any,
                 masked_rows: str) -> None:
        geo = prep.geo
        self.prep, self.geo = prep, geo
        B, L, S = geo.B, geo.L, geo.S
        k64 = np.repeat(prep.k64, prep.group, axis=-3) if prep.group > 1 else prep.k64
        rot, io = plain_rotation(variant, geo, prep.q64, k64)
        assert io is not None
        self.rot = rot
        self.q0, self.k0, self.qr, self.kr = io
        # the rest of the scores as plain attention's: a softcap first, the additive
        # parts (float mask, ALiBi, bias tables) as one mask, a sink as one more key
        # (k' = 0, v = 0, mask column σ; oracle/variants/forward.lowered)
        self.cap, v64, mask = _lowered(prep)
        n_sink = int(v64.shape[-2]) - S
        if n_sink:
            z = np.zeros((B, n_sink, self.k0.shape[-1]))
            self.k0, self.kr = np.concatenate([self.k0, z], 1), np.concatenate([self.kr, z], 1)
        if prep.group > 1:
            v64 = np.repeat(v64, prep.group, axis=-3)
        Ev, Sx = v64.shape[-1], S + n_sink
        self.S = S
        self.v = np.broadcast_to(v64, (*geo.batch, Sx, Ev)).reshape(B, Sx, Ev)
        do = _f64(_as_array(grad_output, "grad_output"))
        self.do = np.broadcast_to(do, (*geo.batch, L, Ev)).reshape(B, L, Ev)
        self.keep = None if mask is None else np.ascontiguousarray(
            np.broadcast_to(mask, (*geo.batch, L, Sx)).reshape(B, L, Sx))
        self.scale, self.masked_rows = scale, masked_rows
        self.qpos = rot.q_positions(range(B))
        # (a sink's zero row at position 0: its rotation bounds are 0)
        kpos = np.concatenate([rot.k_positions(), np.zeros(n_sink, dtype=np.int64)])
        self.kpos = np.broadcast_to(kpos, (B, Sx))

    def call(self, rotated: bool) -> AttentionCall:
        q, k = (self.qr, self.kr) if rotated else (self.q0, self.k0)
        return AttentionCall(q, k, self.v, do=self.do, attn_mask=self.keep,
                             scale=None if self.scale is None else float(self.scale),
                             masked_rows=self.masked_rows,
                             opts=VariantOptions(softcap=self.cap))

    def reduce(self, name: str, flat: Arr, shape: tuple[int, ...], model: Any,
               mag: Arr | None = None) -> Arr:
        """A flat (B, n, E) bound summed into the input's shape (GQA groups, broadcast
        copies), plus the kernel's own sum of the copies γ̃_n(u)·Σ|values| (``mag``)."""
        lead = self.geo.batch
        if name in ("dk", "dv"):    # a sink's rows are not the kernel's
            flat = flat[:, :self.S]
            mag = None if mag is None else mag[:, :self.S]
        x = flat.reshape(*lead, *flat.shape[-2:])
        rep = self.prep.group if name in ("dk", "dv") else 1
        out = reduce_to(x, shape, rep)
        n_copies = max(1, round(flat.size / max(int(np.prod(shape)), 1)))
        if mag is not None and n_copies > 1:
            out = out + model.gamma_sum(n_copies, model.u) * reduce_to(
                np.abs(mag).reshape(x.shape), shape, rep)
        return np.asarray(out, dtype=np.float64)


#: The probabilistic reading runs for kernels this coarse (16 bits and below: at
#: float32 the worst case decides, and the reading costs L·S·E² per head).
_NARROW = 2.0**-12
#: Rows (times keys and head dim) of one block of the first-order propagation.
_BLOCK = 1 << 21


def _first_order_sd(pb: PlainBackward, c: float, eq: Arr, ek: Arr,
                    wq: Arr | None = None, wk: Arr | None = None, es: Arr | None = None
                    ) -> tuple[Arr, ...]:
    """(sd(dQ'), sd(dK')), flat (B, L, E) and (B, S, E): the standard deviations of the
    first-order change of dQ' = c·dS K' and dK' = c·dSᵀ Q' when q', k' move by
    independent, mean-zero roundings a, b with |a| <= eq, |b| <= ek elementwise (the
    rotation's own roundings, module docstring).

    With P = softmax(s), g = dS = P∘(dP − D) and s_il = c q'_i·k'_l, the scores move by
    δs_il = c(a_i·k'_l + q'_i·b_l) and dS by δg_ij = Σ_l M_jl δs_il,
    M = diag(g) − g Pᵀ − P gᵀ (∂D_i/∂s_il = g_il).  So, with k̄_i = Σ_l P_il k'_l,
    h_i = Σ_l g_il k'_l and w_il = g_il(k'_l − k̄_i) − P_il h_i,

        δdQ'_ie = c² Σ_f W_ief a_if + Σ_{l,f} (c² w_ile q'_if + c g_il [e = f]) b_lf,
        W_i = Σ_l w_il k'_lᵀ;
        δdK'_je = Σ_{i,f} (c² q'_ie w_ijf + c g_ij [e = f]) a_if
                  + c² Σ_{l,f} Σ_i q'_ie q'_if (δ_jl g_ij − g_ij P_il − P_ij g_il) b_lf.

    The variance of a sum of independent terms is the sum of coefficient² × bound²
    (a bounded term's variance is at most its bound²); the last coefficient's three
    parts are bounded by Minkowski's inequality over i (sd(ΣX) <= Σ sd(X)), with
    T_il = Σ_f q'_if² ek_lf².  With ``wq``, ``wk`` (perturbations shared, not
    independent: the angles' errors) also the worst case of the same linear terms,
    Σ |coefficient|·bound (|M̃_jl| split as for the Minkowski bound), as (wc_q, wc_k);
    ``es`` (B, L, S) adds a bound on each score's own further change (δdQ'_i =
    c Σ_l w_il δs_il exactly, and likewise dK')."""
    B, L, S = pb.p.shape
    E = pb.q.shape[-1]
    qr, kr = pb.q.reshape(B, L, E), pb.k.reshape(B, S, E)
    P = np.where(pb.allowed, pb.p, 0.0).reshape(B, L, S)
    if pb.cap is not None and pb.cap_t is not None and pb.ds_pre is not None:
        # a softcap: s = C·tanh(s⁰/C) moves by Φ δs⁰ (Φ = 1 − t²) and Φ itself by
        # −2tΦ δs⁰/C, so M becomes M̃ = D_Φ M D_Φ + diag(−2 g t Φ / C) (symmetric)
        g = np.where(pb.allowed, pb.ds_pre, 0.0).reshape(B, L, S)
        t = np.where(pb.allowed, pb.cap_t, 0.0).reshape(B, L, S)
        phi = 1.0 - t * t
        dia = -2.0 * g * t * phi / abs(float(pb.cap))
    else:
        g = np.where(pb.allowed, pb.ds, 0.0).reshape(B, L, S)
        phi, dia = np.ones_like(g), np.zeros_like(g)
    g0 = phi * g                           # dS⁰, what dQ' and dK' take
    dq2, dk2 = (eq * eq).reshape(B, L, E), (ek * ek).reshape(B, S, E)
    var_q = np.zeros((B, L, E))
    var_a = np.zeros((B, S, E))
    sd_yz = np.zeros((B, S, E))
    x2 = np.zeros((B, S, E))
    wc_q, wc_k = np.zeros((B, L, E)), np.zeros((B, S, E))
    wq = np.zeros((B, L, E)) if wq is None else wq.reshape(B, L, E)
    wk = np.zeros((B, S, E)) if wk is None else wk.reshape(B, S, E)
    es = np.zeros((B, L, S)) if es is None else np.where(pb.allowed, es, 0.0).reshape(B, L, S)
    n = max(1, _BLOCK // max(S * E * max(E, 1), 1))
    c2, c3, c4 = c * c, c ** 3, c ** 4
    with np.errstate(over="ignore", invalid="ignore"):
        for b in range(B):
            K, K2 = kr[b], dk2[b]
            for i0 in range(0, L, n):
                sl = slice(i0, min(L, i0 + n))
                g0i, Pi, qi, a2 = g0[b, sl], P[b, sl], qr[b, sl], dq2[b, sl]
                Pf = Pi * phi[b, sl]
                kbar, h = Pf @ K, g0i @ K
                # w_il = Σ_j M̃_lj k'_j
                w = ((g0i * phi[b, sl] + dia[b, sl])[..., None] * K[None]
                     - g0i[..., None] * kbar[:, None] - Pf[..., None] * h[:, None])
                W = np.matmul(np.swapaxes(w, -1, -2), K)          # (i, e, f)
                T = (qi * qi) @ K2.T
                var_q[b, sl] = (c4 * np.matmul(W * W, a2[..., None])[..., 0]
                                + c4 * np.matmul(T[:, None, :], w * w)[:, 0, :]
                                + 2.0 * c3 * qi * np.sum(w * (g0i[..., None] * K2), axis=1)
                                + c2 * (g0i * g0i) @ K2)
                U = np.matmul(w * w, a2[..., None])[..., 0]
                var_a[b] += (c4 * U.T @ (qi * qi)
                             + 2.0 * c3 * np.einsum("ie,ije->je", qi * a2, w * g0i[..., None])
                             + c2 * (g0i * g0i).T @ a2)
                rho = np.sqrt(np.sum(Pf * Pf * T, axis=-1, keepdims=True))
                tau = np.sqrt(np.sum(g0i * g0i * T, axis=-1, keepdims=True))
                sd_yz[b] += c2 * (np.abs(g0i).T @ (np.abs(qi) * rho)
                                  + np.abs(Pf).T @ (np.abs(qi) * tau))
                # the worst case of the shared perturbations (A_il = |q'_i|·wk_l)
                aw, wqi, ag0 = np.abs(w), wq[b, sl], np.abs(g0i)
                A = np.abs(qi) @ wk[b].T
                Ac = A + es[b, sl] / c if c else A   # the scores' own change, over c
                wc_q[b, sl] = (c2 * np.matmul(np.abs(W), wqi[..., None])[..., 0]
                               + c2 * np.matmul(Ac[:, None, :], aw)[:, 0, :] + c * ag0 @ wk[b])
                Z = np.matmul(aw, wqi[..., None])[..., 0]
                xwi = np.abs(g0i * phi[b, sl] + dia[b, sl])
                mb = (xwi * Ac + ag0 * np.sum(np.abs(Pf) * Ac, axis=-1, keepdims=True)
                      + np.abs(Pf) * np.sum(ag0 * Ac, axis=-1, keepdims=True))
                wc_k[b] += c2 * (Z + mb).T @ np.abs(qi) + c * ag0.T @ wqi
            xw = g0[b] * phi[b] + dia[b]       # M̃'s diagonal part
            for j0 in range(0, S, n):
                sj = slice(j0, min(S, j0 + n))
                qw = qr[b][None] * xw[:, sj].T[:, :, None]        # (j, i, e)
                xm = np.matmul(np.swapaxes(qw, -1, -2), qr[b])     # (j, e, f)
                x2[b, sj] = c4 * np.matmul(xm * xm, K2[sj][..., None])[..., 0]
        sd_q = np.sqrt(np.maximum(var_q, 0.0))
        sd_k = np.sqrt(np.maximum(var_a, 0.0) + (np.sqrt(x2) + sd_yz) ** 2)
    return sd_q, sd_k, wc_q, wc_k


def _probabilistic(fl: _Flat, pb: PlainBackward, model: Any, score_model: Any,
                   flat_shapes: dict[str, tuple[int, ...]],
                   dq_in: tuple[Arr, Arr], dk_in: tuple[Arr, Arr]) -> dict[str, Arr]:
    """The probabilistic reading of the rotation's roundings (flat dq', dk' bounds):
    their first-order effect λ·sd (:func:`_first_order_sd`, λ the check's), times
    e^{4σ̄} for the second order (σ̄ the largest score change λ·sd(δs) + the angles' of
    the row, for dQ', or of the key's column, for dK': those weights, hence the
    coefficients above, move by at most e^{±2σ̄} along the way; e^{4σ̄(1 + 1/C)} with a
    softcap C),
    plus the angles' errors (shared along a frequency) through the same linear terms at
    their worst case, the second-order products Δq·Δk as a further change of each
    score (the same linear terms), and the plain model's bound (both propagations, as
    the plain check)."""
    c = abs(fl.call(True).effective_scale)
    lam = float(score_model.lam)
    (rq, aq), (rk, ak) = dq_in, dk_in
    aqr, akr = np.abs(fl.qr), np.abs(fl.kr)
    with np.errstate(over="ignore", invalid="ignore"):
        tq, tk = rq + aq, rk + ak
        # the angles' first-order part goes through the linear terms below (their worst
        # case); the scores' extra term keeps the second-order products Δq·Δk
        ang_s = c * 1.05 * (aq @ np.swapaxes(akr, -1, -2) + aqr @ np.swapaxes(ak, -1, -2))
        extra = c * 1.05 * (tq @ np.swapaxes(tk, -1, -2))
        var_s = c * c * ((rq * rq) @ np.swapaxes(akr * akr, -1, -2)
                         + (aqr * aqr) @ np.swapaxes(rk * rk, -1, -2))
        sig = (lam * np.sqrt(np.where(pb.allowed, var_s, 0.0))
               + np.where(pb.allowed, extra + ang_s, 0.0))
        # σ̄ per query row (dQ'_i reads row i's scores) and per key (dK'_j: column j's)
        # (a softcap's factors Φ, t move by at most e^{±2σ̄/C} relative as well)
        grow = 4.0 * (1.0 + (0.0 if fl.cap is None else 1.0 / abs(fl.cap)))
        top_q = np.max(sig, axis=-1, keepdims=True, initial=0.0)
        top_k = np.swapaxes(np.max(sig, axis=-2, keepdims=True, initial=0.0), -1, -2)
        second_q = np.exp(np.minimum(grow * top_q, 700.0))
        second_k = np.exp(np.minimum(grow * top_k, 700.0))
        # the plain part as the probabilistic model reads it (its γ̃ sums; the worst-case
        # propagation, as the plain check of a softcap)
        plain = backward_error_bound(pb, score_model, shapes=flat_shapes)
        sd_q, sd_k, wc_q, wc_k = _first_order_sd(pb, c, rq, rk, aq, ak, extra)
        t_q = plain["dq"] + second_q * (lam * sd_q + wc_q)
        t_k = plain["dk"] + second_k * (lam * sd_k + wc_k)
    return {"dq": t_q, "dk": t_k}


def _score_extra(fl: _Flat, variant: Any, score_model: Any) -> Arr:
    """(B, L, S + sinks): each score's further error from the kernel's rotation (the
    variant's ``error`` hook; a sink's score σ has none)."""
    geo, rot = fl.geo, fl.rot
    B, L, S = geo.B, geo.L, int(fl.kr.shape[1])
    S0 = fl.S
    vp = SimpleNamespace(rotation=rot, rotation_inputs=(fl.q0, fl.k0[:, :S0]),
                         rotation_outputs=(fl.qr, fl.kr[:, :S0]),
                         scale=fl.call(True).effective_scale, opts=variant)
    hook = next(v.error for v in variant.active() if v.rotate is not None and v.error)
    extra = np.zeros((B, L, S))
    for b in range(B):
        extra[b, :, :S0] = hook(variant, vp, b, slice(0, L), score_model)[0]
    return extra


def _bounds(fl: _Flat, pb: PlainBackward, model: Any, variant: Any,
            shapes: dict[str, tuple[int, ...]], score_model: Any
            ) -> tuple[dict[str, Arr], dict[str, Any]]:
    """(bounds, natural scales) of dq, dk, dv at the inputs' shapes (module docstring);
    ``score_model`` reads the rotation's per-score term (the check's error model)."""
    geo, rot = fl.geo, fl.rot
    B, L, S, E = geo.B, geo.L, int(fl.kr.shape[1]), fl.q0.shape[-1]   # S: with a sink's key
    extra = _score_extra(fl, variant, score_model)
    flat_shapes: dict[str, tuple[int, ...]] = {"dq": (B, L, E), "dk": (B, S, E),
                                               "dv": (B, S, int(fl.v.shape[-1]))}
    plain = backward_error_bound(pb, model, shapes=flat_shapes, score_extra=extra)
    nats = natural_scales(pb, flat_shapes, model.eta)
    kern = KernelRotation(rot, model)
    dq_in = kern.bounds(fl.q0, fl.qr, fl.qpos)
    dk_in = kern.bounds(fl.k0, fl.kr, fl.kpos)
    c = abs(fl.call(True).effective_scale)
    P = np.where(pb.allowed, pb.p, 0.0)
    ds_abs = P * (np.abs(pb.dp) + np.abs(pb.d)) * 1.05
    with np.errstate(over="ignore", invalid="ignore"):
        t_q = plain["dq"] + c * (ds_abs @ (dk_in[0] + dk_in[1]))
        t_k = plain["dk"] + c * (np.swapaxes(ds_abs, -1, -2) @ (dq_in[0] + dq_in[1]))
    if getattr(score_model, "kind", "") == "probabilistic" and model.u >= _NARROW:
        # both hold (the worst case for every rounding, the probabilistic reading with
        # its probability): the smaller (as the plain model's two propagations)
        pr = _probabilistic(fl, pb, model, score_model, flat_shapes, dq_in, dk_in)
        t_q, t_k = np.fmin(t_q, pr["dq"]), np.fmin(t_k, pr["dk"])
    with np.errstate(over="ignore", invalid="ignore"):
        dq, dk = _rt(rot, pb.dq, fl.qpos), _rt(rot, pb.dk, fl.kpos)
        back_q = sum(kern.bounds(pb.dq, dq, fl.qpos))
        back_k = sum(kern.bounds(pb.dk, dk, fl.kpos))
        per = {"dq": (dq, _abs_rt(rot, t_q, fl.qpos) + back_q),
               "dk": (dk, _abs_rt(rot, t_k, fl.kpos) + back_k),
               "dv": (pb.dv, plain["dv"])}
    bounds = {n: fl.reduce(n, err, shapes[n], model, val) for n, (val, err) in per.items()}
    nat = {}
    for n, pos in (("dq", fl.qpos), ("dk", fl.kpos), ("dv", None)):
        size, floor = nats[n]
        size = size if pos is None else _abs_rt(rot, size, pos)
        nat[n] = (fl.reduce(n, size, shapes[n], model),
                  np.full(shapes[n], float(np.max(floor, initial=0.0))))
    return bounds, nat


def _diagnose(fl: _Flat, acts: dict[str, Arr], pb: PlainBackward, bounds: dict[str, Arr],
              model: Any, shapes: dict[str, tuple[int, ...]], safety: float
              ) -> tuple[Diagnosis, ...]:
    """The two rotary backward bug classes that fit (module docstring)."""
    un = plain_backward(fl.call(False))
    wrong = {"rotation_not_transposed": (pb, bounds),
             "rotation_missing": (un, None)}
    found = []
    for name, desc in _BUGS:
        pv, bnd = wrong[name]
        if bnd is None:
            flat_shapes = {"dq": pv.dq.shape, "dk": pv.dk.shape, "dv": pv.dv.shape}
            raw = backward_error_bound(pv, model, shapes=flat_shapes)
            bnd = {n: fl.reduce(n, raw[n], shapes[n], model, getattr(pv, n)) for n in raw}
        ok, worst = True, 0.0
        for n, a in acts.items():
            val = fl.reduce(n, getattr(pv, n), shapes[n], model)
            fit, ratio = _fits(a, val, safety * bnd[n])
            ok &= fit
            worst = max(worst, ratio)
        if ok:
            found.append(Diagnosis(name, desc, worst))
    return tuple(sorted(found, key=lambda d: d.ratio))


@dataclass
class RotatedCheck:
    """What a rotated call's check needs (module docstring): the reference enclosures,
    the bounds and natural scales at the inputs' shapes, the model shown in the report,
    and :meth:`diagnose`."""

    encs: dict[str, Any]
    bounds: dict[str, Arr]
    nats: dict[str, Any]
    shown: Any
    flat: _Flat
    pb: PlainBackward

    variant: Any = None
    score_model: Any = None

    def param_bounds(self, params: dict[str, Any]
                     ) -> tuple[dict[str, Arr], dict[str, Any]]:
        """The bounds of the kernel's variant-parameter gradients (``params``: keyword ->
        (actual, enclosure, reducer); d_sinks, d_alibi_slopes): as the plain check's
        (compare._bounds), sums of the mask gradient's per-element bounds — here the
        plain bound of dS at the float64-rotated inputs with each score widened by the
        rotation's error (the worst-case propagation, which takes that widening) —
        plus the kernel's own sum γ̃_n(u) Σ w|dS|; and their natural scales."""
        pb, fl = self.pb, self.flat
        full = tuple(pb.p.shape)
        extra = _score_extra(fl, self.variant, self.score_model)
        e_m = backward_error_bound(pb, self.shown, shapes={"d_attn_mask": full},
                                   score_extra=extra)["d_attn_mask"]
        nat_m, floor_m = natural_scales(pb, {"d_attn_mask": full},
                                        self.shown.eta)["d_attn_mask"]
        ds_abs = np.abs(np.where(pb.allowed, pb.ds if pb.ds_pre is None else pb.ds_pre, 0.0))
        out, nats = {}, {}
        for name, (a, _, reduce) in params.items():
            n_terms = max(float(np.prod(full)) / max(float(np.prod(a.shape)), 1.0), 1.0)
            gam = self.shown.gamma_sum(n_terms, format_of(a.dtype).u)
            out[name] = np.asarray(reduce(e_m) + gam * reduce(ds_abs), dtype=np.float64)
            nats[name] = (np.asarray(reduce(nat_m), dtype=np.float64),
                          np.full(a.shape, float(np.max(floor_m, initial=0.0)) * n_terms))
        return out, nats

    def diagnose(self, acts: dict[str, Arr], safety: float) -> tuple[Diagnosis, ...]:
        shapes = {n: tuple(e.shape) for n, e in self.encs.items()}
        return _diagnose(self.flat, {n: _f64(a) for n, a in acts.items()}, self.pb,
                         self.bounds, self.shown, shapes, safety)


def rotated_check(acts: dict[str, Arr], query: Any, key: Any, value: Any, grad_output: Any,
                  prep: Any, variant: Any, model: Any, *, rule: str | None,
                  call: dict[str, Any], variants: dict[str, Any],
                  with_mask_events: bool = False) -> RotatedCheck:
    """The reference and the tolerance of a call whose variant rotates q and k, the
    kernel's gradients ``acts`` (dq, dk, dv) checked for shape; ``model`` the check's
    error model (its per-score rotation term; the propagation is the worst case),
    ``call`` the plain keywords, ``variants`` the variant keywords."""
    if rule == "flash":
        raise SpecError("rule='flash' has no simulated kernel with rotary embeddings: use "
                        "rule='model', 'ulp' or 'allclose'")
    ref = reference_attention_backward(query, key, value, grad_output, **call, **variants)
    encs = {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    for name, a in acts.items():
        if tuple(a.shape) != tuple(encs[name].shape):
            raise ShapeError(f"{name}.shape={tuple(a.shape)} does not match the shape of the "
                             f"gradient it stands for {tuple(encs[name].shape)}")
    fl = _Flat(prep, variant, grad_output, call.get("scale"), call["masked_rows"])
    pb = plain_backward(fl.call(True))
    shapes = {n: tuple(e.shape) for n, e in encs.items()}
    n_el = float(sum(np.prod(sh) for sh in shapes.values()))
    if with_mask_events:    # parameter gradients judged by the mask gradient's bounds
        n_el += float(np.prod(pb.p.shape))
    events = backward_events(pb, max(n_el, 1.0))
    # the worst-case propagation (as softcap); the rotation's per-score term as the
    # check's error model reads it (probabilistic: min(worst case, λσ), as the forward's)
    shown = replace(model, kind="worst_case").with_events(*events)
    bounds, nats = _bounds(fl, pb, shown, variant, shapes, model.with_events(*events))
    return RotatedCheck(encs, bounds, nats, shown, fl, pb, variant,
                        model.with_events(*events))
