"""Judge a whole multi-head attention block against the exact answer:
:func:`compare_mha` and :func:`assert_mha_close`, on the verdict engine of
:mod:`.compare` (the model's level; the dtype level covers plain SDPA only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import SpecError
from ...oracle.forward.mha import reference_mha
from ..options import asserting, passes_options_to
from ..tolerance import DEFAULT_SAFETY
from ..verdict import (
    AttentionComparison,
    _as_actual,
    _as_array,
    _check_enclosure,
    _check_shape,
    _f64,
    _index_names,
    _model,
    _refined,
    _rule_line,
    _rule_options,
    _rule_tolerance,
    _verdict,
    _with_diagnoses,
    _within,
    mid_of,
)
from .bugs import MhaInputs, diagnose_mha, plain_mha

__all__ = ["assert_mha_close", "compare_mha"]


@passes_options_to(reference_mha)
def compare_mha(
    actual: Any,
    query: Any,
    key: Any,
    value: Any,
    *,
    rule: str | None = None,
    accumulation_dtype: Any = None,
    kernel: str = "fused",
    error_model: str = "probabilistic",
    subnormals: str = "keep",
    safety: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    ulps: float | None = None,
    factor: float | None = None,
    diagnose_bugs: bool = True,
    **mha_options: Any,
) -> AttentionComparison:
    """Compare the output of a multi-head attention block with the exact
    :func:`mha_symbolic.reference_mha` of the same inputs and weights
    (``mha_options`` are passed to it unchanged).

    >>> import numpy as np
    >>> x = np.eye(2)[None]
    >>> w = np.eye(2)
    >>> r = compare_mha(np.zeros((1, 2, 2)), x, x, x, num_heads=1, batch_first=True,
    ...                 in_proj_weight=np.concatenate([w, w, w]), out_proj_weight=w)
    >>> r.passed
    False
    """
    rule = _rule_options(rule, rtol=rtol, atol=atol, ulps=ulps, factor=factor, safety=safety)
    if rule == "flash":
        raise SpecError("rule='flash' is available for compare_attention only; use "
                        "rule='model', 'ulp' or 'allclose' for a multi-head block")
    a = _as_actual(actual)
    model = _model(a, accumulation_dtype, kernel, error_model, subnormals)
    ref = reference_mha(query, key, value, **mha_options)
    _check_shape(a, tuple(ref.shape), "multi-head attention output")
    lower, upper = _f64(ref.lower), _f64(ref.upper)
    _check_enclosure(lower, upper, mha_options.get("masked_rows") == "nan")
    x = _mha_inputs(query, key, value, mha_options)
    plain = plain_mha(x)
    model = model.with_events(*plain.events)
    model_tol, vacuous = plain.bound(model)
    # the float64 block works batch-first (N, L, E): back to the caller's layout
    mod = mha_options.get("module")
    bf = bool(getattr(mod, "batch_first", False) if mod is not None
              else mha_options.get("batch_first", False))
    seq_first = a.ndim == 3 and not bf
    if seq_first:
        model_tol, vacuous = np.swapaxes(model_tol, 0, 1), np.swapaxes(vacuous, 0, 1)
    elif a.ndim == 2:
        model_tol, vacuous = model_tol[0], vacuous[0]
    lower, upper = _refined(ref, lower, upper, model_tol, rule, model.fmt, safety, rtol,
                            atol, ulps)
    mid = mid_of(lower, upper)
    tol = _rule_tolerance(rule, model_tol=model_tol, mid=mid, fmt=model.fmt, rtol=rtol, atol=atol,
                     ulps=ulps, factor=factor, safety=safety, plain_err=None)
    comp = _verdict(a, lower, upper, tol, vacuous if rule == "model" else None, model=model,
                  rule=_rule_line(rule, model, safety, rtol, atol, ulps, factor),
                  index_names=("query", "batch", "feature") if seq_first
                  else _index_names(a.ndim, mha=True),
                  title="multi-head attention output")
    if comp.passed or not diagnose_bugs:
        return comp
    saf = DEFAULT_SAFETY if safety is None or rule != "model" else safety
    if not _within(a, lower, upper, saf * model_tol):
        comp = _with_diagnoses(comp, diagnose_mha(
            np.swapaxes(a, 0, 1) if seq_first else (a[None] if a.ndim == 2 else a), x,
            model=model, safety=saf))
    return comp


@asserting(compare_mha)
def assert_mha_close(actual: Any, query: Any, key: Any, value: Any, *, msg: Any = None,
                     **options: Any) -> None:
    """:func:`compare_mha`, raising :class:`~mha_symbolic.errors.AttentionMismatchError`
    (``msg`` as :func:`assert_attention_close`'s).

    >>> import numpy as np
    >>> x, w = np.eye(2)[None], np.eye(2)
    >>> assert_mha_close(np.zeros((1, 2, 2)), x, x, x, num_heads=1, batch_first=True,
    ...                  in_proj_weight=np.concatenate([w, w, w]), out_proj_weight=w)
    Traceback (most recent call last):
    ...
    mha_symbolic.errors.AttentionMismatchError: FAIL [...] multi-head attention output: 4 / 4 off...
    """


def _mha_inputs(query: Any, key: Any, value: Any, o: dict[str, Any]) -> MhaInputs:
    """The block in float64, batch-first, torch weight layout, masks as (N, H, L, S)
    ``keep`` (True = takes part) and additive float; the conventions of reference_mha
    (which has already validated every shape when this runs)."""
    mod = o.get("module")

    def opt(name: str, attr: str | None = None) -> np.ndarray | None:
        val = o.get(name)
        if mod is not None:
            obj = mod.out_proj if attr and attr.startswith("out_proj.") else mod
            val = getattr(obj, (attr or name).split(".")[-1], None)
        return None if val is None else _f64(_as_array(val, name))

    q, k, v = (_f64(_as_array(t, n)) for t, n in ((query, "query"), (key, "key"),
                                                    (value, "value")))
    batch_first = bool(getattr(mod, "batch_first", False)) if mod is not None else bool(
        o.get("batch_first", False))
    if q.ndim == 2:
        q, k, v = q[None], k[None], v[None]
    elif not batch_first:
        q, k, v = (np.swapaxes(t, 0, 1) for t in (q, k, v))
    H = int(mod.num_heads) if mod is not None else int(o["num_heads"])
    g = H if o.get("num_kv_heads") is None else int(o["num_kv_heads"])
    w_in = opt("in_proj_weight")
    wq: np.ndarray | None
    wk: np.ndarray | None
    wv: np.ndarray | None
    if w_in is not None:
        E = w_in.shape[0] // 3
        wq, wk, wv = w_in[:E], w_in[E:2 * E], w_in[2 * E:]
    else:
        wq, wk, wv = (opt(n) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    wo = opt("out_proj_weight", "out_proj.weight")
    if wq is None or wk is None or wv is None or wo is None:
        raise SpecError("compare_mha needs the projection weights: in_proj_weight (or "
                        "q/k/v_proj_weight) and out_proj_weight, or module=")
    E, Ekv = wq.shape[0], wk.shape[0]
    b_in = opt("in_proj_bias")
    bq = bk = bv = None
    if b_in is not None:
        bq, bk, bv = b_in[:E], b_in[E:E + Ekv], b_in[E + Ekv:]
    bo = opt("out_proj_bias", "out_proj.bias")
    N, L, S = q.shape[0], q.shape[1], k.shape[1]
    keep = np.ones((N, H, L, S), dtype=bool)
    mask_add = None
    for name in ("key_padding_mask", "attn_mask"):
        m = o.get(name)
        if m is None:
            continue
        a = _as_array(m, name)
        if name == "key_padding_mask":
            a4 = np.broadcast_to(a.reshape(N, 1, 1, S), (N, H, L, S))
        elif a.shape == (L, S):
            a4 = np.broadcast_to(a, (N, H, L, S))
        else:
            a4 = a.reshape(N, H, L, S)                 # torch: index n * num_heads + h
        if a4.dtype == np.bool_:
            keep = keep & ~a4                          # torch MHA: True = masked out
        else:
            f = _f64(a4)
            keep = keep & (f != -np.inf)
            fin = np.where(f == -np.inf, 0.0, f)
            mask_add = fin if mask_add is None else mask_add + fin
    if o.get("is_causal"):
        keep = keep & (np.arange(S)[None, :] <= np.arange(L)[:, None])
    return MhaInputs(q, k, v, H, wq, wk, wv, wo, bq, bk, bv, bo, keep, mask_add,
                     num_kv_heads=g, masked_rows=str(o.get("masked_rows", "zero")))


