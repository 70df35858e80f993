"""The pytest plugin (mha_symbolic/testing/pytest_plugin.py), run in pytester sandboxes."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mha_symbolic

pytest_plugins = ["pytester"]

_ROOT = str(Path(mha_symbolic.__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def _package_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandboxed pytest runs in a subprocess: let it import this checkout."""
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", _ROOT if not old else _ROOT + os.pathsep + old)


def _plugin_args() -> list[str]:
    """``-p mha_symbolic.testing.pytest_plugin`` unless the installed entry point loads it."""
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.value == "mha_symbolic.testing.pytest_plugin" for ep in eps):
        return []
    return ["-p", "mha_symbolic.testing.pytest_plugin"]


_GOOD_AND_BAD = '''
import numpy as np

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))


def attention(q, k, v, scale):
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True) @ v).astype(np.float32)


def test_correct(attention_oracle):
    attention_oracle.assert_close(attention(q, k, v, 8 ** -0.5), q, k, v)


def test_unscaled(attention_oracle):
    attention_oracle.assert_close(attention(q, k, v, 1.0), q, k, v)
'''


def test_fixture_passes_a_correct_kernel_and_fails_a_buggy_one(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(_GOOD_AND_BAD)
    result = pytester.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*AttentionMismatchError: FAIL [[]no_scale[]] attention output: * / 64 off",
        "*attention output is not close to the exact answer: "
        "* / 64 elements mismatched, worst *; matches bug class 'no_scale'",
        "*shape: (1, 2, 4, 8), dtype: float32*",
        "*Mismatched elements: * / 64 (*%)*",
        "*Worst element (greatest error / tolerance) at index (batch=*, head=*, query=*, "
        "feature=*)*",
        "*Diagnosis: matches bug class 'no_scale'*",
    ])


def test_short_summary_shows_the_one_line_summary(pytester: pytest.Pytester) -> None:
    # pytest's "short test summary info" prints "FAILED <node> - <first line of the
    # error>" (cut to the terminal's width, whole with -vv or on CI)
    pytester.makepyfile(_GOOD_AND_BAD)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-k", "unscaled", "-rf", "-vv")
    summary = [ln for ln in result.stdout.lines if ln.startswith("FAILED ")]
    assert len(summary) == 1
    head = ("FAILED test_short_summary_shows_the_one_line_summary.py::test_unscaled - "
            "FAIL [no_scale] attention output: ")
    assert summary[0].startswith(head) and summary[0].endswith(" / 64 off")


def test_short_summary_at_80_columns_starts_with_the_verdict(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    pytester.makepyfile(test_k=_GOOD_AND_BAD)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-k", "unscaled", "-rf")
    summary = [ln for ln in result.stdout.lines if ln.startswith("FAILED ")]
    # the verdict and the bug class lead, so that they survive the cut at 80 columns
    assert len(summary) == 1 and len(summary[0]) <= 80
    assert summary[0].startswith("FAILED test_k.py::test_unscaled - FAIL [no_scale] attention")


def test_failure_report_hides_library_frames(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(_GOOD_AND_BAD)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-k", "unscaled")
    text = result.stdout.str()
    assert "test_unscaled" in text
    # the traceback stops in the user's test: no frame from inside the library
    assert "mha_symbolic/testing/forward/compare.py" not in text
    assert "mha_symbolic/testing/pytest_plugin.py" not in text


def test_fixture_offers_reference_and_options(pytester: pytest.Pytester) -> None:
    pytester.makepyfile('''
import numpy as np

def test_reference(attention_oracle):
    q = k = v = np.eye(2, dtype=np.float32)[None]
    ref = attention_oracle.reference(q, k, v)
    assert ref.shape == (1, 2, 2)
    assert np.all(ref.lower <= ref.upper)

def test_options(attention_oracle):
    strict = attention_oracle.with_options(rule="ulp", ulps=0.0)
    q = k = v = np.eye(2, dtype=np.float32)[None]
    assert not strict.compare(np.zeros((1, 2, 2), np.float32), q, k, v).passed
''')
    result = pytester.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes(passed=2)


def test_fixture_passes_the_model_options_through(pytester: pytest.Pytester) -> None:
    pytester.makepyfile('''
import numpy as np
import pytest
from mha_symbolic import ToleranceError

rng = np.random.default_rng(1)
q = rng.standard_normal((1, 1, 2, 8)).astype(np.float16)
k = rng.standard_normal((1, 1, 1500, 8)).astype(np.float16)
v = rng.standard_normal((1, 1, 1500, 4)).astype(np.float16)

def test_report_states_the_model(attention_oracle):
    zeros = np.zeros((1, 1, 2, 4), np.float16)
    text = attention_oracle.with_options(kernel="eager").compare(zeros, q, k, v).report()
    assert "accumulation: float32 (default)" in text and "kernel 'eager'" in text

def test_a_vacuous_model_refuses_a_verdict(attention_oracle):
    worst = attention_oracle.with_options(accumulation_dtype="same", error_model="worst_case")
    with pytest.raises(ToleranceError, match="vacuous"):
        worst.compare(np.zeros((1, 1, 2, 4), np.float16), q, k, v)
''')
    result = pytester.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes(passed=2)


def test_fixture_with_the_hypothesis_strategy(pytester: pytest.Pytester) -> None:
    pytester.makepyfile('''
import numpy as np
from hypothesis import HealthCheck, given, settings
from mha_symbolic.strategies import attention_inputs

@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=attention_inputs(dtype="float32", max_keys=300))
def test_exact_answer_rounded_passes(attention_oracle, case):
    ref = attention_oracle.reference(case.query, case.key, case.value, **case.options)
    out = np.asarray(ref.rounded("float32"))
    attention_oracle.assert_close(out, case.query, case.key, case.value, **case.options)
''')
    result = pytester.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes(passed=1)


def test_plugin_import_is_light() -> None:
    code = ("import sys, mha_symbolic.testing.pytest_plugin; "
            "print(sorted(m for m in ('numpy', 'sympy', 'mpmath', 'flint', 'torch', 'jax', "
            "'ml_dtypes', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
