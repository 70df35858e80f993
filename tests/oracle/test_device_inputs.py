"""The oracle reads tensors that live on a device (issue 17): ``.detach().cpu()`` before
any numpy conversion, every value exactly (bf16 and fp16 bit patterns preserved).

No GPU here: a torch.Tensor subclass plays a CUDA tensor — it reports
``device.type == "cuda"`` and, like a real one, refuses ``.numpy()`` and
``__array__`` until ``.cpu()`` has copied it to the host.  The expected values are
the bit patterns the test writes itself (uint16 words viewed as bf16/fp16 by
ml_dtypes/numpy), never the code under test.  The same path on a real GPU:
test_cuda_tensors_are_read_exactly (skipped without CUDA).
"""

from __future__ import annotations

from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mha_symbolic import compare_attention  # noqa: E402
from mha_symbolic.oracle.inputs import as_exact_array  # noqa: E402


class FakeCudaTensor(torch.Tensor):
    """Reports a CUDA device; numpy only after .cpu() (which returns a plain tensor)."""

    cpu_calls: ClassVar[list[str]] = []

    @property  # type: ignore[override]
    def device(self) -> Any:
        return torch.device("cuda", 0)

    @property  # type: ignore[override]
    def is_cuda(self) -> bool:
        return True

    def cpu(self, *a: Any, **k: Any) -> Any:
        FakeCudaTensor.cpu_calls.append(str(self.dtype))
        return self.as_subclass(torch.Tensor).clone()

    def numpy(self, *a: Any, **k: Any) -> Any:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use "
                        "Tensor.cpu() to copy the tensor to host memory first.")

    def __array__(self, *a: Any, **k: Any) -> Any:
        return self.numpy()


def _fake(t: Any) -> Any:
    return t.as_subclass(FakeCudaTensor)


# bit patterns: 1, -2, the largest finite, the smallest subnormal, a subnormal, -0, pi-ish
BF16_BITS = np.array([0x3F80, 0xC000, 0x7F7F, 0x0001, 0x0035, 0x8000, 0x4049], np.uint16)
FP16_BITS = np.array([0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0235, 0x8000, 0x4248], np.uint16)


def test_fake_device_tensor_refuses_numpy_like_a_cuda_tensor() -> None:
    t = _fake(torch.ones(3))
    assert t.device.type == "cuda"
    with pytest.raises(TypeError, match="cuda"):
        np.asarray(t)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_bf16_device_tensor_read_bit_for_bit(requires_grad: bool) -> None:
    host = torch.from_numpy(BF16_BITS.view(np.int16).copy()).view(torch.bfloat16)
    t = _fake(host.float().requires_grad_(requires_grad).to(torch.bfloat16)) \
        if requires_grad else _fake(host)
    FakeCudaTensor.cpu_calls.clear()
    a = as_exact_array(t, "query")
    assert FakeCudaTensor.cpu_calls, "the device tensor was not copied with .cpu()"
    assert a.dtype == ml_dtypes.bfloat16
    assert a.view(np.uint16).tolist() == BF16_BITS.tolist()


def test_fp16_and_fp32_device_tensors_read_bit_for_bit() -> None:
    h = torch.from_numpy(FP16_BITS.view(np.float16).copy())
    a = as_exact_array(_fake(h), "key")
    assert a.dtype == np.float16 and a.view(np.uint16).tolist() == FP16_BITS.tolist()
    words = np.array([0x3F800001, 0x00000001, 0xFF7FFFFF], np.uint32)
    b = as_exact_array(_fake(torch.from_numpy(words.view(np.float32).copy())), "value")
    assert b.dtype == np.float32 and b.view(np.uint32).tolist() == words.tolist()


def test_device_bool_mask_read_as_bool() -> None:
    m = np.array([[True, False], [False, True]])
    a = as_exact_array(_fake(torch.from_numpy(m)), "attn_mask")
    assert a.dtype == np.bool_ and a.tolist() == m.tolist()


def test_negated_view_of_a_device_tensor_reads_the_negated_values() -> None:
    h = torch.from_numpy(FP16_BITS.view(np.float16).copy())
    a = as_exact_array(_fake(torch._neg_view(h)), "query")
    # flipping the sign bit of each fp16 word is the exact negation
    assert a.view(np.uint16).tolist() == (FP16_BITS ^ 0x8000).tolist()


def test_compare_attention_on_device_tensors_equals_the_host_verdict() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    host = compare_attention(out, q, k, v, is_causal=True)
    dev = compare_attention(_fake(out), _fake(q), _fake(k), _fake(v), is_causal=True)
    assert host.passed and dev.passed
    assert host.worst is not None and dev.worst is not None
    assert dev.worst.ratio == host.worst.ratio
    # a wrong output on the device is still caught
    bad = out.clone()
    bad[0, 1, 4, 3] += 0.25
    assert not compare_attention(_fake(bad), _fake(q), _fake(k), _fake(v), is_causal=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device "
                    "(the fake-device tests above cover the code path on CPU)")
def test_cuda_tensors_are_read_exactly() -> None:  # pragma: no cover - GPU only
    host = torch.from_numpy(BF16_BITS.view(np.int16).copy()).view(torch.bfloat16)
    a = as_exact_array(host.to("cuda"), "query")
    assert a.view(np.uint16).tolist() == BF16_BITS.tolist()
    q, k, v = (torch.randn(1, 2, 33, 64, device="cuda", dtype=torch.float16)
               for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert compare_attention(out, q, k, v).passed
