"""The attention specification: one object that states an attention computation.

Conventions (stated once, used everywhere):

* ``n_q`` query length, ``n_k`` key/value length (``n_k = n_q`` for
  self-attention), ``d_model`` model width, ``heads`` query heads,
  ``kv_heads`` key/value heads (``== heads``: MHA; ``1``: MQA; between: GQA,
  query head ``g`` uses key/value head ``g // (heads // kv_heads)``, as
  ``repeat_interleave`` does).
* ``d_k`` and ``d_v`` default to ``d_model / heads``; ``kdim``/``vdim`` (widths
  of the key and value *inputs*, cross-attention) default to ``d_model``.
* ``scale=None`` means the default ``1/sqrt(d_k)``; any other exact number is
  used as given, ``1`` is "unscaled" and ``0`` is zero (uniform weights), never
  "default".
* masks: ``None``; ``"causal"`` aligned ``"top_left"`` (query i sees keys
  j <= i, PyTorch's ``is_causal``) or ``"bottom_right"`` (j <= i + n_k - n_q,
  FlashAttention >= 2.1); a boolean ``n_q x n_k`` matrix with **True = takes
  part**; or an additive ``n_q x n_k`` matrix added to the scaled scores
  (``-oo`` removes a key); or a list of ``heads`` such matrices, one per head
  (per-head masks, ALiBi-like biases).
* ``masked_rows``: what a query row with no key left gets: ``"zero"`` (output
  0, as PyTorch SDPA and FlashAttention), ``"nan"``, or ``"error"``.

>>> spec = AttentionSpec(n_q=3, n_k=5, d_model=512, heads=8)
>>> spec.d_k, spec.is_cross, spec.kind
(64, True, 'MHA')
>>> AttentionSpec(d_model=10, heads=4)
Traceback (most recent call last):
...
mha_symbolic.errors.SpecError: d_model=10 is not divisible by heads=4: give d_k and d_v explicitly
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._text import echo, expr_text, int_text
from ..errors import SpecError

__all__ = ["AttentionSpec", "Dim", "dim"]

Dim = Any  # a positive int, or a SymPy expression for a symbolic size
MaskedRows = Literal["zero", "nan", "error"]
Alignment = Literal["top_left", "bottom_right"]

_MASKED_ROWS = ("zero", "nan", "error")
_ALIGNMENTS = ("top_left", "bottom_right")
MAX_DIM = 10**9  # sizes beyond this are refused: nobody means them, and they would hang


def dim(value: Any, name: str) -> Dim:
    """Normalize a size: a positive int, or a symbol name / SymPy expression."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(f"{name}={value} is not a size")
    if isinstance(value, int):
        if value < 1:
            raise SpecError(f"{name}={int_text(value)} must be a positive integer")
        if value > MAX_DIM:
            raise SpecError(f"{name}={int_text(value)} is larger than the limit {MAX_DIM}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():  # not "²" or "٣", which int() may refuse
            if len(text.lstrip("0")) > len(str(MAX_DIM)):
                raise SpecError(f"{name}={text[:20]}... is larger than the limit {MAX_DIM}")
            return dim(int(text), name)
        if text.isascii() and text.isidentifier() and len(text) <= 32:
            import sympy as sp

            return sp.Symbol(text, integer=True, positive=True)
        raise SpecError(f"{name}={echo(value)} is neither a positive integer nor a symbol name "
                        "(at most 32 ASCII letters, digits and _)")
    import sympy as sp

    if isinstance(value, sp.Basic):
        if value.is_Integer:
            return dim(int(value), name)
        if value.is_number or value.has(sp.Float) or value.is_integer is False:
            raise SpecError(f"{name}={expr_text(value)} is not a whole number of rows or columns")
        if value.is_positive is False:
            raise SpecError(f"{name}={expr_text(value)} must be positive")
        return value
    raise SpecError(f"{name}={expr_text(value)} ({type(value).__name__}) is not a size")


def _is_num(x: Any) -> bool:
    return isinstance(x, int)


@dataclass(frozen=True)
class AttentionSpec:
    """A complete statement of one (multi-head) attention computation.

    Every size may be an int or a symbol (a name string or SymPy symbol) for
    shape algebra and counts; the numeric checks run where the sizes are numbers.
    """

    n_q: Dim = None
    n_k: Dim = None
    d_model: Dim = None
    heads: Dim = 1
    kv_heads: Dim = None
    d_k: Dim = None
    d_v: Dim = None
    kdim: Dim = None
    vdim: Dim = None
    bias: Any = True  # a bool, or (q, k, v, o) flags as nn.Linear(..., bias=...) per projection
    add_bias_kv: bool = False
    scale: Any = None
    mask: Any = None
    causal_alignment: Alignment = "top_left"
    masked_rows: MaskedRows = "zero"
    _given: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        given = {k for k in ("n_k", "kv_heads", "d_k", "d_v", "kdim", "vdim")
                 if getattr(self, k) is not None}
        put = object.__setattr__
        put(self, "_given", frozenset(given))
        if hasattr(self.mask, "tolist"):  # numpy arrays: plain lists of Python bools/numbers
            put(self, "mask", self.mask.tolist())
        put(self, "bias", _bias_flags(self.bias))
        for name in ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim"):
            put(self, name, dim(getattr(self, name), name))
        if self.n_k is None:
            put(self, "n_k", self.n_q)
        if self.kv_heads is None:
            put(self, "kv_heads", self.heads)
        for name in ("kdim", "vdim"):
            if getattr(self, name) is None:
                put(self, name, self.d_model)
        for name in ("d_k", "d_v"):
            if getattr(self, name) is None and self.d_model is not None:
                put(self, name, self._per_head(name))
        self._check()

    def _per_head(self, name: str) -> Dim:
        d_model, heads = self.d_model, self.heads
        if _is_num(d_model) and _is_num(heads):
            if d_model % heads:
                raise SpecError(
                    f"d_model={d_model} is not divisible by heads={heads}: "
                    "give d_k and d_v explicitly"
                )
            return d_model // heads
        return d_model / heads

    def _check(self) -> None:
        if self.masked_rows not in _MASKED_ROWS:
            raise SpecError(f"masked_rows={echo(self.masked_rows)} must be one of {_MASKED_ROWS}")
        if self.causal_alignment not in _ALIGNMENTS:
            raise SpecError(
                f"causal_alignment={echo(self.causal_alignment)} must be one of {_ALIGNMENTS}"
            )
        heads, kv = self.heads, self.kv_heads
        if _is_num(heads) and _is_num(kv):
            if kv > heads:
                raise SpecError(f"kv_heads={kv} is larger than heads={heads}")
            if heads % kv:
                raise SpecError(
                    f"heads={heads} is not a multiple of kv_heads={kv}: each key/value head "
                    "must serve the same number of query heads"
                )
        self._check_mask()

    def _check_mask(self) -> None:
        mask = self.mask
        if mask is None or (isinstance(mask, str) and mask == "causal"):
            return
        if isinstance(mask, str):
            raise SpecError(f"mask={echo(mask)} must be None, 'causal', or an n_q x n_k matrix")
        if _is_per_head(mask):
            if _is_num(self.heads) and len(mask) != self.heads:
                raise SpecError(f"mask has {len(mask)} per-head matrices but heads={self.heads}")
            for h, m in enumerate(mask):
                self._check_matrix(m, f"mask[{h}]")
            return
        self._check_matrix(mask, "mask")

    def _check_matrix(self, mask: Any, name: str) -> None:
        rows = _rows(mask, name)
        if _is_num(self.n_q) and len(rows) != self.n_q:
            raise SpecError(f"{name} has {len(rows)} rows but n_q={self.n_q}")
        for i, row in enumerate(rows):
            if _is_num(self.n_k) and len(row) != self.n_k:
                raise SpecError(f"{name} row {i} has {len(row)} entries but n_k={self.n_k}")

    def head_mask(self, head: int) -> Any:
        """The mask that applies to query head ``head`` (0-based)."""
        mask = self.mask
        return mask[head] if _is_per_head(mask) else mask

    # -- derived facts ------------------------------------------------------------
    @property
    def bias_parts(self) -> dict[str, bool]:
        """Which projections have a bias: {'q': …, 'k': …, 'v': …, 'o': …}."""
        flags = self.bias if isinstance(self.bias, tuple) else (bool(self.bias),) * 4
        return dict(zip(("q", "k", "v", "o"), flags, strict=True))

    @property
    def is_cross(self) -> bool:
        """Whether queries and keys have different lengths (or widths)."""
        return bool(self.n_k != self.n_q or self.kdim != self.d_model or self.vdim != self.d_model)

    @property
    def kind(self) -> str:
        """'MHA', 'GQA' or 'MQA'."""
        if self.kv_heads == self.heads:
            return "MHA"
        if self.kv_heads == 1:
            return "MQA"
        return "GQA"

    @property
    def group_size(self) -> Dim:
        """Query heads per key/value head."""
        if _is_num(self.heads) and _is_num(self.kv_heads):
            return self.heads // self.kv_heads
        return self.heads / self.kv_heads

    def kv_head_of(self, query_head: int) -> int:
        """The key/value head used by query head ``query_head`` (repeat_interleave)."""
        return int(query_head // self.group_size)

    def resolved_scale(self) -> Any:
        """The scale as an exact SymPy number: ``1/sqrt(d_k)`` unless given."""
        import sympy as sp

        if self.scale is None:
            if self.d_k is None:
                raise SpecError("the default scale 1/sqrt(d_k) needs d_k (or d_model and heads)")
            return 1 / sp.sqrt(self.d_k)
        return self.scale

    def takes_part(self, i: int, j: int, head: int = 0) -> bool:
        """Whether query ``i`` may attend to key ``j`` under a causal or boolean mask."""
        mask = self.head_mask(head)
        if mask is None:
            return True
        if isinstance(mask, str) and mask == "causal":
            offset = 0 if self.causal_alignment == "top_left" else int(self.n_k) - int(self.n_q)
            return j <= i + offset
        entry = mask[i][j]
        if isinstance(entry, bool):
            return entry
        return True  # additive masks remove keys through -oo, handled by the engine

    @property
    def additive_mask(self) -> list[list[Any]] | None:
        """The additive mask matrix (of head 0 for per-head masks), or None when the mask
        is not additive."""
        return self.head_additive_mask(0)

    def head_additive_mask(self, head: int) -> list[list[Any]] | None:
        """The additive mask matrix of query head ``head``, or None when not additive."""
        mask = self.head_mask(head)
        if mask is None or isinstance(mask, str):
            return None
        rows = _rows(mask, "mask")
        if all(isinstance(x, bool) for row in rows for x in row):
            return None
        return rows


def _bias_flags(bias: Any) -> Any:
    """True/False, or a (q, k, v, o) tuple of flags when they differ."""
    if isinstance(bias, bool):
        return bias
    if isinstance(bias, dict):
        unknown = set(bias) - {"q", "k", "v", "o"}
        if unknown:
            raise SpecError(f"bias has unknown part(s) {', '.join(sorted(unknown))}; "
                            "expected q, k, v, o")
        bias = tuple(bias.get(p, True) for p in ("q", "k", "v", "o"))
    if isinstance(bias, (tuple, list)) and len(bias) == 4 and all(isinstance(b, bool) for b in bias):
        flags = tuple(bias)
        return flags[0] if len(set(flags)) == 1 else flags
    raise SpecError(f"bias={echo(repr(bias))} must be True, False, or (q, k, v, o) flags")


def _is_per_head(mask: Any) -> bool:
    """A list of matrices (one per head), as opposed to one matrix."""
    if hasattr(mask, "ndim"):
        return int(mask.ndim) == 3
    return (isinstance(mask, Sequence) and not isinstance(mask, str) and len(mask) > 0
            and isinstance(mask[0], Sequence) and not isinstance(mask[0], str) and len(mask[0]) > 0
            and isinstance(mask[0][0], Sequence) and not isinstance(mask[0][0], str))


def _rows(matrix: Any, name: str) -> list[list[Any]]:
    if hasattr(matrix, "tolist"):
        matrix = matrix.tolist()
    if not isinstance(matrix, Sequence) or isinstance(matrix, str):
        raise SpecError(f"{name} must be a matrix (a list of rows)")
    rows = []
    for i, row in enumerate(matrix):
        if not isinstance(row, Sequence) or isinstance(row, str):
            raise SpecError(f"{name} row {i} is not a list")
        rows.append(list(row))
    return rows
