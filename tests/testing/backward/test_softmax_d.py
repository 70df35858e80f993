"""D = rowsum(dO ∘ O) judged where a kernel exposes it (testing/backward/softmax_d.py):
the enclosure holds the exact D of an mpmath loop written here; D as FlashAttention's
and Triton's preprocessing computes it (from the kernel's own output, in float32) and as
a MATH kernel does (rowsum(P ∘ dP)) passes at fp32/bf16/fp16; the planted D bugs are
caught and named; compare_attention_backward(softmax_d=) judges it with the gradients."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import ShapeError, SpecError
from mha_symbolic.testing.backward.softmax_d import _exact_d, compare_softmax_d

torch = pytest.importorskip("torch")


def test_the_enclosure_holds_the_exact_d_of_an_mpmath_loop() -> None:
    rng = np.random.default_rng(0)
    L, S, E = 3, 5, 4
    q, k, v, do = (rng.standard_normal((n, E)).astype(np.float32) for n in (L, S, S, L))
    r = ms.reference_attention(q, k, v, is_causal=True)
    lo, hi = _exact_d(np.asarray(r.lower, np.float64), np.asarray(r.upper, np.float64),
                      do.astype(np.float64))
    mpmath.mp.prec = 200
    c = 1 / mpmath.sqrt(E)
    for i in range(L):
        s = [c * mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b))
                             for a, b in zip(q[i], k[j], strict=True)) for j in range(i + 1)]
        m = max(s)
        w = [mpmath.exp(x - m) for x in s]
        tot = mpmath.fsum(w)
        o = [mpmath.fsum(w[j] * mpmath.mpf(float(v[j, e])) for j in range(i + 1)) / tot
             for e in range(E)]
        d = mpmath.fsum(mpmath.mpf(float(do[i, e])) * o[e] for e in range(E))
        assert mpmath.mpf(float(lo[i])) <= d <= mpmath.mpf(float(hi[i]))
        assert float(hi[i] - lo[i]) <= 1e-13 * max(1.0, abs(float(d)))


def _case(dtype: torch.dtype, causal: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 4, 200, 64, generator=g).to(dtype) for _ in range(4))
    q.requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return q.detach(), k, v, do, out.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_d_as_kernels_compute_it_passes(dtype: torch.dtype, causal: bool) -> None:
    q, k, v, do, out = _case(dtype, causal)
    # FlashAttention / Triton preprocessing: delta = sum(o.float() * do.float(), -1)
    d_fa = (out.float() * do.float()).sum(-1)
    c = compare_softmax_d(d_fa, q, k, v, do, is_causal=causal)
    assert c.passed, c.report()
    # a MATH kernel: rowsum(P ∘ dP) of its own float32 P and dP
    s = (q.float() @ k.float().transpose(-1, -2)) / 8.0
    if causal:
        s = s.masked_fill(~torch.ones(200, 200, dtype=torch.bool).tril(), float("-inf"))
    p = torch.softmax(s, -1)
    dp = do.float() @ v.float().transpose(-1, -2)
    c = compare_softmax_d((p * dp).sum(-1), q, k, v, do, is_causal=causal)
    assert c.passed, c.report()


@pytest.mark.parametrize(("bug", "make"), [
    ("d_term_from_grad_output", lambda out, do, dp: (do.float() * do.float()).sum(-1)),
    ("d_term_missing", lambda out, do, dp: torch.zeros(do.shape[:-1])),
    ("d_term_unweighted", lambda out, do, dp: dp.sum(-1)),
])
def test_d_bugs_are_caught_and_named(bug: str, make: object) -> None:
    q, k, v, do, out = _case(torch.float32, True)
    dp = (do.float() @ v.float().transpose(-1, -2)).masked_fill(
        ~torch.ones(200, 200, dtype=torch.bool).tril(), 0.0)
    c = compare_softmax_d(make(out, do, dp), q, k, v, do, is_causal=True)  # type: ignore[operator]
    assert not c.passed
    assert c.diagnoses and c.diagnoses[0].bug == bug, c.report()


def test_compare_attention_backward_judges_softmax_d_with_the_gradients() -> None:
    q, k, v, do, _ = _case(torch.float32, False)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg)
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), do)
    d = (out.detach() * do).sum(-1)
    c = ms.compare_attention_backward(dq, dk, dv, q, k, v, do, softmax_d=d)
    assert c.passed and c.softmax_d is not None and c.softmax_d.passed, c.report()
    c = ms.compare_attention_backward(dq, dk, dv, q, k, v, do, softmax_d=2 * d)
    assert not c.passed and not c.softmax_d.passed
    assert "softmax_d" in c.report()
    with pytest.raises(SpecError, match="plain attention"):
        ms.compare_attention_backward(dq, dk, dv, q, k, v, do, softmax_d=d, window=(4, 4))
    with pytest.raises(ShapeError, match=r"softmax_d\.shape"):
        compare_softmax_d(d[..., :-1], q, k, v, do)


def test_d_from_a_lower_precision_output_is_caught_in_fp32() -> None:
    """A float32 kernel that takes D from its output rounded to bf16 or fp16, or with
    TF32's 10-bit significand (a precision bug, not a wrong formula): caught."""
    q, k, v, do, out = _case(torch.float32, True)
    tf32 = (out.view(torch.int32) & ~0x1FFF).view(torch.float32)
    for o in (out.bfloat16().float(), out.half().float(), tf32):
        assert not compare_softmax_d((o * do).sum(-1), q, k, v, do, is_causal=True).passed
