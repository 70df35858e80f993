"""Example: testing JAX attention against the exact answer.

``jax.nn.dot_product_attention`` (and a hand-written jnp kernel) in float32,
float16 and bfloat16.  JAX arrays go to the oracle as they are (read through
``np.asarray``; jax is never imported by mha_symbolic itself).  Skipped when jax is
not installed.  JAX lays attention out as (batch, length, heads, features): the
tests transpose to the (batch, heads, length, features) layout of the oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax example needs jax (pip install jax)")
jnp = jax.numpy

from mha_symbolic import assert_attention_close  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16"]


def _inputs(dtype: str, L: int, S: int, H: int, Hkv: int, E: int, seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape), dtype=dtype)
                 for shape in ((2, L, H, E), (2, S, Hkv, E), (2, S, Hkv, E)))


def _bhle(x: Any) -> Any:
    return jnp.swapaxes(x, 1, 2)                               # (B, L, H, E) -> (B, H, L, E)


def jnp_attention(q: Any, k: Any, v: Any) -> Any:
    """A plain jnp kernel in the input dtype, softmax in float32, (B, H, L, E) layout."""
    s = jnp.einsum("bhle,bhse->bhls", q, k, preferred_element_type=jnp.float32)
    w = jax.nn.softmax(s / np.sqrt(q.shape[-1]), axis=-1)
    return jnp.einsum("bhls,bhse->bhle", w.astype(q.dtype), v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hand_written_jnp_kernel(dtype: str) -> None:
    q, k, v = (_bhle(x) for x in _inputs(dtype, 6, 9, 2, 2, 8, seed=0))
    assert_attention_close(jnp_attention(q, k, v), q, k, v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dot_product_attention_causal_and_gqa(dtype: str) -> None:
    if not hasattr(jax.nn, "dot_product_attention"):
        pytest.skip("jax.nn.dot_product_attention needs jax >= 0.4.31")
    q, k, v = _inputs(dtype, 7, 7, 4, 2, 8, seed=1)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    assert_attention_close(_bhle(out), _bhle(q), _bhle(k), _bhle(v), is_causal=True,
                           enable_gqa=True)
