"""Sliding window (FlashAttention's ``window_size``): query i sees keys j with
-left <= j - (i + off) <= right (off = 0 top-left, S - L bottom-right); -1 is
unbounded; ``is_causal`` caps the right edge at 0."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import SpecError
from .protocol import Variant, VariantOptions, register
from .semantics import Geometry, window_allowed


def _window(window: Any) -> dict[str, Any]:
    if window is None:
        return {}
    if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
        raise SpecError(f"window={window!r}: expected (left, right) with integers >= 0 or -1 "
                        "(unbounded), FlashAttention's window_size")
    out: list[int | None] = []
    for side, w in zip(("left", "right"), window, strict=True):
        if w is None:
            out.append(None)
            continue
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
            raise SpecError(f"window={tuple(window)!r}: {side}={w!r} is not an integer")
        if w < -1:
            raise SpecError(f"window={tuple(window)!r}: {side}={w} must be >= 0, or -1 for "
                            "unbounded")
        # a window wider than any sequence is unbounded in effect; 2**62 keeps the
        # integer comparisons inside int64
        out.append(None if w == -1 else min(int(w), 2**62))
    if out == [None, None]:
        return {}
    return {"window": (out[0], out[1])}


def _keep(opts: VariantOptions, geo: Geometry, is_causal: bool) -> Any:
    return window_allowed(opts.window, is_causal, geo)


WINDOW = register(Variant(
    name="window", keywords=("window",), fields={"window": None}, parse=_window,
    summary="sliding window (left, right), FlashAttention's window_size",
    keep=_keep, bugs=("window_left_off_by_one_wide", "window_left_off_by_one_narrow",
          "window_right_off_by_one_wide", "window_right_off_by_one_narrow",
          "window_misaligned")))
