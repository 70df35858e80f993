"""The two levels of a verdict (issue 22), beside :mod:`.compare`: the certified model
(beyond it an output is certainly wrong) and the dtype level of :mod:`.emulated`
(beyond it the error exceeds DTYPE_FACTOR × what correct kernels of that precision
make on these inputs); the dtype the inputs promise; the precision bug classes as
diagnoses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import SpecError
from ...oracle.variants.registry import emulated_inputs
from ...oracle.variants.semantics import Geometry
from ..call import AttentionCall
from ..tolerance import ErrorModel, format_of
from .emulated import DTYPE_FACTOR, DtypeLevel, dtype_level
from .precision_bugs import precision_bugs

__all__: list[str] = []

#: FlashAttention's multiple of a plain same-dtype kernel's error (rule="flash")
DEFAULT_FLASH_FACTOR = 2.0


def dtype_factor(rule: str, factor: float | None) -> float:
    """The dtype level's factor: ``factor=`` with rule='model', the default otherwise
    (rule='flash' takes ``factor`` for its own plain-kernel multiple)."""
    return float(factor) if rule == "model" and factor is not None else DTYPE_FACTOR


@dataclass
class TwoLevels:
    """The tolerance of rule='model' (and the floor of rule='flash') from both levels:
    the certified model (``model_tol``: beyond it an output is certainly wrong) and
    the dtype level (``dtype_tol``: beyond it the error exceeds DTYPE_FACTOR × what
    correct kernels of that precision make on these inputs)."""

    tol: np.ndarray
    vacuous: np.ndarray
    model_tol: np.ndarray
    dtype_tol: np.ndarray
    undecided: np.ndarray
    level: DtypeLevel
    factor: float
    worst: float

    def rule_line(self, model_line: str) -> str:
        fmt = self.level.model.fmt.name
        return (f"two levels: certainly wrong beyond the {model_line}; wrong for "
                f"{fmt} beyond {self.factor:g} × the error of correct {fmt} kernels "
                f"emulated on these inputs ({', '.join(self.level.names)}; the worst "
                f"{self.worst:.3g}) + an ulp floor")

    def levels_note(self, a: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> str:
        with np.errstate(invalid="ignore"):
            a64 = np.asarray(a, np.float64)
            dist = np.maximum(np.maximum(a64 - upper, lower - a64), 0.0)
            fin = np.isfinite(dist)
            certain = int(np.sum(fin & (dist > self.model_tol) & ~self.vacuous))
            dtype_only = int(np.sum(fin & (dist > self.dtype_tol) & ~self.undecided)) - certain
        fmt = self.level.model.fmt.name
        return (f"levels: {certain} element(s) certainly wrong (beyond the bound of every "
                f"correct kernel), {max(dtype_only, 0)} more wrong for {fmt} (errors over "
                f"{self.factor:g} × those of correct {fmt} kernels on these inputs)")


def variant_dtype_level(x: AttentionCall, vp: Any, model: ErrorModel) -> DtypeLevel | None:
    """The dtype level of a call with variants that only keep keys or rotate q and k
    (:func:`mha_symbolic.oracle.variants.registry.emulated_inputs`): the plain
    emulations of :func:`.emulated.dtype_level` on the kept keys as a boolean mask, on
    q and k as each correct kernel rotates them (HF's rotation in the output dtype,
    FlashAttention's in float32), their outputs pooled into one level.  None for the
    other variants (score pipelines, sinks, FP8 descale): the model alone judges
    those.  ``vp``: the call's float64 evaluation
    (:func:`.bugs_variants.plain_variant`), or a bug class's: then the emulated kernels
    are that bug's (its scale, kept keys, v and rotation switches), the level a correct
    implementation of the bug is judged at."""
    L, E = vp.q.shape[-2:]
    lead = tuple(vp.q.shape[:-2])
    S = vp.allowed.shape[-1]
    if vp.rotation_inputs is not None:
        q = vp.rotation_inputs[0].reshape(*lead, L, E)
        k = vp.rotation_inputs[1].reshape(*lead, S, E)
    else:
        q, k = vp.q, np.broadcast_to(vp.k, (*lead, S, E))
    off = 0 if x.causal_alignment == "top_left" else S - L
    geo = Geometry(lead, lead[-1] if lead else 1, L, S, off)
    # a bug's rotation (``vp.rotate_changes``): the kernels implementing that bug, v
    # rotated as a key by each of them where the bug rotates v too (``on_v``)
    changes = dict(vp.rotate_changes or {})
    on_v = bool(changes.pop("on_v", False))
    inputs = emulated_inputs(vp.opts, geo, q, k, model.fmt.name, changes)
    if inputs is None:
        return None
    keep = vp.allowed if vp.uniform is None else vp.allowed & ~vp.uniform[..., None]
    mask: np.ndarray = keep
    if x.attn_mask is not None and x.attn_mask.dtype != np.bool_:
        mask = np.where(keep, x.attn_mask, -np.inf)
    v = np.broadcast_to(vp.v, (*lead, S, vp.v.shape[-1]))
    vs = [v] * len(inputs)
    if on_v and vp.v_unrotated is not None:
        v0 = np.broadcast_to(vp.v_unrotated, (*lead, S, E))
        rotated = emulated_inputs(vp.opts, geo, q, v0, model.fmt.name, changes)
        assert rotated is not None
        vs = [np.asarray(ve) for _, _, ve in rotated]
    levels = []
    for (name, qe, ke), v in zip(inputs, vs, strict=True):
        xe = AttentionCall(np.asarray(qe), np.asarray(ke), v, attn_mask=mask, scale=vp.scale,
                           masked_rows=x.masked_rows, in_format=x.in_format)
        lev = dtype_level(xe, model)
        if lev is None:
            return None
        levels.append((name, lev))
    first = levels[0][1]
    outputs = tuple(o for _, lev in levels for o in lev.outputs)
    names = tuple(f"{n}: {m}" if n else m for n, lev in levels for m in lev.names)
    return DtypeLevel(outputs, first.a, first.groups, first.shape, model, names, first.a2,
                      first.u_p, first.vmax, first.n_keys)


def two_levels(level: DtypeLevel, mid: np.ndarray, tol: np.ndarray, vacuous: np.ndarray,
                rule: str, factor: float | None, plain_err: float | None) -> TwoLevels:
    f = dtype_factor(rule, factor)
    dtol, und, worst = level.tolerance(mid, f)
    both = np.where(und, tol, np.minimum(tol, dtol))
    if rule == "flash":   # FlashAttention's multiple, never below the two levels
        assert plain_err is not None
        fl = DEFAULT_FLASH_FACTOR if factor is None else factor
        both = np.where(und, tol, np.maximum(fl * plain_err, np.minimum(tol, dtol)))
    return TwoLevels(both, vacuous & und, tol, dtol, und, level, f, worst)


def fmt_name(x: Any) -> str | None:
    """The float format of an array-like's dtype, None for lists and scalars."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    try:
        return format_of(dt).name
    except SpecError:
        return None


def dtype_promise(actual: Any, inputs: tuple[Any, ...], out_dtype: Any,
                   fp8: bool) -> str:
    """'' when the output's dtype is the one promised, else the problem in words: the
    inputs' common format (when every input is an array of one float format) or
    ``out_dtype=``, when given.  fp8 inputs promise no output format (FlashAttention-3
    returns bf16 or fp16)."""
    got = fmt_name(actual)
    if out_dtype is not None:
        want = format_of(out_dtype).name
        if got is not None and got != want:
            return f"output dtype {got}, but out_dtype={want} was stated"
        return ""
    if fp8 or got is None:
        return ""
    names = {fmt_name(x) for x in inputs}
    if None in names or len(names) != 1:
        return ""
    want = str(next(iter(names)))
    if got == want:
        return ""
    return (f"output dtype {got} for {want} inputs: a kernel returns its inputs' dtype "
            f"(state out_dtype={got!r} if that is the kernel's contract)")


def precision_candidates(a: np.ndarray, x: AttentionCall, mid: np.ndarray,
                         model: ErrorModel, query: Any, key: Any, value: Any,
                         dtype_tol: np.ndarray) -> list[tuple[str, str, float, bool]]:
    """(name, description, ratio, explains) of the precision bugs that explain ``a``
    or whose error has its size, at most three, best first."""
    ins = {n for n in (fmt_name(query), fmt_name(key), fmt_name(value)) if n}
    found = precision_bugs(a, x, mid, model.fmt.name, ins, dtype_tol)
    return [(f.name, f.description, f.ratio, f.explains) for f in found[:3]]
