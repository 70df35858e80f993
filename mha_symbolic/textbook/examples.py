"""Worked-example files: the TOML format (docs/worked-example-format.md), read into
:class:`WorkedExample` objects with their claims, every key and value checked."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..errors import ClaimError, ExampleFileError, MhaSymbolicError
from .quantities import parse_quantity

__all__ = ["Claim", "WorkedExample", "load_examples", "select_examples"]


MAX_FILE_BYTES = 1_000_000
MAX_EXAMPLES = 500
MAX_CLAIMS = 5000
_INPUT_KEYS = ("scores", "query", "key", "value", "x", "x_kv", "w_q", "w_k", "w_v", "w_o",
               "b_q", "b_k", "b_v", "b_o")
_OPTION_KEYS = ("heads", "kv_heads", "d_k", "scale", "mask", "causal_alignment", "masked_rows",
                "window", "softcap", "alibi_slopes", "sinks")
_DIM_KEYS = ("n_q", "n_k", "d_model", "d_v", "kdim", "vdim", "bias", "add_bias_kv")
_EXAMPLE_KEYS = {"name", "title", "notes", "claim", *_INPUT_KEYS, *_OPTION_KEYS, *_DIM_KEYS}
_CLAIM_KEYS = {"quantity", "claimed", "head", "expr", "rtol", "note"}


@dataclass(frozen=True)
class Claim:
    """One claim of a worked example: a quantity and its answer as printed."""

    quantity: str
    claimed: str
    head: int = 1
    expr: str | None = None
    rtol: Fraction = Fraction(1, 10**6)
    note: str = ""


@dataclass
class WorkedExample:
    """A worked example: its inputs at whatever level the text gives, and its claims."""

    name: str
    title: str = ""
    notes: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    _attention: Any = field(default=None, repr=False)
    _variants: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def has_attention(self) -> bool:
        return any(k in self.inputs for k in ("scores", "query", "x"))

    def attention(self, **changes: Any) -> Any:
        """The exact attention of the example's inputs (None for dimension-only examples).

        ``changes`` override options (used for diagnosis variants)."""
        if not self.has_attention:
            return None
        if not changes and self._attention is not None:
            return self._attention
        key = repr(sorted(changes.items()))
        if changes and key in self._variants:
            return self._variants[key]
        from ..exact.engine import exact_attention

        kwargs = {**self.inputs, **self.options, **changes}
        result = exact_attention(**kwargs)
        if changes:
            self._variants[key] = result
        else:
            self._attention = result
        return result

    @property
    def spec(self) -> Any:
        """The attention specification: from the inputs, else from the stated sizes."""
        from ..exact.spec import AttentionSpec

        att = self.attention()
        stated = {k: v for k, v in {**self.dims, **self.options}.items()
                  if k in ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim",
                           "vdim", "bias", "add_bias_kv", "causal_alignment", "masked_rows")}
        if att is not None:
            base = att.spec
            merged = {k: getattr(base, k) for k in ("n_q", "n_k", "heads", "kv_heads", "d_k",
                                                     "d_v")}
            merged.update({k: v for k, v in stated.items() if v is not None})
            if merged.get("d_model") is None and base.d_model is not None:
                merged["d_model"] = base.d_model
            if merged.get("d_model") is None:
                merged["d_model"] = merged["heads"] * merged["d_v"] if merged.get("d_v") else None
            return AttentionSpec(**merged)
        return AttentionSpec(**stated)


def load_examples(path: str | Path | None = None, *, text: str | None = None) -> list[WorkedExample]:
    """Load worked examples from a TOML file (or TOML ``text``).

    Errors are :class:`~mha_symbolic.errors.ExampleFileError`, one line naming the
    example and the key.
    """
    if (path is None) == (text is None):
        raise ExampleFileError("give a path or text, not both or neither")
    source = "<text>"
    if path is not None:
        p = Path(path)
        source = str(p)
        if p.is_dir():
            raise ExampleFileError(f"{source}: is a directory, not a worked-example file")
        if not p.exists():
            raise ExampleFileError(f"{source}: no such file")
        if not p.is_file():
            raise ExampleFileError(f"{source}: not a regular file")
        data = p.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            raise ExampleFileError(f"{source}: larger than {MAX_FILE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExampleFileError(f"{source}: not UTF-8 text ({exc.reason} at byte "
                                   f"{exc.start})") from None
    assert text is not None
    if len(text) > MAX_FILE_BYTES:
        raise ExampleFileError(f"{source}: larger than {MAX_FILE_BYTES} characters")
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExampleFileError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ExampleFileError(f"{source}: TOML nested too deeply") from None
    unknown = set(doc) - {"example", "title", "source", "notes"}
    if unknown:
        raise ExampleFileError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))};"
                               " examples go in [[example]] tables")
    raw = doc.get("example")
    if not isinstance(raw, list) or not raw:
        raise ExampleFileError(f"{source}: no [[example]] tables")
    if len(raw) > MAX_EXAMPLES:
        raise ExampleFileError(f"{source}: more than {MAX_EXAMPLES} examples")
    examples = [_example(item, i, source) for i, item in enumerate(raw)]
    names = [e.name for e in examples]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ExampleFileError(f"{source}: duplicate example name(s) {', '.join(dupes)}")
    if sum(len(e.claims) for e in examples) > MAX_CLAIMS:
        raise ExampleFileError(f"{source}: more than {MAX_CLAIMS} claims")
    return examples


def _example(item: Any, index: int, source: str) -> WorkedExample:
    where = f"{source}: example #{index + 1}"
    if not isinstance(item, dict):
        raise ExampleFileError(f"{where} is not a table")
    name = item.get("name", str(index + 1))
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise ExampleFileError(f"{where}: name must be a non-empty string")
    where = f"{source}: example {name!r}"
    unknown = set(item) - _EXAMPLE_KEYS
    if unknown:
        raise ExampleFileError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("title", "notes"):
        if key in item and not isinstance(item[key], str):
            raise ExampleFileError(f"{where}: {key} must be a string")
    inputs = {k: _matrix_input(item[k], f"{where}: {k}") for k in _INPUT_KEYS if k in item}
    options: dict[str, Any] = {}
    for key in _OPTION_KEYS:
        if key in item:
            options[key] = _option(key, item[key], where)
    dims: dict[str, Any] = {}
    for key in _DIM_KEYS:
        if key in item:
            value = item[key]
            if key in ("bias", "add_bias_kv"):
                if not isinstance(value, bool):
                    raise ExampleFileError(f"{where}: {key} must be true or false")
            elif not (isinstance(value, int) and not isinstance(value, bool)) and not (
                    isinstance(value, str) and value.isidentifier()):
                raise ExampleFileError(f"{where}: {key}={value!r} must be a positive integer "
                                       "or a symbol name")
            dims[key] = value
    claims_raw = item.get("claim", [])
    if not isinstance(claims_raw, list):
        raise ExampleFileError(f"{where}: claim must be an array of tables ([[example.claim]])")
    claims = [_claim(c, j, where) for j, c in enumerate(claims_raw)]
    ex = WorkedExample(name=name.strip(), title=item.get("title", ""), notes=item.get("notes", ""),
                       inputs=inputs, options=options, dims=dims, claims=claims)
    # Build once now, so that inconsistent inputs are reported at load time.
    try:
        ex.attention()
        ex.spec  # noqa: B018 - validates the stated sizes
    except MhaSymbolicError as exc:
        raise ExampleFileError(f"{where}: {exc}") from None
    return ex


def _matrix_input(value: Any, where: str) -> Any:
    """Matrices stay as nested lists of TOML numbers/strings; the engine reads them exactly."""
    depth = 0
    v = value
    while isinstance(v, list):
        if not v:
            raise ExampleFileError(f"{where} is empty")
        v = v[0]
        depth += 1
    if depth == 0 or depth > 3:
        raise ExampleFileError(f"{where} must be a vector or matrix (nested arrays)")

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, bool) or not isinstance(x, (int, float, str)):
            raise ExampleFileError(f"{where}: entry {x!r} is not a number or a number string")
        elif isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
            raise ExampleFileError(f"{where}: entry {x!r} is not a finite number")

    walk(value)
    return value


def _option(key: str, value: Any, where: str) -> Any:
    if key in ("heads", "kv_heads", "d_k"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExampleFileError(f"{where}: {key}={value!r} must be a positive integer")
        return value
    if key == "scale":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ExampleFileError(f"{where}: scale={value!r} must be a number or number string")
        return value
    if key == "mask":
        if isinstance(value, str):
            if value != "causal":
                raise ExampleFileError(f"{where}: mask={value!r} must be 'causal' or a matrix")
            return value
        if not isinstance(value, list):
            raise ExampleFileError(f"{where}: mask must be 'causal' or a matrix")
        return value
    if key in ("causal_alignment", "masked_rows"):
        if not isinstance(value, str):
            raise ExampleFileError(f"{where}: {key} must be a string")
        return value
    if key == "window":  # the engine checks the values (integers >= 0 or -1)
        if not isinstance(value, list) or len(value) != 2:
            raise ExampleFileError(f"{where}: window={value!r} must be [left, right] "
                                   "(integers, -1 for unbounded)")
        return tuple(value)
    if key == "softcap":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ExampleFileError(f"{where}: softcap={value!r} must be a number or number "
                                   "string")
        return value
    if key in ("alibi_slopes", "sinks"):  # one entry per head
        if not isinstance(value, list) or not value or any(
                isinstance(x, bool) or not isinstance(x, (int, float, str)) for x in value):
            raise ExampleFileError(f"{where}: {key} must be a list of numbers, one per head")
        return value
    raise AssertionError(key)  # pragma: no cover


def _claim(item: Any, index: int, where: str) -> Claim:
    cwhere = f"{where}: claim #{index + 1}"
    if not isinstance(item, dict):
        raise ExampleFileError(f"{cwhere} is not a table")
    unknown = set(item) - _CLAIM_KEYS
    if unknown:
        raise ExampleFileError(f"{cwhere}: unknown key(s) {', '.join(sorted(unknown))}")
    quantity, claimed = item.get("quantity"), item.get("claimed")
    if not isinstance(quantity, str) or not quantity.strip():
        raise ExampleFileError(f"{cwhere}: quantity must be a non-empty string")
    if isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
        raise ExampleFileError(f"{cwhere}: claimed={claimed!r} must be a string, as printed "
                               f"(write claimed = \"{claimed}\")")
    if not isinstance(claimed, str) or not claimed.strip():
        raise ExampleFileError(f"{cwhere}: claimed must be a non-empty string (as printed)")
    head = item.get("head", 1)
    if not isinstance(head, int) or isinstance(head, bool) or head < 1:
        raise ExampleFileError(f"{cwhere}: head={head!r} must be a positive integer (1-based)")
    expr = item.get("expr")
    if expr is not None and not isinstance(expr, str):
        raise ExampleFileError(f"{cwhere}: expr must be a string")
    rtol = item.get("rtol", None)
    rtol_f = Fraction(1, 10**6)
    if rtol is not None:
        if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 < rtol < 1:
            raise ExampleFileError(f"{cwhere}: rtol={rtol!r} must be a number in (0, 1)")
        rtol_f = Fraction(repr(float(rtol)))
    note = item.get("note", "")
    if not isinstance(note, str):
        raise ExampleFileError(f"{cwhere}: note must be a string")
    claim = Claim(quantity.strip(), claimed, head, expr, rtol_f, note)
    try:
        parse_quantity(claim.quantity)
        if parse_quantity(claim.quantity)[0] == "expr" and expr is None:
            raise ClaimError("quantity 'expr' needs expr = \"...\"")
    except ClaimError as exc:
        raise ExampleFileError(f"{cwhere}: {exc}") from None
    return claim


def select_examples(examples: Sequence[WorkedExample], names: Sequence[str] | None
                    ) -> list[WorkedExample]:
    """The examples named in ``names`` (all when None or empty), in the order given."""
    if not names:
        return list(examples)
    by_name = {e.name: e for e in examples}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ExampleFileError(f"no example named {', '.join(map(repr, missing))}; "
                               f"the file has {', '.join(repr(n) for n in by_name)}")
    return [by_name[n] for n in dict.fromkeys(names)]
