"""The device bench (bench/device_sdpa.py, issue 17) on the CPU: a tiny run through
every piece (backends forced in turn, refusals counted as "not supported", the oracle,
PyTorch's and FlashAttention's rules, the time budget), a planted wrong kernel
failing, and the plan.  The GPU run itself: bench/gpu_check.sh (test skipped here
without CUDA).  Expected values come from hand counts and hand-written loops.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import device_cli as dc  # noqa: E402
import device_sdpa as ds  # noqa: E402
from external_rules import flash2, torch5  # noqa: E402


def _tiny(flex: tuple[int, ...] = (16,), kinds: tuple[str, ...] = ds.KINDS) -> list[Any]:
    return ds.make_plan((1, 16), (16,), ("bfloat16",), flex, kinds)


def test_plan_has_every_kind_square_and_decode_and_flex_masks() -> None:
    specs = _tiny()
    # n = 1: one square shape; n = 16: square and decode (L = 1); 5 kinds each;
    # plus FlexAttention with 2 mask_mods
    assert len(specs) == 3 * 5 + 2
    assert {s.kind for s in specs if not s.flex} == set(ds.KINDS)
    assert {(s.L, s.S) for s in specs if not s.flex} == {(1, 1), (16, 16), (1, 16)}
    sdpa = [s.macs for s in specs if not s.flex]
    assert sdpa == sorted(sdpa, reverse=True)             # the longest start first
    assert all(s.flex for s in specs[len(sdpa):])         # FlexAttention last
    gqa = [s for s in specs if s.kind == "gqa"]
    assert all(s.hq == 2 * s.hk and s.causal for s in gqa)


def test_long_sequences_run_head_dim_128_causal_only() -> None:
    specs = ds.make_plan((8192,), (64, 128), ("float16",), ())
    square = [s for s in specs if s.L == s.S]
    assert [(s.E, s.kind, s.hq) for s in square] == [(128, "causal", 1)]
    assert {s.L for s in specs} == {1, 8192} and all(s.E == 128 for s in specs)
    # the backward oracle holds O(L·S) memory: L = S = 8192 forward only, 4096 both
    assert not ds.judged_in(square[0], "bwd") and ds.judged_in(square[0], "fwd")
    s4096 = ds.make_plan((4096,), (128,), ("float16",), ())[0]
    assert (s4096.L, s4096.S) == (4096, 4096) and ds.judged_in(s4096, "bwd")
    assert ds.memory(s4096, "bwd") > ds.memory(s4096, "fwd")


def test_gpu_plan_estimate_fits_the_budget_on_16_workers() -> None:
    specs, backends, budget, _ = dc.configure(dc.parser("t").parse_args(["--device", "cuda"]))
    n, total, big = dc.plan_estimate(specs, backends, ("fwd", "bwd"))
    assert n > 500 and budget <= 480
    assert max(total / 16, big) < budget


def test_mask_mods_match_hand_loops() -> None:
    L, S, w = 7, 9, 3
    qi, ki = np.arange(L)[:, None], np.arange(S)[None, :]
    causal = ds.CausalMask()(0, 0, qi, ki)
    sliding = ds.SlidingWindowMask(w)(0, 0, qi, ki)
    for i in range(L):
        for j in range(S):
            assert causal[i, j] == (j <= i)
            assert sliding[i, j] == (j <= i and i - j < w)
    flex = [s for s in ds.make_plan((), (64,), ("float16",), (64,)) if s.flex == "sliding"]
    mm = ds.mask_mod_of(flex[0])
    assert mm.window == 16 and ds.mask_mod_of(flex[0]) is mm   # S/4; one object (compile)


def test_external_rules_by_hand() -> None:
    ref = np.array([1.0, -2.0, 0.5])
    lp = ref + np.array([1e-3, 0.0, -1e-3])
    assert flash2(ref + np.array([2e-3, 0, 0]), ref, lp)          # 2e-3 <= 2·1e-3
    assert not flash2(ref + np.array([0, 2.1e-3, 0]), ref, lp)
    # torch5 in bf16: atol 5·max(1e-3, 1e-3) = 5e-3, rtol 5·max(2e-3, 1.6e-2) = 0.08
    assert torch5(ref + np.array([0.0, 0.16, 0.0]), ref, lp, "bfloat16")   # 0.16 <= .005+.16
    assert not torch5(ref + np.array([0.0, 0.17, 0.0]), ref, lp, "bfloat16")


def test_tiny_cpu_run_counts_refusals_and_has_no_false_alarm() -> None:
    specs = [s for s in _tiny(kinds=("causal", "float", "gqa")) if s.S > 1]
    backends = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    res = ds.run(specs, "cpu", backends, ("fwd", "bwd"), jobs=1, budget_s=600, seed=5,
                 flex=True, progress=False)
    assert res.meta["device_read_check"] == {"device": "cpu", "bitwise": True,
                                             "same_verdict": True, "passed": True}
    n_sdpa = sum(1 for s in specs if not s.flex)
    for d in ("fwd", "bwd"):
        eff = res.rows[("EFFICIENT_ATTENTION", "bfloat16", d)]
        # no memory-efficient kernel on CPU: every case refused, none judged
        assert (eff.cases, eff.not_supported, eff.judged) == (n_sdpa, n_sdpa, 0)
        for b in ("FLASH_ATTENTION", "MATH"):
            r = res.rows[(b, "bfloat16", d)]
            assert (r.cases, r.not_supported, r.judged) == (n_sdpa, 0, n_sdpa)
            assert r.ours == r.refused == r.errors == 0
            assert 0 < r.worst < 1
    fwd = res.rows[("FLEX (eager)", "bfloat16", "fwd")]
    assert (fwd.cases, fwd.judged, fwd.ours) == (2, 2, 0)
    bwd = res.rows[("FLEX (eager)", "bfloat16", "bwd")]     # no flex backward on CPU
    assert bwd.cases == 2 and bwd.judged + bwd.not_supported == 2
    assert "FLASH_ATTENTION" in dc.table(res) and dc.to_json(res)["rows"]


def test_a_wrong_kernel_is_counted_as_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ds.run_kernel

    def off_by_a_bit(x: Any, spec: Any, backend: str, device: str, direction: str) -> Any:
        out, grads = real(x, spec, backend, device, direction)
        if direction == "fwd":
            out = out.clone()
            out[..., -1, 0] += 0.25
        else:
            grads = (grads[0] * 1.25, *grads[1:])
        return out, grads

    monkeypatch.setattr(ds, "run_kernel", off_by_a_bit)
    specs = [s for s in _tiny(()) if s.L == s.S == 16 and s.kind in ("none", "causal")]
    res = ds.run(specs, "cpu", ("MATH",), ("fwd", "bwd"), jobs=1, budget_s=600, seed=1,
                 flex=False, progress=False)
    for d in ("fwd", "bwd"):
        r = res.rows[("MATH", "bfloat16", d)]
        assert r.judged == 2 and r.ours == 2
        assert r.flash2 == 2                   # their rule sees it too (lp is exact MATH)
    assert all(f["verdict"] == "fail" for f in res.failures)


def test_worker_pool_one_verdict_at_a_time_when_memory_is_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "mem_budget_bytes", lambda: 1.0)   # every verdict "too big"
    specs = [s for s in _tiny(()) if s.L == s.S == 16 and s.kind in ("none", "bool")]
    res = ds.run(specs, "cpu", ("MATH",), ("fwd", "bwd"), jobs=2, budget_s=600, seed=2,
                 flex=False, progress=False)
    for d in ("fwd", "bwd"):
        r = res.rows[("MATH", "bfloat16", d)]
        assert (r.cases, r.judged, r.ours, r.errors, r.not_judged_time) == (2, 2, 0, 0, 0)


def test_spent_budget_reports_cases_as_not_judged_never_as_passed() -> None:
    specs = [s for s in _tiny(()) if s.L == s.S == 16][:2]
    res = ds.run(specs, "cpu", ("MATH",), ("fwd",), jobs=1, budget_s=1e-9, seed=1,
                 flex=False, progress=False)
    r = res.rows[("MATH", "bfloat16", "fwd")]
    assert (r.cases, r.judged, r.ours, r.not_judged_time) == (2, 0, 0, 2)


@pytest.mark.parametrize("bad", [["--sizes", "0,5"], ["--sizes", "x"], ["--jobs", "0"],
                                 ["--backends", "CUTLASS"], ["--dtypes", "int8"],
                                 ["--budget-s", "nan"], ["--kinds", "alibi"]])
def test_bad_options_exit_2_with_one_line(bad: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        dc.configure(dc.parser("t").parse_args(["--device", "cpu", *bad]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_estimate_only_runs_as_a_script() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device",
                        "cuda", "--estimate-only"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "outputs to judge (fwd, bwd)" in p.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the "
                    "GPU run is bench/gpu_check.sh on the device machine")
def test_cuda_quick_run_has_no_false_alarm() -> None:  # pragma: no cover - GPU only
    specs = ds.make_plan((1, 128), (64,), ("float16", "bfloat16"), ())
    res = ds.run(specs, "cuda", ds.BACKENDS["cuda"], ("fwd", "bwd"), jobs=1, budget_s=600,
                 seed=3, flex=False, progress=False)
    assert res.meta["device_read_check"]["bitwise"]
    assert all(r.ours == 0 and r.errors == 0 for r in res.rows.values())
