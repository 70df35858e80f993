"""Judge a kernel's ``softmax_lse`` against the certified log-sum-exp.

:func:`compare_lse` compares an LSE (…, H_q, L) with
:func:`mha_symbolic.oracle.lse.reference_lse` under the worst-case error model of a
correct kernel (below); :func:`with_lse` gives ``compare_attention`` its ``lse=``
option (the output and the LSE judged together: one fails, the comparison fails).

**The model** (u_a: the accumulation format's unit roundoff, float32 for fp16/bf16/fp32
kernels; u: the LSE's own format).  Each score t_j = c·q·k_j + mask_j is computed with
error at most γ_{E+4}(u_a)·(|c|·|q|·|k_j| + |mask_j|) (the dot product, the scale, a
folded log2 e, the mask), plus 2u_in·(|c|·|q|·|k_j| + |mask_j|) for a kernel that holds
the scaled query in the inputs' format u_in first (torch's CPU flash kernel does for
fp16/bf16); the log-sum-exp is 1-Lipschitz in the sup norm, so that is
also an error of the LSE.  The exps (also a hardware exp2, relative 4u_a), the online
rescalings and the sum of S terms err relatively by at most γ_{2S+8}(u_a) in Σ, an
absolute error in log Σ; m + log Σ, the base change and the store add
(4u_a + u)·|lse|.  Worst case, so it never fails a correct kernel; the bug classes
below are off by O(1).

**Bug classes** (float64 variants, each named only when the LSE lies within the
model's tolerance of it): ``lse_missing_max`` (log Σ exp(t - m) returned: the max not
added back), ``lse_log2_for_ln`` / ``lse_ln_for_log2`` (the other base), ``lse_unscaled``
(the softmax scale left out of the LSE), ``lse_merge_max`` / ``lse_merge_sum`` /
``lse_merge_last`` (split-KV partial LSEs merged by max, by sum, or the last split's
kept, for 2, 4 or 8 splits), ``lse_masked_convention`` (rows with no key given the
other infinity).

>>> import numpy as np
>>> q = np.zeros((1, 2, 4), np.float32); k = np.zeros((1, 8, 4), np.float32)
>>> compare_lse(np.full((1, 2), np.log(8.0), np.float32), q, k).passed
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..oracle.arith.formats import get_format
from ..oracle.layout import swap_layout
from ..oracle.lse import check_lse_options, reference_lse
from ..oracle.variants.forward import lse_problem
from ..oracle.variants.protocol import keyword_owner
from ..oracle.variants.registry import variant_options
from .verdict import Diagnosis, _as_actual, _as_array, _f64, _model, _verdict, mid_of

__all__ = ["LSE_BUGS", "compare_lse", "with_lse"]

#: bug class -> what it means (data)
LSE_BUGS: dict[str, str] = {
    "lse_missing_max": "log Σ exp(t - m) returned: the row maximum m not added back",
    "lse_log2_for_ln": "log2 returned where the natural log is expected (× 1/ln 2)",
    "lse_ln_for_log2": "the natural log returned where log2 is expected (× ln 2)",
    "lse_unscaled": "the softmax scale left out of the LSE's scores",
    "lse_merge_max": "split-KV partial LSEs merged by max instead of log-sum-exp",
    "lse_merge_sum": "split-KV partial LSEs merged by their sum",
    "lse_merge_last": "split-KV merge kept the last split's LSE only",
    "lse_masked_convention": "fully masked rows given the other infinity",
}
_MAX_SCORES = 1 << 24


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def _scores(q: np.ndarray, k: np.ndarray, attn_mask: Any, is_causal: bool, scale: Any,
            enable_gqa: bool, causal_alignment: str) -> tuple[np.ndarray, np.ndarray,
                                                              np.ndarray, float]:
    """Float64 (t, allowed, |c|·|q||k| + |mask|, c) over (…, H_q, L, S)."""
    rep = q.shape[-3] // k.shape[-3] if enable_gqa and q.ndim >= 3 else 1
    if rep > 1:
        k = np.repeat(k, rep, axis=-3)
    E = q.shape[-1]
    c = (1 / math.sqrt(E) if E else 0.0) if scale is None else float(scale)
    g = np.einsum("...le,...se->...ls", q, k)
    G = np.einsum("...le,...se->...ls", np.abs(q), np.abs(k))
    L, S = g.shape[-2:]
    allowed = np.ones(g.shape, bool)
    add = np.zeros(g.shape)
    if is_causal:
        off = S - L if causal_alignment == "bottom_right" else 0
        allowed &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    if attn_mask is not None:
        m = np.asarray(_as_array(attn_mask, "attn_mask"))
        if m.dtype == np.bool_:
            allowed &= m
        else:
            mf = np.asarray(m, np.float64)
            allowed &= ~np.isneginf(mf)
            add = add + np.where(np.isneginf(mf), 0.0, mf)
    t = np.where(allowed, c * g + add, -np.inf)
    return t, allowed, abs(c) * G + np.abs(add), c


def _lse(t: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.max(t, axis=axis, keepdims=True)
        mm = np.where(np.isfinite(m), m, 0.0)
        return np.squeeze(mm, axis) + np.log(np.sum(np.exp(t - mm), axis=axis))


def _variants(t: np.ndarray, t_unscaled: np.ndarray, base: Any
              ) -> list[tuple[str, str, np.ndarray]]:
    """(bug, description, float64 LSE in ``base``) of each bug class."""
    conv = 1 / math.log(2) if base == 2 else 1.0
    true = _lse(t)
    with np.errstate(invalid="ignore"):
        m = np.max(t, axis=-1)
        out = [("lse_missing_max", LSE_BUGS["lse_missing_max"], (true - m) * conv)]
    if base == "e":
        out.append(("lse_log2_for_ln", LSE_BUGS["lse_log2_for_ln"], true / math.log(2)))
    else:
        out.append(("lse_ln_for_log2", LSE_BUGS["lse_ln_for_log2"], true))
    out.append(("lse_unscaled", LSE_BUGS["lse_unscaled"], _lse(t_unscaled) * conv))
    S = t.shape[-1]
    for n in (2, 4, 8):
        if n > S:
            continue
        parts = np.stack([_lse(t[..., idx]) for idx in np.array_split(np.arange(S), n)])
        with np.errstate(invalid="ignore"):
            out.append(("lse_merge_max", LSE_BUGS["lse_merge_max"] + f" ({n} splits)",
                        np.max(parts, axis=0) * conv))
            out.append(("lse_merge_sum", LSE_BUGS["lse_merge_sum"] + f" ({n} splits)",
                        np.where(np.isfinite(parts), parts, 0.0).sum(axis=0) * conv))
            out.append(("lse_merge_last", LSE_BUGS["lse_merge_last"] + f" ({n} splits)",
                        parts[-1] * conv))
    return out


def compare_lse(actual: Any, query: Any, key: Any, *, attn_mask: Any = None,
                is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False, causal_alignment: str = "top_left",
                lse_base: Any = "e", lse_masked: str = "-inf",
                accumulation_dtype: Any = None, safety: float = 1.0,
                diagnose_bugs: bool = True, input_dtype: Any = None) -> Any:
    """Compare a kernel's LSE (…, H_q, L) with the certified one (module docstring);
    an :class:`~mha_symbolic.testing.verdict.AttentionComparison` titled
    "softmax_lse" with index names (batch, head, query).  ``input_dtype``: the
    kernel's input format when ``query`` is an exact float64 rewrite of its inputs
    (a variant lowered to plain attention; default: ``query``'s dtype)."""
    check_lse_options(lse_base, lse_masked)
    a = _as_actual(actual)
    ref = reference_lse(query, key, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                        base=lse_base, masked=lse_masked)
    if tuple(a.shape) != tuple(ref.shape):
        raise ShapeError(f"lse.shape={tuple(a.shape)} does not match the log-sum-exp shape="
                         f"{tuple(ref.shape)} (…, H_q, L)")
    model = _model(a, accumulation_dtype, "fused", "worst_case")
    q = _f64(_as_array(query, "query"))
    k = _f64(_as_array(key, "key"))
    if q.size // max(1, q.shape[-1]) * k.shape[-2] > _MAX_SCORES:
        raise ShapeError(f"query.shape={q.shape}, key.shape={k.shape}: compare_lse "
                         f"evaluates at most {_MAX_SCORES} scores")
    t, allowed, mag, c = _scores(q, k, attn_mask, is_causal, scale, enable_gqa,
                                 causal_alignment)
    S = t.shape[-1]
    E = q.shape[-1]
    ua, u = model.ua, model.u
    lower, upper = _f64(ref.lower), _f64(ref.upper)
    mid = mid_of(lower, upper)
    empty = ~np.isfinite(lower)
    conv = 1 / math.log(2) if lse_base == 2 else 1.0
    # a kernel may hold the scaled query (or the scores) in the inputs' format first:
    # one more rounding of each product's size in that format (CPU flash kernels do)
    fq = get_format(_as_array(query, "query").dtype if input_dtype is None else input_dtype)
    u_in = max(ua, 2.0**-fq.p)
    delta = np.max(np.where(allowed, mag, 0.0), axis=-1) * (_gamma(E + 4, ua) + 2 * u_in) * conv
    tol = safety * (delta + _gamma(2 * S + 8, ua) * conv
                    + (4 * ua + u) * np.where(empty, 0.0, np.abs(mid))) + 2.0**-1074
    a64 = _f64(a)
    want_inf = np.where(empty, lower, 0.0)
    hit = empty & (a64 == want_inf)
    a_used = np.where(empty, np.where(hit, 0.0, 1.0), a64)
    lo_u, hi_u = np.where(empty, 0.0, lower), np.where(empty, 0.0, upper)
    tol_u = np.where(empty, 0.0, tol)
    names = ("batch", "head", "query")[-a.ndim:] if a.ndim <= 3 else (
        *(f"batch{i}" for i in range(a.ndim - 2)), "head", "query")
    notes: tuple[str, ...] = ()
    if empty.any():
        notes = (f"{int(empty.sum())} row(s) have no key: expected {lse_masked} "
                 f"(lse_masked={lse_masked!r}); {int((empty & ~hit).sum())} differ",)
    rule = (f"worst-case LSE model (γ_(E+4) of the scores, γ_(2S+8) of the sum, "
            f"accumulation {model.acc.name}) × {safety:g}")
    comp = _verdict(a_used, lo_u, hi_u, tol_u, None, model=model, rule=rule,
                    index_names=names, title="softmax_lse", notes=notes)
    if comp.passed or not diagnose_bugs:
        return comp
    diags = []
    other = math.inf if lse_masked == "-inf" else -math.inf
    if empty.any() and np.all(a64[empty & ~hit] == other) and not np.any(empty & ~hit
                                                                        & ~np.isinf(a64)):
        diags.append(Diagnosis("lse_masked_convention",
                               f"{LSE_BUGS['lse_masked_convention']}: pass "
                               f"lse_masked={'+inf' if other > 0 else '-inf'!r} if intended",
                               0.0))
    t_uns = np.where(allowed, t / c if c else t, -np.inf) if c not in (0.0, 1.0) else None
    fin = ~empty
    for bug, text, var in _variants(t, t_uns if t_uns is not None else t, lse_base):
        if bug == "lse_unscaled" and t_uns is None:
            continue
        with np.errstate(invalid="ignore"):
            ratio = np.abs(a64 - var) / tol
        if fin.any() and np.all(np.isfinite(var[fin])) and float(np.max(ratio[fin])) <= 1.0:
            diags.append(Diagnosis(bug, text, float(np.max(ratio[fin]))))
    diags.sort(key=lambda d: d.ratio)
    return replace(comp, diagnosis_run=True, diagnoses=tuple(diags[:2]))


def with_lse(compare: Callable[..., Any]) -> Callable[..., Any]:
    """The decorator of ``compare_attention``: ``lse=`` (a kernel's LSE, judged by
    :func:`compare_lse`), ``lse_base``, ``lse_masked``; the comparison fails when
    either fails, its ``.lse`` holds the LSE's findings."""

    @functools.wraps(compare)
    def run(actual: Any, query: Any, key: Any, value: Any, *, lse: Any = None,
            lse_base: Any = "e", lse_masked: str = "-inf", **options: Any) -> Any:
        __tracebackhide__ = True
        comp = compare(actual, query, key, value, **options)
        if lse is None:
            return comp
        layout = options.get("layout", "bhsd")
        keep = ("attn_mask", "is_causal", "scale", "enable_gqa", "causal_alignment",
                "accumulation_dtype", "diagnose_bugs")
        kw = {n: options[n] for n in keep if n in options}
        q, k = swap_layout(query, layout, "query"), swap_layout(key, layout, "key")
        given = {n: x for n, x in options.items()
                 if x is not None and keyword_owner(n) is not None}
        opts = variant_options(**given) if given else None
        if opts is not None:
            # the plain problem the variants lower to: its LSE is the call's
            q_dtype = _as_array(q, "query").dtype
            q, k, mask, gqa = lse_problem(
                q, k, swap_layout(value, layout, "value"), opts,
                attn_mask=kw.pop("attn_mask", None), is_causal=kw.pop("is_causal", False),
                scale=kw.get("scale"), enable_gqa=kw.pop("enable_gqa", False),
                causal_alignment=kw.pop("causal_alignment", "top_left"))
            kw.update(attn_mask=mask, enable_gqa=gqa, input_dtype=q_dtype)
        lc = compare_lse(lse, q, k, lse_base=lse_base, lse_masked=lse_masked, **kw)
        return replace(comp, passed=comp.passed and lc.passed, lse=lc)

    return run
