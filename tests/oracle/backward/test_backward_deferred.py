"""Tier 1 of a plain backward call deferred (issue 29 item 4): rounding to float64 runs
no tier 1, anything else that reads the bounds runs it first, and every rounding and
bound equals the eager path's bit for bit (the same call with tier 1 at construction)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mha_symbolic import reference_attention_backward
from mha_symbolic.oracle.backward import attention

Arr = np.ndarray[Any, Any]
rng = np.random.default_rng(291)


def _draw(*shape: int, f32: bool = True) -> Arr:
    x = rng.standard_normal(shape)
    return x.astype(np.float32) if f32 else x


_MASK = rng.random((6, 7)) < 0.6
_MASK[2] = False                                  # a row with no key
_KEEP = rng.random((1, 2, 6, 7)) < 0.8

CASES: dict[str, tuple[tuple[Arr, ...], dict[str, Any]]] = {
    "plain": ((_draw(1, 2, 6, 8), _draw(1, 2, 7, 8), _draw(1, 2, 7, 4), _draw(1, 2, 6, 4)), {}),
    "float64 causal": ((_draw(2, 6, 8, f32=False), _draw(2, 7, 8, f32=False),
                        _draw(2, 7, 8, f32=False), _draw(2, 6, 8, f32=False)),
                       {"is_causal": True, "causal_alignment": "bottom_right"}),
    "gqa": ((_draw(1, 4, 6, 8), _draw(1, 2, 7, 8), _draw(1, 2, 7, 8), _draw(1, 4, 6, 8)),
            {"enable_gqa": True}),
    "mask, nan rows": ((_draw(1, 2, 6, 8), _draw(1, 2, 7, 8), _draw(1, 2, 7, 8),
                        _draw(1, 2, 6, 8)), {"attn_mask": _MASK, "masked_rows": "nan"}),
    "uniform rows": ((_draw(1, 2, 6, 8), _draw(1, 2, 7, 8), _draw(1, 2, 7, 8),
                      _draw(1, 2, 6, 8)), {"attn_mask": _MASK, "masked_rows": "uniform"}),
    "dropout": ((_draw(1, 2, 6, 8), _draw(1, 2, 7, 8), _draw(1, 2, 7, 8), _draw(1, 2, 6, 8)),
                {"dropout_p": 0.25, "dropout_mask": _KEEP}),
    "broadcast key": ((_draw(2, 2, 6, 8), _draw(1, 2, 7, 8), _draw(2, 2, 7, 8),
                       _draw(2, 2, 6, 8)), {}),
}


def _bits(x: Arr) -> tuple[Arr, Arr]:
    x = np.asarray(x, dtype=np.float64)
    return np.isnan(x), np.where(np.isnan(x), 0.0, x).view(np.int64)


def _results(g: Any, order: tuple[str, ...]) -> list[tuple[Arr, Arr]]:
    out = []
    for enc in g:
        out += [_bits(enc.rounded(f)) for f in order]
        out += [_bits(enc.lower), _bits(enc.upper), _bits(enc.midpoint)]
    return out


@pytest.mark.parametrize("order", [("float64", "float32", "bfloat16"),
                                   ("bfloat16", "float64")], ids=["float64 first", "last"])
@pytest.mark.parametrize("name", list(CASES))
def test_deferred_tier1_equals_the_eager_path(monkeypatch: Any, name: str,
                                             order: tuple[str, ...]) -> None:
    args, kw = CASES[name]
    deferred = reference_attention_backward(*args, **kw)
    assert deferred.dq._deferred is not None
    got = _results(deferred, order)
    monkeypatch.setattr(attention, "_deferred_gradients", lambda st, progress: None)
    eager = reference_attention_backward(*args, **kw)
    assert eager.dq._deferred is None
    want = _results(eager, order)
    for (n1, b1), (n2, b2) in zip(got, want, strict=True):
        assert np.array_equal(n1, n2) and np.array_equal(b1, b2)


def test_float64_rounding_runs_no_tier1_and_the_bounds_run_it(monkeypatch: Any) -> None:
    calls: list[int] = []
    real = attention.tier1_backward

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(attention, "tier1_backward", counted)
    args, kw = CASES["gqa"]
    g = reference_attention_backward(*args, **kw)
    r64 = [enc.rounded("float64") for enc in g]
    assert calls == []
    # the float64 roundings agree with torch's float64 autograd to within an ulp or two
    torch = pytest.importorskip("torch")
    t = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in args[:3]]
    out = torch.nn.functional.scaled_dot_product_attention(*t, enable_gqa=True)
    ref = torch.autograd.grad(out, t, torch.tensor(np.asarray(args[3], dtype=np.float64)))
    for a, b in zip(r64, ref, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-13, atol=1e-15)
    lower = g.dk.lower                      # tier 1 now runs, for the whole call
    assert len(calls) == 4                  # once per problem: the 4 query heads
    assert np.all(lower <= r64[1]) and np.all(g.dk.upper >= r64[1])
    assert g.dq._deferred is None and g.dv._deferred is None
    g.dv.rounded("float32")
    assert len(calls) == 4


def test_variant_and_mask_gradient_calls_stay_eager() -> None:
    args, _ = CASES["plain"]
    g = reference_attention_backward(*args, attn_mask=rng.standard_normal((6, 7)))
    assert g.dq._deferred is None
    g = reference_attention_backward(*args, window=(2, 1))
    assert getattr(g.dq, "_deferred", None) is None


def test_a_copy_of_a_deferred_gradient_gets_real_bounds() -> None:
    import copy

    args, kw = CASES["plain"]
    g = reference_attention_backward(*args, **kw)
    c = copy.copy(g.dk)
    want = g.dk.lower                       # runs tier 1 for the call's own Enclosures
    assert c._deferred is not None          # the copy is not one of them
    np.testing.assert_array_equal(c.lower, want)
    assert np.all(np.isfinite(c.upper))
