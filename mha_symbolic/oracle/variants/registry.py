"""The registered variants (the one list of them) and what the doors and the
lowering ask of them all: :func:`variant_options` reads the variant keywords of a
call, :func:`score_pipeline`, :func:`kept`, :func:`sink_logits` and
:func:`exact_inputs` compose the registered variants' contributions.  A new variant
is a module of this package calling :func:`.protocol.register`, imported below."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np

from ..._text import echo
from ...errors import SpecError, UnknownOptionError
from ..inputs import to_float64
from . import alibi, chunk, flex, fp8, kvcache, rotary, score_mod, sinks, softcap, window  # noqa: F401  (registration)
from .protocol import (
    GradParam,
    Variant,
    VariantOptions,
    keyword_owner,
    own_key_origins,
    own_query_offsets,
    registered,
)
from .semantics import Bias, Cap, Geometry

__all__ = [
    "VariantOptions",
    "backward_bug_classes",
    "bug_classes",
    "cap_keywords",
    "emulated_inputs",
    "grad_params",
    "kept",
    "per_sequence",
    "plain_cap",
    "plain_rotation",
    "refuse_backward_check",
    "require_gradients",
    "rotation",
    "score_pipeline",
    "sdpa_variant_options",
    "sink_logits",
    "variant_keywords",
    "variant_options",
    "with_variant_keywords",
]


def variant_keywords() -> tuple[str, ...]:
    """Every door keyword a registered variant takes, in registration order."""
    return tuple(kw for v in registered() for kw in v.keywords)


F = TypeVar("F", bound=Callable[..., Any])


def with_variant_keywords(fn: F) -> F:
    """Show the registered variants' keywords in ``fn``'s signature (help(), IDEs) in
    place of ``**variants``."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params += [inspect.Parameter(kw, inspect.Parameter.KEYWORD_ONLY, default=None)
               for kw in variant_keywords()]
    fn.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return fn


def split_variant_keywords(options: dict[str, Any], *, door: Callable[..., Any] | str) -> None:
    """Refuse keywords no variant takes, as Python would (``door() got an unexpected
    keyword argument``), the name echoed safely, with the closest of the door's own
    keywords (``door`` a function: its signature's; a name: the variants')."""
    for kw in options:
        if keyword_owner(kw) is None:
            if isinstance(door, str):
                name, known = door, list(variant_keywords())
            else:
                name = door.__name__
                known = [p for p in inspect.signature(door).parameters]
            close = difflib.get_close_matches(kw, sorted(set(known)), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise UnknownOptionError(f"{name}() got an unexpected keyword argument "
                                     f"{echo(kw, 60)}{hint}")


def variant_options(**options: Any) -> VariantOptions | None:
    """The validated options, or None when no variant is asked for.

    >>> variant_options() is None
    True
    >>> variant_options(window=(2, 0)).window
    (2, 0)
    """
    split_variant_keywords(options, door="variant_options")
    fields: dict[str, Any] = {}
    for v in registered():
        given = {kw: options[kw] for kw in v.keywords if kw in options}
        if given and any(x is not None for x in given.values()):
            fields.update(v.parse(**given))
    opts = VariantOptions(**fields)
    return None if opts.empty else opts


def sdpa_variant_options(dropout_p: Any, dropout_mask: Any, **options: Any
                         ) -> VariantOptions | None:
    """:func:`variant_options` for ``reference_attention`` and its backward, which
    refuse dropout together with a variant.

    >>> sdpa_variant_options(0.0, None, window=None) is None
    True
    """
    opts = variant_options(**options)
    if opts is not None and (dropout_mask is not None or dropout_p):
        raise SpecError("dropout with attention variants is not supported: pass "
                        "dropout_p=0 without a dropout_mask")
    return opts


def score_pipeline(opts: VariantOptions, geo: Geometry) -> tuple[Cap | Bias, ...]:
    """The operations applied to the scaled score, in pipeline order."""
    ops: list[Cap | Bias] = []
    for v in sorted(opts.active(), key=lambda v: v.order):
        if v.scores is not None:
            ops.extend(v.scores(opts, geo))
    return tuple(ops)


def kept(opts: VariantOptions, geo: Geometry, is_causal: bool,
         exclude: tuple[str, ...] = ()) -> list[np.ndarray[Any, Any]]:
    """The variants' kept-key masks (each broadcastable to (*batch, L, S)), but those of
    the variants named in ``exclude``.  A positional variant's keys (a window, chunks)
    are measured from each sequence's own query positions when a variant sets them
    (the KV cache: :func:`per_sequence`), its keys from the sequence's origin (its
    left padding)."""
    out = []
    for v in opts.active():
        if v.keep is None or v.name in exclude:
            continue
        offsets = (own_query_offsets(opts, geo) if v.positional is not None
                   and v.positional(opts) else None)
        if offsets is not None:
            part = per_sequence(partial(_keep_at, v.keep, opts, is_causal), geo, offsets,
                                own_key_origins(opts, geo))
        else:
            part = v.keep(opts, geo, is_causal)
        if part is not None:
            out.append(part)
    return out


def _keep_at(keep: Callable[..., Any], opts: VariantOptions, is_causal: bool,
             geo: Geometry) -> Any:
    return keep(opts, geo, is_causal)


def per_sequence(keep: Callable[[Geometry], Any], geo: Geometry, offsets: Any,
                 origins: Any = None) -> np.ndarray[Any, Any] | None:
    """A kept-key mask evaluated per outer batch element b at query offset offsets[b]
    (n_outer, 1 or H, L, S), or None when it keeps every key of every element.  With
    ``origins`` element b's positions start at key origins[b]: the mask is evaluated at
    offset offsets[b] - origins[b] and key j read as position j - origins[b] (keys
    before the origin are dropped: the left padding, which the cache drops anyway)."""
    if origins is None:
        origins = np.zeros(len(offsets), dtype=np.int64)
    parts = [keep(Geometry(geo.batch, geo.heads, geo.L, geo.S, int(off) - int(o)))
             for off, o in zip(offsets, origins, strict=True)]
    if all(p is None for p in parts):
        return None
    full = np.ones((geo.L, geo.S), dtype=bool)
    parts = [full if p is None else _from_origin(p, int(o), geo.S)
             for p, o in zip(parts, origins, strict=True)]
    if all(np.ndim(p) <= 2 for p in parts):
        return np.stack([np.broadcast_to(p, (geo.L, geo.S)) for p in parts])[:, None]
    return np.stack([np.broadcast_to(p, (*geo.batch, geo.L, geo.S))[b]
                     for b, p in enumerate(parts)])


def _from_origin(part: Any, origin: int, S: int) -> Any:
    """A kept-key mask over positions 0 … S-1 read at keys j = position + origin."""
    if origin == 0:
        return part
    arr = np.asarray(part)
    out = np.zeros((*arr.shape[:-1], S), dtype=bool)
    if arr.shape[-1] == 1:                     # broadcast over the keys
        out[..., origin:] = arr
        return out
    out[..., origin:] = arr[..., :S - origin]
    return out


def sink_logits(opts: VariantOptions, geo: Geometry) -> np.ndarray[Any, Any] | None:
    """σ per flat problem (B,), or None (at most one variant gives sinks)."""
    got = [v.sinks(opts, geo) for v in opts.active() if v.sinks is not None]
    if len(got) > 1:
        raise SpecError("two variants give attention sinks")
    return got[0] if got else None


def exact_inputs(opts: VariantOptions, q: Any, k: Any, v: Any, geo: Geometry, group: int
                 ) -> tuple[Any, Any, Any]:
    """q, k, v as float64 after the variants' exact input changes (FP8 descale)."""
    hooks = [x for x in opts.active() if x.inputs is not None]
    if not hooks:
        return to_float64(q), to_float64(k), to_float64(v)
    for h in hooks:
        assert h.inputs is not None
        q, k, v = h.inputs(opts, q, k, v, geo, group)
    return q, k, v


def rotation(opts: VariantOptions, geo: Geometry, E: int) -> Any:
    """The rotation of q and k a variant asks for (rotary embeddings), or None."""
    got = [v.rotate(opts, geo, E) for v in opts.active() if v.rotate is not None]
    if len(got) > 1:
        raise SpecError("two variants rotate q and k")
    return got[0] if got else None


def plain_rotation(opts: VariantOptions, geo: Geometry, q: Any, k: Any,
                   changes: dict[str, Any] | None = None) -> tuple[Any, tuple[Any, ...] | None]:
    """The testing side's float64 rotation of q and k (a variant's ``rotate_plain``
    hook, with its bug switches ``changes``): (rotation, (q, k, q', k') flat), or
    (None, None) when no variant rotates."""
    got = [v for v in opts.active() if v.rotate_plain is not None]
    if len(got) > 1:
        raise SpecError("two variants rotate q and k")
    if not got:
        return None, None
    hook = got[0].rotate_plain
    assert hook is not None
    return hook(opts, geo, q, k, **(changes or {}))


def emulated_inputs(opts: VariantOptions, geo: Geometry, q: Any, k: Any, fmt: str,
                    changes: dict[str, Any] | None = None
                    ) -> list[tuple[str, Any, Any]] | None:
    """The q, k of the testing side's emulated correct kernels (its dtype level) for a
    call whose variants only keep keys or rotate q and k: [(name, q', k')] — a
    variant's ``rotate_emulated`` rotations (with the bug switches ``changes``, as
    :func:`plain_rotation`'s: the kernels of a bug class), or the inputs themselves
    ("") when none rotates; None when a variant changes the scores, adds sinks or
    changes the inputs, or the hook has no emulation of that bug (the model alone
    judges those calls)."""
    active = opts.active()
    if any(v.scores is not None or v.sinks is not None or v.inputs is not None
           or (v.rotate is not None and v.rotate_emulated is None) for v in active):
        return None
    rot = [v for v in active if v.rotate_emulated is not None]
    if not rot:
        return [("", q, k)]
    hook = rot[0].rotate_emulated
    assert hook is not None and len(rot) == 1
    return hook(opts, geo, q, k, fmt, **(changes or {}))


def bug_classes() -> tuple[Any, ...]:
    """The registered variants' bug classes (:class:`.protocol.BugClass`), in
    registration order."""
    return tuple(b for v in registered() for b in v.bugs)


def require_gradients(opts: VariantOptions | None) -> None:
    """Refuse, for the backward doors, a variant whose gradients are not certified."""
    if opts is None:
        return
    for v in opts.active():
        if not v.gradients:
            raise SpecError(f"gradients with the {v.name} variant are not certified yet "
                            f"({', '.join(v.keywords)}): only its forward is; "
                            "reference_attention_backward and compare_attention_backward "
                            "refuse it rather than return an unproved enclosure")


# --------------------------------------------------------------------------------------
# the backward hooks (protocol.py: grad_params, backward_bugs, backward_check, cap_*)


def grad_params(opts: VariantOptions | None = None) -> tuple[tuple[Variant, GradParam], ...]:
    """(variant, parameter gradient) of the registered variants (of those ``opts``
    uses, when given), in registration order."""
    vs = registered() if opts is None else iter(opts.active())
    return tuple((v, p) for v in vs for p in v.grad_params)


def backward_bug_classes() -> tuple[Any, ...]:
    """The registered variants' backward bug classes (:class:`.protocol.BugClass`)."""
    return tuple(b for v in registered() for b in v.backward_bugs)


def refuse_backward_check(opts: VariantOptions | None, door: str) -> None:
    """Refuse a variant whose gradients the comparison door ``door`` has no tolerance
    for (the ``backward_check`` hook)."""
    if opts is None:
        return
    for v in opts.active():
        if v.backward_check is not None:
            raise SpecError(f"{v.backward_check} are not supported by {door} "
                            "(reference_attention_backward computes those gradients)")


def plain_cap(opts: VariantOptions) -> float | None:
    """The cap C of s -> C·tanh(s/C) on the scaled score a variant puts first (the
    ``cap_of`` hook), or None."""
    got = [c for v in opts.active() if v.cap_of is not None
           for c in (v.cap_of(opts),) if c is not None]
    if len(got) > 1:
        raise SpecError("two variants cap the scaled score first")
    return got[0] if got else None


def cap_keywords(cap: float | None) -> dict[str, Any]:
    """The door keywords that put the cap C first on the scaled score ({} for None)."""
    if cap is None:
        return {}
    for v in registered():
        if v.cap_keywords is not None:
            return v.cap_keywords(cap)
    raise SpecError("no registered variant caps the scaled score")  # pragma: no cover
