"""The testing tool (mha_symbolic/testing/forward/compare.py): verdicts, reports, diagnoses.

Correct and buggy implementations come from tests/kernels/bugs_catalog.py, written in
plain numpy independently of the library; the exact answer comes from the oracle.
The full evaluation (thousands of cases) is bench/bench_verdicts.py; this file runs
a smaller but real sample of it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic import AttentionMismatchError, assert_attention_close, compare_attention
from mha_symbolic.errors import ShapeError, SpecError, ToleranceError
from mha_symbolic.testing.forward.mha import assert_mha_close, compare_mha

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
import bugs_catalog as bc

DTYPE_NAMES = ["float64", "float32", "float16", "bfloat16"]
LOW = ("float16", "bfloat16")


def _qkv(seed: int = 0, dtype: object = np.float32, shape_q: tuple[int, ...] = (1, 2, 5, 8),
         shape_kv: tuple[int, ...] = (1, 2, 7, 8)) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape_q).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype))


# ---------------------------------------------------------------------------------
# No false alarms


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_correct_numpy_implementations_pass_random_and_hard_cases(dtype: str) -> None:
    rng = np.random.default_rng(100 + DTYPE_NAMES.index(dtype))
    for i in range(24):
        kind = ("random", "long_rows", "large_range", "near_ties", "cancelling",
                "fully_masked_row")[i % 6]
        case = bc.random_case(rng, dtype, kind=kind, max_len=8, max_e=8)
        for variant in bc.CORRECT_SDPA:
            out = bc.numpy_attention(case, variant=variant)
            options = bc.KERNEL_OPTIONS[variant]
            try:
                result = compare_attention(out, case.q, case.k, case.v, **case.kwargs(),
                                           **options)
            except ToleranceError:
                # a kernel accumulating 16-bit sums may be wrong by the whole answer on
                # long rows or large scores: the tool refuses a verdict, never fails it
                assert options.get("accumulation_dtype") == "same" and dtype in LOW, variant
                continue
            assert result.passed, (variant, case.kind, result.report())


# ---------------------------------------------------------------------------------
# No false passes: every bug class, caught and named


def _designed_case(bug: str) -> bc.Case:
    """A float32 case on which ``bug`` changes the output far beyond rounding."""
    q, k, v = _qkv(1, np.float32, (1, 2, 5, 8), (1, 2, 7, 8))
    case = bc.Case("float32", q, k, v)
    if bug == "inverted_bool_mask":
        m = np.random.default_rng(2).random((5, 7)) < 0.5
        m[:, 0], m[:, 1] = True, False
        case.attn_mask = m
    elif bug.startswith("causal"):
        case.is_causal = True
    elif bug == "gqa_tile":
        case.q = _qkv(3, np.float32, (1, 4, 5, 8))[0]
        case.enable_gqa = True
    elif bug == "finite_mask_sentinel":     # matters where a row is fully masked
        m = np.ones((5, 7), dtype=bool)
        m[2] = False
        case.attn_mask = m
    return case


@pytest.mark.parametrize("bug", bc.SDPA_BUGS)
def test_every_bug_class_is_caught_and_diagnosed_in_float32(bug: str) -> None:
    case = _designed_case(bug)
    assert bc.bug_applies(bug, case)
    out = bc.numpy_attention(case, bug=bug)
    result = compare_attention(out, case.q, case.k, case.v, **case.kwargs())
    assert not result.passed
    assert bug in [d.bug for d in result.diagnoses], result.report()
    # the correct implementation of the same case passes
    good = bc.numpy_attention(case)
    assert compare_attention(good, case.q, case.k, case.v, **case.kwargs()).passed


@pytest.mark.parametrize("bug", ["no_scale", "softmax_over_query_axis", "swapped_key_value",
                                 "causal_excludes_diagonal", "inverted_bool_mask"])
def test_coarse_bugs_are_caught_in_bfloat16(bug: str) -> None:
    case = _designed_case(bug)
    for name in ("q", "k", "v"):
        setattr(case, name, getattr(case, name).astype(ml_dtypes.bfloat16))
    case.dtype = "bfloat16"
    out = bc.numpy_attention(case, bug=bug)
    result = compare_attention(out, case.q, case.k, case.v, **case.kwargs())
    assert not result.passed
    assert bug in [d.bug for d in result.diagnoses], result.report()


def test_random_sample_of_bugs_in_float32_is_caught_when_above_rounding() -> None:
    rng = np.random.default_rng(9)
    checked = 0
    for _ in range(12):
        case = bc.random_case(rng, "float32", max_len=8, max_e=8)
        exact = bc.numpy_attention(_as64(case)).astype(np.float64)
        for bug in bc.SDPA_BUGS:
            if not bc.bug_applies(bug, case):
                continue
            effect = np.max(np.abs(bc.numpy_attention(_as64(case), bug=bug) - exact), initial=0)
            if effect < 1e-3:          # not above float32 rounding by a wide margin
                continue
            out = bc.numpy_attention(case, bug=bug)
            result = compare_attention(out, case.q, case.k, case.v, **case.kwargs(),
                                       diagnose_bugs=False)
            assert not result.passed, (bug, effect)
            checked += 1
    assert checked > 30


def _as64(case: bc.Case) -> bc.Case:
    c = bc.Case("float64", *(x.astype(np.float64) for x in (case.q, case.k, case.v)),
                **case.kwargs())
    if c.attn_mask is not None and c.attn_mask.dtype != np.bool_:
        c.attn_mask = c.attn_mask.astype(np.float64)
    return c


# ---------------------------------------------------------------------------------
# Multi-head attention


def test_mha_correct_passes_and_each_mha_bug_is_named() -> None:
    rng = np.random.default_rng(21)
    case = bc.random_mha_case(rng, "float32")
    while case.num_heads < 2 or case.query.shape[1] < 2:
        case = bc.random_mha_case(rng, "float32")
    assert compare_mha(bc.numpy_mha(case), case.query, case.key, case.value,
                       **case.kwargs()).passed
    for bug in bc.MHA_BUGS:
        out = bc.numpy_mha(case, bug=bug)
        result = compare_mha(out, case.query, case.key, case.value, **case.kwargs())
        assert not result.passed, bug
        assert bug in [d.bug for d in result.diagnoses], result.report()
        with pytest.raises(AttentionMismatchError, match=bug):
            assert_mha_close(out, case.query, case.key, case.value, **case.kwargs())


# ---------------------------------------------------------------------------------
# The report


def test_report_shows_metadata_counts_worst_element_and_diagnosis() -> None:
    q, k, v = _qkv(4)
    good = bc.numpy_attention(bc.Case("float32", q, k, v))
    bad = good.copy()
    bad[0, 1, 3, 2] += np.float32(0.25)
    result = compare_attention(bad, q, k, v)
    text = result.report()
    lines = text.splitlines()
    # the first line leads with the verdict and the bug class (pytest's short summary
    # shows it, cut at the terminal's width); the second is the one-line summary
    assert lines[0] == "FAIL [no known bug] attention output: 1 / 80 off"
    lines = lines[1:]
    assert lines[0].startswith("attention output is not close to the exact answer: 1 / 80 "
                               "elements mismatched, worst ")
    assert lines[0].endswith(" × tolerance at (batch=0, head=1, query=3, feature=2): "
                             f"{float(bad[0, 1, 3, 2])!r} vs exact ≈ "
                             f"{float(good[0, 1, 3, 2]):.6g}")
    assert lines[0] == result.summary()
    assert lines[1] == "  shape: (1, 2, 5, 8), dtype: float32, accumulation: float32 (default)"
    assert "Mismatched elements: 1 / 80 (1.2%)" in text
    assert "index (batch=0, head=1, query=3, feature=2)" in text
    assert result.worst is not None and result.worst.index == (0, 1, 3, 2)
    # the exact value is shown as its certified enclosure, and contains the truth
    w = result.worst
    assert w.exact_lower <= float(good[0, 1, 3, 2]) + 1e-6
    assert abs(w.error - 0.25) < 1e-6
    assert w.error_ulps == pytest.approx(w.error / 2.0 ** (math.floor(math.log2(abs(
        w.exact_lower))) - 23), rel=1e-6)
    assert "Diagnosis: no known bug class matches." in text


def test_report_names_nan_first() -> None:
    q, k, v = _qkv(5)
    out = bc.numpy_attention(bc.Case("float32", q, k, v))
    out[0, 0, 1, 1] = np.nan
    out[0, 1, 0, 0] += 1
    text = compare_attention(out, q, k, v).report()
    nan_line = text.index("Non-finite: 1 element(s) are NaN/Inf where the exact value is "
                          "finite, first at (batch=0, head=0, query=1, feature=1)")
    assert nan_line < text.index("Mismatched elements: 2 / 80")


def test_fully_masked_rows_follow_the_policy() -> None:
    q, k, v = _qkv(6)
    mask = np.ones((5, 7), dtype=bool)
    mask[3] = False
    zero = bc.numpy_attention(bc.Case("float32", q, k, v, attn_mask=mask))
    assert np.all(zero[..., 3, :] == 0)
    assert compare_attention(zero, q, k, v, attn_mask=mask).passed
    nan_policy = compare_attention(zero, q, k, v, attn_mask=mask, masked_rows="nan")
    assert not nan_policy.passed
    assert nan_policy.n_missing_nan == 16
    with_nan = zero.copy()
    with_nan[..., 3, :] = np.nan
    assert compare_attention(with_nan, q, k, v, attn_mask=mask, masked_rows="nan").passed


def test_assert_raises_an_assertion_error_carrying_the_report() -> None:
    q, k, v = _qkv(7)
    with pytest.raises(AssertionError) as info:
        assert_attention_close(np.zeros((1, 2, 5, 8), np.float32), q, k, v)
    assert isinstance(info.value, AttentionMismatchError)
    assert "Mismatched elements:" in str(info.value)
    findings = info.value.comparison  # type: ignore[attr-defined]
    assert findings.n_mismatched == 80 and not findings.passed


# ---------------------------------------------------------------------------------
# The other rules


def test_ulp_rule_accepts_the_correctly_rounded_answer_and_not_one_ulp_off() -> None:
    from mha_symbolic import reference_attention

    q, k, v = _qkv(8)
    best = np.asarray(reference_attention(q, k, v).rounded("float32"))
    assert compare_attention(best, q, k, v, rule="ulp", ulps=0.5).passed
    off = best.copy()
    off[0, 0, 0, 0] = np.nextafter(off[0, 0, 0, 0], np.float32(np.inf))
    off[0, 0, 0, 0] = np.nextafter(off[0, 0, 0, 0], np.float32(np.inf))
    result = compare_attention(off, q, k, v, rule="ulp", ulps=1.0)
    assert not result.passed and result.n_mismatched == 1


def test_allclose_rule_uses_atol_plus_rtol_times_exact() -> None:
    q, k, v = _qkv(9, np.float64)
    good = bc.numpy_attention(bc.Case("float64", q, k, v))
    shifted = good + 1e-4
    assert compare_attention(shifted, q, k, v, rule="allclose", rtol=0, atol=2e-4).passed
    assert not compare_attention(shifted, q, k, v, rule="allclose", rtol=0, atol=5e-5).passed


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flash_rule_passes_a_plain_same_dtype_run_and_fails_a_bug(dtype: str) -> None:
    q, k, v = _qkv(10, bc.DTYPES[dtype])
    case = bc.Case(dtype, q, k, v)
    assert compare_attention(bc.numpy_attention(case), q, k, v, rule="flash").passed
    bad = bc.numpy_attention(case, bug="scale_1_over_d")
    assert not compare_attention(bad, q, k, v, rule="flash").passed


def test_accumulation_dtype_is_stated_in_the_report() -> None:
    q, k, v = _qkv(11, ml_dtypes.bfloat16)
    out = bc.numpy_attention(bc.Case("bfloat16", q, k, v))
    result = compare_attention(out, q, k, v, accumulation_dtype="float32")
    assert result.passed
    assert "dtype: bfloat16, accumulation: float32" in result.report()


# ---------------------------------------------------------------------------------
# Bad arguments: one clear line naming the argument


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rule": "fuzzy"}, "rule='fuzzy' is not a tolerance rule"),
    ({"rule": "allclose", "rtol": 1e-3}, "rule='allclose' needs both rtol and atol"),
    ({"ulps": 2}, "ulps=2 does not apply to rule='model'"),
    ({"rule": "ulp", "ulps": -1}, "ulps=-1 must be a finite number >= 0"),
    ({"accumulation_dtype": "int8"}, "accumulation_dtype='int8' is not a float format"),
])
def test_bad_options_raise_spec_error(kwargs: dict[str, object], message: str) -> None:
    q, k, v = _qkv(12)
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compare_attention(np.zeros((1, 2, 5, 8), np.float32), q, k, v, **kwargs)  # type: ignore[arg-type]


def test_wrong_actual_shape_names_both_shapes() -> None:
    q, k, v = _qkv(13)
    with pytest.raises(ShapeError, match=r"actual.shape=\(1, 2, 8, 5\) does not match the "
                                         r"attention output shape=\(1, 2, 5, 8\)"):
        compare_attention(np.zeros((1, 2, 8, 5), np.float32), q, k, v)


def test_integer_actual_is_refused() -> None:
    q, k, v = _qkv(14)
    with pytest.raises(SpecError, match=r"actual\.dtype=int"):
        compare_attention(np.zeros((1, 2, 5, 8), np.int32), q, k, v)


@pytest.mark.parametrize(("shape_q", "shape_kv"), [((1, 2, 0, 4), (1, 2, 3, 4)),
                                                   ((1, 2, 3, 4), (1, 2, 0, 4))])
def test_empty_lengths_are_judged_not_crashed(shape_q: tuple[int, ...],
                                              shape_kv: tuple[int, ...]) -> None:
    q = np.ones(shape_q, np.float32)
    k = v = np.ones(shape_kv, np.float32)
    out_shape = (*shape_q[:-1], shape_kv[-1])
    # no key at all: every row is fully masked, the output is 0 under masked_rows="zero"
    assert compare_attention(np.zeros(out_shape, np.float32), q, k, v).passed
    if np.prod(out_shape):
        assert not compare_attention(np.ones(out_shape, np.float32), q, k, v).passed


def test_float64_error_just_above_the_tolerance_is_caught() -> None:
    # the oracle's fast enclosure is far wider than a float64 tolerance; the verdict
    # must still see an error of a few tolerances (the enclosure gets refined)
    from mha_symbolic.testing.call import AttentionCall
    from mha_symbolic.testing.forward.plain import Plain
    from mha_symbolic.testing.tolerance import error_model

    q, k, v = _qkv(15, np.float64)
    good = bc.numpy_attention(bc.Case("float64", q, k, v))
    assert compare_attention(good, q, k, v).passed
    plain = Plain(AttentionCall(q, k, v))
    bound, _ = plain.bound(error_model("float64").with_events(*plain.events()))
    bad = good.copy()
    bad[0, 1, 2, 3] += 3 * bound[0, 1, 2, 3]
    verdict = compare_attention(bad, q, k, v, rule="certified")   # the model alone
    assert verdict.n_mismatched == 1 and verdict.worst is not None
    assert verdict.worst.index == (0, 1, 2, 3)
    assert 2.5 < verdict.worst.ratio < 3.5


# ---------------------------------------------------------------------------------
# No verdict on an internal inf/NaN, never a pass on a vacuous tolerance


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       scale: float) -> np.ndarray:
    """Independent float64 attention (broadcasting by numpy's matmul)."""
    s = scale * (q @ np.swapaxes(k, -1, -2))
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the oracle's float64 overflow
@pytest.mark.parametrize("options", [{}, {"rule": "allclose", "rtol": 0, "atol": 0},
                                     {"rule": "ulp", "ulps": 1e6}, {"rule": "flash"}])
def test_overflowing_scores_never_pass_garbage(options: dict[str, object]) -> None:
    # fp64 scores near 1e400 (beyond float64): the exact answer is one-hot on the largest
    # score (the values of that key), so zeros are wrong; the tool must fail them or
    # refuse a verdict (ToleranceError), never pass them
    rng = np.random.default_rng(30)
    q = 1e200 * rng.standard_normal((1, 1, 3, 4))
    k = 1e200 * rng.standard_normal((1, 1, 5, 4))
    v = 1.0 + rng.random((1, 1, 5, 2))                 # every value >= 1: zero is wrong
    try:
        r = compare_attention(np.zeros((1, 1, 3, 2)), q, k, v, **options)  # type: ignore[arg-type]
    except ToleranceError as exc:
        assert "no verdict" in str(exc)
    else:
        assert not r.passed


def test_an_infinite_enclosure_raises_tolerance_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_symbolic.testing.forward.compare as door  # where compare looks it up

    real = door.reference_attention

    class Broken:
        def __init__(self, ref: object) -> None:
            self.shape = ref.shape  # type: ignore[attr-defined]
            self.lower = np.full(self.shape, -np.inf)
            self.upper = np.full(self.shape, np.inf)

    monkeypatch.setattr(door, "reference_attention",
                        lambda *a, **kw: Broken(real(*a, **kw)))
    q, k, v = _qkv(31)
    with pytest.raises(ToleranceError, match=r"enclosure of the exact value is \[-inf, inf\]"):
        compare_attention(np.zeros((1, 2, 5, 8), np.float32), q, k, v, rule="allclose",
                          rtol=0, atol=0)


def test_a_nan_tolerance_raises_tolerance_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from mha_symbolic.testing.forward.plain import Plain

    real = Plain.bound
    monkeypatch.setattr(Plain, "bound", lambda self, m, progress=None: (
        np.full(self.shape, np.nan), real(self, m)[1]))
    q, k, v = _qkv(32)
    good = bc.numpy_attention(bc.Case("float32", q, k, v))
    with pytest.raises(ToleranceError, match="the tolerance is nan"):
        compare_attention(good, q, k, v)


def test_a_vacuous_model_refuses_to_pass_even_garbage() -> None:
    # bf16 accumulated in bf16 over 2048 keys, worst case: (1 − 2^-8)^-4096 − 1 ≈ e^16,
    # every weight may be off by any factor: whatever the output, no pass
    rng = np.random.default_rng(33)
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((1, 1, 2, 8)).astype(bf)
    k = rng.standard_normal((1, 1, 2048, 8)).astype(bf)
    v = rng.standard_normal((1, 1, 2048, 4)).astype(bf)
    opts = dict(accumulation_dtype="same", error_model="worst_case")
    good = bc.numpy_attention(bc.Case("bfloat16", q, k, v), variant="numpy_fused")
    for out in (good, np.zeros_like(good), (good.astype(np.float32) + 1).astype(bf)):
        with pytest.raises(ToleranceError, match="is vacuous"):
            compare_attention(out, q, k, v, **opts)
    # a non-finite output is still a decided failure
    bad = good.copy()
    bad[0, 0, 0, 0] = np.nan
    r = compare_attention(bad, q, k, v, **opts)
    assert not r.passed and r.n_nonfinite == 1 and r.n_vacuous == 7
    # the default model (float32 accumulation, probabilistic) judges the same output
    assert compare_attention(good, q, k, v).passed


def test_bfloat16_with_thousands_of_keys_catches_a_shifted_key() -> None:
    # the review's case: today's model is infinite there; a kernel attending to the
    # keys shifted by one must fail by default
    rng = np.random.default_rng(34)
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((1, 2, 4, 64)).astype(bf)
    k = rng.standard_normal((1, 2, 2048, 64)).astype(bf)
    v = rng.standard_normal((1, 2, 2048, 16)).astype(bf)
    good = bc.numpy_attention(bc.Case("bfloat16", q, k, v), variant="numpy_fused")
    shifted = bc.numpy_attention(bc.Case("bfloat16", q, np.roll(k, 1, axis=-2), v),
                                 variant="numpy_fused")
    assert compare_attention(good, q, k, v).passed
    assert not compare_attention(shifted, q, k, v).passed


# ---------------------------------------------------------------------------------
# Broadcasting exactly as torch SDPA


@pytest.mark.parametrize(("shape_q", "shape_kv"), [((3, 4), (2, 2, 5, 4)),
                                                   ((2, 3, 4), (2, 2, 5, 4)),
                                                   ((1, 1, 3, 4), (2, 2, 5, 4))])
def test_a_query_with_fewer_leading_dims_broadcasts(shape_q: tuple[int, ...],
                                                    shape_kv: tuple[int, ...]) -> None:
    rng = np.random.default_rng(35)
    q = rng.standard_normal(shape_q).astype(np.float32)
    k = rng.standard_normal(shape_kv).astype(np.float32)
    v = rng.standard_normal(shape_kv).astype(np.float32)
    exact = _softmax_attention(q.astype(np.float64), k.astype(np.float64),
                               v.astype(np.float64), 0.5)
    assert exact.shape == (2, 2, 3, 4)
    assert compare_attention(exact.astype(np.float32), q, k, v).passed
    wrong = exact.copy()
    wrong[1, 0, 2, 1] += 0.01
    r = compare_attention(wrong.astype(np.float32), q, k, v)
    assert not r.passed and r.n_mismatched == 1 and r.worst is not None
    assert r.worst.index == (1, 0, 2, 1)


def test_gqa_with_broadcast_batch_matches_repeat_interleave() -> None:
    rng = np.random.default_rng(36)
    q = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)     # batch broadcast, H_kv = 2
    v = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    kk, vv = (np.repeat(a.astype(np.float64), 2, axis=1) for a in (k, v))
    exact = _softmax_attention(q.astype(np.float64), kk, vv, 8**-0.5)
    assert compare_attention(exact.astype(np.float32), q, k, v, enable_gqa=True).passed
    tiled = _softmax_attention(q.astype(np.float64), np.tile(k.astype(np.float64), (1, 2, 1, 1)),
                               np.tile(v.astype(np.float64), (1, 2, 1, 1)), 8**-0.5)
    r = compare_attention(tiled.astype(np.float32), q, k, v, enable_gqa=True)
    assert not r.passed and "gqa_tile" in [d.bug for d in r.diagnoses]


# ---------------------------------------------------------------------------------
# rule="flash"


def test_flash_rule_is_never_tighter_than_the_model() -> None:
    # a float32 kernel accurate to the last bit of the simulated plain kernel (the case
    # behind 16/300 false alarms on torch MATH): the flash tolerance is floored at the
    # model, so every output the model passes, flash passes
    rng = np.random.default_rng(37)
    for _ in range(20):
        case = bc.random_case(rng, "float32", max_len=8, max_e=8)
        out = bc.numpy_attention(case, variant="numpy_fused")
        model = compare_attention(out, case.q, case.k, case.v, **case.kwargs())
        flash = compare_attention(out, case.q, case.k, case.v, **case.kwargs(), rule="flash")
        assert model.passed and flash.passed
        assert flash.worst is None or model.worst is None or \
            flash.worst.tolerance >= model.worst.tolerance * (1 - 1e-12) or \
            flash.worst.index != model.worst.index


def test_flash_rule_with_float16_scores_beyond_65504() -> None:
    rng = np.random.default_rng(38)
    q = (300 * rng.standard_normal((1, 1, 3, 4))).astype(np.float16)
    k = (300 * rng.standard_normal((1, 1, 5, 4))).astype(np.float16)
    v = rng.standard_normal((1, 1, 5, 4)).astype(np.float16)
    assert np.max(np.abs(q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))) \
        > 65504
    from mha_symbolic import reference_attention

    best = np.asarray(reference_attention(q, k, v).rounded("float16"))
    r = compare_attention(best, q, k, v, rule="flash")
    assert r.passed
    assert any("overflows" in n for n in r.notes)
    assert "Note: the simulated plain float16 kernel overflows" in r.report()
    assert not compare_attention(np.zeros_like(best), q, k, v, rule="flash").passed


# ---------------------------------------------------------------------------------
# Options passed through to the oracle


def test_dropout_p_zero_is_plain_attention() -> None:
    q, k, v = _qkv(39)
    good = bc.numpy_attention(bc.Case("float32", q, k, v))
    assert compare_attention(good, q, k, v, dropout_p=0.0).passed


def test_dropout_with_an_explicit_keep_mask() -> None:
    q, k, v = _qkv(40)
    keep = np.random.default_rng(41).random((1, 2, 5, 7)) < 0.7
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) / math.sqrt(8)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    exact = ((w * keep) / 0.75) @ v.astype(np.float64)          # ((softmax ∘ keep)/(1−p))·V
    opts = dict(dropout_p=0.25, dropout_mask=keep)
    assert compare_attention(exact.astype(np.float32), q, k, v, **opts).passed
    r = compare_attention((w @ v.astype(np.float64)).astype(np.float32), q, k, v, **opts)
    assert not r.passed


def test_uniform_policy_matches_jax_for_a_fully_masked_row() -> None:
    jax = pytest.importorskip("jax")
    q, k, v = _qkv(43)
    mask = np.ones((5, 7), dtype=bool)
    mask[2] = False
    out = np.asarray(jax.nn.dot_product_attention(
        np.swapaxes(q, 1, 2), np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2),
        mask=np.broadcast_to(mask, (1, 2, 5, 7))))
    out = np.swapaxes(out, 1, 2)
    assert np.allclose(out[:, :, 2], v.mean(axis=-2), atol=1e-6)    # the mean of the values
    assert compare_attention(out, q, k, v, attn_mask=mask, masked_rows="uniform").passed
    assert not compare_attention(out, q, k, v, attn_mask=mask).passed  # "zero" expects 0


def test_integer_masks_surface_the_oracles_refusal() -> None:
    from mha_symbolic import reference_attention

    q, k, v = _qkv(44)
    imask = np.ones((5, 7), dtype=np.int64)
    with pytest.raises(SpecError, match="attn_mask"):       # as torch, which refuses them
        reference_attention(q, k, v, attn_mask=imask)
    with pytest.raises(SpecError, match="attn_mask"):
        compare_attention(np.zeros((1, 2, 5, 8), np.float32), q, k, v, attn_mask=imask)


def test_float16_long_rows_catch_a_slightly_wrong_scale() -> None:
    # 4096 keys in float16: the underflow slack of the stored weights belongs only to
    # weights below float16's normal range (2^-14); charged to every key it was ten
    # times the rounding error and hid this bug (bench/RESULTS.md, issue 10)
    rng = np.random.default_rng(45)
    q = rng.standard_normal((1, 1, 64, 64)).astype(np.float16)
    k = rng.standard_normal((1, 1, 4096, 64)).astype(np.float16)
    v = rng.standard_normal((1, 1, 4096, 64)).astype(np.float16)
    case = bc.Case("float16", q, k, v, is_causal=True, causal_alignment="bottom_right")
    good = bc.numpy_attention(case, variant="numpy_fused")
    bad = bc.numpy_attention(case, variant="numpy_fused", bug="scale_sqrt_d_plus_1")
    # the bug is visible: its effect is at least 10 × the correct kernel's error
    keep = np.arange(4096)[None, :] <= np.arange(64)[:, None] + 4096 - 64
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) / 8
    w = np.exp(np.where(keep, s, -np.inf) - s.max(-1, keepdims=True))
    exact = (w / w.sum(-1, keepdims=True)) @ v.astype(np.float64)
    s9 = s * 8 / math.sqrt(65)
    w9 = np.exp(np.where(keep, s9, -np.inf) - s9.max(-1, keepdims=True))
    effect = np.max(np.abs((w9 / w9.sum(-1, keepdims=True)) @ v.astype(np.float64) - exact))
    assert effect >= 10 * np.max(np.abs(good.astype(np.float64) - exact))
    opts = dict(is_causal=True, causal_alignment="bottom_right")
    assert compare_attention(good, q, k, v, **opts).passed
    assert not compare_attention(bad, q, k, v, **opts, diagnose_bugs=False).passed


def _subnormal_case() -> tuple[np.ndarray, ...]:
    """Values near float32's smallest normal and weights about 1/3: the products p·v
    are subnormal (below 2^-126)."""
    tiny = 2.0**-126
    q = np.zeros((1, 1, 2, 4), np.float32)
    k = np.zeros((1, 1, 3, 4), np.float32)
    v = (np.array([[3.0, -2.0, 1.0, 2.0], [1.0, 2.0, -1.0, 1.0], [-1.0, 1.0, 3.0, 2.0]])
         * tiny).astype(np.float32)
    return q, k, v.reshape(1, 1, 3, 4)


def test_a_kernel_flushing_subnormals_is_caught_unless_stated() -> None:
    q, k, v = _subnormal_case()
    mean = v.astype(np.float64).mean(axis=-2, keepdims=True)     # uniform weights
    exact = np.broadcast_to(mean, (1, 1, 2, 4)).astype(np.float32)
    flushed = np.zeros_like(exact)             # every product p·v flushed to zero
    assert compare_attention(exact, q, k, v).passed
    assert not compare_attention(flushed, q, k, v).passed
    # stated: the flush may cost 2^-126 per product, as much as the answer itself, so
    # the tool refuses a verdict rather than failing (or passing) the flushing kernel
    with pytest.raises(ToleranceError, match="subnormals flushed"):
        compare_attention(flushed, q, k, v, subnormals="flush")


def test_jax_on_cpu_flushes_subnormals() -> None:
    jax = pytest.importorskip("jax")
    q, k, v = _subnormal_case()
    out = np.swapaxes(np.asarray(jax.nn.dot_product_attention(
        *(np.swapaxes(a, 1, 2) for a in (q, k, v)))), 1, 2)
    r = compare_attention(out, q, k, v)
    if r.passed:
        pytest.skip("this JAX build keeps subnormals")
    assert r.worst is not None and r.worst.actual == 0.0


def test_a_subnormal_answer_is_judged_not_refused() -> None:
    # one key: the weight is exactly 1 and the answer is v itself (by hand).  fp16 values
    # in the subnormal range (k·2^-24) once made the tolerance "vacuous" — its absolute
    # underflow terms exceed Σ p|v| there — and the check refused a correct kernel (found
    # by examples/test_property_based.py)
    import numpy as np

    from mha_symbolic import compare_attention

    q = np.full((1, 1, 2, 4), 0.25, dtype=np.float16)
    k = np.full((1, 1, 1, 4), 0.5, dtype=np.float16)
    v = (np.array([[[[1, 2, 3, 1000]]]], dtype=np.float64) * 2.0**-24).astype(np.float16)
    assert float(v[0, 0, 0, 0]) == 2.0**-24  # subnormal in fp16, exactly
    exact = np.broadcast_to(v, (1, 1, 2, 4))
    assert compare_attention(exact.copy(), q, k, v).passed
    assert not compare_attention(exact + np.float16(1.0), q, k, v).passed
    big = (v.astype(np.float64) * 2.0**24).astype(np.float16)  # 1, 2, 3, 1000: normal
    assert not compare_attention(np.zeros((1, 1, 2, 4), np.float16), q, k, big).passed
