"""compare_attention_backward / assert_attention_backward_close: verdicts, reports,
diagnoses.  The kernels judged here are independent: tests/kernels/fa2_backward_kernel.py (a
blocked FlashAttention-2 backward written from the paper, with the catalogue's bugs
injectable) and torch's SDPA backward."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

from fa2_backward_kernel import fa2_backward

from mha_symbolic import AttentionMismatchError
from mha_symbolic.errors import ShapeError, SpecError, ToleranceError
from mha_symbolic.testing.backward.bugs import BACKWARD_BUG_CLASSES
from mha_symbolic.testing.backward.compare import (
    assert_attention_backward_close,
    compare_attention_backward,
)
from mha_symbolic.testing.tolerance import error_model

DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
          "bfloat16": ml_dtypes.bfloat16}


def _case(dt: Any, seed: int = 2, L: int = 24, S: int = 24) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((4, L, 16)).astype(dt)
    k = rng.standard_normal((2, S, 16)).astype(dt)
    v = rng.standard_normal((2, S, 16)).astype(dt)
    do = rng.standard_normal((4, L, 16)).astype(dt)
    mask = rng.random((L, S)) < 0.85
    mask[:, 0] = True
    keep = rng.random((4, L, S)) < 0.9
    return dict(q=q, k=k, v=v, do=do, mask=mask, keep=keep)


def _opts(c: dict[str, Any]) -> dict[str, Any]:
    return dict(attn_mask=c["mask"], is_causal=True, enable_gqa=True, dropout_p=0.25,
                dropout_mask=c["keep"])


def _kernel(c: dict[str, Any], dt: Any, bug: str | None = None) -> list[np.ndarray]:
    g = fa2_backward(c["q"], c["k"], c["v"], c["do"], dtype=dt, causal=True, mask=c["mask"],
                     keep=c["keep"], p_drop=0.25, bug=bug)
    return [x.astype(dt) for x in g]


@pytest.mark.parametrize("name", list(DTYPES))
def test_correct_flashattention2_kernel_passes_in_every_dtype(name: str) -> None:
    dt = DTYPES[name]
    c = _case(dt)
    comp = compare_attention_backward(*_kernel(c, dt), c["q"], c["k"], c["v"], c["do"], **_opts(c))
    assert comp.passed, comp.report()
    assert comp.dtype == name
    want = "float32" if name in ("float16", "bfloat16") else name
    assert comp.accumulation == f"{want} (default)"
    assert f"accumulation: {want} (default)" in comp.report()


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("bug", [b.name for b in BACKWARD_BUG_CLASSES
                                 # needs a softcap: tests/oracle/variants/test_variant_backward.py
                                 if b.name != "softcap_derivative_missing"])
def test_every_backward_bug_is_caught_and_named(name: str, bug: str) -> None:
    dt = DTYPES[name]
    c = _case(dt)
    comp = compare_attention_backward(*_kernel(c, dt, bug), c["q"], c["k"], c["v"], c["do"],
                                      **_opts(c))
    assert not comp.passed
    assert comp.diagnoses and comp.diagnoses[0].bug == bug, comp.report()
    assert f"'{bug}'" in comp.report()


def test_torch_sdpa_backward_passes_default_and_math() -> None:
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    torch.manual_seed(3)
    for dt in (torch.float32, torch.bfloat16):
        q, k, v, do = (torch.randn(2, 2, 33, 32, dtype=dt) for _ in range(4))
        for math_backend in (False, True):
            qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
            if math_backend:
                with sdpa_kernel(SDPBackend.MATH):
                    out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            g = torch.autograd.grad(out, (qq, kk, vv), do)
            comp = compare_attention_backward(*g, q, k, v, do, is_causal=True)
            assert comp.passed, comp.report()


def test_report_names_the_gradient_the_worst_element_and_the_bug() -> None:
    dt = np.float32
    c = _case(dt)
    dq, dk, dv = _kernel(c, dt, "scale_missing_in_dk")
    with pytest.raises(AttentionMismatchError) as info:
        assert_attention_backward_close(dq, dk, dv, c["q"], c["k"], c["v"], c["do"], **_opts(c))
    text = str(info.value)
    assert "grad_key (dk): FAILED" in text and "grad_query (dq): passed" in text
    assert "Worst element" in text and "index (head=" in text
    assert "scale_missing_in_dk" in text
    assert info.value.comparison.gradients["dk"].n_mismatched > 0  # type: ignore[attr-defined]


def test_tolerance_is_finite_and_rejects_a_zero_gradient_for_long_bf16_rows() -> None:
    rng = np.random.default_rng(4)
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((1, 8, 32)).astype(bf)
    k = rng.standard_normal((1, 1024, 32)).astype(bf)
    v = rng.standard_normal((1, 1024, 32)).astype(bf)
    do = rng.standard_normal((1, 8, 32)).astype(bf)
    dq, dk, dv = (x.astype(bf) for x in fa2_backward(q, k, v, do, dtype=bf, block=128))
    comp = compare_attention_backward(dq, dk, dv, q, k, v, do)
    assert comp.passed, comp.report()
    assert all(np.all(np.isfinite(b)) for b in comp.bounds.values())
    assert not comp.warnings
    for i, g in enumerate((dq, dk, dv)):
        grads = [dq, dk, dv]
        grads[i] = np.zeros_like(g)
        assert not compare_attention_backward(*grads, q, k, v, do).passed


def test_low_precision_accumulation_refuses_a_verdict_where_the_tolerance_is_vacuous() -> None:
    # bf16 accumulating in bf16 over 512 keys: a sum of 512 terms may lose every digit
    # (512 u = 2 > 1), so a correct FA2 kernel's gradients would pass only under a
    # tolerance as large as the gradients: no verdict, never a pass
    rng = np.random.default_rng(5)
    bf = ml_dtypes.bfloat16
    q, k, v, do = (rng.standard_normal((1, n, 64)).astype(bf) for n in (4, 512, 512, 4))
    dq, dk, dv = (x.astype(bf) for x in fa2_backward(q, k, v, do, dtype=bf))
    with pytest.raises(ToleranceError, match="natural size"):
        compare_attention_backward(dq, dk, dv, q, k, v, do, accumulation_dtype="same")
    # garbage is still refused or failed, never passed
    try:
        bad = compare_attention_backward(dq, dk, 2 * dv + 1, q, k, v, do,
                                          accumulation_dtype="same")
        assert not bad.passed
    except ToleranceError:
        pass
    # the default (float32 accumulation) decides, and says so
    comp = compare_attention_backward(dq, dk, dv, q, k, v, do)
    assert comp.passed and comp.accumulation == "float32 (default)"
    assert all(np.all(np.isfinite(b)) for b in comp.bounds.values())


def test_sum_factor_of_the_gradients_model_is_finite_for_every_length() -> None:
    n = np.array([1, 10, 256, 4096, 10**6, 10**9])
    for kind in ("probabilistic", "worst_case"):
        m = error_model("float32", kind=kind).with_events(1e6, 1e9)
        for u in (2.0**-8, 2.0**-11, 2.0**-24):
            g = m.gamma_sum(n, u)
            assert np.all(np.isfinite(g)) and np.all(g > 0)
        # small n u: at most Higham's γ_n = nu/(1 − nu) (closed form by hand)
        assert m.gamma_sum(10, 2.0**-24) <= 10 * 2.0**-24 / (1 - 10 * 2.0**-24)


def test_worst_case_model_is_selectable_and_looser() -> None:
    c = _case(np.float32)
    g = _kernel(c, np.float32)
    prob = compare_attention_backward(*g, c["q"], c["k"], c["v"], c["do"], **_opts(c))
    worst = compare_attention_backward(*g, c["q"], c["k"], c["v"], c["do"], **_opts(c),
                                       error_model="worst_case")
    alias = compare_attention_backward(*g, c["q"], c["k"], c["v"], c["do"], **_opts(c),
                                       error_model="worst")
    assert prob.passed and worst.passed and alias.passed
    assert np.all(worst.bounds["dq"] >= prob.bounds["dq"] * 0.5)
    assert np.array_equal(alias.bounds["dq"], worst.bounds["dq"])
    assert "worst case" in worst.report() and "probabilistic" in prob.report()
    with pytest.raises(SpecError, match="error_model='best'"):
        compare_attention_backward(*g, c["q"], c["k"], c["v"], c["do"], error_model="best")


def test_other_rules_and_argument_errors() -> None:
    c = _case(np.float32)
    g = _kernel(c, np.float32)
    args = (c["q"], c["k"], c["v"], c["do"])
    assert compare_attention_backward(*g, *args, **_opts(c), rule="flash").passed
    assert not compare_attention_backward(*g, *args, **_opts(c), rule="allclose", rtol=0.0,
                                          atol=0.0).passed
    with pytest.raises(ShapeError, match=r"dk.shape=\(2, 24, 15\)"):
        compare_attention_backward(g[0], g[1][..., :15], g[2], *args, **_opts(c))
    with pytest.raises(SpecError, match="only a float mask has a gradient"):
        compare_attention_backward(*g, *args, **_opts(c), d_attn_mask=np.zeros((24, 24)))


def test_multihead_attention_module_gradients_pass_and_a_wrong_one_fails() -> None:
    torch = pytest.importorskip("torch")
    from mha_symbolic import assert_mha_backward_close, compare_mha_backward

    torch.manual_seed(6)
    for dt in (torch.float32, torch.bfloat16):
        m = torch.nn.MultiheadAttention(16, 2, batch_first=True, dtype=dt)
        x = torch.randn(2, 7, 16, dtype=dt, requires_grad=True)
        out, _ = m(x, x, x, need_weights=False)
        g = torch.randn_like(out)
        params = dict(m.named_parameters())
        grads = torch.autograd.grad(out, [x, *params.values()], g)
        d = dict(zip(params, grads[1:], strict=True))
        d["input"] = grads[0]     # self-attention: the sum of the three input gradients
        comp = compare_mha_backward(d, x, x, x, g, module=m)
        assert comp.passed, comp.report()
        bad = dict(d)
        bad["out_proj.weight"] = d["out_proj.weight"].T.contiguous()
        with pytest.raises(AttentionMismatchError, match=r"grad out_proj\.weight"):
            assert_mha_backward_close(bad, x, x, x, g, module=m)
