"""Precision bugs: a kernel that promises a format and computes part of the work in
a narrower one (issue 22).

Each class is a kernel of the promised format with one step done in less precision:
P rounded to float16 or bfloat16 before P·V, K and V stored in float16/bfloat16 (a KV
cache), the scores or the scale held in bfloat16, the matmuls in TF32, everything
computed in bfloat16 or float16 and returned in the promised format.  Their errors are
rounding errors, not formulas: a kernel with the same bug rounds at other places (the
unnormalised weights rather than the normalised ones, another summation order), so
its output is not the emulated one but has an error *of the same size*.  A class is
named when the emulated variant explains the actual output (its distance to the
actual is at most half the actual's error: a deterministic rounding such as a KV cache
or TF32 operands), or, said as such, when its error has the actual's size (within a
factor :data:`SAME_SIZE`) while correct kernels of the promised format err far less.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...oracle.arith.formats import get_format
from ..call import AttentionCall
from .emulated import exp_shifted, normalised, store
from .plain import Chunk, Plain

__all__ = ["SAME_SIZE", "PrecisionBug", "PrecisionFinding", "precision_bugs", "round_tf32"]

#: An actual error within this factor of a variant's error (either way) has its size.
SAME_SIZE = 3.0

_F32 = np.dtype(np.float32)


def round_tf32(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 stored significand bits; nearest, ties to
    even), as float32.

    >>> float(round_tf32(np.array([1 + 2**-11 + 2**-20], np.float32))[0]) == 1 + 2**-10
    True
    """
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    with np.errstate(over="ignore"):
        r = (b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    fin = np.isfinite(np.asarray(a, np.float32))
    return np.where(fin, r.view(np.float32), np.asarray(a, np.float32))


@dataclass(frozen=True)
class PrecisionBug:
    name: str
    description: str
    inputs: str | None = None     # q, k, v rounded to this format first
    kv: str | None = None         # k and v only
    scores: str | None = None     # the scaled scores rounded to this format
    scale: str | None = None      # the scale rounded to this format
    weights: str | None = None    # P rounded to this format before P·V
    tf32: bool = False            # both matmuls' operands rounded to TF32
    work: str | None = None       # every product and sum in this format


_LOW = ("float16", "bfloat16")
PRECISION_BUGS: tuple[PrecisionBug, ...] = (
    *(PrecisionBug(f"computed_in_{f}", f"computed in {f} (inputs, scores and weights "
                   f"stored in {f}) and returned in the promised format", inputs=f,
                   scores=f, weights=f) for f in _LOW),
    *(PrecisionBug(f"p_{f}_before_pv", f"the weights P rounded to {f} before P·V",
                   weights=f) for f in _LOW),
    *(PrecisionBug(f"kv_cache_{f}", f"K and V stored in {f} (a {f} KV cache)", kv=f)
      for f in _LOW),
    PrecisionBug("scores_bfloat16", "the scaled scores held in bfloat16", scores="bfloat16"),
    PrecisionBug("scale_bfloat16", "the softmax scale held in bfloat16", scale="bfloat16"),
    PrecisionBug("tf32_matmuls", "matmuls in TF32 (torch.backends.cuda.matmul.allow_tf32 "
                 "left on): operands rounded to 10 significand bits", tf32=True),
    PrecisionBug("computed_in_float32", "computed in float32 and returned in float64",
                 work="float32"),
    PrecisionBug("scores_in_output_dtype", "the scores rounded to the output dtype after "
                 "q·kᵀ and after the scale, P stored in it (an op-by-op kernel, "
                 "softmax(q @ k.T * c) @ v): if that is the kernel, state kernel='eager'",
                 scores="output", weights="output"),
)


@dataclass(frozen=True)
class PrecisionFinding:
    name: str
    description: str
    explains: bool       # the variant's output is within half the actual error of it
    ratio: float         # actual error / the variant's error (max over elements)


def _rnd(a: np.ndarray, fmt: str | None, wk: np.dtype) -> np.ndarray:
    return a if fmt is None else store(a, get_format(fmt).numpy_dtype(), wk)


def _run_chunk(ch: Chunk, bug: PrecisionBug, wk: np.dtype, out_fmt: str) -> np.ndarray:
    if "output" in (bug.scores, bug.weights):
        bug = replace(bug, scores=out_fmt if bug.scores == "output" else bug.scores,
                      weights=out_fmt if bug.weights == "output" else bug.weights)
    with np.errstate(over="ignore", invalid="ignore"):
        q, k, v = (_rnd(a.astype(wk), bug.inputs, wk) for a in (ch.q, ch.k, ch.v))
    k, v = _rnd(k, bug.kv, wk), _rnd(v, bug.kv, wk)
    c = _rnd(np.asarray(ch.scale, wk), bug.scale, wk)
    mm = (lambda a, b: round_tf32(a) @ round_tf32(b)) if bug.tf32 else (lambda a, b: a @ b)
    allowed = ch.allowed
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        s = mm(q, k.T).astype(wk)
        if bug.scores is not None and bug.weights is not None:   # op by op: stored twice
            s = _rnd(s, bug.scores, wk)
        s = (s * c).astype(wk)
        if ch.mask_add is not None:
            s = s + ch.mask_add.astype(wk)
        s = _rnd(s, bug.scores, wk)
        if ch.uniform is not None and np.any(ch.uniform):
            allowed = allowed | ch.uniform[:, None]
            s = np.where(ch.uniform[:, None], wk.type(0), s)
        s = np.where(allowed, s, wk.type(-np.inf)).astype(wk)
        if s.shape[-1] == 0:
            return np.zeros((s.shape[0], v.shape[1]))
        e = exp_shifted(s, allowed, wk)
        p = normalised(e, np.sum(e, axis=-1, keepdims=True), wk)
        if ch.kappa is not None:
            p = (p * ch.kappa.astype(wk)).astype(wk)
        p = _rnd(p, bug.weights, wk)
        return np.asarray(mm(p, v), np.float64)


def _applies(bug: PrecisionBug, out_fmt: str, in_fmts: set[str]) -> bool:
    """A bug narrows a format the kernel promises: float32 outputs for every class but
    the float64 one, float64 outputs for that one; inputs already in the narrow format
    make its rounding a no-op."""
    if bug.work is not None:
        return out_fmt == "float64"
    if "output" in (bug.scores, bug.weights):
        return out_fmt in _LOW
    if out_fmt != "float32":
        return False
    narrow = bug.inputs or bug.kv
    return narrow is None or narrow not in in_fmts


def precision_bugs(actual: np.ndarray, x: AttentionCall, mid: np.ndarray,
                   out_fmt: str, in_fmts: set[str], dtype_tol: np.ndarray
                   ) -> tuple[PrecisionFinding, ...]:
    """The precision classes that explain ``actual`` or whose error has its size
    (explaining ones first, then by closeness of size), among the variants whose
    own error exceeds the dtype tolerance (a variant a correct kernel could pass for
    says nothing)."""
    a = np.asarray(actual, np.float64)
    with np.errstate(invalid="ignore"):
        fin = np.isfinite(a) & np.isfinite(mid)
        if not np.any(fin):
            return ()
        e_act = float(np.max(np.abs(a - mid)[fin]))
    if e_act == 0:
        return ()
    found: list[PrecisionFinding] = []
    pl = Plain(x)
    lay = pl.layout
    for bug in PRECISION_BUGS:
        if not _applies(bug, out_fmt, in_fmts):
            continue
        wk = np.dtype(bug.work) if bug.work else _F32
        flat = np.zeros((lay.B, lay.L, lay.Ev))
        for ch in pl.chunks():
            flat[ch.b, ch.rows] = _run_chunk(ch, bug, wk, out_fmt)
        out = flat.reshape(pl.shape)
        with np.errstate(invalid="ignore"):
            ok = fin & np.isfinite(out)
            if not np.any(ok):
                continue
            dev = np.abs(out - mid)
            if not np.any(dev[ok] > dtype_tol[ok]):
                continue
            e_bug = float(np.max(dev[ok]))
            d = float(np.max(np.abs(a - out)[ok]))
        explains = d <= 0.5 * e_act
        ratio = e_act / e_bug if e_bug > 0 else np.inf
        if explains or 1 / SAME_SIZE <= ratio <= SAME_SIZE:
            found.append(PrecisionFinding(bug.name, bug.description, explains, ratio))
    found.sort(key=lambda f: (not f.explains, abs(np.log(f.ratio))))
    return tuple(found)
