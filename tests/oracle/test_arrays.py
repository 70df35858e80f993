"""Tests of mha_symbolic.oracle.inputs: exact input conversion and finiteness checks."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from mha_symbolic.errors import InputValueError, SpecError
from mha_symbolic.oracle.inputs import as_exact_array, to_float64, validate_finite


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16])
def test_numpy_arrays_keep_their_dtype(dtype: type) -> None:
    x = np.array([[1.5, -2.25]], dtype=dtype)
    out = as_exact_array(x, "query")
    assert out.dtype == np.dtype(dtype)
    assert to_float64(out).tolist() == [[1.5, -2.25]]


def test_lists_and_scalars_become_float64() -> None:
    assert as_exact_array([[1, 2.5], [3, 4]], "q").dtype == np.float64
    assert as_exact_array(0.1, "q").item() == 0.1  # the double 0.1, exactly
    assert as_exact_array([True, False], "mask").dtype == bool


def test_big_integers_and_strings_are_refused() -> None:
    with pytest.raises(InputValueError, match=r"query holds an integer above 2\*\*53"):
        as_exact_array([2**60 + 1], "query")
    with pytest.raises(SpecError, match="query must hold numbers"):
        as_exact_array([["a", "b"]], "query")
    with pytest.raises(SpecError, match=r"value.*ragged"):
        as_exact_array([[1.0], [1.0, 2.0]], "value")
    with pytest.raises(SpecError, match=r"key.dtype=complex128"):
        as_exact_array(np.array([1j]), "key")


def test_torch_tensors_exact_including_bfloat16() -> None:
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0 + 2.0**-7, -3.0, 2.0**-133], dtype=torch.bfloat16, requires_grad=True)
    out = as_exact_array(x, "query")
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    assert to_float64(out).tolist() == [1.0 + 2.0**-7, -3.0, 2.0**-133]
    h = torch.tensor([65504.0, 2.0**-24], dtype=torch.float16)
    out = as_exact_array(h, "key")
    assert out.dtype == np.float16 and to_float64(out).tolist() == [65504.0, 2.0**-24]


def test_numpy_input_does_not_import_torch_or_jax() -> None:
    code = ("import sys, numpy as np; from mha_symbolic.oracle.inputs import as_exact_array; "
            "as_exact_array(np.ones(3, np.float32), 'q'); as_exact_array([1.0], 'k'); "
            "print('torch' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"]


def test_validate_finite_names_the_first_bad_index() -> None:
    x = np.zeros((2, 3, 4), dtype=np.float16)
    x[1, 2, 0] = np.inf
    x[1, 2, 3] = np.nan
    with pytest.raises(InputValueError, match=r"^value\[1, 2, 0\] = inf: expected a finite"):
        validate_finite(x, "value")
    validate_finite(np.array([1.0, -np.inf]), "attn_mask", allow_neg_inf=True)
    with pytest.raises(InputValueError, match=r"attn_mask\[1\] = inf"):
        validate_finite(np.array([-np.inf, np.inf]), "attn_mask", allow_neg_inf=True)
    with pytest.raises(InputValueError, match=r"attn_mask\[0\] = nan"):
        validate_finite(np.array([np.nan]), "attn_mask", allow_neg_inf=True)
    validate_finite(np.zeros((0, 3)), "empty")
    validate_finite(np.array([True]), "mask")


def test_subnormals_survive_conversion() -> None:
    x = np.array([5e-324, -2.0**-1060])
    assert to_float64(as_exact_array(x, "q")).tolist() == [5e-324, -2.0**-1060]
    b = np.array([2.0**-133], dtype=ml_dtypes.bfloat16)  # bfloat16 subnormal
    assert to_float64(as_exact_array(b, "q")).tolist() == [2.0**-133]
