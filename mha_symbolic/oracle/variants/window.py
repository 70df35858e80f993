"""Sliding window (FlashAttention's ``window_size``): query i sees keys j with
-left <= j - (i + off) <= right (off = 0 top-left, S - L bottom-right); -1 is
unbounded; ``is_causal`` caps the right edge at 0."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ...errors import SpecError
from .protocol import BugClass, Variant, VariantOptions, lengths_differ, register
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


def _win(x: Any) -> tuple[int | None, int | None]:
    w = x.opts.window
    return w if w is not None else (None, None)


def _shift(side: int, d: int) -> Any:
    """The window with one edge moved by d keys (the edge is bounded: see _has_side)."""
    def make(x: Any) -> dict[str, Any]:
        w = list(_win(x))
        w[side] = int(w[side] or 0) + d
        return {"window": (w[0], w[1])}
    return make


def _has_side(side: int, positive: bool = False) -> Any:
    def test(x: Any) -> bool:
        w = _win(x)[side]
        return w is not None and (w > 0 or not positive)
    return test


def _plain_keep(opts: VariantOptions, *, window: Any = None,
                flip_window_alignment: bool = False) -> tuple[Any, bool]:
    """The testing side's float64 kept keys (``plain_keep``): the window, or ``window``
    (the off-by-one bug classes' edges), causal apart, and whether it is measured from
    the other corner (``flip_window_alignment``)."""
    win = opts.window if window is None else window
    return partial(window_allowed, win, False), flip_window_alignment


_BUGS = (
    BugClass("window_left_off_by_one_wide",
             "sliding window one key too wide on the left (sees key i - left - 1)",
             _has_side(0), _shift(0, 1)),
    BugClass("window_left_off_by_one_narrow",
             "sliding window one key too narrow on the left (misses key i - left)",
             _has_side(0, True), _shift(0, -1)),
    BugClass("window_right_off_by_one_wide",
             "sliding window one key too wide on the right (sees key i + right + 1)",
             _has_side(1), _shift(1, 1)),
    BugClass("window_right_off_by_one_narrow",
             "sliding window one key too narrow on the right (misses key i + right)",
             _has_side(1, True), _shift(1, -1)),
    BugClass("window_misaligned",
             "sliding window aligned to the other corner (top-left vs bottom-right, "
             "FlashAttention aligns bottom-right; in a KV-cache decode, to the cache's "
             "end instead of each sequence's valid length)",
             lambda x: x.opts.window is not None and lengths_differ(x),
             lambda x: {"flip_window_alignment": True}),
)

_BACKWARD_BUGS = (
    BugClass("window_missing_in_backward", "sliding window not applied when the "
             "backward recomputes P = exp(S − lse)", lambda x: x.opts.window is not None,
             lambda x: {"variant_changes": {"window": None}}),
)

WINDOW = register(Variant(
    name="window", keywords=("window",), fields={"window": None}, parse=_window,
    summary="sliding window (left, right), FlashAttention's window_size",
    keep=_keep, bugs=_BUGS, positional=lambda opts: True, plain_keep=_plain_keep,
    backward_bugs=_BACKWARD_BUGS))
