"""Hypothesis strategies of adversarial attention inputs (needs ``hypothesis``).

:func:`attention_inputs` draws an :class:`AttentionCase`: query, key and value in a
float dtype plus the options of one ``scaled_dot_product_attention`` call, from
families chosen to break kernels — near ties, large score ranges, rows of thousands
of keys, fully masked rows, cancelling values, subnormals, causal masks with L ≠ S,
grouped-query attention — and plain random inputs.  A kernel author writes::

    from hypothesis import given
    from mha_symbolic import assert_attention_close
    from mha_symbolic.strategies import attention_inputs

    @given(attention_inputs(dtype="bfloat16"))
    def test_my_kernel(case):
        out = my_kernel(case.query, case.key, case.value, **case.sdpa_kwargs)
        assert_attention_close(out, case.query, case.key, case.value, **case.options)

Arrays are numpy (``ml_dtypes.bfloat16`` for bfloat16); :meth:`AttentionCase.torch`
gives torch tensors.  Each case is generated from a drawn seed and a few drawn
sizes, so hypothesis shrinks a failure towards the smallest shapes and the simplest
family.  Importing this module imports hypothesis; ``import mha_symbolic`` does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import OptionalDependencyError, SpecError
from ..oracle.arith.formats import get_format
from ..oracle.layout import check_layout

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised only without hypothesis
    raise OptionalDependencyError("hypothesis", "mha_symbolic.strategies", "test") from exc

__all__ = ["FAMILIES", "AttentionCase", "attention_inputs"]

#: family -> what it stresses (data; the order is the shrinking order: simplest first)
FAMILIES: dict[str, str] = {
    "random": "standard normal inputs, random masks, scales and options",
    "near_ties": "keys equal up to tiny perturbations: scores tie within a rounding",
    "large_range": "scores spanning hundreds: the softmax is nearly one-hot, exp underflows",
    "long_rows": "1-4 queries against thousands of keys (accumulation over long rows)",
    "fully_masked": "rows whose every key is masked out (the masked_rows policy)",
    "cancelling": "values in ± pairs with equal scores: outputs cancel to about zero",
    "subnormal": "values and products near the dtype's underflow threshold",
    "causal_rect": "causal masks with L != S, in both alignments",
    "gqa": "grouped-query attention: H_q a multiple of H_kv (repeat_interleave)",
    "llm_outliers": "LLM-like activations: a few query/key channels ×6 (scores up to ~70), "
                    "long rows",
    "shifted_values": "values with a common offset (mean 3): the output does not cancel, "
                      "long rows",
    "tile_edges": "key lengths at a tile edge (16·2^k − 1, +0, +1) with stride-0 keys "
                  "and values shared across the batch (pytorch#191937: a kernel wrong "
                  "only for kv_len ≡ 1 mod 32 with expanded K/V)",
}


@dataclass(frozen=True)
class AttentionCase:
    """One drawn attention call.

    ``query (B, H_q, L, E)``, ``key (B, H_kv, S, E)``, ``value (B, H_kv, S, E_v)`` in
    the drawn dtype; ``attn_mask`` a bool array (True = takes part) broadcastable to
    (B, H_q, L, S), or None.  :attr:`sdpa_kwargs` are the keywords of
    ``torch.nn.functional.scaled_dot_product_attention`` (a bottom-right causal case
    carries its mask explicitly there); :attr:`options` are those of
    :func:`mha_symbolic.assert_attention_close` / ``reference_attention``.
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    attn_mask: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    causal_alignment: str = "top_left"
    masked_rows: str = "zero"
    family: str = "random"
    seed: int = field(default=0, compare=False)
    #: "bhsd" (the arrays as above) or "bshd" (FlashAttention's: query (B, L, H_q, E),
    #: key (B, S, H_kv, E), value (B, S, H_kv, E_v); the mask keeps (…, H_q, L, S))
    layout: str = "bhsd"

    @property
    def options(self) -> dict[str, Any]:
        """Keywords for ``assert_attention_close`` / ``compare_attention`` /
        ``reference_attention``."""
        return dict(attn_mask=self.attn_mask, is_causal=self.is_causal, scale=self.scale,
                    enable_gqa=self.enable_gqa, causal_alignment=self.causal_alignment,
                    masked_rows=self.masked_rows, layout=self.layout)

    @property
    def sdpa_kwargs(self) -> dict[str, Any]:
        """Keywords for an SDPA-like kernel (torch's: ``is_causal`` is top-left, so a
        bottom-right causal case passes its causal mask in ``attn_mask`` instead)."""
        mask, causal = self.attn_mask, self.is_causal
        if causal and self.causal_alignment == "bottom_right":
            seq = -3 if self.layout == "bshd" else -2
            L, S = self.query.shape[seq], self.key.shape[seq]
            keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + (S - L)
            mask = keep if mask is None else mask & keep
            causal = False
        return dict(attn_mask=mask, is_causal=causal, scale=self.scale,
                    enable_gqa=self.enable_gqa)

    def torch(self, device: Any = None) -> tuple[Any, Any, Any, dict[str, Any]]:
        """(query, key, value, sdpa_kwargs) as torch tensors of the case's dtype."""
        try:
            import torch
        except ImportError as exc:  # pragma: no cover
            raise OptionalDependencyError("torch", "AttentionCase.torch", "torch") from exc
        dt = getattr(torch, get_format(self.query.dtype).name)

        def tt(a: np.ndarray) -> Any:
            # a stride-0 axis (tile_edges: K/V shared across the batch) stays one in
            # torch: the unique slice, expanded (as a kernel sees an .expand()ed cache)
            zero = [i for i, s in enumerate(a.strides) if s == 0 and a.shape[i] > 1]
            base = a[tuple(slice(0, 1) if i in zero else slice(None) for i in range(a.ndim))]
            t = torch.from_numpy(np.ascontiguousarray(base.astype(np.float32)))
            return t.to(dtype=dt, device=device).expand(*a.shape)

        kw = dict(self.sdpa_kwargs)
        if kw["attn_mask"] is not None:
            kw["attn_mask"] = torch.from_numpy(np.ascontiguousarray(kw["attn_mask"])).to(device)
        return tt(self.query), tt(self.key), tt(self.value), kw

    def __repr__(self) -> str:
        m = None if self.attn_mask is None else tuple(self.attn_mask.shape)
        return (f"AttentionCase(family={self.family!r}, dtype={self.query.dtype}, "
                f"query={tuple(self.query.shape)}, key={tuple(self.key.shape)}, "
                f"value={tuple(self.value.shape)}, attn_mask={m}, is_causal={self.is_causal}, "
                f"causal_alignment={self.causal_alignment!r}, scale={self.scale!r}, "
                f"enable_gqa={self.enable_gqa}, layout={self.layout!r}, seed={self.seed})")


# --------------------------------------------------------------------------------------
# Generation from a seed (numpy), the sizes drawn by hypothesis


@dataclass(frozen=True)
class _Draw:
    family: str
    B: int
    H: int
    rep: int          # GQA group size (1: none)
    L: int
    S: int
    E: int
    Ev: int
    seed: int
    option: int       # 0..5: the random option mix


def _np_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _build(d: _Draw, dtype: str, masked_rows: str, alignments: tuple[str, ...],
           layout: str = "bhsd") -> AttentionCase:
    fmt = get_format(dtype)
    dt = _np_dtype(fmt.name)
    rng = np.random.default_rng(d.seed)
    Hq = d.H * d.rep
    q = rng.standard_normal((d.B, Hq, d.L, d.E))
    k = rng.standard_normal((d.B, d.H, d.S, d.E))
    v = rng.standard_normal((d.B, d.H, d.S, d.Ev))
    mask: np.ndarray | None = None
    is_causal, align, scale = False, "top_left", None
    fam = d.family
    top = math.ldexp(1.0, fmt.emax)                       # keep inputs finite in dtype
    if fam == "near_ties":
        base = rng.standard_normal((d.B, d.H, 1, d.E))
        k = base + math.ldexp(1.0, -fmt.p) * rng.standard_normal((d.B, d.H, d.S, d.E))
    elif fam == "large_range":
        # scores up to a few hundred (and within the dtype: |q|, |k| below its range)
        g = min(float(rng.choice([4.0, 8.0, 16.0])), math.sqrt(top) / 8)
        q, k = q * g, k * g
    elif fam == "cancelling":
        half = (d.S + 1) // 2
        vv = 10.0 * rng.standard_normal((d.B, d.H, half, d.Ev))
        v = np.concatenate([vv, -vv], axis=-2)[..., :d.S, :]
        k = np.concatenate([k[..., :half, :], k[..., :half, :]], axis=-2)[..., :d.S, :]
    elif fam == "subnormal":
        tiny = math.ldexp(1.0, fmt.emin)                  # smallest normal of the dtype
        v = v * tiny * 4.0
        q = q * math.sqrt(tiny) * 4.0
    elif fam == "causal_rect":
        is_causal = True
        align = alignments[d.option % len(alignments)]
    elif fam == "llm_outliers":
        ch = rng.choice(d.E, size=min(3, d.E), replace=False)
        g = min(6.0, math.sqrt(top) / 8)
        q[..., ch] *= g
        k[..., ch] *= g
    elif fam == "shifted_values":
        v = v + 3.0
    elif fam == "fully_masked":
        mask = rng.random((d.L, d.S)) < 0.6
        mask[:, 0] = True
        mask[rng.integers(0, d.L)] = False                # at least one dead row
    if fam in ("random", "gqa", "long_rows", "cancelling", "near_ties", "large_range",
               "llm_outliers", "shifted_values"):
        opt = d.option
        if opt == 1:
            is_causal = True
            align = alignments[d.seed % len(alignments)]
        elif opt == 2:
            mask = rng.random((d.L, d.S)) < 0.7
            mask[:, 0] = True                            # no dead row outside its family
        elif opt == 3:
            scale = float(rng.choice([0.5, 0.125, 1.0, 2.0]))
        elif opt == 4:
            mask = rng.random((d.B, 1, d.L, d.S)) < 0.8  # broadcast over heads
            mask[..., 0] = True
    if is_causal and align == "bottom_right" and d.S < d.L:
        align = "top_left"          # bottom-right with S < L masks rows entirely
    arrs = []
    for n, a in enumerate((q, k, v)):
        x = np.clip(a, -top, top).astype(dt)
        if layout == "bshd":
            x = np.ascontiguousarray(np.swapaxes(x, -3, -2))
        if fam == "tile_edges" and n and x.shape[0] > 1:
            x = np.broadcast_to(x[:1], x.shape)   # stride 0 along the batch
        arrs.append(x)
    return AttentionCase(arrs[0], arrs[1], arrs[2], attn_mask=mask, is_causal=is_causal,
                         scale=scale, enable_gqa=d.rep > 1, causal_alignment=align,
                         masked_rows=masked_rows, family=fam, seed=d.seed, layout=layout)


def attention_inputs(
    dtype: Any = "float32",
    *,
    max_len: int = 16,
    max_keys: int = 4096,
    max_dim: int = 64,
    max_batch: int = 2,
    max_heads: int = 3,
    families: Any = None,
    masked_rows: str = "zero",
    causal_alignment: str = "both",
    layout: str = "bhsd",
) -> Any:
    """A hypothesis strategy of :class:`AttentionCase` in ``dtype`` (float64, float32,
    float16, bfloat16; numpy, ml_dtypes or torch dtype, or a name).

    ``max_len``: the largest L and S of ordinary cases; ``max_keys``: the largest S of
    the ``"long_rows"`` family (its L is 1-4); ``max_dim``: the largest E and E_v;
    ``families``: a subset of :data:`FAMILIES` (default all); ``masked_rows``: the
    policy the cases are judged under (torch: ``"zero"``, JAX: ``"uniform"``);
    ``causal_alignment``: ``"top_left"`` (torch), ``"bottom_right"`` (FlashAttention)
    or ``"both"``; ``layout``: ``"bhsd"`` (SDPA) or ``"bshd"`` (FlashAttention's
    (B, S, H, D); the case's ``options`` carry it to the comparison).

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=5, deadline=None)
    ... @given(attention_inputs(dtype="float16", max_keys=64))
    ... def check(case):
    ...     assert case.query.dtype == "float16" and case.key.shape[-2] <= 64
    >>> check()
    """
    fmt = get_format(dtype)
    check_layout(layout)
    fams = tuple(FAMILIES) if families is None else tuple(families)
    for f in fams:
        if f not in FAMILIES:
            raise SpecError(f"families={families!r}: {f!r} is not a family: expected some "
                            f"of {tuple(FAMILIES)}")
    if not fams:
        raise SpecError("families=() is empty: expected at least one family")
    for name, val, lo in (("max_len", max_len, 1), ("max_keys", max_keys, 1),
                          ("max_dim", max_dim, 1), ("max_batch", max_batch, 1),
                          ("max_heads", max_heads, 1)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise SpecError(f"{name}={val!r} must be an integer >= {lo}")
    aligns = {"both": ("top_left", "bottom_right"), "top_left": ("top_left",),
              "bottom_right": ("bottom_right",)}.get(causal_alignment)
    if aligns is None:
        raise SpecError(f"causal_alignment={causal_alignment!r}: expected 'top_left', "
                        "'bottom_right' or 'both'")

    @st.composite
    def draw(draw_: Any) -> AttentionCase:
        fam = draw_(st.sampled_from(fams))
        B = draw_(st.integers(1, max_batch))
        H = draw_(st.integers(1, max_heads))
        rep = draw_(st.integers(2, 3)) if fam == "gqa" else 1
        if fam in ("long_rows", "llm_outliers", "shifted_values"):
            L = draw_(st.integers(1, 4))
            S = draw_(st.integers(min(max_keys, max(2 * max_len, 256)), max_keys))
        elif fam == "tile_edges":
            edges = [t + d for t in (16, 32, 64, 128, 256, 512) for d in (-1, 0, 1)
                     if t + d <= max_keys] or [max_keys]
            L = draw_(st.integers(1, min(4, max_len)))
            S = draw_(st.sampled_from(edges))
        else:
            L = draw_(st.integers(1, max_len))
            S = draw_(st.integers(1, max_len))
            if fam == "causal_rect" and L == S:
                S = S - 1 if S > 1 else S + 1     # L != S (S = 2 when max_len = 1)
        E = draw_(st.integers(1, max_dim))
        Ev = draw_(st.one_of(st.just(E), st.integers(1, max_dim)))
        option = draw_(st.integers(0, 5))
        seed = draw_(st.integers(0, 2**32 - 1))
        return _build(_Draw(fam, B, H, rep, L, S, E, Ev, seed, option), fmt.name,
                      masked_rows, aligns, layout)

    return draw()
