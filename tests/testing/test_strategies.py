"""The hypothesis strategy of adversarial attention inputs
(mha_symbolic/testing/strategies.py, public as mha_symbolic.strategies).

Each family's defining property is checked by hand on the drawn arrays; the
zero-false-alarm property runs the independent numpy kernels of tests/kernels/bugs_catalog.py
on drawn cases and judges them with compare_attention.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from mha_symbolic import compare_attention
from mha_symbolic.errors import SpecError
from mha_symbolic.strategies import FAMILIES, AttentionCase, attention_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
import bugs_catalog as bc

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def test_import_mha_symbolic_does_not_import_hypothesis() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, "-c", "import json, sys, mha_symbolic, mha_symbolic.testing\n"
         "print(json.dumps('hypothesis' in sys.modules))"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) is False


def test_public_path_and_lazy_attribute_give_the_same_strategy() -> None:
    import mha_symbolic
    from mha_symbolic.testing import strategies

    assert mha_symbolic.attention_inputs is strategies.attention_inputs


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_arrays_have_the_requested_dtype_and_are_finite(dtype: str) -> None:
    @FAST
    @given(attention_inputs(dtype=dtype, max_keys=300))
    def check(case: AttentionCase) -> None:
        for a in (case.query, case.key, case.value):
            assert str(a.dtype) == dtype
            assert np.all(np.isfinite(a.astype(np.float64)))
        _, Hq, _, E = case.query.shape
        assert case.key.shape[-1] == E and case.value.shape[-2] == case.key.shape[-2]
        assert Hq % case.key.shape[-3] == 0

    check()


def _family(name: str, **kw: object) -> object:
    return attention_inputs(dtype="float32", families=[name], **kw)  # type: ignore[arg-type]


def test_fully_masked_family_has_a_row_without_keys() -> None:
    @FAST
    @given(_family("fully_masked"))
    def check(case: AttentionCase) -> None:
        m = case.attn_mask
        assert m is not None and m.dtype == np.bool_
        assert np.any(~np.any(m, axis=-1))

    check()


def test_causal_rect_family_is_causal_with_l_not_s() -> None:
    @FAST
    @given(_family("causal_rect"))
    def check(case: AttentionCase) -> None:
        assert case.is_causal and case.query.shape[-2] != case.key.shape[-2]

    check()


def test_gqa_family_groups_query_heads() -> None:
    @FAST
    @given(_family("gqa"))
    def check(case: AttentionCase) -> None:
        hq, hk = case.query.shape[-3], case.key.shape[-3]
        assert case.enable_gqa and hq // hk in (2, 3) and hq % hk == 0

    check()


def test_long_rows_family_has_thousands_of_keys_for_few_queries() -> None:
    @settings(max_examples=5, deadline=None)
    @given(_family("long_rows", max_keys=3000))
    def check(case: AttentionCase) -> None:
        assert case.query.shape[-2] <= 4 and 256 <= case.key.shape[-2] <= 3000

    check()


def test_near_ties_family_has_keys_equal_within_a_few_ulps() -> None:
    @FAST
    @given(_family("near_ties"))
    def check(case: AttentionCase) -> None:
        k = case.key.astype(np.float64)
        spread = np.max(k, axis=-2) - np.min(k, axis=-2)          # per (batch, head, e)
        scale = np.max(np.abs(k), axis=-2) + 1e-30
        assert np.all(spread <= 2.0**-24 * 16 * (1.0 + scale))    # a few float32 ulps of 1

    check()


def test_subnormal_family_has_values_near_the_underflow_threshold() -> None:
    @FAST
    @given(attention_inputs(dtype="float16", families=["subnormal"]))
    def check(case: AttentionCase) -> None:
        v = np.abs(case.value.astype(np.float64))
        assert np.max(v) <= 2.0**-14 * 32                        # float16's smallest normal

    check()


def test_bottom_right_sdpa_kwargs_carry_the_causal_mask() -> None:
    q, k, v = (np.zeros((1, 1, n, 2), np.float32) for n in (2, 5, 5))
    case = AttentionCase(q, k, v, is_causal=True, causal_alignment="bottom_right")
    kw = case.sdpa_kwargs
    assert kw["is_causal"] is False
    # query i sees keys j <= i + S − L = i + 3
    assert kw["attn_mask"].tolist() == [[True, True, True, True, False],
                                        [True, True, True, True, True]]
    assert case.options["causal_alignment"] == "bottom_right"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"families": ["random", "nope"]}, "'nope' is not a family"),
    ({"families": []}, "families=\\(\\) is empty"),
    ({"max_len": 0}, "max_len=0 must be an integer >= 1"),
    ({"causal_alignment": "left"}, "causal_alignment='left'"),
    ({"dtype": "int8"}, "dtype='int8' is not a supported float format"),
])
def test_bad_arguments_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        attention_inputs(**kwargs)  # type: ignore[arg-type]


def test_every_family_is_reachable() -> None:
    seen: set[str] = set()

    # derandomized and 400 examples: random runs of 150 missed a family now and then
    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(attention_inputs(dtype="float32", max_keys=300))
    def check(case: AttentionCase) -> None:
        seen.add(case.family)

    check()
    assert seen == set(FAMILIES)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_correct_kernels_pass_on_adversarial_inputs(dtype: str) -> None:
    # the numpy kernels of bugs_catalog (independent of the library): no false alarm
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(attention_inputs(dtype=dtype, max_keys=600, max_dim=32))
    def check(case: AttentionCase) -> None:
        c = bc.Case(dtype, case.query, case.key, case.value, attn_mask=case.attn_mask,
                    is_causal=case.is_causal, scale=case.scale, enable_gqa=case.enable_gqa,
                    causal_alignment=case.causal_alignment)
        for variant in ("numpy_fused", "numpy_fused_online"):
            out = bc.numpy_attention(c, variant=variant)
            r = compare_attention(out, case.query, case.key, case.value, **case.options,
                                  diagnose_bugs=False)
            assert r.passed, (case, variant, r.report())

    check()


def test_tile_edges_family_draws_edge_lengths_and_stride_zero_kv() -> None:
    @FAST
    @given(_family("tile_edges", max_batch=3))
    def check(case: AttentionCase) -> None:
        S = case.key.shape[-2]
        assert any(S - t in (-1, 0, 1) for t in (16, 32, 64, 128, 256, 512))
        if case.key.shape[0] > 1:
            assert case.key.strides[0] == 0 and case.value.strides[0] == 0

    check()


def test_tile_edges_family_catches_a_kernel_wrong_only_at_one_past_a_tile() -> None:
    """pytorch#191937's shape: a kernel correct except when kv_len ≡ 1 mod 32 with
    expanded (stride-0) K/V, where it drops the last key; the family draws such calls,
    torch sees them expanded, and the oracle fails them."""
    torch = pytest.importorskip("torch")
    import mha_symbolic as ms

    failures, hits = [], []

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(_family("tile_edges", max_batch=2, max_keys=128))
    def check(case: AttentionCase) -> None:
        q, k, v, kw = case.torch()
        S = k.shape[-2]
        if S % 32 == 1 and k.stride(0) == 0:
            hits.append(S)
            k, v = k[..., :-1, :], v[..., :-1, :]
            if kw["attn_mask"] is not None:
                kw["attn_mask"] = kw["attn_mask"][..., :-1]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
        c = ms.compare_attention(out, *case.torch()[:3], **case.options)
        if not c.passed:
            failures.append(S)

    check()
    assert hits, "the family drew no stride-0 call with kv_len ≡ 1 mod 32"
    assert failures and all(s % 32 == 1 for s in failures)
    assert len(failures) == len(hits)
