"""The log-sum-exp with variants (issue 24): reference_attention(return_lse=True, ...)
and compare_attention(..., lse=) with a window, ALiBi, sinks, a mask_mod, a KV cache
and FP8 descale.  Expected values: mpmath loops written here at 300 bits over the keys
each variant keeps, with its bias (the sink's logit as one more term of the sum),
rounded to float32 by hand; real kernels: FlexAttention's return_lse with a mask_mod
and a score_mod-free ALiBi written in plain torch."""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import SpecError
from mha_symbolic.testing import compare_attention


def _round_f32(x: mpmath.mpf) -> float:
    """x rounded to float32 by hand: the nearest of three candidates, ties to even."""
    f = np.float32(float(x))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    dist = [abs(mpmath.mpf(float(c)) - x) for c in cands]
    winners = [c for c, d in zip(cands, dist, strict=True) if d == min(dist)]
    if len(winners) > 1:
        winners = [c for c in winners if int(np.float32(c).view(np.uint32)) % 2 == 0]
    return float(winners[0])

L, S, E, H = 5, 7, 4, 2


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, H, n, E)).astype(np.float32)  # type: ignore[return-value]
                 for n in (L, S, S))


def _mp_lse(q: np.ndarray, k: np.ndarray, keep: Any, bias: Any, sink: Any = None,
            c: Any = None) -> list[list[float]]:
    """float32-rounded log Σ_j e^{c q_i·k_j + bias(h, i, j)} (+ e^{sink_h}) per (h, i)."""
    mpmath.mp.prec = 300
    c = 1 / mpmath.sqrt(E) if c is None else c
    out = []
    for h in range(H):
        row = []
        for i in range(L):
            terms = [mpmath.exp(c * mpmath.fsum(mpmath.mpf(float(x)) * mpmath.mpf(float(y))
                                                for x, y in zip(q[0, h, i], k[0, h, j],
                                                                strict=True))
                                + bias(h, i, j))
                     for j in range(S) if keep(h, i, j)]
            if sink is not None:
                terms.append(mpmath.exp(mpmath.mpf(float(sink[h]))))
            row.append(_round_f32(mpmath.log(mpmath.fsum(terms))) if terms else -math.inf)
        out.append(row)
    return out


def _zero(h: int, i: int, j: int) -> Any:
    return mpmath.mpf(0)


def _check(got: Any, want: list[list[float]]) -> None:
    np.testing.assert_array_equal(got.lse.rounded("float32")[0], np.array(want, np.float32))


def test_window_lse_is_correctly_rounded() -> None:
    q, k, v = _inputs(1)
    r = ms.reference_attention(q, k, v, window=(2, 0), is_causal=True, return_lse=True)
    _check(r, _mp_lse(q, k, lambda h, i, j: i - 2 <= j <= i, _zero))


def test_alibi_lse_is_correctly_rounded() -> None:
    q, k, v = _inputs(2)
    slopes = np.array([0.5, 0.25], np.float32)
    r = ms.reference_attention(q, k, v, alibi_slopes=slopes, return_lse=True)
    # ALiBi: -slope·|j - (i + off)|, off = 0 for top-left alignment
    _check(r, _mp_lse(q, k, lambda h, i, j: True,
                      lambda h, i, j: -mpmath.mpf(float(slopes[h])) * abs(j - i)))


def test_sinks_lse_holds_the_sinks_term() -> None:
    q, k, v = _inputs(3)
    sinks = np.array([1.5, -0.75], np.float32)
    r = ms.reference_attention(q, k, v, sinks=sinks, is_causal=True, return_lse=True)
    _check(r, _mp_lse(q, k, lambda h, i, j: j <= i, _zero, sink=sinks))


def test_mask_mod_and_kv_cache_lse() -> None:
    q, k, v = _inputs(4)
    r = ms.reference_attention(q, k, v, mask_mod=lambda b, h, qi, ki: (qi + ki) % 2 == 0,
                               return_lse=True)
    _check(r, _mp_lse(q, k, lambda h, i, j: (i + j) % 2 == 0, _zero))
    r = ms.reference_attention(q, k, v, cache_seqlens=[5], return_lse=True)
    _check(r, _mp_lse(q, k, lambda h, i, j: j < 5, _zero))


def test_fp8_descale_lse() -> None:
    ml = pytest.importorskip("ml_dtypes")
    q, k, v = (x.astype(ml.float8_e4m3fn) for x in _inputs(5))
    dq = np.array([[0.5, 2.0]], np.float32)
    dk = np.array([[1.25, 0.75]], np.float32)
    r = ms.reference_attention(q, k, v, q_descale=dq, k_descale=dk,
                               v_descale=np.ones((1, H), np.float32), return_lse=True)
    qd = q.astype(np.float64) * dq[0][None, :, None, None]
    kd = k.astype(np.float64) * dk[0][None, :, None, None]
    _check(r, _mp_lse(qd, kd, lambda h, i, j: True, _zero))


def test_softcap_lse_is_refused_in_one_line() -> None:
    q, k, v = _inputs(6)
    with pytest.raises(SpecError, match="softcap or a bias that is not an exact double"):
        ms.reference_attention(q, k, v, softcap=5.0, return_lse=True)


def test_compare_judges_the_lse_of_the_variant_call() -> None:
    """The LSE of the windowed call passes; the LSE without the window (what a
    comparison that ignored the variant would take for right) fails."""
    q, k, v = _inputs(7)
    r = ms.reference_attention(q, k, v, window=(1, 1), return_lse=True)
    out, lse = r.rounded("float32"), r.lse.rounded("float32")
    c = compare_attention(out, q, k, v, window=(1, 1), lse=lse)
    assert c.passed, c.report()
    plain_lse = ms.reference_attention(q, k, v, return_lse=True).lse.rounded("float32")
    c = compare_attention(out, q, k, v, window=(1, 1), lse=plain_lse)
    assert not c.passed and not c.lse.passed


def test_flex_attention_return_lse_with_a_mask_mod_and_sinks_written_in_torch() -> None:
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))

    def band(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (qi - ki).abs() <= 5

    bm = flex.create_block_mask(band, None, None, 40, 40, device="cpu")
    out, lse = flex.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    c = compare_attention(out, q, k, v, mask_mod=band, lse=lse)
    assert c.passed, c.report()
    # gpt-oss sinks in plain torch: the sink's logit in the denominator (and the LSE)
    sinks = torch.tensor([0.5, -1.0, 2.0])
    s = (q @ k.transpose(-1, -2)) / 4.0
    s = torch.cat([s, sinks.view(1, 3, 1, 1).expand(2, 3, 40, 1)], dim=-1)
    lse_t = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1)[..., :-1] @ v
    c = compare_attention(o, q, k, v, sinks=sinks, lse=lse_t)
    assert c.passed, c.report()
    c = compare_attention(o, q, k, v, sinks=sinks,
                          lse=torch.logsumexp(s[..., :-1], dim=-1))   # the sink forgotten
    assert not c.lse.passed
