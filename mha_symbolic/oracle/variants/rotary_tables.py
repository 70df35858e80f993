"""The cos/sin tables kernels build for rotary embeddings (:mod:`.rotary`): as correct
kernels build them in float32 (HF's ``LlamaRotaryEmbedding``, llama.cpp's running
product), and as bug classes build them (in a 16-bit dtype, inv_freq over the head dim).
``spec`` is a :class:`.rotary.RotarySpec` throughout."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["fp32_running_tables", "fp32_tables", "head_dim_tables", "low_tables", "round_to"]


def round_to(x: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    import ml_dtypes

    dt = np.float32 if dtype == "float32" else getattr(ml_dtypes, dtype, np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(dt).astype(np.float64)


def low_tables(spec: Any, npos: int, r: int, dtype: str, cos32: bool = False
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A kernel's tables built in ``dtype`` (a bug class): tables rounded to it; base
    mode — inv_freq in fp32 as HF builds it, then the positions, inv_freq and their
    product in ``dtype``, cos and sin rounded to it (``cos32``: computed in float32
    first, as torch's 16-bit cos does)."""
    if spec.cos is not None and spec.sin is not None:
        c, s = round_to(spec.cos[:npos], dtype), round_to(spec.sin[:npos], dtype)
    else:
        assert spec.base is not None
        m = np.arange(r // 2)
        inv = (np.float32(1.0) / (np.float32(spec.base) ** (np.float32(2) * m.astype(np.float32)
                                                            / np.float32(r))))
        inv = round_to(inv / np.float32(spec.scale), dtype)
        theta = round_to(round_to(np.arange(npos, dtype=np.float64), dtype)[:, None] * inv[None, :],
                       dtype)
        t = theta.astype(np.float32) if cos32 else theta
        c, s = round_to(np.cos(t), dtype), round_to(np.sin(t), dtype)
    return c, s


def fp32_tables(spec: Any, npos: int, r: int
                 ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """cos, sin as correct kernels build them: the tables as given, or (base mode) HF's
    ``LlamaRotaryEmbedding`` — inv_freq = 1 / base^(2m/r), positions / scale, their
    product, cos and sin, all in float32."""
    if spec.cos is not None and spec.sin is not None:
        return spec.cos[:npos], spec.sin[:npos]
    assert spec.base is not None
    f32 = np.float32
    m = np.arange(r // 2).astype(f32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        inv = f32(1.0) / (f32(spec.base) ** (f32(2) * m / f32(r)))
        t = np.arange(npos, dtype=f32) / f32(spec.scale)
        theta = t[:, None] * inv[None, :]
        return np.cos(theta).astype(np.float64), np.sin(theta).astype(np.float64)


def fp32_running_tables(spec: Any, npos: int, r: int
                         ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """cos, sin as llama.cpp's ggml builds them (``ggml_rope_cache_init``): theta_scale =
    base^(-2/r), θ_0 = pos / scale, θ_m = θ_{m-1}·theta_scale pair after pair, cos and
    sin, all in float32 (pair m's angle carries m roundings: several times HF's angle
    error at long positions)."""
    assert spec.base is not None
    f32 = np.float32
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ratio = f32(spec.base) ** (f32(-2) / f32(r))
        theta = np.arange(npos, dtype=f32) / f32(spec.scale)
        cols = []
        for _ in range(r // 2):
            cols.append(theta)
            theta = (theta * ratio).astype(f32)
        ang = np.stack(cols, axis=-1)
        return np.cos(ang).astype(np.float64), np.sin(ang).astype(np.float64)


def head_dim_tables(spec: Any, npos: int, r: int, E: int, f32: bool = False
                     ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A bug class's tables: the r rotated dims' angles pos/λ · β^(-2m/E) with inv_freq
    built over the head dim E instead of r (m < r/2); in float64, or (``f32``) as HF
    builds them, all in float32."""
    assert spec.base is not None
    if f32:
        c, s = fp32_tables(dataclasses.replace(spec, cos=None, sin=None, dim=E), npos, E)
        return c[:, : r // 2], s[:, : r // 2]
    inv = spec.base ** (-2.0 * np.arange(r // 2) / E) / spec.scale
    theta = np.arange(npos, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(theta), np.sin(theta)
