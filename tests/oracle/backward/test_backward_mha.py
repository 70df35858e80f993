"""reference_mha_backward: gradients of a multi-head attention block.

Expected values: forward-mode differentiation in Arb of the block written out element
by element (tests/kernels/backward_reference.py), and torch autograd of nn.MultiheadAttention
(agreement)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

from backward_reference import forward_mode_mha_gradients
from test_backward import _check_enclosure_and_rounding

from mha_symbolic import reference_mha_backward
from mha_symbolic.errors import InputValueError, ShapeError


def _block(rng: np.random.Generator, L: int, S: int, E: int, kdim: int, vdim: int,
           E_out: int) -> dict[str, np.ndarray]:
    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32).astype(np.float64)

    return {"query": r(L, E), "key": r(S, kdim), "value": r(S, vdim), "wq": r(E, E),
            "wk": r(E, kdim), "wv": r(E, vdim), "bq": r(E), "bk": r(E), "bv": r(E),
            "wo": r(E_out, E), "bo": r(E_out)}


@pytest.mark.parametrize("packed", [True, False])
def test_every_gradient_encloses_forward_mode_derivatives(packed: bool) -> None:
    rng = np.random.default_rng(11)
    kdim = vdim = 4 if packed else 3
    x = _block(rng, 2, 3, 4, kdim, vdim, 3)
    dout = rng.standard_normal((2, 3)).astype(np.float32).astype(np.float64)
    pad = np.array([False, False, True])
    ref = forward_mode_mha_gradients(x, 2, dout, key_padding=pad)
    kw: dict[str, Any] = dict(num_heads=2, out_proj_weight=x["wo"], out_proj_bias=x["bo"],
                              in_proj_bias=np.concatenate([x["bq"], x["bk"], x["bv"]]),
                              key_padding_mask=pad)
    if packed:
        kw["in_proj_weight"] = np.vstack([x["wq"], x["wk"], x["wv"]])
    else:
        kw.update(q_proj_weight=x["wq"], k_proj_weight=x["wk"], v_proj_weight=x["wv"])
    g = reference_mha_backward(x["query"], x["key"], x["value"], dout, **kw)
    fmts = ("float64", "float32")
    _check_enclosure_and_rounding(g.query, ref["query"], fmts)
    _check_enclosure_and_rounding(g.key, ref["key"], fmts)
    _check_enclosure_and_rounding(g.value, ref["value"], fmts)
    p = g.parameters
    if packed:
        _check_enclosure_and_rounding(p["in_proj_weight"],
                                      np.vstack([ref["wq"], ref["wk"], ref["wv"]]), fmts)
    else:
        for name, key in (("q_proj_weight", "wq"), ("k_proj_weight", "wk"),
                          ("v_proj_weight", "wv")):
            _check_enclosure_and_rounding(p[name], ref[key], fmts)
    _check_enclosure_and_rounding(p["in_proj_bias"],
                                  np.concatenate([ref["bq"], ref["bk"], ref["bv"]]), fmts)
    _check_enclosure_and_rounding(p["out_proj.weight"], ref["wo"], fmts)
    _check_enclosure_and_rounding(p["out_proj.bias"], ref["bo"], fmts)


@pytest.mark.parametrize("batch_first", [False, True])
def test_module_gradients_agree_with_torch_autograd(batch_first: bool) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(12)
    m = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64, batch_first=batch_first,
                                    kdim=6, vdim=5)
    L, S, N = 4, 5, 2

    def t(*shape: int) -> Any:
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    if batch_first:
        q, k, v = t(N, L, 8), t(N, S, 6), t(N, S, 5)
    else:
        q, k, v = t(L, N, 8), t(S, N, 6), t(S, N, 5)
    am = torch.zeros(L, S, dtype=torch.bool)
    am[0, 1:] = True
    out, _ = m(q, k, v, attn_mask=am, need_weights=False)
    do = torch.randn_like(out)
    params = dict(m.named_parameters())
    grads = torch.autograd.grad(out, [q, k, v, *params.values()], do)
    g = reference_mha_backward(q, k, v, do, module=m, attn_mask=am)
    assert set(g.parameters) == set(params)
    encs = [g.query, g.key, g.value] + [g.parameters[n] for n in params]
    for enc, tg in zip(encs, grads, strict=True):
        assert enc.shape == tuple(tg.shape)
        np.testing.assert_allclose(enc.midpoint, tg.numpy(), rtol=1e-12, atol=1e-13)


def test_gqa_block_sums_kv_gradients_over_query_heads() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    E, H, Hkv, L = 8, 4, 2, 3
    hd = E // H
    xq, xk = rng.standard_normal((L, 1, E)), rng.standard_normal((L, 1, E))
    wq, wk, wv = rng.standard_normal((E, E)), rng.standard_normal((Hkv * hd, E)), \
        rng.standard_normal((Hkv * hd, E))
    wo = rng.standard_normal((E, E))
    do = rng.standard_normal((L, 1, E))
    g = reference_mha_backward(xq, xk, xk, do, num_heads=H, num_kv_heads=Hkv,
                               q_proj_weight=wq, k_proj_weight=wk, v_proj_weight=wv,
                               out_proj_weight=wo)
    # torch: the same block with K, V heads repeated (repeat_interleave) for each query head
    T = {n: torch.tensor(a, requires_grad=True) for n, a in
         (("xq", xq), ("xk", xk), ("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo))}
    Q = (T["xq"][:, 0] @ T["wq"].T).reshape(L, H, hd).transpose(0, 1)
    K = (T["xk"][:, 0] @ T["wk"].T).reshape(L, Hkv, hd).transpose(0, 1).repeat_interleave(2, 0)
    V = (T["xk"][:, 0] @ T["wv"].T).reshape(L, Hkv, hd).transpose(0, 1).repeat_interleave(2, 0)
    A = torch.nn.functional.scaled_dot_product_attention(Q, K, V).transpose(0, 1).reshape(L, E)
    out = (A @ T["wo"].T)[:, None]
    gr = torch.autograd.grad(out, [T["wk"], T["wv"], T["xq"]], torch.tensor(do))
    np.testing.assert_allclose(g.parameters["k_proj_weight"].midpoint, gr[0].numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.parameters["v_proj_weight"].midpoint, gr[1].numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.query.midpoint, gr[2].numpy(), rtol=1e-12, atol=1e-14)


def test_fully_masked_row_policies() -> None:
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 1, 4))
    w = rng.standard_normal((12, 4))
    wo = rng.standard_normal((4, 4))
    do = rng.standard_normal((2, 1, 4))
    am = np.array([[True, True], [False, False]])  # torch MHA: True = masked out; row 0 empty
    kw = dict(num_heads=2, in_proj_weight=w, out_proj_weight=wo, attn_mask=am)
    with pytest.raises(InputValueError, match=r"query row \(0, 0, 0\) has every key masked"):
        reference_mha_backward(x, x, x, do, masked_rows="error", **kw)
    g = reference_mha_backward(x, x, x, do, masked_rows="nan", **kw)
    assert np.isnan(g.query.rounded("float32")[0]).all()
    assert np.isfinite(g.query.rounded("float32")[1]).all()
    assert np.isnan(g.parameters["in_proj_weight"].rounded("float32")).all()
    z = reference_mha_backward(x, x, x, do, masked_rows="zero", **kw)
    assert np.isfinite(z.parameters["out_proj.weight"].rounded("float64")).all()


def test_grad_output_shape_is_checked() -> None:
    x = np.ones((2, 1, 4))
    with pytest.raises(ShapeError, match=r"grad_output.shape=\(2, 4\)"):
        reference_mha_backward(x, x, x, np.ones((2, 4)), num_heads=2,
                               in_proj_weight=np.ones((12, 4)), out_proj_weight=np.eye(4))


def test_key_bias_gradient_is_exactly_zero_and_value_bias_gradient_is_rational() -> None:
    # a key bias shifts every score of a row by q_i·b_k: softmax ignores it, so
    # d b_k = 0 exactly; Σ_j P_ij = 1 makes d b_v = Σ_i dA_i = Σ_i (G W_o)_i exactly
    from fractions import Fraction

    rng = np.random.default_rng(15)
    x = _block(rng, 3, 2, 4, 4, 4, 2)
    dout = rng.standard_normal((3, 2)).astype(np.float32).astype(np.float64)
    g = reference_mha_backward(
        x["query"], x["key"], x["value"], dout, num_heads=2,
        in_proj_weight=np.vstack([x["wq"], x["wk"], x["wv"]]),
        in_proj_bias=np.concatenate([x["bq"], x["bk"], x["bv"]]),
        out_proj_weight=x["wo"], out_proj_bias=x["bo"])
    b = g.parameters["in_proj_bias"]
    for c in range(4):
        assert b.exact((4 + c,)) == 0
        want = sum((Fraction(float(dout[i, r])) * Fraction(float(x["wo"][r, c]))
                    for i in range(3) for r in range(2)), Fraction(0))
        assert b.exact((8 + c,)) == want
    r64 = b.rounded("float64")
    assert r64[4:8].tolist() == [0.0] * 4 and not np.signbit(r64[4:8]).any()
    assert g.parameters["out_proj.bias"].exact((1,)) == sum(Fraction(float(t)) for t in dout[:, 1])
