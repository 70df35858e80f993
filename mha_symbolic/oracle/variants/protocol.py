"""The variant protocol: what one attention variant tells the oracle, registered once.

A variant is one module of this package that builds a :class:`Variant` and passes it
to :func:`register`; :mod:`.registry` imports every such module (the one list of
them).  The doors (:mod:`..api`, the testing tools) take variant keywords in one
place, :func:`.registry.variant_options`, which asks each registered variant to
parse its own keywords into validated *fields*; the tiers never name a variant.
What a variant may contribute, each optional:

* ``inputs`` — exact changes of the inputs (FP8 descale: q·d_q, exactly);
* ``keep`` — which keys each query may see (a bool array broadcastable to the
  scores), AND-ed with the user's mask, causal and the other variants';
* ``scores`` — operations on the scaled score, in pipeline order ``order``
  (a :class:`~.semantics.Cap` or an exact :class:`~.semantics.Bias`);
* ``sinks`` — a logit per flat problem in the denominator only;
* ``transcendental`` — whether its scores are no longer exact doubles (softcap's
  tanh), which sends the call to the transformed-score tiers;
* ``rotate`` — q and k rotated before the scores (rotary embeddings): a rotation
  object for the call's geometry (``float_rotate``, ``float_chunk``, ``problem``: see
  :class:`~.rotary.Rotation`), given to the transformed tiers; with it ``rotate_plain``,
  the testing side's float64 rotation (``rotate_plain(opts, geo, q, k, **changes)`` ->
  (rotation, (q, k, q', k') flat); ``changes`` are the bug switches its catalogue uses)
  and ``rotate_emulated``, the rotations correct kernels storing in a format compute
  (``rotate_emulated(opts, geo, q, k, fmt, **changes)`` -> [(name, q', k')]: the dtype
  level's; with a bug's switches the kernels of that bug, None where it has none);
* ``error`` — the variant's own term in the testing side's error model (issue 23):
  ``error(opts, vp, b, rows, model)`` -> (independent bound, variance) per score,
  added to :class:`~mha_symbolic.testing.forward.model.ScoreExtras`;
* ``gradients`` — False when its gradients are not certified (the backward refuses);
* ``backward`` — the variant computes the call's gradients itself (rotary: the plain
  tiers on the rotated q', k', then Rᵀ): ``backward(opts, prep, grad_output, **common)``
  -> {"dq", "dk", "dv": Enclosure} in place of the plain backward's
  (:func:`.backward.variant_attention_backward`; ``prep`` its
  :class:`.forward.Prepared`, ``common`` the scale, GQA, masked_rows, progress and
  functionals keywords);
* ``bugs`` — its bug classes, as data (:class:`BugClass`): a mistake kernels make
  with it, when it applies to a call and the switches of the testing side's float64
  evaluation that reproduce it; the testing catalogue collects them from here;
* ``sequence`` — its fields for sequence b of a packed varlen batch of n sequences
  (``sequence(opts, b, n)``: a per-batch parameter's row b, a mask_mod shifted to
  the sequence); without it the variant's fields are shared by every sequence, and
  ``packed=False`` refuses the variant in the varlen doors (KV-cache lengths);
* ``positional`` — whether its semantics read a query's position relative to the keys
  (the geometry's alignment offset: a window, chunks, ALiBi's distances), and
  ``own_positions`` — each batch element's own query offsets, ``own_positions(opts,
  geo)`` -> (n_outer,) (the KV cache: query i of sequence b sits at
  cache_seqlens[b] - L + i, as FlashAttention aligns them; :func:`own_query_offsets`).
  With it ``own_origins`` — where each batch element's positions start for the kept-key
  variants, ``own_origins(opts, geo)`` -> (n_outer,) or None (the KV cache's
  ``cache_leftpad``: FlashAttention measures a window and chunks from the first valid
  key; :func:`own_key_origins`).  A positional ``keep`` is then evaluated per sequence
  at its own offset, its key axis starting at the origin (:func:`.registry.kept`); a
  distance (a window, ALiBi) does not move with the origin, chunks do.  A positional
  score operation (a score_mod's ALiBi, a relative-bias table) keeps its own literal
  offset, as FlexAttention applies it to the raw q_idx, kv_idx (an offset of one per
  batch element is the score_mod's own choice: ``alibi_score_mod(slopes, offset=n - L)``).
  A variant that reads the positions itself (rotary; ALiBi's keyword, whose
  :class:`~.semantics.Bias` takes one offset per batch element) is not ``positional``.

The testing side's float64 evaluation (:func:`mha_symbolic.testing.forward.bugs_variants.plain_variant`,
the input of its error model and of its bug catalogue) uses the oracle hooks above, and
these four where it needs more (each optional; their keyword-only parameters are the
variant's *switches*, which its ``bugs`` entries return and ``plain_variant`` routes to
the hook that names them):

* ``plain_inputs`` — the inputs changed in float64, as a kernel (or a buggy one) does:
  ``plain_inputs(opts, q, k, v, outer, H, group, **switches)`` -> (q', k', v',
  qk_changed, v_changed), k and v with their own heads (GQA ``group`` query heads per
  key head); the two flags tell the error model that the kernel folds a factor into
  the scale (two more roundings) and one into the output (FP8 descale);
* ``plain_keep`` — the variant's kept keys in float64, in place of ``keep`` (and left
  out of the call record's ``mod_keep``), so that its switches can move them:
  ``plain_keep(opts, **switches)`` -> (keep, misaligned), ``keep(geo)`` a bool array or
  None, evaluated at the call's query positions (each sequence's own, where a variant
  sets them) or, ``misaligned``, at the other corner's (with own positions: the keys'
  end) — the window's edges and alignment;
* ``plain_scores`` — its score operations with their stage, in place of ``scores``:
  ``plain_scores(opts, geo, **switches)`` -> ((stage, op), ...), stage ``"scores"`` (in
  pipeline ``order``), ``"unscaled"`` (a :class:`~.semantics.Cap` applied to q·k before
  the scale) or ``"masked"`` (a ``Cap`` applied after the masks: a masked score -inf
  becomes -C and its key takes part) — softcap's and ALiBi's bug classes;
* ``packed_whole`` — the changes of its fields when the sequences of a packed varlen
  call are read as one (the ``varlen_no_boundaries`` bug): ``packed_whole(opts)`` ->
  {field: value} for sequence 0's options.

A variant that changes the inputs (``inputs``) voids the value-hull check, which reads
the values as given.

The backward hooks (each optional; the backward side loops over them and never names
a variant):

* ``grad_params`` — its parameters' gradients (:class:`GradParam`: the sink logits',
  the ALiBi slopes', a score_mod's tensors), as linear functionals of dS for the
  oracle (:func:`.backward.variant_attention_backward`) and as reducers of the mask
  gradient's bounds for the comparison door's tolerance;
* ``backward_bugs`` — its backward bug classes (:class:`BugClass`) of the testing
  side's catalogue: ``applies(call)`` reads the call record of the lowered problem
  whose ``opts`` are the call's own options; ``switches(call)`` -> keywords of
  :func:`mha_symbolic.testing.backward.bugs.plain_backward` (``softcap_derivative``),
  or ``{"variant_changes": {...}}``: the backward recomputes P = exp(S − lse) with the
  forward's lse but the scores of the call with those options changed (the window
  or ALiBi missing in the backward);
* ``backward_inputs`` — the chain rule through its exact input change (FP8 descale):
  ``backward_inputs(opts, prep, query, key, value)`` checks the call and returns
  grads -> grads, the {"dq", "dk", "dv"} Enclosures with respect to the changed
  inputs mapped to those with respect to the caller's;
* ``backward_check`` — what the variant is, when the comparison door has no
  tolerance for its gradients (``compare_attention_backward`` refuses it: "<this> are
  not supported by compare_attention_backward");
* ``cap_of`` and ``cap_keywords`` — the cap C of s -> C·tanh(s/C) the variant's options
  put first on the scaled score (None: none), and the door keywords that put a cap C
  there: the testing side's float64 backward and the backward check's lowering
  (:func:`.forward.lowered_after_cap`) use them.

Its gradients follow from the same pieces (:mod:`.backward`: a bias's parameters are
linear functionals of dS, :mod:`..backward.functionals`) and its term in the error
model from its kind (:mod:`mha_symbolic.testing.forward.model_variants`).  The
exact semantics of every registered variant are composed in :mod:`.semantics`'s
docstring order; docs/variants.md has the sources and "Adding a variant".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import SpecError

__all__ = ["BugClass", "GradParam", "Variant", "VariantOptions", "lengths_differ",
           "own_key_origins", "own_query_offsets", "register", "registered", "unregister"]


@dataclass(frozen=True)
class BugClass:
    """A mistake kernels make with a variant, as data.

    ``applies(call)`` and ``switches(call)`` take the testing side's call record
    (:class:`mha_symbolic.testing.call.AttentionCall`: q, k, v, ``opts``, ``is_causal``,
    ``causal_alignment``, ``attn_mask``, ``mod_keep``); ``switches`` returns keywords of
    its float64 evaluation (:func:`mha_symbolic.testing.forward.bugs_variants.plain_variant`:
    the switches of the variant's own testing hooks — ``plain_inputs``, ``plain_keep``,
    ``plain_scores``: their keyword-only parameters —, ``sink_mode``, ``keep_changes`` —
    a kept-key variant's options changed —, ``rotate_changes`` — the ``rotate_plain``
    hook's switches —, ``scale``, ``causal_offset``).  A class
    is only *named* once checked: the kernel's output fits the buggy evaluation's own
    tolerance and not the truth's."""

    name: str
    description: str
    applies: Callable[[Any], bool]
    switches: Callable[[Any], dict[str, Any]]


def lengths_differ(call: Any) -> bool:
    """L != S: the bug classes that only show when the two corners differ."""
    return bool(call.q.shape[-2] != call.k.shape[-2])


@dataclass(frozen=True)
class GradParam:
    """The gradient of a variant parameter, as data (the backward hooks, issue 23).

    ``keyword``: its name in :class:`~mha_symbolic.oracle.backward.attention.AttentionGradients`
    and, when the comparison door judges it, that door's keyword (``d_sinks``);
    ``title``: its name in the reports (``grad_sinks``).  ``functionals(opts, prep,
    flat_lead, n_keys)`` -> one :class:`~mha_symbolic.oracle.backward.functionals.ScoreFunctional`
    (or None: no gradient, a constant) per item: the parameter's gradient as linear
    functionals of dS (``prep`` the call's :class:`.forward.Prepared`, ``flat_lead`` its
    flat-problem lead shape, ``n_keys`` the keys with the sink's); ``many``: the result
    is a tuple, one per item (a score_mod's), else the one item.  ``stacked(opts)``: a
    packed varlen batch stacks the sequences' gradients as (batch, ·) rather than
    summing them (a (batch, H) parameter).  ``reduce(geo, shape)``: the testing side's
    reducer, x -> the parameter's shape, of a nonnegative weighted sum of the lowered
    mask gradient's elements (…, L, S + sinks) whose weights are the functional's
    absolute values (its tolerance: docs/gradients.md §11.6); None: not judged."""

    keyword: str
    title: str
    functionals: Callable[..., tuple[Any, ...]]
    many: bool = False
    stacked: Callable[[VariantOptions], bool] | None = None
    reduce: Callable[[Any, tuple[int, ...]], Callable[[Any], Any]] | None = None


@dataclass(frozen=True)
class Variant:
    """One variant: its name, the door keywords it takes, the fields its validated
    options fill (with their value when the variant is off), and its hooks."""

    name: str
    keywords: tuple[str, ...]
    fields: dict[str, Any]
    parse: Callable[..., dict[str, Any]]
    summary: str
    keep: Callable[[VariantOptions, Any, bool], Any] | None = None
    scores: Callable[[VariantOptions, Any], tuple[Any, ...]] | None = None
    order: int = 50
    sinks: Callable[[VariantOptions, Any], Any] | None = None
    inputs: Callable[..., tuple[Any, Any, Any]] | None = None
    transcendental: Callable[[VariantOptions], bool] | None = None
    rotate: Callable[..., Any] | None = None
    rotate_plain: Callable[..., tuple[Any, tuple[Any, ...]]] | None = None
    rotate_emulated: Callable[..., list[tuple[str, Any, Any]] | None] | None = None
    error: Callable[..., tuple[Any, Any]] | None = None
    gradients: bool = True
    backward: Callable[..., dict[str, Any]] | None = None
    bugs: tuple[BugClass, ...] = field(default=())
    sequence: Callable[[VariantOptions, int, int], dict[str, Any]] | None = None
    packed: bool = True
    positional: Callable[[VariantOptions], bool] | None = None
    own_positions: Callable[[VariantOptions, Any], Any] | None = None
    own_origins: Callable[[VariantOptions, Any], Any] | None = None
    # testing-side forward hooks (h23f)
    plain_inputs: Callable[..., tuple[Any, Any, Any, bool, bool]] | None = None
    plain_keep: Callable[..., tuple[Callable[[Any], Any], bool]] | None = None
    plain_scores: Callable[..., tuple[tuple[str, Any], ...]] | None = None
    packed_whole: Callable[[VariantOptions], dict[str, Any]] | None = None
    # backward hooks (h23b)
    grad_params: tuple[GradParam, ...] = field(default=())
    backward_bugs: tuple[BugClass, ...] = field(default=())
    backward_inputs: Callable[..., Callable[[dict[str, Any]], dict[str, Any]]] | None = None
    backward_check: str | None = None
    cap_of: Callable[[VariantOptions], float | None] | None = None
    cap_keywords: Callable[[float], dict[str, Any]] | None = None


_REGISTRY: dict[str, Variant] = {}
_FIELDS: dict[str, Any] = {}
_KEYWORDS: dict[str, str] = {}


def register(variant: Variant) -> Variant:
    """Add a variant (once; its keywords and fields must be new)."""
    if variant.name in _REGISTRY:
        raise ValueError(f"variant {variant.name!r} is registered twice")
    for kw in variant.keywords:
        if kw in _KEYWORDS:
            raise ValueError(f"keyword {kw!r} of {variant.name!r} is taken by "
                             f"{_KEYWORDS[kw]!r}")
    for f in variant.fields:
        if f in _FIELDS:
            raise ValueError(f"field {f!r} of {variant.name!r} is taken")
    _REGISTRY[variant.name] = variant
    _KEYWORDS.update({kw: variant.name for kw in variant.keywords})
    _FIELDS.update(variant.fields)
    return variant


def unregister(name: str) -> None:
    """Remove a variant (for tests that register one of their own)."""
    v = _REGISTRY.pop(name)
    for kw in v.keywords:
        _KEYWORDS.pop(kw, None)
    for f in v.fields:
        _FIELDS.pop(f, None)


def registered() -> Iterator[Variant]:
    """The registered variants, in registration order."""
    return iter(tuple(_REGISTRY.values()))


def keyword_owner(keyword: str) -> Variant | None:
    name = _KEYWORDS.get(keyword)
    return None if name is None else _REGISTRY[name]


class VariantOptions:
    """Validated variant options: the fields the registered variants filled (arrays
    are exact float64 copies of the inputs).  A field no variant set reads as its
    variant's "off" value (None, or () for the score_mod tuple)."""

    __slots__ = ("_fields",)

    def __init__(self, **fields: Any) -> None:
        unknown = [f for f in fields if f not in _FIELDS]
        if unknown:
            raise TypeError(f"VariantOptions: unknown field(s) {unknown}")
        object.__setattr__(self, "_fields", {
            f: v for f, v in fields.items() if not _is_off(v, _FIELDS[f])})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in _FIELDS:
            raise AttributeError(name)
        return self._fields.get(name, _FIELDS[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("VariantOptions is immutable")

    def replace(self, **changes: Any) -> VariantOptions:
        return VariantOptions(**{**self._fields, **changes})

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self._fields)

    @property
    def empty(self) -> bool:
        """No variant at all (plain scaled dot-product attention)."""
        return not self._fields

    def active(self) -> tuple[Variant, ...]:
        """The variants this call uses."""
        return tuple(v for v in registered() if any(f in self._fields for f in v.fields))

    @property
    def has_cap(self) -> bool:
        """A transcendental score operation anywhere in the pipeline (softcap's tanh)."""
        return any(v.transcendental is not None and v.transcendental(self)
                   for v in self.active())

    def __repr__(self) -> str:
        return f"VariantOptions({', '.join(sorted(self._fields))})"


def own_query_offsets(opts: VariantOptions, geo: Any) -> Any:
    """The query offsets per outer batch element a variant sets (the ``own_positions``
    hook: query i of element b at position off_b + i), or None when none does."""
    got = [v.own_positions(opts, geo) for v in opts.active() if v.own_positions is not None]
    if len(got) > 1:
        raise SpecError("two variants set the query positions")
    return got[0] if got else None


def own_key_origins(opts: VariantOptions, geo: Any) -> Any:
    """Where each outer batch element's positions start for the kept-key variants (the
    ``own_origins`` hook: key j of element b at position j - origin_b), or None."""
    got = [v.own_origins(opts, geo) for v in opts.active() if v.own_origins is not None]
    got = [g for g in got if g is not None]
    if len(got) > 1:
        raise SpecError("two variants set the key origins")
    return got[0] if got else None


def _is_off(value: Any, off: Any) -> bool:
    if value is None:
        return True
    return isinstance(off, tuple) and isinstance(value, tuple) and not value
