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
    dW_o = Σ Gᵀ A, db_o = Σ G   with A's forward bound (tolerance.attention_error_bound)
    weight and bias gradients also allow the per-sequence partial sums to be stored in
    the dtype before they are added: + u Σ_n |partial_n|
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AttentionMismatchError, PrecisionError, ShapeError, SpecError
from .backward import BackwardComparison, _formats_bwd, _index_names
from .backward_model import ERROR_MODELS, accumulation_gamma, backward_error_bound
from .bugs import MhaInputs
from .bugs_backward import BackwardInputs, plain_backward
from .compare import (
    AttentionComparison,
    _as_actual,
    _f64,
    _judge,
    _mha_inputs,
    _refined,
    _rule_options,
    _rule_text,
    _tolerance,
)
from .tolerance import attention_error_bound, format_of, linear_error_bound

__all__ = ["assert_mha_backward_close", "compare_mha_backward"]

Arr = np.ndarray


def _heads(x: Arr, n_h: int) -> Arr:
    n, ln, w = x.shape
    return np.ascontiguousarray(x.reshape(n, ln, n_h, w // n_h).transpose(0, 2, 1, 3))


def _merge(x: Arr) -> Arr:
    n, h, ln, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(n, ln, h * d)


def mha_backward_bounds(x: MhaInputs, dout: Arr, fmt: Any, acc: Any,
                        error_model: str = "probabilistic") -> dict[str, Arr]:
    """The model's bound on every gradient of the block, batch-first layout:
    "query", "key", "value" (N, len, width); "wq", "wk", "wv", "wo" (torch layout);
    "bq", "bk", "bv", "bo"."""
    u, ua = fmt.u, acc.u
    H = x.num_heads
    G = H if x.num_kv_heads is None else x.num_kv_heads
    N, L, _ = x.query.shape
    S = x.key.shape[1]

    def lin(a: Arr, w: Arr, b: Arr | None) -> Arr:
        y = a @ w.T
        return y + b if b is not None else y

    Q, K, V = lin(x.query, x.wq, x.bq), lin(x.key, x.wk, x.bk), lin(x.value, x.wv, x.bv)
    eQ = linear_error_bound(x.query, x.wq, x.bq, y=Q, fmt=fmt, acc=acc)
    eK = linear_error_bound(x.key, x.wk, x.bk, y=K, fmt=fmt, acc=acc)
    eV = linear_error_bound(x.value, x.wv, x.bv, y=V, fmt=fmt, acc=acc)
    E_out = x.wo.shape[0]
    dA = dout @ x.wo
    gam_out = accumulation_gamma(E_out, ua, dA.size)
    e_dA = gam_out * (np.abs(dout) @ np.abs(x.wo)) + u * np.abs(dA)
    mask: Any = None
    if x.keep is not None and x.mask_add is not None:
        mask = np.where(x.keep, x.mask_add, -np.inf)
    elif x.keep is not None:
        mask = x.keep
    elif x.mask_add is not None:
        mask = x.mask_add
    bi = BackwardInputs(_heads(Q, H), _heads(K, G), _heads(V, G), _heads(dA, H), attn_mask=mask,
                        enable_gqa=G != H, masked_rows=x.masked_rows)
    pb = plain_backward(bi)
    shapes = {"dq": bi.q.shape, "dk": bi.k.shape, "dv": bi.v.shape}
    intrinsic = backward_error_bound(pb, fmt, acc, shapes=shapes, model=error_model)
    # input errors carried through the attention backward (first order, worst case)
    c = abs(pb.scale)
    rep = pb.rep
    eq_h, ek_h, ev_h = _heads(eQ, H), np.repeat(_heads(eK, G), rep, 1), np.repeat(_heads(eV, G), rep, 1)
    e_do = _heads(e_dA, H)
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
        aw = np.abs(W)
        n_out = W.shape[0]
        dX = dY @ W
        g_in = accumulation_gamma(n_out, ua, dX.size)
        out[{"q": "query", "k": "key", "v": "value"}[tag]] = (
            eY @ aw + g_in * (np.abs(dY) @ aw) + u * np.abs(dX))
        dYf, eYf, Xf = dY.reshape(n_rows, -1), eY.reshape(n_rows, -1), X.reshape(n_rows, -1)
        g_rows = accumulation_gamma(n_rows, ua, W.size)
        dW = dYf.T @ Xf
        # + u Σ_n |per-sequence partial sum|: a kernel may store them in its dtype first
        out["w" + tag] = (eYf.T @ np.abs(Xf) + g_rows * (np.abs(dYf).T @ np.abs(Xf))
                          + u * np.abs(dW) + u * np.abs(np.swapaxes(dY, 1, 2) @ X).sum(axis=0))
        out["b" + tag] = (eYf.sum(axis=0) + g_rows * np.abs(dYf).sum(axis=0)
                          + u * np.abs(dYf.sum(axis=0)) + u * np.abs(dY.sum(axis=1)).sum(axis=0))
    # the output projection: A is the kernel's own attention output, with its forward error
    att_out = _merge(np.asarray(pb.out))
    fwd = attention_error_bound(pb.q, pb.k, pb.v, np.where(pb.allowed, pb.p, 0.0),
                                scale=pb.scale, allowed=pb.allowed, mask_add=pb.mask_add,
                                out=pb.out, fmt=fmt, acc=acc, dq=eq_h, dk=ek_h, dv=ev_h)
    e_A = _merge(np.where(np.isfinite(fwd), fwd, 0.0))
    Gf, Af, eAf = dout.reshape(rows, E_out), att_out.reshape(rows, -1), e_A.reshape(rows, -1)
    g_rows = accumulation_gamma(rows, ua, x.wo.size)
    dWo = Gf.T @ Af
    out["wo"] = (np.abs(Gf).T @ eAf + g_rows * (np.abs(Gf).T @ np.abs(Af)) + u * np.abs(dWo)
                 + u * np.abs(np.swapaxes(dout, 1, 2) @ att_out).sum(axis=0))
    out["bo"] = (g_rows * np.abs(Gf).sum(axis=0) + u * np.abs(Gf.sum(axis=0))
                 + u * np.abs(dout.sum(axis=1)).sum(axis=0))
    return {k_: np.asarray(v_, dtype=np.float64) for k_, v_ in out.items()}


_PARAM_BOUND = {"in_proj_weight": ("wq", "wk", "wv"), "q_proj_weight": ("wq",),
                "k_proj_weight": ("wk",), "v_proj_weight": ("wv",),
                "in_proj_bias": ("bq", "bk", "bv"), "out_proj.weight": ("wo",),
                "out_proj.bias": ("bo",)}


def compare_mha_backward(
    grads: dict[str, Any], query: Any, key: Any, value: Any, grad_output: Any, *,
    rule: str = "model", accumulation_dtype: Any = None, safety: float | None = None,
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
    _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=None, safety=safety)
    if rule == "flash":
        raise SpecError("rule='flash' is available for compare_attention_backward only")
    if error_model not in ERROR_MODELS:
        raise SpecError(f"error_model={error_model!r}: expected one of {ERROR_MODELS}")
    from ..oracle.backward_mha import reference_mha_backward

    acts = {n: _as_actual(a) for n, a in grads.items()}
    if not acts:
        raise SpecError("grads is empty: give at least one gradient to compare")
    fmt, acc = _formats_bwd(list(acts.values()), accumulation_dtype)
    ref = reference_mha_backward(query, key, value, grad_output, **mha_options)
    x = _mha_inputs(query, key, value, mha_options)
    dout = _f64(np.asarray(_as_actual(grad_output)))
    mod = mha_options.get("module")
    bf = bool(getattr(mod, "batch_first", False) if mod is not None
              else mha_options.get("batch_first", False))
    seq_first = dout.ndim == 3 and not bf
    d_bf = dout[None] if dout.ndim == 2 else (np.swapaxes(dout, 0, 1) if seq_first else dout)
    bounds = mha_backward_bounds(x, d_bf, fmt, acc, error_model)

    def layout(a: Arr) -> Arr:
        return a[0] if dout.ndim == 2 else (np.swapaxes(a, 0, 1) if seq_first else a)

    refs: dict[str, tuple[Any, Arr]] = {}
    for name in acts:
        if name in ("query", "key", "value"):
            refs[name] = (getattr(ref, name), layout(bounds[name]))
        elif name == "input":
            refs[name] = (_SumEnclosure([ref.query, ref.key, ref.value],
                                        format_of(acts[name].dtype).name == "float64"),
                          layout(bounds["query"] + bounds["key"] + bounds["value"]))
        elif name in ref.parameters:
            parts = _PARAM_BOUND[name]
            b = np.concatenate([bounds[p_] for p_ in parts], axis=0)
            refs[name] = (ref.parameters[name], b)
        else:
            raise SpecError(f"grads[{name!r}]: expected query, key, value, input or one of "
                            f"{', '.join(ref.parameters)}")
    rule_text = _rule_text(rule, safety, rtol, atol, ulps, None)
    comps: dict[str, AttentionComparison] = {}
    for name, a in acts.items():
        enc, model = refs[name]
        if tuple(a.shape) != tuple(enc.shape):
            raise ShapeError(f"grads[{name!r}].shape={tuple(a.shape)} does not match the "
                             f"gradient's shape {tuple(enc.shape)}")
        if not np.all(np.isfinite(model)):
            raise ArithmeticError(f"internal error: the {name} tolerance is not finite")
        f_a = format_of(a.dtype)
        lower, upper = _f64(enc.lower), _f64(enc.upper)
        lower, upper = _refined(enc, lower, upper, model, rule, f_a, safety, rtol, atol, ulps)
        mid = 0.5 * (lower + upper)
        tol = _tolerance(rule, model=model, mid=mid, fmt=f_a, rtol=rtol, atol=atol, ulps=ulps,
                         factor=None, safety=safety, plain=None)
        names = (_index_names(a.ndim, "position") if name in ("query", "key", "value", "input")
                 else tuple(f"dim{i}" for i in range(a.ndim)))
        comps[name], _ = _judge(a, lower, upper, tol, fmt=f_a, acc=acc, rule=rule_text,
                                index_names=names, title=f"grad {name}")
    passed = all(c_.passed for c_ in comps.values())
    return BackwardComparison(passed, rule_text, fmt.name, acc.name, comps, bounds={
        n: refs[n][1] for n in acts})


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


def assert_mha_backward_close(grads: dict[str, Any], query: Any, key: Any, value: Any,
                              grad_output: Any, **options: Any) -> None:
    """:func:`compare_mha_backward`, raising :class:`~mha_symbolic.errors.AttentionMismatchError`."""
    __tracebackhide__ = True
    comp = compare_mha_backward(grads, query, key, value, grad_output, **options)
    if not comp.passed:
        exc = AttentionMismatchError(comp.report())
        exc.comparison = comp  # type: ignore[attr-defined]
        raise exc from None
