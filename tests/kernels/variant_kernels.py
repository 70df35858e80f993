"""Attention implementations with variants, for the evaluation of the testing tool:
correct ones (as FlashAttention's ``attention_ref``, gpt-oss's ``sdpa``, FA3's FP8
reference would compute them) and one mutant per bug class of the variant catalogue.

Written independently of ``mha_symbolic`` (it imports nothing from it): torch in
float32 from inputs of any dtype, the output cast to ``out_dtype``.  Used by
tests/testing/forward/test_compare_variants.py and bench/bench_variants.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

BUGS = (
    "window_left_off_by_one_wide", "window_left_off_by_one_narrow",
    "window_right_off_by_one_wide", "window_right_off_by_one_narrow", "window_misaligned",
    "softcap_before_scale", "softcap_after_mask", "softcap_missing", "alibi_sign_flipped",
    "alibi_slopes_reversed", "alibi_misaligned", "alibi_missing", "sinks_ignored",
    "sink_in_numerator", "q_descale_missing", "k_descale_missing", "v_descale_missing",
    "descale_missing", "descale_applied_twice",
)


def reference_like(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   out_dtype: torch.dtype, scale: float | None = None, causal: bool = False,
                   align: str = "top_left", window: tuple[int, int] | None = None,
                   softcap: float | None = None, alibi: torch.Tensor | None = None,
                   sinks: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                   descale: tuple[Any, Any, Any] | None = None,
                   p_dtype: torch.dtype | None = None, bug: str | None = None) -> torch.Tensor:
    """(B, H, L, E) attention in float32 with the variants; ``bug`` makes a mutant.

    Window as FlashAttention's construct_local_mask (bottom-right when align says so),
    softcap after the scale and before the masks, ALiBi -slope·|i + off - j| after the
    softcap, sinks as gpt-oss (softmax over cat([scores, sink]) with the sink column
    dropped), descale as FA3's attention_ref (q·dq, k·dk, v·dv, factors (B, H)),
    ``p_dtype``: the unnormalised weights rounded to it before P·V (FA3 FP8)."""
    B, H, L, E = q.shape
    S = k.shape[2]
    qf, kf, vf = q.float(), k.float(), v.float()
    if descale is not None:
        dq, dk, dv = descale
        pw = {"q_descale_missing": (0, 1, 1), "k_descale_missing": (1, 0, 1),
              "v_descale_missing": (1, 1, 0), "descale_missing": (0, 0, 0),
              "descale_applied_twice": (2, 2, 2)}.get(bug or "", (1, 1, 1))
        qf = qf * (dq ** pw[0])[:, :, None, None]
        kf = kf * (dk ** pw[1])[:, :, None, None]
        vf = vf * (dv ** pw[2])[:, :, None, None]
    c = 1.0 / math.sqrt(E) if scale is None else scale
    raw = qf @ kf.transpose(-1, -2)
    if softcap is not None and bug == "softcap_before_scale":
        s = torch.tanh(raw / softcap) * softcap * c
    else:
        s = raw * c
        if softcap is not None and bug not in ("softcap_missing", "softcap_after_mask"):
            s = torch.tanh(s / softcap) * softcap
    off = 0 if align == "top_left" else S - L
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal:
        allowed &= j <= i + off
    if window is not None:
        left, right = window
        woff = (S - L) - off if bug == "window_misaligned" else off
        left += {"window_left_off_by_one_wide": 1, "window_left_off_by_one_narrow": -1}.get(
            bug or "", 0)
        right += {"window_right_off_by_one_wide": 1, "window_right_off_by_one_narrow": -1}.get(
            bug or "", 0)
        if window[0] >= 0:
            allowed &= j >= i + woff - left
        if window[1] >= 0:
            allowed &= j <= i + woff + right
    allowed = allowed.expand(B, H, L, S)
    if keep is not None:
        allowed = allowed & keep
    if alibi is not None and bug != "alibi_missing":
        sl = alibi.float().expand(B, H)
        if bug == "alibi_slopes_reversed":
            sl = sl.flip(-1)
        if bug == "alibi_sign_flipped":
            sl = -sl
        aoff = (S - L) - off if bug == "alibi_misaligned" else off
        s = s - sl[:, :, None, None] * (i + aoff - j).abs().float()
    if softcap is not None and bug == "softcap_after_mask":
        s = torch.where(allowed, s, torch.tensor(-math.inf))
        s = torch.tanh(s / softcap) * softcap
        allowed = torch.ones_like(allowed)
    s = torch.where(allowed, s, torch.tensor(-math.inf))
    if sinks is not None and bug != "sinks_ignored":
        sk = sinks.float().view(1, H, 1, 1).expand(B, H, L, 1)
        top = torch.maximum(s.amax(-1, keepdim=True), sk)
        e = torch.exp(s - top)
        es = torch.exp(sk - top)
        den = e.sum(-1, keepdim=True) + es
        if bug == "sink_in_numerator":
            e = torch.where(allowed, e + es, torch.zeros(()))
        pt, norm = e, den
    else:
        top = s.amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros(()))
        pt = torch.exp(s - top)
        norm = pt.sum(-1, keepdim=True)
    if p_dtype is not None:
        pt = pt.to(p_dtype).float()
    norm = torch.where(norm == 0, torch.ones(()), norm)
    out = (pt @ vf) / norm
    return out.to(out_dtype)


def alibi_bias(slopes: torch.Tensor, L: int, S: int, align: str = "top_left") -> torch.Tensor:
    """The ALiBi float mask -slope·|i + off - j| of shape (H, L, S)."""
    off = 0 if align == "top_left" else S - L
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    return -slopes.float()[:, None, None] * (i + off - j).abs().float()


def window_mask(L: int, S: int, window: tuple[int, int], causal: bool = False,
                align: str = "top_left") -> torch.Tensor:
    off = 0 if align == "top_left" else S - L
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    m = torch.ones(L, S, dtype=torch.bool)
    if window[0] >= 0:
        m &= j >= i + off - window[0]
    if window[1] >= 0:
        m &= j <= i + off + window[1]
    if causal:
        m &= j <= i + off
    return m
