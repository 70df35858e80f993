"""compare_attention_backward at the float limits (issue 30 item 3, backward): values
and output gradients up to 2^1000 (the check in exact power-of-two units,
testing/backward/units.py) and queries of 1e100–1e300, where the top key of a row has
no finite bound that says anything.  Vacuity is per element: an element whose
tolerance is vacuous (or whose model bound is not finite) is not judged, and a
tolerance that admits an all-zero gradient makes only the certifiably non-zero
elements vacuous.  So a correct gradient is passed or refused (never failed, never
"please report", never a NaN or infinite tolerance), and a wrong gradient at a key
whose exact weight is e^(−1e100) fails: it was refused, hiding the bug.

Expected values are independent of the code under test: the one-hot weights of rows
whose score gaps are ~1e100 (P_ij = [j = argmax_j s_ij] to every float), so that
dV = Pᵀ dO by hand, and torch's float64/float32 autograd for the correct gradients."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import ToleranceError
from mha_symbolic.oracle.shifted import shift_of
from mha_symbolic.testing.backward.compare import _finite_part
from mha_symbolic.testing.backward.units import power_of_two_form

torch = pytest.importorskip("torch")

SHAPE = (1, 2, 6, 8)


def _inputs(qs: float, vs: float, dos: float, dtype: Any = np.float64, seed: int = 0
            ) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(SHAPE) * qs
    k = rng.standard_normal(SHAPE)
    v = rng.uniform(-1, 1, SHAPE) * vs
    do = rng.uniform(-1, 1, SHAPE) * dos
    return [a.astype(dtype) for a in (q, k, v, do)]


def _mask(kind: str) -> dict[str, Any]:
    if kind == "causal":
        return {"is_causal": True}
    if kind == "bool":
        m = np.random.default_rng(1).random((SHAPE[-2], SHAPE[-2])) < 0.7
        m[:, 0] = True
        return {"attn_mask": m}
    return {}


def _torch_grads(x: list[np.ndarray], kw: dict[str, Any]) -> list[np.ndarray]:
    t = [torch.tensor(a, requires_grad=True) for a in x[:3]]
    am = kw.get("attn_mask")
    o = torch.nn.functional.scaled_dot_product_attention(
        *t, attn_mask=None if am is None else torch.tensor(am),
        is_causal=kw.get("is_causal", False))
    o.backward(torch.tensor(x[3]))
    return [a.grad.numpy() for a in t]


def _outcome(g: list[np.ndarray], x: list[np.ndarray], **kw: Any) -> str:
    """pass / fail / refused; a warning, a foreign exception, "please report" or a
    non-finite tolerance in the refusal fail the test."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = ms.compare_attention_backward(*g, *x, **kw)
    except ToleranceError as exc:
        msg = str(exc)
        assert "no verdict" in msg, msg
        assert "please report" not in msg and "tolerance is nan" not in msg, msg
        assert "tolerance is inf" not in msg and "float64 range" not in msg, msg
        return "refused"
    return "pass" if r.passed else "fail"


def _one_hot_dv(x: list[np.ndarray], kw: dict[str, Any]) -> np.ndarray:
    """dV = Pᵀ dO by hand with the one-hot weights of score gaps ~1e100."""
    q, k, _, do = (a.astype(np.float64) for a in x)
    s = np.einsum("...le,...se->...ls", q, k)
    allowed = np.ones(s.shape[-2:], bool)
    if kw.get("is_causal"):
        allowed = np.tril(allowed)
    if "attn_mask" in kw:
        allowed = kw["attn_mask"]
    s = np.where(allowed, s, -np.inf)
    p = (s == s.max(axis=-1, keepdims=True)).astype(np.float64)
    return np.einsum("...ls,...le->...se", p, do)


# ------------------------------------------------------------------------------------
# Values and output gradients up to 2^1000 (exact power-of-two units)

@pytest.mark.parametrize(("vs", "dos"), [(1e120, 1.0), (1e200, 1.0), (1e300, 1.0),
                                         (2.0 ** 1000, 1.0), (1.0, 1e200), (1.0, 1e300),
                                         (1.0, 2.0 ** 1000), (1e120, 1e120),
                                         (2.0 ** 1000, 2.0 ** -900), (1.0, 2.0 ** -900),
                                         (2.0 ** -600, 1.0)])
@pytest.mark.parametrize("mask", ["none", "causal", "bool"])
def test_correct_float64_gradients_at_huge_values_pass_decided(vs: float, dos: float,
                                                                mask: str) -> None:
    x, kw = _inputs(1.0, vs, dos), _mask(mask)
    g = _torch_grads(x, kw)
    assert _outcome(g, x, **kw) == "pass"
    bad = g[2].copy()
    bad[0, 0, 3, 0] += np.max(np.abs(x[3]))
    assert _outcome([g[0], g[1], bad], x, **kw) == "fail"


def test_correct_float32_gradients_at_huge_values_pass_decided() -> None:
    for vs, dos in ((1e30, 1.0), (1.0, 1e30)):
        x = _inputs(1.0, vs, dos, np.float32)
        g = _torch_grads(x, {})
        assert _outcome(g, x) == "pass"
        assert _outcome([g[0], g[1], g[2] * np.float32(1.5)], x) == "fail"


def test_power_of_two_units_are_exact_or_not_used() -> None:
    x = _inputs(1.0, 2.0 ** 1000, 1.0)
    g = _torch_grads(x, {})
    form = power_of_two_form(x[2], x[3], *g, None)
    assert form is not None
    v2, do2, dq2, dk2, dv2, dm2, _, floor = form
    a = shift_of(x[2])
    assert a > 0
    # exact: V·2^-a, dQ, dK·2^-a scale back to the inputs bit for bit; dO, dV unscaled
    for scaled, orig in ((v2, x[2]), (dq2, g[0]), (dk2, g[1])):
        assert np.array_equal(np.ldexp(scaled, a), orig)
    assert np.array_equal(do2, x[3]) and np.array_equal(dv2, g[2]) and dm2 is None
    assert floor == 1.0   # scaled down only: the model's underflow floor as it is
    # a subnormal bit that the scaling would lose: the check runs unscaled
    dk = g[1].copy()
    dk[0, 0, 0, 0] = 5e-324
    assert power_of_two_form(x[2], x[3], g[0], dk, g[2], None) is None


# ------------------------------------------------------------------------------------
# Queries of 1e100-1e300: per-element vacuity

def _planted(x: list[np.ndarray], g: list[np.ndarray], kw: dict[str, Any]
             ) -> list[tuple[int, list[np.ndarray]]]:
    """dV moved by max|dO| at each key that no row weights (exact dV there is 0 by hand)."""
    dv_hand = _one_hot_dv(x, kw)
    out = []
    for j in range(SHAPE[-2]):
        if np.any(dv_hand[0, 0, j] != 0):
            continue
        bad = g[2].copy()
        bad[0, 0, j, 0] += np.max(np.abs(x[3]))
        out.append((j, [g[0], g[1], bad]))
    return out


@pytest.mark.parametrize("qs", [1e100, 1e200, 1e300])
@pytest.mark.parametrize("mask", ["none", "causal", "bool"])
def test_a_wrong_dv_at_an_unweighted_key_fails_at_huge_queries(qs: float, mask: str) -> None:
    x, kw = _inputs(qs, 1.0, 1.0), _mask(mask)
    g = _torch_grads(x, kw)
    # torch's dV is the hand-made one-hot dV (float64 sums of one term)
    np.testing.assert_array_equal(g[2], _one_hot_dv(x, kw))
    assert _outcome(g, x, **kw) in ("pass", "refused")
    planted = _planted(x, g, kw)
    assert planted
    for _, bad in planted:
        assert _outcome(bad, x, **kw) == "fail"


def test_the_failing_report_counts_the_elements_it_did_not_judge() -> None:
    x = _inputs(1e100, 1.0, 1.0)
    g = _torch_grads(x, {})
    (_, bad), *_ = _planted(x, g, {})
    r = ms.compare_attention_backward(*bad, *x)
    assert not r.passed
    dv = r.gradients["dv"]
    assert dv.n_mismatched == 1 and 0 < dv.n_vacuous < dv.n_elements
    assert "Not judged" in r.report()


def test_a_missing_gradient_at_huge_queries_never_passes() -> None:
    x = _inputs(1e100, 1.0, 1.0)
    g = _torch_grads(x, {})
    assert _outcome([g[0], g[1], np.zeros_like(g[2])], x) in ("fail", "refused")


@pytest.mark.parametrize("qs", [1e100, 1e300])
def test_correct_gradients_at_huge_queries_and_values_are_never_failed(qs: float) -> None:
    for vs, dos in ((1e200, 1.0), (1.0, 1e200), (2.0 ** 1000, 2.0 ** -900)):
        x = _inputs(qs, vs, dos)
        with np.errstate(all="ignore"):
            g = _torch_grads(x, {})
        if not all(np.all(np.isfinite(a)) for a in g):
            continue
        assert _outcome(g, x) in ("pass", "refused")


def test_a_non_finite_model_bound_is_vacuous_only_where_it_is() -> None:
    b = np.array([[1e-16, np.inf], [np.nan, 2e-16]])
    finite, bad = _finite_part(b, "model")
    assert bad is not None
    np.testing.assert_array_equal(bad, [[False, True], [True, False]])
    np.testing.assert_array_equal(finite, [[1e-16, 0.0], [0.0, 2e-16]])
    assert _finite_part(np.array([1.0, 2.0]), "model")[1] is None
