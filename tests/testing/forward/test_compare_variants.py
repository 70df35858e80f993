"""Tests of compare/assert with the attention variants (mha_symbolic.testing.forward.compare
with variant options, compare_variants, bugs_variants, tolerance_variants).

Correct kernels are real implementations (torch SDPA with an explicit window or ALiBi
mask, FlexAttention on CPU, jax.nn.dot_product_attention's local window) or the
independent torch implementations of tests/kernels/variant_kernels.py (written from the
sources' conventions, importing nothing from mha_symbolic); mutants come from the
same file, one per bug class.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from mha_symbolic.errors import AttentionMismatchError, SpecError
from mha_symbolic.oracle.variants.score_mods import (
    alibi_score_mod,
    relative_bias_score_mod,
    softcap_score_mod,
)
from mha_symbolic.testing.forward.compare import assert_attention_close, compare_attention
from mha_symbolic.testing.forward.variants import (
    assert_attention_varlen_close,
    compare_attention_varlen,
)

torch = pytest.importorskip("torch")
import variant_kernels as vk  # noqa: E402  (tests/ is on sys.path under pytest)

DTYPES = ("float32", "float16", "bfloat16")


def _qkv(B: int, H: int, L: int, S: int, E: int, dtype: str, seed: int = 0,
         hk: int | None = None) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, H, L, E, generator=g).to(dt)
    k = torch.randn(B, hk or H, S, E, generator=g).to(dt)
    v = torch.randn(B, hk or H, S, E, generator=g).to(dt)
    return q, k, v


# ---------------------------------------------------------------------------
# No false alarms on real implementations
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_sdpa_with_an_explicit_window_mask_passes(dtype: str) -> None:
    q, k, v = _qkv(2, 2, 24, 40, 16, dtype, seed=1)
    keep = vk.window_mask(24, 40, (5, 2), causal=True, align="bottom_right")
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    comp = compare_attention(out, q, k, v, window=(5, 2), is_causal=True,
                             causal_alignment="bottom_right")
    assert comp.passed, comp.report()


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_sdpa_with_an_alibi_float_mask_passes(dtype: str) -> None:
    q, k, v = _qkv(1, 4, 20, 20, 16, dtype, seed=2)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])
    bias = vk.alibi_bias(slopes, 20, 20).to(getattr(torch, dtype))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    comp = compare_attention(out, q, k, v, alibi_slopes=slopes)
    assert comp.passed, comp.report()


@pytest.mark.parametrize("dtype,which", [("float32", "softcap"), ("float16", "alibi"),
                                         ("bfloat16", "table")])
def test_flex_attention_on_cpu_with_mask_mod_and_certified_score_mods_passes(
        dtype: str, which: str) -> None:
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = _qkv(1, 2, 16, 16, 8, dtype, seed=3)

    def sliding(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (qi >= ki) & (qi - ki <= 4)

    mod = {"softcap": softcap_score_mod(2.0),
           "alibi": alibi_score_mod(torch.tensor([0.5, 0.25])),
           "table": relative_bias_score_mod(torch.tensor([[0.5, 0.0, -0.5],
                                                          [1.0, 0.25, 0.0]]))}[which]
    bm = fa.create_block_mask(sliding, None, None, 16, 16, device="cpu", BLOCK_SIZE=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fa.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    for mask in (sliding, bm):
        comp = compare_attention(out, q, k, v, mask_mod=mask, score_mod=mod)
        assert comp.passed, comp.report()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_jax_local_window_attention_passes(dtype: str) -> None:
    jax = pytest.importorskip("jax")
    import ml_dtypes

    rng = np.random.default_rng(4)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    q = rng.standard_normal((1, 12, 2, 8)).astype(dt)   # jax layout (B, L, H, E)
    k = rng.standard_normal((1, 12, 2, 8)).astype(dt)
    v = rng.standard_normal((1, 12, 2, 8)).astype(dt)
    out = np.asarray(jax.nn.dot_product_attention(q, k, v, local_window_size=(3, 1)))
    def t(a: np.ndarray) -> np.ndarray:   # (B, L, H, E) -> (B, H, L, E)
        return np.swapaxes(a, 1, 2)

    comp = compare_attention(t(out), t(q), t(k), t(v), window=(3, 1))
    assert comp.passed, comp.report()


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_and_sinks_implementations_pass(dtype: str) -> None:
    q, k, v = _qkv(2, 2, 12, 12, 16, dtype, seed=5)
    q = q * 4
    sinks = torch.tensor([0.5, -1.0])
    dt = getattr(torch, dtype)
    out = vk.reference_like(q, k, v, out_dtype=dt, softcap=3.0, sinks=sinks, causal=True,
                            window=(4, 0))
    comp = compare_attention(out, q, k, v, softcap=3.0, sinks=sinks, is_causal=True,
                             window=(4, 0))
    assert comp.passed, comp.report()


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_kernel_model_passes_a_flash_attention_3_style_kernel(fp8: str) -> None:
    q, k, v = _qkv(1, 2, 32, 32, 16, "float32", seed=6)
    dt = getattr(torch, fp8)
    q8, k8, v8 = q.to(dt), k.to(dt), v.to(dt)
    dq = torch.tensor([[0.5, 0.25]])
    dk = torch.tensor([[1.5, 0.75]])
    dv = torch.tensor([[2.0, 0.125]])
    out = vk.reference_like(q8, k8, v8, out_dtype=torch.bfloat16, descale=(dq, dk, dv),
                            p_dtype=torch.float8_e4m3fn, causal=True)
    comp = compare_attention(out, q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv,
                             is_causal=True, weights_dtype="float8_e4m3fn")
    assert comp.passed, comp.report()
    assert "FP8 kernel model" in comp.report()


def test_varlen_per_sequence_sdpa_passes() -> None:
    g = torch.Generator().manual_seed(7)
    cu = [0, 5, 5, 17, 24]
    q = torch.randn(24, 2, 8, generator=g)
    k = torch.randn(24, 2, 8, generator=g)
    v = torch.randn(24, 2, 8, generator=g)
    parts = []
    for b in range(4):
        sl = slice(cu[b], cu[b + 1])
        if cu[b + 1] == cu[b]:
            continue
        o = torch.nn.functional.scaled_dot_product_attention(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1),
            is_causal=True)
        parts.append(o.transpose(0, 1))
    out = torch.cat(parts)
    comp = compare_attention_varlen(out, q, k, v, torch.tensor(cu, dtype=torch.int32),
                                    torch.tensor(cu, dtype=torch.int32), 12, 12, is_causal=True)
    assert comp.passed, comp.report()


# ---------------------------------------------------------------------------
# Every mutant caught, with its diagnosis
# ---------------------------------------------------------------------------

def _config(bug: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {"L": 16, "S": 16, "align": "top_left"}
    if bug.startswith("window"):
        cfg.update(window=(3, 2), L=12, S=20, align="bottom_right")
    elif bug.startswith("softcap"):
        cfg.update(softcap=1.5, causal=True)
    elif bug.startswith("alibi"):
        cfg.update(alibi=torch.tensor([1.0, 0.25, 0.0625, 0.5]), L=10, S=16,
                   align="bottom_right")
    elif "sink" in bug:
        cfg.update(sinks=torch.tensor([1.5, 0.5, 2.0, 1.0]))
    elif "descale" in bug:
        cfg.update(descale=(torch.tensor([[0.5, 2.0, 0.75, 1.5]]),
                            torch.tensor([[3.0, 0.25, 1.25, 0.5]]),
                            torch.tensor([[0.375, 4.0, 2.5, 0.625]])))
    return cfg


@pytest.mark.parametrize("bug", vk.BUGS)
def test_every_variant_mutant_is_caught_and_diagnosed(bug: str) -> None:
    cfg = _config(bug)
    L, S, align = cfg.pop("L"), cfg.pop("S"), cfg.pop("align")
    q, k, v = _qkv(1, 4, L, S, 16, "float32", seed=8)
    q = q * 2
    out = vk.reference_like(q, k, v, out_dtype=torch.float32, align=align, bug=bug, **cfg)
    opts: dict[str, Any] = {"causal_alignment": align}
    if "window" in cfg:
        opts["window"] = cfg["window"]
    if "softcap" in cfg:
        opts["softcap"] = cfg["softcap"]
    if cfg.get("causal"):
        opts["is_causal"] = True
    if "alibi" in cfg:
        opts["alibi_slopes"] = cfg["alibi"]
    if "sinks" in cfg:
        opts["sinks"] = cfg["sinks"]
    if "descale" in cfg:
        opts.update(q_descale=cfg["descale"][0], k_descale=cfg["descale"][1],
                    v_descale=cfg["descale"][2])
    correct = vk.reference_like(q, k, v, out_dtype=torch.float32, align=align, **cfg)
    assert compare_attention(correct, q, k, v, **opts).passed
    comp = compare_attention(out, q, k, v, **opts)
    assert not comp.passed
    assert bug in [d.bug for d in comp.diagnoses], comp.report()


def test_varlen_leaks_are_caught_and_diagnosed() -> None:
    g = torch.Generator().manual_seed(9)
    cu = [0, 6, 14, 20]
    q = torch.randn(20, 2, 8, generator=g) * 2
    k = torch.randn(20, 2, 8, generator=g)
    v = torch.randn(20, 2, 8, generator=g)
    whole = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
    comp = compare_attention_varlen(whole, q, k, v, cu, cu)
    assert not comp.passed
    assert "varlen_no_boundaries" in [d.bug for d in comp.diagnoses], comp.report()
    parts = []
    for b in range(3):
        end = cu[b + 1] + (1 if b < 2 else 0)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[cu[b]:cu[b + 1]].transpose(0, 1), k[cu[b]:end].transpose(0, 1),
            v[cu[b]:end].transpose(0, 1))
        parts.append(o.transpose(0, 1))
    comp = compare_attention_varlen(torch.cat(parts), q, k, v, cu, cu)
    assert not comp.passed
    assert "varlen_boundary_off_by_one" in [d.bug for d in comp.diagnoses], comp.report()
    with pytest.raises(AttentionMismatchError, match="varlen attention output"):
        assert_attention_varlen_close(whole, q, k, v, cu, cu)


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rule_flash_works_with_variants(dtype: str) -> None:
    q, k, v = _qkv(1, 2, 16, 16, 8, dtype, seed=13)
    dt = getattr(torch, dtype)
    out = vk.reference_like(q, k, v, out_dtype=dt, softcap=2.0, window=(3, 0), causal=True)
    opts = {"softcap": 2.0, "window": (3, 0), "is_causal": True, "rule": "flash"}
    comp = compare_attention(out, q, k, v, **opts)
    assert comp.passed, comp.report()
    assert "plain same-dtype" in comp.report()
    bad = vk.reference_like(q, k, v, out_dtype=dt, softcap=2.0, window=(3, 0), causal=True,
                            bug="softcap_before_scale")
    assert not compare_attention(bad, q, k, v, **opts).passed


def test_arbitrary_score_mod_is_refused_in_compare() -> None:
    q, k, v = _qkv(1, 1, 4, 4, 4, "float32")
    with pytest.raises(SpecError, match="cannot be certified"):
        assert_attention_close(q, q, k, v, score_mod=lambda s, b, h, i, j: s)


def test_fixture_passes_variant_options(attention_oracle: Any) -> None:
    q, k, v = _qkv(1, 2, 8, 8, 8, "float32", seed=10)
    keep = vk.window_mask(8, 8, (2, 0))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    attention_oracle.assert_close(out, q, k, v, window=(2, 0))


def test_fp8_inputs_without_descale_use_the_fp8_kernel_model() -> None:
    q, k, v = _qkv(1, 2, 16, 16, 8, "float32", seed=11)
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    out = vk.reference_like(q8, k8, v8, out_dtype=torch.bfloat16,
                            p_dtype=torch.float8_e4m3fn)
    comp = compare_attention(out, q8, k8, v8)
    assert comp.passed, comp.report()
    assert "accumulation: float32" in comp.report() and "FP8 kernel model" in comp.report()
    out8 = out.to(torch.float8_e4m3fn)        # an fp8 output is judged in its own format
    assert compare_attention(out8, q8, k8, v8).passed


def test_fixture_checks_packed_varlen_outputs(attention_oracle: Any) -> None:
    g = torch.Generator().manual_seed(12)
    cu = [0, 3, 7]
    q, k, v = (torch.randn(7, 2, 4, generator=g) for _ in range(3))
    parts = [torch.nn.functional.scaled_dot_product_attention(
        q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1)).transpose(0, 1)
        for a, b in ((0, 3), (3, 7))]
    attention_oracle.assert_varlen_close(torch.cat(parts), q, k, v, cu, cu)
    with pytest.raises(AttentionMismatchError):
        attention_oracle.assert_varlen_close(torch.cat(parts).flip(0), q, k, v, cu, cu)
