"""layout="bhsd" | "bshd" on every door, and the diagnosis of a layout read as the other.

Expected values: a float64 softmax written here (einsum over the bshd axes directly,
never through the library's transposition), and torch's SDPA."""

from __future__ import annotations

import numpy as np
import pytest

import mha_symbolic as ms
from mha_symbolic.errors import ShapeError, SpecError
from mha_symbolic.testing import compare_attention


def _bshd_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Attention written on (B, S, H, D) axes, in float64 (independent of the library)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("blhe,bshe->bhls", q, k) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhls,bshe->blhe", w, v)


def _inputs(B: int = 2, L: int = 7, H: int = 4, D: int = 16, seed: int = 0
            ) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, L, H, D)).astype(np.float32) for _ in range(3))


def test_reference_in_bshd_is_the_attention_of_the_bshd_axes() -> None:
    q, k, v = _inputs()
    r = ms.reference_attention(q, k, v, layout="bshd")
    assert r.shape == (2, 7, 4, 16)
    want = _bshd_attention(q, k, v)
    assert np.all(r.lower <= want + 1e-12) and np.all(want - 1e-12 <= r.upper)
    assert np.max(np.abs(r.rounded("float64") - want)) < 1e-13
    # exact() at a bshd index is the bhsd element moved
    base = ms.reference_attention(*(np.swapaxes(x, 1, 2) for x in (q, k, v)))
    assert r.exact((1, 5, 2, 3)).mid() == base.exact((1, 2, 5, 3)).mid()


def test_a_bad_layout_is_one_clear_error() -> None:
    q, k, v = _inputs()
    with pytest.raises(SpecError, match="layout='bsdh' is not a layout"):
        ms.reference_attention(q, k, v, layout="bsdh")
    with pytest.raises(SpecError, match="layout="):
        compare_attention(q, q, k, v, layout="BSHD")
    with pytest.raises(ShapeError, match="at least 3 dimensions"):
        ms.reference_attention(q[0, 0], k[0, 0], v[0, 0], layout="bshd")


def test_correct_bshd_output_passes_and_reports_in_bshd() -> None:
    q, k, v = _inputs()
    out = _bshd_attention(q, k, v).astype(np.float32)
    c = compare_attention(out, q, k, v, layout="bshd")
    assert c.passed, c.report()
    assert c.shape == (2, 7, 4, 16) and c.index_names == ("batch", "query", "head", "feature")
    bad = out.copy()
    bad[1, 6, 2, 0] += 0.5            # one element wrong: its bshd index is reported
    c = compare_attention(bad, q, k, v, layout="bshd")
    assert not c.passed and c.worst is not None and c.worst.index == (1, 6, 2, 0)
    assert c.mismatched.shape == bad.shape and c.mismatched[1, 6, 2, 0]
    assert int(c.mismatched.sum()) == 1
    assert "(batch=1, query=6, head=2, feature=0)" in c.report()
    assert not any(d.bug == "layout" for d in c.diagnoses)


def test_torch_sdpa_output_in_bshd_read_as_bhsd_is_diagnosed() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 7, 4, 16) for _ in range(3))          # (B, S, H, D)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2)).transpose(1, 2)
    assert compare_attention(out, q, k, v, layout="bshd").passed
    c = compare_attention(out, q, k, v)                             # read as bhsd
    assert not c.passed and c.n_mismatched > 0.9 * c.n_elements
    assert [d.bug for d in c.diagnoses][:1] == ["layout"]
    assert "layout (B, S, H, D) read as (B, H, S, D)" in c.report()
    assert c.report().startswith("FAIL [layout")
    with pytest.raises(ms.AttentionMismatchError, match=r"read as \(B, H, S, D\)"):
        ms.assert_attention_close(out, q, k, v)
    # without the diagnosis: no claim about the layout
    c = compare_attention(out, q, k, v, diagnose_bugs=False)
    assert not c.passed and not c.diagnoses


def test_bhsd_arrays_given_as_bshd_are_diagnosed_the_other_way() -> None:
    q, k, v = (np.swapaxes(x, 1, 2) for x in _inputs(L=6, H=6))     # bhsd, H = L
    out = np.swapaxes(_bshd_attention(*(np.swapaxes(x, 1, 2) for x in (q, k, v))),
                      1, 2).astype(np.float32)
    assert compare_attention(out, q, k, v).passed
    c = compare_attention(out, q, k, v, layout="bshd")
    assert not c.passed
    assert "layout (B, H, S, D) read as (B, S, H, D)" in c.diagnoses[0].description


def test_an_output_returned_in_the_other_layout_is_diagnosed() -> None:
    q, k, v = (np.swapaxes(x, 1, 2) for x in _inputs(L=5, H=5))     # bhsd inputs
    good = np.swapaxes(_bshd_attention(*(np.swapaxes(x, 1, 2) for x in (q, k, v))), 1, 2)
    out = np.ascontiguousarray(np.swapaxes(good, 1, 2)).astype(np.float32)  # bshd output
    c = compare_attention(out, q, k, v)
    assert not c.passed and c.diagnoses and c.diagnoses[0].bug == "layout"
    assert "the output is in (B, S, H, D)" in c.diagnoses[0].description


def test_a_wrong_output_gets_no_layout_diagnosis() -> None:
    q, k, v = _inputs(L=5, H=5)
    out = (_bshd_attention(q, k, v) * 1.01).astype(np.float32)
    for layout in ("bhsd", "bshd"):
        c = compare_attention(out, q, k, v, layout=layout)
        assert not c.passed and not any(d.bug == "layout" for d in c.diagnoses)


def test_a_shape_error_says_when_the_other_layout_fits() -> None:
    q, k, v = _inputs(L=7, H=4)
    with pytest.raises(ShapeError, match="agree read as \\(B, S, H, D\\): pass layout='bshd'"):
        compare_attention(q[:, :5], q[:, :5], k, v)                  # L=5, S=7 in bshd
    with pytest.raises(ShapeError) as e:
        compare_attention(q[:, :5], q[:, :5, :3], k, v)              # no layout fits
    assert "layout" not in str(e.value)


def test_check_attention_runs_a_bshd_kernel_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def flash_like(q, k, v, **kw):  # type: ignore[no-untyped-def]
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), **kw).transpose(1, 2)

    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 6, 3, 8, dtype=torch.float64) for _ in range(3))
    res = ms.check_attention(flash_like, q, k, v, is_causal=True, layout="bshd")
    assert res.passed and res.backward is not None and res.backward.passed
    assert res.output.index_names == ("batch", "query", "head", "feature")

    def no_causal(q, k, v, **kw):  # type: ignore[no-untyped-def]
        return flash_like(q, k, v)

    res = ms.check_attention(no_causal, q, k, v, is_causal=True, layout="bshd",
                             raise_on_failure=False)
    assert not res.passed


def test_strategies_draw_bshd_cases_that_torch_sdpa_passes() -> None:
    pytest.importorskip("hypothesis")
    torch = pytest.importorskip("torch")
    from hypothesis import HealthCheck, given, settings

    from mha_symbolic.strategies import attention_inputs

    F = torch.nn.functional

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(attention_inputs(dtype="float32", max_keys=300, max_dim=16, layout="bshd",
                            families=("random", "causal_rect", "gqa")))
    def check(case):  # type: ignore[no-untyped-def]
        assert case.layout == "bshd" and case.options["layout"] == "bshd"
        q, k, v, kw = case.torch()
        assert q.shape[-2] % k.shape[-2] == 0 and k.shape[-3] == v.shape[-3]  # (B, L, H, E)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), **kw).transpose(1, 2)
        r = compare_attention(out, case.query, case.key, case.value, **case.options,
                              diagnose_bugs=False)
        assert r.passed, (case, r.report())

    check()
