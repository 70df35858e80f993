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
from ...oracle.variants.registry import plain_rotation
from ...oracle.variants.rotary import KernelRotation
from ...oracle.variants.rotary_backward import refuse_unsupported
from ..call import AttentionCall
from ..forward.bugs import _fits
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


class _Flat:
    """The call as B flat problems (heads matched), rotated in float64."""

    def __init__(self, prep: Any, variant: Any, grad_output: Any, scale: Any,
                 masked_rows: str) -> None:
        geo = prep.geo
        self.prep, self.geo = prep, geo
        B, L, S = geo.B, geo.L, geo.S
        k64 = np.repeat(prep.k64, prep.group, axis=-3) if prep.group > 1 else prep.k64
        v64 = np.repeat(prep.v64, prep.group, axis=-3) if prep.group > 1 else prep.v64
        rot, io = plain_rotation(variant, geo, prep.q64, k64)
        assert io is not None
        self.rot = rot
        self.q0, self.k0, self.qr, self.kr = io
        Ev = v64.shape[-1]
        self.v = np.broadcast_to(v64, (*geo.batch, S, Ev)).reshape(B, S, Ev)
        do = _f64(_as_array(grad_output, "grad_output"))
        self.do = np.broadcast_to(do, (*geo.batch, L, Ev)).reshape(B, L, Ev)
        mask = prep.keep
        if prep.user_madd is not None:   # a float attn_mask: additive, -inf off the keys
            mask = prep.user_madd if mask is None else np.where(mask, prep.user_madd, -np.inf)
        self.keep = None if mask is None else np.ascontiguousarray(
            np.broadcast_to(mask, (*geo.batch, L, S)).reshape(B, L, S))
        self.scale, self.masked_rows = scale, masked_rows
        self.qpos = rot.q_positions(range(B))
        self.kpos = np.broadcast_to(rot.k_positions(), (B, S))

    def call(self, rotated: bool) -> AttentionCall:
        q, k = (self.qr, self.kr) if rotated else (self.q0, self.k0)
        return AttentionCall(q, k, self.v, do=self.do, attn_mask=self.keep,
                             scale=None if self.scale is None else float(self.scale),
                             masked_rows=self.masked_rows)

    def reduce(self, name: str, flat: Arr, shape: tuple[int, ...], model: Any,
               mag: Arr | None = None) -> Arr:
        """A flat (B, n, E) bound summed into the input's shape (GQA groups, broadcast
        copies), plus the kernel's own sum of the copies γ̃_n(u)·Σ|values| (``mag``)."""
        lead = self.geo.batch
        x = flat.reshape(*lead, *flat.shape[-2:])
        rep = self.prep.group if name in ("dk", "dv") else 1
        out = reduce_to(x, shape, rep)
        n_copies = max(1, round(flat.size / max(int(np.prod(shape)), 1)))
        if mag is not None and n_copies > 1:
            out = out + model.gamma_sum(n_copies, model.u) * reduce_to(
                np.abs(mag).reshape(x.shape), shape, rep)
        return np.asarray(out, dtype=np.float64)


def _bounds(fl: _Flat, pb: PlainBackward, model: Any, variant: Any,
            shapes: dict[str, tuple[int, ...]], score_model: Any
            ) -> tuple[dict[str, Arr], dict[str, Any]]:
    """(bounds, natural scales) of dq, dk, dv at the inputs' shapes (module docstring);
    ``score_model`` reads the rotation's per-score term (the check's error model)."""
    geo, rot = fl.geo, fl.rot
    B, L, S, E = geo.B, geo.L, geo.S, fl.q0.shape[-1]
    vp = SimpleNamespace(rotation=rot, rotation_inputs=(fl.q0, fl.k0),
                         rotation_outputs=(fl.qr, fl.kr), scale=fl.call(True).effective_scale,
                         opts=variant)
    hook = next(v.error for v in variant.active() if v.rotate is not None and v.error)
    extra = np.stack([hook(variant, vp, b, slice(0, L), score_model)[0] for b in range(B)]) \
        if B else np.zeros((0, L, S))
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

    def diagnose(self, acts: dict[str, Arr], safety: float) -> tuple[Diagnosis, ...]:
        shapes = {n: tuple(e.shape) for n, e in self.encs.items()}
        return _diagnose(self.flat, {n: _f64(a) for n, a in acts.items()}, self.pb,
                         self.bounds, self.shown, shapes, safety)


def rotated_check(acts: dict[str, Arr], query: Any, key: Any, value: Any, grad_output: Any,
                  prep: Any, variant: Any, model: Any, *, rule: str | None,
                  call: dict[str, Any], variants: dict[str, Any]) -> RotatedCheck:
    """The reference and the tolerance of a call whose variant rotates q and k, the
    kernel's gradients ``acts`` (dq, dk, dv) checked for shape; ``model`` the check's
    error model (its per-score rotation term; the propagation is the worst case),
    ``call`` the plain keywords, ``variants`` the variant keywords."""
    if rule == "flash":
        raise SpecError("rule='flash' has no simulated kernel with rotary embeddings: use "
                        "rule='model', 'ulp' or 'allclose'")
    refuse_unsupported(variant, prep)
    ref = reference_attention_backward(query, key, value, grad_output, **call, **variants)
    encs = {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    for name, a in acts.items():
        if tuple(a.shape) != tuple(encs[name].shape):
            raise ShapeError(f"{name}.shape={tuple(a.shape)} does not match the shape of the "
                             f"gradient it stands for {tuple(encs[name].shape)}")
    fl = _Flat(prep, variant, grad_output, call.get("scale"), call["masked_rows"])
    pb = plain_backward(fl.call(True))
    shapes = {n: tuple(e.shape) for n, e in encs.items()}
    events = backward_events(pb, max(float(sum(np.prod(sh) for sh in shapes.values())), 1.0))
    # the worst-case propagation (as softcap); the rotation's per-score term as the
    # check's error model reads it (probabilistic: min(worst case, λσ), as the forward's)
    shown = replace(model, kind="worst_case").with_events(*events)
    bounds, nats = _bounds(fl, pb, shown, variant, shapes, model.with_events(*events))
    return RotatedCheck(encs, bounds, nats, shown, fl, pb)
