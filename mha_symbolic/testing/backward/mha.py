"""Judge the gradients of a multi-head attention block (``torch.nn.MultiheadAttention``
conventions) against the exact ones: :func:`compare_mha_backward`.

The tolerance composes the attention backward model of :mod:`.backward_model` (each
head, on the block's float64 projections) with the roundings around it, to first
order and in the worst case (the projections' errors are small next to the attention's
with float32 accumulation)::

    Q = X_q W_qᵀ + b_q …      δQ: tolerance.linear_error_bound (per element)
    dA = G W_o                 δdA = γ̃_{E_out} |G||W_o| + u|dA|
    attention backward         the head model, plus the input errors carried through:
                               δs = c(|δQ||K|ᵀ + |Q||δK|ᵀ), δP <= P(|δs| + Σ_j P|δs|),
                               δdP = |δdA||V|ᵀ + |dA||δV|ᵀ, δD <= Σ_j (δP|dP| + P δdP),
                               δdS <= δP|dP − D| + P(δdP + δD),
                               δdQ <= c(δdS|K| + |dS| δK), δdK <= c(δdSᵀ|Q| + |dS|ᵀ δQ),
                               δdV <= δPᵀ|dA| + Pᵀ δdA
    dX = dQ W, dW = Σ dQᵀ X, db = Σ dQ      (H1) with the dQ bound carried: δdQ|W| + γ̃|dQ||W| + u|dX|
    dW_o = Σ Gᵀ A, db_o = Σ G   with A's forward bound (model.batched_attention_error_bound)
    weight and bias gradients also allow the per-sequence partial sums to be stored in
    the dtype before they are added: + u Σ_n |partial_n|

γ̃_n is the factor of a sum under the check's error model
(:meth:`~mha_symbolic.testing.tolerance.ErrorModel.gamma_sum`: the same defaults and λ
as every check; worst case γ(n) with ``error_model="worst_case"``).  Vacuity as for
attention (:mod:`.backward_model`): the natural sizes of the heads' gradients carried
through the projections the same way; a passing check whose tolerance reaches them
raises :class:`~mha_symbolic.errors.ToleranceError`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import PrecisionError, ShapeError, SpecError
from ...oracle.backward import reference_mha_backward
from ..call import AttentionCall
from ..forward.bugs import MhaInputs
from ..forward.mha import _mha_inputs
from ..options import asserting, passes_options_to
from ..tolerance import ErrorModel, format_of, linear_error_bound
from ..verdict import _acc_text, _as_actual, _f64, _rule_line, _rule_options
from .bugs import plain_backward
from .compare import BackwardComparison, _judge_gradients, _model_bwd, _refuse_vacuous
from .model import (
    BACKWARD_KERNEL,
    backward_error_bound,
    backward_events,
    batched_attention_error_bound,
    natural_scales,
)

__all__ = ["assert_mha_backward_close", "compare_mha_backward"]

Arr = np.ndarray


def _heads(x: Arr, n_h: int) -> Arr:
    n, ln, w = x.shape
    return np.ascontiguousarray(x.reshape(n, ln, n_h, w // n_h).transpose(0, 2, 1, 3))


def _merge(x: Arr) -> Arr:
    n, h, ln, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(n, ln, h * d)


def mha_backward_bounds(x: MhaInputs, dout: Arr, model: ErrorModel
                        ) -> tuple[dict[str, Arr], dict[str, tuple[Arr, Arr]], ErrorModel]:
    """The model's bound on every gradient of the block, batch-first layout:
    "query", "key", "value" (N, len, width); "wq", "wk", "wv", "wo" (torch layout);
    "bq", "bk", "bv", "bo"; the (natural size, floor) of each (vacuity); and the model
    with the check's λs."""
    H = x.num_heads
    G = H if x.num_kv_heads is None else x.num_kv_heads
    N, L, _ = x.query.shape
    S = x.key.shape[1]

    def lin(a: Arr, w: Arr, b: Arr | None) -> Arr:
        y = a @ w.T
        return y + b if b is not None else y

    Q, K, V = lin(x.query, x.wq, x.bq), lin(x.key, x.wk, x.bk), lin(x.value, x.wv, x.bv)
    E_out = x.wo.shape[0]
    dA = dout @ x.wo
    mask: Any = None
    if x.keep is not None and x.mask_add is not None:
        mask = np.where(x.keep, x.mask_add, -np.inf)
    elif x.keep is not None:
        mask = x.keep
    elif x.mask_add is not None:
        mask = x.mask_add
    bi = AttentionCall(_heads(Q, H), _heads(K, G), _heads(V, G), do=_heads(dA, H), attn_mask=mask,
                        enable_gqa=G != H, masked_rows=x.masked_rows)
    pb = plain_backward(bi)
    shapes = {"dq": bi.q.shape, "dk": bi.k.shape, "dv": bi.v.shape}
    # one check: the heads' events, and the projections' (every element of Q, K, V, dA,
    # the inputs' and weights' gradients, each a sum over a width or the rows)
    n_el, n_sums = backward_events(pb, float(sum(math.prod(sh) for sh in shapes.values())))
    widths = x.query.shape[-1] + x.key.shape[-1] + x.value.shape[-1] + E_out
    n_proj = float(Q.size + K.size + V.size + dA.size) * 2
    events = (n_el + n_proj, n_sums + n_proj * (widths + N * max(L, S)))
    model = model.with_events(*events)
    u = model.u
    eQ = linear_error_bound(x.query, x.wq, x.bq, y=Q, model=model)
    eK = linear_error_bound(x.key, x.wk, x.bk, y=K, model=model)
    eV = linear_error_bound(x.value, x.wv, x.bv, y=V, model=model)
    e_dA = model.gamma_sum(E_out) * (np.abs(dout) @ np.abs(x.wo)) + u * np.abs(dA)
    intrinsic = backward_error_bound(pb, model, shapes=shapes, events=events)
    nat_h = natural_scales(pb, shapes, model.eta)
    # input errors carried through the attention backward (first order, worst case)
    rep = pb.rep
    eq_h, ek_h, ev_h = _heads(eQ, H), np.repeat(_heads(eK, G), rep, 1), np.repeat(_heads(eV, G), rep, 1)
    e_do = _heads(e_dA, H)
    carried_q, carried_k, carried_v = _carried(pb, eq_h, ek_h, ev_h, e_do)

    def kv_sum(a: Arr) -> Arr:
        return a.reshape(N, G, rep, S, a.shape[-1]).sum(axis=2) if rep > 1 else a

    e_dq_h = intrinsic["dq"] + carried_q
    e_dk_h = intrinsic["dk"] + kv_sum(carried_k)
    e_dv_h = intrinsic["dv"] + kv_sum(carried_v)
    dq_h, dk_h, dv_h = pb.dq, pb.dk, pb.dv
    dQ, dK, dV = _merge(dq_h), _merge(dk_h), _merge(dv_h)
    e_dQ, e_dK, e_dV = _merge(e_dq_h), _merge(e_dk_h), _merge(e_dv_h)
    out: dict[str, Arr] = {}
    rows = N * L
    for tag, dY, eY, X, W, n_rows in (("q", dQ, e_dQ, x.query, x.wq, N * L),
                                      ("k", dK, e_dK, x.key, x.wk, N * S),
                                      ("v", dV, e_dV, x.value, x.wv, N * S)):
        name = {"q": "query", "k": "key", "v": "value"}[tag]
        out[name], out["w" + tag], out["b" + tag] = _projection(dY, eY, X, W, n_rows, model)
    # the output projection: A is the kernel's own attention output, with its forward error
    att_out = _merge(np.asarray(pb.out))
    fwd = batched_attention_error_bound(pb.q, pb.k, pb.v, np.where(pb.allowed, pb.p, 0.0),
                                scale=pb.scale, allowed=pb.allowed, mask_add=pb.mask_add,
                                out=pb.out, model=model, dq=eq_h, dk=ek_h, dv=ev_h)
    e_A = _merge(np.where(np.isfinite(fwd), fwd, 0.0))
    Gf, Af, eAf = dout.reshape(rows, E_out), att_out.reshape(rows, -1), e_A.reshape(rows, -1)
    g_rows = model.gamma_sum(rows)
    dWo = Gf.T @ Af
    out["wo"] = (np.abs(Gf).T @ eAf + g_rows * (np.abs(Gf).T @ np.abs(Af)) + u * np.abs(dWo)
                 + u * np.abs(np.swapaxes(dout, 1, 2) @ att_out).sum(axis=0))
    out["bo"] = (g_rows * np.abs(Gf).sum(axis=0) + u * np.abs(Gf.sum(axis=0))
                 + u * np.abs(dout.sum(axis=1)).sum(axis=0))
    bounds = {k_: np.asarray(v_, dtype=np.float64) for k_, v_ in out.items()}
    return bounds, _mha_natural(x, dout, nat_h, att_out), model


def _carried(pb: Any, eq_h: Arr, ek_h: Arr, ev_h: Arr, e_do: Arr) -> tuple[Arr, Arr, Arr]:
    """The errors of the heads' inputs (q, k, v, dO: ``eq_h`` …) carried through the
    attention backward to dq, dk, dv (first order, worst case; key heads repeated)."""
    c = abs(pb.scale)
    aq, ak, av, ado = np.abs(pb.q), np.abs(pb.k), np.abs(pb.v), np.abs(pb.do)
    t = np.swapaxes
    P = pb.p
    d_s = c * (eq_h @ t(ak, -1, -2) + aq @ t(ek_h, -1, -2) + eq_h @ t(ek_h, -1, -2))
    d_s = np.where(pb.allowed, d_s, 0.0)
    dP_in = P * (d_s + np.sum(P * d_s, axis=-1, keepdims=True))
    ddp = e_do @ t(av, -1, -2) + ado @ t(ev_h, -1, -2) + e_do @ t(ev_h, -1, -2)
    dD = np.sum(dP_in * np.abs(pb.dp) + P * ddp, axis=-1, keepdims=True)
    dds = dP_in * np.abs(pb.dp - pb.d) + P * (ddp + dD)
    carried_q = c * (dds @ ak + np.abs(pb.ds) @ ek_h)
    carried_k = c * (t(dds, -1, -2) @ aq + t(np.abs(pb.ds), -1, -2) @ eq_h)
    carried_v = t(dP_in, -1, -2) @ ado + t(P, -1, -2) @ e_do
    return carried_q, carried_k, carried_v


def _projection(dY: Arr, eY: Arr, X: Arr, W: Arr, n_rows: int, model: ErrorModel
                ) -> tuple[Arr, Arr, Arr]:
    """The bounds on the gradients of an input projection Y = X Wᵀ + b given the bound
    ``eY`` on dY: (dX, dW, db)."""
    u = model.u
    aw = np.abs(W)
    dX = dY @ W
    e_x = eY @ aw + model.gamma_sum(W.shape[0]) * (np.abs(dY) @ aw) + u * np.abs(dX)
    dYf, eYf, Xf = dY.reshape(n_rows, -1), eY.reshape(n_rows, -1), X.reshape(n_rows, -1)
    g_rows = model.gamma_sum(n_rows)
    dW = dYf.T @ Xf
    # + u Σ_n |per-sequence partial sum|: a kernel may store them in its dtype first
    e_w = (eYf.T @ np.abs(Xf) + g_rows * (np.abs(dYf).T @ np.abs(Xf))
           + u * np.abs(dW) + u * np.abs(np.swapaxes(dY, 1, 2) @ X).sum(axis=0))
    e_b = (eYf.sum(axis=0) + g_rows * np.abs(dYf).sum(axis=0)
           + u * np.abs(dYf.sum(axis=0)) + u * np.abs(dY.sum(axis=1)).sum(axis=0))
    return e_x, e_w, e_b


def _mha_natural(x: MhaInputs, dout: Arr, nat_h: dict[str, tuple[Arr, Arr]],
                 att_out: Arr) -> dict[str, tuple[Arr, Arr]]:
    """(natural size, floor) of every gradient of the block: the heads' natural sizes
    (backward_model.natural_scales) carried through the projections as the gradients
    are (|dX| ≤ |dY||W|, |dW| ≤ Σ|dY|ᵀ|X|, |db| ≤ Σ|dY|), and the output projection's
    from |G| and |A|."""
    N, L, _ = x.query.shape
    S = x.key.shape[1]
    out: dict[str, tuple[Arr, Arr]] = {}
    for tag, key_h, X, W, n_rows in (("q", "dq", x.query, x.wq, N * L),
                                     ("k", "dk", x.key, x.wk, N * S),
                                     ("v", "dv", x.value, x.wv, N * S)):
        size_h, floor_h = nat_h[key_h]
        size, floor = _merge(size_h), _merge(floor_h)
        aw = np.abs(W)
        Xf = np.abs(X).reshape(n_rows, -1)
        name = {"q": "query", "k": "key", "v": "value"}[tag]
        out[name] = (size @ aw, floor @ aw)
        sf, ff = size.reshape(n_rows, -1), floor.reshape(n_rows, -1)
        out["w" + tag] = (sf.T @ Xf, ff.T @ Xf)
        out["b" + tag] = (sf.sum(axis=0), ff.sum(axis=0))
    Gf = np.abs(dout).reshape(-1, dout.shape[-1])
    Af = np.abs(att_out).reshape(Gf.shape[0], -1)
    out["wo"] = (Gf.T @ Af, np.zeros((Gf.shape[1], Af.shape[1])))
    out["bo"] = (Gf.sum(axis=0), np.zeros(Gf.shape[1]))
    return out


_PARAM_BOUND = {"in_proj_weight": ("wq", "wk", "wv"), "q_proj_weight": ("wq",),
                "k_proj_weight": ("wk",), "v_proj_weight": ("wv",),
                "in_proj_bias": ("bq", "bk", "bv"), "out_proj.weight": ("wo",),
                "out_proj.bias": ("bo",)}


@passes_options_to(reference_mha_backward)
def compare_mha_backward(
    grads: dict[str, Any], query: Any, key: Any, value: Any, grad_output: Any, *,
    rule: str | None = None, accumulation_dtype: Any = None, safety: float | None = None,
    rtol: float | None = None, atol: float | None = None, ulps: float | None = None,
    error_model: str = "probabilistic", **mha_options: Any,
) -> BackwardComparison:
    """Compare a block's gradients with the exact ones of
    :func:`mha_symbolic.reference_mha_backward` (``mha_options`` as reference_mha's).

    ``grads``: a dict keyed "query", "key", "value" and torch's parameter names
    ("in_proj_weight", "q_proj_weight", …, "out_proj.weight", "out_proj.bias"), any
    subset; for self-attention with one tensor x passed three times, give its gradient
    as "input" (the sum of the three).  Rules: "model" (default), "ulp", "allclose".

    >>> import torch
    >>> m = torch.nn.MultiheadAttention(8, 2)
    >>> q = torch.randn(3, 1, 8, requires_grad=True)
    >>> out, _ = m(q, q, q, need_weights=False)
    >>> g = torch.randn_like(out)
    >>> dq, dw = torch.autograd.grad(out, (q, m.in_proj_weight), g)
    >>> compare_mha_backward({"input": dq, "in_proj_weight": dw}, q, q, q, g, module=m).passed
    True
    """
    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=None, safety=safety)
    if rule == "flash":
        raise SpecError("rule='flash' is available for compare_attention_backward only")
    acts = {n: _as_actual(a) for n, a in grads.items()}
    if not acts:
        raise SpecError("grads is empty: give at least one gradient to compare")
    emodel = _model_bwd(list(acts.values()), accumulation_dtype, error_model)
    ref = reference_mha_backward(query, key, value, grad_output, **mha_options)
    x = _mha_inputs(query, key, value, mha_options)
    dout = _f64(np.asarray(_as_actual(grad_output)))
    mod = mha_options.get("module")
    bf = bool(getattr(mod, "batch_first", False) if mod is not None
              else mha_options.get("batch_first", False))
    seq_first = dout.ndim == 3 and not bf
    d_bf = dout[None] if dout.ndim == 2 else (np.swapaxes(dout, 0, 1) if seq_first else dout)
    bounds, nats, shown = mha_backward_bounds(x, d_bf, emodel)

    def layout(a: Arr) -> Arr:
        return a[0] if dout.ndim == 2 else (np.swapaxes(a, 0, 1) if seq_first else a)

    def nat_of(parts: tuple[str, ...], lay: bool) -> tuple[Arr, Arr]:
        size = sum(nats[p_][0] for p_ in parts)
        floor = sum(nats[p_][1] for p_ in parts)
        if lay:
            return layout(np.asarray(size)), layout(np.asarray(floor))
        return (np.concatenate([nats[p_][0] for p_ in parts], axis=0),
                np.concatenate([nats[p_][1] for p_ in parts], axis=0))

    encs: dict[str, Any] = {}
    tols: dict[str, Arr] = {}
    nat: dict[str, tuple[Arr, Arr]] = {}
    for name in acts:
        if name in ("query", "key", "value"):
            encs[name], tols[name] = getattr(ref, name), layout(bounds[name])
            nat[name] = nat_of((name,), True)
        elif name == "input":
            encs[name] = _SumEnclosure([ref.query, ref.key, ref.value],
                                       format_of(acts[name].dtype).name == "float64")
            tols[name] = layout(bounds["query"] + bounds["key"] + bounds["value"])
            nat[name] = nat_of(("query", "key", "value"), True)
        elif name in ref.parameters:
            parts = _PARAM_BOUND[name]
            encs[name] = ref.parameters[name]
            tols[name] = np.concatenate([bounds[p_] for p_ in parts], axis=0)
            nat[name] = nat_of(parts, False)
        else:
            raise SpecError(f"grads[{name!r}]: expected query, key, value, input or one of "
                            f"{', '.join(ref.parameters)}")
        if tuple(acts[name].shape) != tuple(encs[name].shape):
            raise ShapeError(f"grads[{name!r}].shape={tuple(acts[name].shape)} does not "
                             f"match the gradient's shape {tuple(encs[name].shape)}")
    rule_text = _rule_line(rule, shown, safety, rtol, atol, ulps, None, kernel=BACKWARD_KERNEL)
    comps, warns, _ = _judge_gradients(
        acts, encs, tols, nat, shown, rule=rule, rule_text=rule_text, safety=safety,
        rtol=rtol, atol=atol, ulps=ulps, factor=None, plain=None,
        titles={n: f"grad {n}" for n in acts}, masked_nan=mha_options.get("masked_rows") == "nan")
    _refuse_vacuous(comps, shown)
    passed = all(c_.passed for c_ in comps.values())
    return BackwardComparison(passed, rule_text, emodel.fmt.name, _acc_text(emodel), comps,
                              bounds=tols, warnings=tuple(warns))


class _SumEnclosure:
    """Certified bounds of a sum of enclosures (self-attention's input gradient).

    Each part's exact value lies strictly between the neighbours of its correctly
    rounded double r_p, so the sum lies in [Σ r_p⁻, Σ r_p⁺] (each float sum rounded
    outward); with ``refine`` that interval is intersected with the parts' own
    bounds.  There is no correctly rounded value of the sum here: ``rounded`` refuses,
    which tells the comparison to keep these bounds."""

    def __init__(self, parts: list[Any], refine: bool) -> None:
        self.shape = parts[0].shape
        with np.errstate(over="ignore"):
            lo = np.nextafter(sum(p.lower for p in parts), -np.inf)
            hi = np.nextafter(sum(p.upper for p in parts), np.inf)
            if refine:
                r = [p.rounded("float64").astype(np.float64) for p in parts]
                lo2 = sum(np.nextafter(x, -np.inf) for x in r)
                hi2 = sum(np.nextafter(x, np.inf) for x in r)
                # each partial sum of k terms rounds once: step outward k times
                for _ in range(len(parts)):
                    lo2, hi2 = np.nextafter(lo2, -np.inf), np.nextafter(hi2, np.inf)
                lo, hi = np.maximum(lo, lo2), np.minimum(hi, hi2)
        self.lower, self.upper = lo, hi

    def rounded(self, dtype: Any) -> Arr:
        raise PrecisionError("a sum of gradients has no certified rounding here")


@asserting(compare_mha_backward)
def assert_mha_backward_close(grads: dict[str, Any], query: Any, key: Any, value: Any,
                              grad_output: Any, *, msg: Any = None, **options: Any) -> None:
    """:func:`compare_mha_backward`, raising :class:`~mha_symbolic.errors.AttentionMismatchError`
    (``msg`` as :func:`mha_symbolic.assert_attention_close`'s).

    >>> import numpy as np
    >>> x, w = np.eye(2)[None], np.eye(2)
    >>> do = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    >>> assert_mha_backward_close({"query": np.zeros((1, 2, 2))}, x, x, x, do, num_heads=1,
    ...     batch_first=True, in_proj_weight=np.concatenate([w, w, w]), out_proj_weight=w)
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.AttentionMismatchError: FAIL [...] gradients: grad query 4 / 4 off...
    """
