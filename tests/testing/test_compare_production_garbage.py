"""Every compare entry point, at a production size (bfloat16, S = 4096 keys): a correct
answer passes and garbage — zeros, 1e30, the heads swapped — never passes.

This is the failure of version 0.1 (issue 10): γ_n = nu/(1 − nu) became +inf once
n·u ≥ 1, and bfloat16 with 256 or more keys then passed any output.  The expected
behaviour here is reasoned independently of the code under test:

* the exact answers are computed by straightforward float64 numpy written here
  (softmax with the row maximum subtracted, the gradients by their textbook formulas
  dV = Pᵀ dO, dP = dO Vᵀ, dS = P∘(dP − rowsum(P∘dP)), dQ = c dS K, dK = c dSᵀ Q), whose
  own error (≲ 1e-12 relative) is far below a bfloat16 ulp (2^-8);
* "correct" is that float64 answer rounded to bfloat16: a half-ulp away from the
  exact value, which any sound tolerance for a bfloat16 kernel must accept;
* every garbage output is shown, by the same float64 numbers, to be wrong by at least
  half of the answer's own magnitude (the values of head h have mean h, so the heads'
  outputs differ by about 1): a tool whose tolerance let it pass would have a
  vacuous tolerance, the very defect of issue 10.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic import (
    assert_attention_close,
    compare_attention,
    compare_attention_backward,
    compare_attention_varlen,
    compare_mha,
    compare_mha_backward,
)
from mha_symbolic.errors import AttentionMismatchError, ToleranceError

BF = ml_dtypes.bfloat16
H, L, S, E = 2, 16, 4096, 64


def _inputs(seed: int = 0, in_dtype: Any = BF) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, H, L, E)).astype(in_dtype)
    k = rng.standard_normal((1, H, S, E)).astype(in_dtype)
    offset = np.arange(H, dtype=np.float64)[None, :, None, None]      # head h: mean h
    v = (rng.standard_normal((1, H, S, E)) + offset).astype(in_dtype)
    do = rng.standard_normal((1, H, L, E)).astype(in_dtype)
    return q, k, v, do


def _f(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _attention64(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float,
                 bias: np.ndarray | None = None, allowed: np.ndarray | None = None,
                 sink: np.ndarray | None = None, softcap: float | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(output, weights) in float64, written here: scores c q·k, optional C tanh(s/C),
    an added bias, masked keys dropped, a per-head sink logit in the denominator."""
    s = scale * (_f(q) @ np.swapaxes(_f(k), -1, -2))
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink[:, None, None])
    e = np.exp(s - m)
    den = np.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        den = den + np.exp(sink[:, None, None] - m)
    p = e / den
    return p @ _f(v), p


def _garbage(ref: np.ndarray, head_axis: int) -> dict[str, np.ndarray]:
    """Zeros, 1e30 everywhere, and the first two heads swapped, each checked to be
    wrong by at least half of the answer's magnitude (independently of the tool)."""
    out = {"zeros": np.zeros_like(ref), "1e30": np.full_like(ref, 1e30),
           "swapped heads": np.flip(ref, axis=head_axis)}
    scale = float(np.max(np.abs(ref)))
    for name, g in out.items():
        assert float(np.max(np.abs(g - ref))) >= 0.5 * scale, name
    return out


def _never_passes(fn: Any) -> str:
    """Run a comparison; 'failed' or 'refused' (ToleranceError: no verdict) — a pass
    is the defect under test."""
    try:
        comp = fn()
    except ToleranceError:
        return "refused"
    assert not comp.passed, comp.report()
    return "failed"


# --------------------------------------------------------------------------------------
# compare_attention: plain, variants, FP8


def test_compare_attention_passes_the_answer_and_fails_garbage_at_4096_keys() -> None:
    q, k, v, _ = _inputs()
    ref, _ = _attention64(q, k, v, scale=E**-0.5)
    comp = compare_attention(ref.astype(BF), q, k, v)
    assert comp.passed, comp.report()
    assert "accumulation: float32 (default)" in comp.report()
    assert "false-alarm probability ≤ 1e-9" in comp.report()
    for name, g in _garbage(ref, 1).items():
        assert _never_passes(lambda g=g: compare_attention(g.astype(BF), q, k, v,
                                                        diagnose_bugs=False)) == "failed", name
        with pytest.raises(AttentionMismatchError):
            assert_attention_close(g.astype(BF), q, k, v)
    # the worst-case model, selectable, also decides (never vacuous with fp32 sums)
    assert compare_attention(ref.astype(BF), q, k, v, error_model="worst_case").passed
    assert not compare_attention(np.zeros_like(ref).astype(BF), q, k, v,
                                 error_model="worst_case").passed


@pytest.mark.parametrize("variant", ["window", "softcap_alibi", "sinks"])
def test_compare_attention_with_variants_fails_garbage_at_4096_keys(variant: str) -> None:
    q, k, v, _ = _inputs(1)
    c = E**-0.5
    i = np.arange(L)[:, None] + (S - L)                 # bottom-right positions
    j = np.arange(S)[None, :]
    opts: dict[str, Any] = {"causal_alignment": "bottom_right"}
    if variant == "window":
        opts["window"] = (1024, 0)                      # keys i − 1024 … i
        ref, _ = _attention64(q, k, v, scale=c, allowed=(j >= i - 1024) & (j <= i))
    elif variant == "softcap_alibi":
        slopes = np.array([2.0**-8, 2.0**-10])
        opts.update(softcap=5.0, alibi_slopes=slopes)
        bias = -slopes[:, None, None] * np.abs(j - i)[None]
        ref, _ = _attention64(q, k, v, scale=c, bias=bias[None], softcap=5.0)
    else:
        sinks = np.array([2.0, -1.0])
        opts["sinks"] = sinks
        ref, _ = _attention64(q, k, v, scale=c, sink=sinks)
    comp = compare_attention(ref.astype(BF), q, k, v, **opts)
    assert comp.passed, comp.report()
    assert "accumulation: float32 (default)" in comp.report()
    for name, g in _garbage(ref, 1).items():
        assert _never_passes(lambda g=g: compare_attention(g.astype(BF), q, k, v, **opts,
                                                              diagnose_bugs=False)) \
            == "failed", name


def test_compare_attention_fp8_kernel_model_fails_garbage_at_4096_keys() -> None:
    q, k, v, _ = _inputs(2, ml_dtypes.float8_e4m3fn)
    ref, _ = _attention64(q, k, v, scale=E**-0.5)
    comp = compare_attention(ref.astype(BF), q, k, v)
    assert comp.passed, comp.report()
    assert "FP8 kernel model" in comp.report()
    for name, g in _garbage(ref, 1).items():
        assert _never_passes(lambda g=g: compare_attention(g.astype(BF), q, k, v,
                                                        diagnose_bugs=False)) == "failed", name


def test_compare_attention_varlen_fails_garbage_at_4096_keys() -> None:
    q, k, v, _ = _inputs(3)
    ref, _ = _attention64(q, k, v, scale=E**-0.5)
    # two packed sequences (the same sequence twice): (total, H, E) layout
    pack = [np.concatenate([np.swapaxes(x[0], 0, 1)] * 2) for x in (q, k, v)]
    want = np.concatenate([np.swapaxes(ref[0], 0, 1)] * 2)
    cu_q, cu_k = [0, L, 2 * L], [0, S, 2 * S]
    comp = compare_attention_varlen(want.astype(BF), *pack, cu_q, cu_k)
    assert comp.passed, comp.report()
    for name, g in _garbage(want, 1).items():
        assert _never_passes(lambda g=g: compare_attention_varlen(
            g.astype(BF), *pack, cu_q, cu_k, diagnose_bugs=False)) == "failed", name


# --------------------------------------------------------------------------------------
# gradients


def _grads64(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV of softmax(c q kᵀ) v against dO, by the textbook formulas."""
    c = E**-0.5
    _, p = _attention64(q, k, v, scale=c)
    dof = _f(do)
    dv = np.swapaxes(p, -1, -2) @ dof
    dp = dof @ np.swapaxes(_f(v), -1, -2)
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    return c * ds @ _f(k), c * np.swapaxes(ds, -1, -2) @ _f(q), dv


def test_compare_attention_backward_fails_garbage_at_4096_keys() -> None:
    q, k, v, do = _inputs(4)
    grads = _grads64(q, k, v, do)
    comp = compare_attention_backward(*(g.astype(BF) for g in grads), q, k, v, do)
    assert comp.passed, comp.report()
    assert "accumulation: float32 (default)" in comp.report()
    for which in range(3):
        for name, g in _garbage(grads[which], 1).items():
            bad = [x.astype(BF) for x in grads]
            bad[which] = g.astype(BF)
            assert _never_passes(lambda bad=bad: compare_attention_backward(
                *bad, q, k, v, do, diagnose_bugs=False)) == "failed", (which, name)


def test_check_attention_fails_garbage_kernels_at_4096_keys() -> None:
    torch = pytest.importorskip("torch")
    from mha_symbolic import check_attention

    q, k, v, _ = _inputs(5)
    tq, tk, tv = (torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16)
                  for x in (q, k, v))
    good = check_attention(torch.nn.functional.scaled_dot_product_attention, tq, tk, tv,
                           raise_on_failure=False)
    assert good.passed, good.report()
    kernels = {
        "zeros": lambda a, b, c: a * 0,
        "1e30": lambda a, b, c: a * 0 + 1e30,
        "swapped heads": lambda a, b, c: torch.flip(
            torch.nn.functional.scaled_dot_product_attention(a, b, c), dims=(1,)),
    }
    for name, fn in kernels.items():
        try:
            res = check_attention(fn, tq, tk, tv, raise_on_failure=False, diagnose_bugs=False)
        except ToleranceError:
            continue
        assert not res.passed, name


# --------------------------------------------------------------------------------------
# multi-head blocks


def _mha_case(seed: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Ed = 64
    xq = rng.standard_normal((1, L, Ed)).astype(BF)
    xk = rng.standard_normal((1, S, Ed)).astype(BF)
    xv = rng.standard_normal((1, S, Ed)).astype(BF)
    w_in = (rng.standard_normal((3 * Ed, Ed)) / 8).astype(BF)
    w_o = (rng.standard_normal((Ed, Ed)) / 8).astype(BF)
    # value bias: head h's values have mean h + 1 (its half of the features)
    b_in = np.concatenate([np.zeros(2 * Ed), np.repeat([1.0, 2.0], Ed // 2)]).astype(BF)
    opts = dict(num_heads=2, batch_first=True, in_proj_weight=w_in, in_proj_bias=b_in,
                out_proj_weight=w_o)
    return opts, xq, xk, xv


def _mha64(opts: dict[str, Any], xq: np.ndarray, xk: np.ndarray, xv: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """(output, per-head attention output A (1, L, Ed)) of the block in float64."""
    w, b, wo = _f(opts["in_proj_weight"]), _f(opts["in_proj_bias"]), _f(opts["out_proj_weight"])
    Ed = w.shape[1]
    qq, kk, vv = (_f(x) @ w[i * Ed:(i + 1) * Ed].T + b[i * Ed:(i + 1) * Ed]
                  for i, x in enumerate((xq, xk, xv)))

    def heads(x: np.ndarray) -> np.ndarray:
        return x.reshape(1, x.shape[1], 2, Ed // 2).transpose(0, 2, 1, 3)

    a, _ = _attention64(heads(qq), heads(kk), heads(vv), scale=(Ed // 2) ** -0.5)
    a = a.transpose(0, 2, 1, 3).reshape(1, L, Ed)
    return a @ wo.T, a


def test_compare_mha_fails_garbage_at_4096_keys() -> None:
    opts, xq, xk, xv = _mha_case(6)
    ref, _ = _mha64(opts, xq, xk, xv)
    comp = compare_mha(ref.astype(BF), xq, xk, xv, **opts)
    assert comp.passed, comp.report()
    garbage = {"zeros": np.zeros_like(ref), "1e30": np.full_like(ref, 1e30),
               # the two heads' halves of the attention output exchanged before out_proj
               "swapped heads": np.flip(_mha64(opts, xq, xk, xv)[1].reshape(1, L, 2, -1),
                                        axis=2).reshape(1, L, -1) @ _f(opts["out_proj_weight"]).T}
    for name, g in garbage.items():
        assert float(np.max(np.abs(g - ref))) >= 0.5 * float(np.max(np.abs(ref))), name
        assert _never_passes(lambda g=g: compare_mha(g.astype(BF), xq, xk, xv, **opts,
                                                        diagnose_bugs=False)) \
            == "failed", name


def test_compare_mha_backward_never_passes_garbage_at_4096_keys() -> None:
    from mha_symbolic import reference_mha_backward

    opts, xq, xk, xv = _mha_case(7)
    rng = np.random.default_rng(8)
    do = rng.standard_normal((1, L, 64)).astype(BF)
    # the exact gradients' rounding stands for a correct kernel here: the block's
    # backward formulas through the projections are the oracle's, cross-checked
    # against torch autograd and forward-mode Arb in tests/oracle/backward/test_backward_mha.py
    g = reference_mha_backward(xq, xk, xv, do, **opts)
    kv = {"key": g.key.rounded("bfloat16"), "value": g.value.rounded("bfloat16")}
    comp = compare_mha_backward(kv, xq, xk, xv, do, **opts)
    assert comp.passed, comp.report()
    for which in kv:
        ref = _f(kv[which])
        half = ref.shape[-1] // 2
        garbage = {"zeros": np.zeros_like(ref), "1e30": np.full_like(ref, 1e30),
                   "swapped heads": np.concatenate([ref[..., half:], ref[..., :half]], -1)}
        for name, bad in garbage.items():
            assert float(np.max(np.abs(bad - ref))) >= 0.5 * float(np.max(np.abs(ref))), name
            grads = dict(kv)
            grads[which] = bad.astype(BF)
            assert _never_passes(lambda grads=grads: compare_mha_backward(
                grads, xq, xk, xv, do, **opts)) == "failed", (which, name)
    # the query gradient at this size: the model's tolerance there admits an all-zero
    # gradient (a loose bound, see the report of issue 10's merge), so the check
    # refuses a verdict instead of passing a missing gradient
    q_only = {"query": np.zeros_like(g.query.rounded("bfloat16"))}
    assert _never_passes(lambda: compare_mha_backward(q_only, xq, xk, xv, do, **opts)) in (
        "failed", "refused")
