"""Logit softcapping (Gemma 2, FlashAttention's ``softcap``): s -> C·tanh(s/C) after
the scale, before the masks and biases; 0 is off."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import InputValueError, SpecError
from .protocol import BugClass, Variant, VariantOptions, register
from .semantics import Cap, Geometry


def _softcap(softcap: Any) -> dict[str, Any]:
    if softcap is None:
        return {}
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.floating,
                                                              np.integer)):
        raise SpecError(f"softcap={softcap!r}: expected a real number (0 = off)")
    cf = float(softcap)
    if not math.isfinite(cf) or cf < 0:
        raise InputValueError(f"softcap={softcap!r}: expected a finite number >= 0 "
                              "(0 = off, as FlashAttention)")
    return {"softcap": cf} if cf > 0 else {}


def _scores(opts: VariantOptions, geo: Geometry) -> tuple[Cap, ...]:
    return (Cap(opts.softcap),)


#: where ``softcap_mode`` puts the cap in the testing side's float64 evaluation
_STAGES = {"right": "scores", "before_scale": "unscaled", "after_mask": "masked"}


def _plain_scores(opts: VariantOptions, geo: Geometry, *, softcap_mode: str = "right"
                  ) -> tuple[tuple[str, Cap], ...]:
    """The testing side's cap (``plain_scores``): after the scale (right), before it, after
    the masks, or not at all (``softcap_mode="none"``)."""
    if softcap_mode == "none":
        return ()
    return ((_STAGES[softcap_mode], Cap(opts.softcap)),)


def _has_cap(x: Any) -> bool:
    return x.opts.softcap is not None


def _cap_and_mask(x: Any) -> bool:
    # a mask of any kind: causal, the user's, the kept-key variants' (in the call's
    # mod_keep, or kept by the testing side itself: plain_keep)
    return _has_cap(x) and (x.is_causal or x.mod_keep is not None or x.attn_mask is not None
                            or any(v.plain_keep is not None for v in x.opts.active()))


_BUGS = (
    BugClass("softcap_before_scale", "softcap applied before the scale: "
             "c·C·tanh(q·k/C) instead of C·tanh(c·q·k/C)", _has_cap,
             lambda x: {"softcap_mode": "before_scale"}),
    BugClass("softcap_after_mask", "softcap applied after the mask: masked scores "
             "-inf become -C and the masked keys take part", _cap_and_mask,
             lambda x: {"softcap_mode": "after_mask"}),
    BugClass("softcap_missing", "softcap not applied", _has_cap,
             lambda x: {"softcap_mode": "none"}),
)

def _has_plain_cap(x: Any) -> bool:
    # the lowered problem's cap (softcap= or a softcap score_mod applied first)
    return x.opts.has_cap


_BACKWARD_BUGS = (
    BugClass("softcap_derivative_missing",
             "softcap's derivative 1 − tanh²(s/C) left out: dQ, dK take dS' = "
             "P ∘ (dP − D) of the capped scores", _has_plain_cap,
             lambda x: {"softcap_derivative": False}),
)

SOFTCAP = register(Variant(
    name="softcap", keywords=("softcap",), fields={"softcap": None}, parse=_softcap,
    summary="softcap C: s -> C·tanh(s/C) after the scale", scores=_scores, order=10,
    transcendental=lambda opts: opts.softcap is not None,
    bugs=_BUGS, plain_scores=_plain_scores,
    backward_bugs=_BACKWARD_BUGS,
    cap_of=lambda opts: None if opts.softcap is None else float(opts.softcap),
    cap_keywords=lambda C: {"softcap": C}))
