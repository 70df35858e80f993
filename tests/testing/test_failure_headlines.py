"""The first line of every failure leads with the verdict and the bug class, short
enough for pytest's short summary; ulps are not counted below the smallest normal."""

from __future__ import annotations

import numpy as np
import pytest

from mha_symbolic import compare_attention
from mha_symbolic.errors import AttentionMismatchError
from mha_symbolic.testing.report import HEADLINE_WIDTH, headline

Q = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], np.float32)
V = np.array([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], np.float32)


def test_a_long_headline_is_cut_to_the_width() -> None:
    line = headline(["a_very_long_bug_class_name", "another_one"], "attention gradients",
                    "dq 12 / 12, dk 12 / 12, dv 12 / 12 off")
    assert len(line) == HEADLINE_WIDTH and line.endswith("…") and line.startswith("FAIL [a_very")


def test_an_error_at_an_exact_zero_is_not_counted_in_ulps() -> None:
    # exact outputs 0 (V = 0): ulp(0) is 2^-149 in float32, and 4e-8 read as 2.7e37 ulp
    out = np.full((1, 3, 2), 4e-8, np.float32)
    comp = compare_attention(out, Q, Q, np.zeros_like(V))
    text = comp.report()
    assert "Greatest error in ulps: not counted (the exact value is below the smallest normal)" in text
    assert "e+37 ulp" not in text and "e+36 ulp" not in text
    assert comp.worst is not None and np.isnan(comp.worst.error_ulps)


def test_ulps_are_still_counted_at_normal_exact_values() -> None:
    out = np.asarray(V.mean(axis=1, keepdims=True).repeat(3, axis=1) + 1e-3, np.float32)
    comp = compare_attention(out, np.zeros_like(Q), np.zeros_like(Q), V)
    # the exact outputs are 3 (ulp 2^-22) and 4 (ulp 2^-21): the greatest count is at 3
    assert comp.max_ulps == pytest.approx(1e-3 / 2.0 ** -22, rel=0.01)


def test_the_backward_report_leads_with_its_headline() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra (mha-symbolic[torch])")
    from mha_symbolic import check_attention

    q, k, v = (torch.tensor(a, dtype=torch.float32) for a in (Q, Q, V))

    def kernel(q: object, k: object, v: object, **_: object) -> object:
        import torch.nn.functional as F

        return F.scaled_dot_product_attention(q, k, v, scale=1.0)  # the classic no_scale bug

    with pytest.raises(AttentionMismatchError) as info:
        check_attention(kernel, q, k, v)
    first = str(info.value).splitlines()[0]
    assert first.startswith("FAIL [") and "torch kernel: output" in first
    assert len(first) <= HEADLINE_WIDTH
