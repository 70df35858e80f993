"""Worked-example files: the TOML format (docs/worked-example-format.md), read into
:class:`WorkedExample` objects with their claims, every key and value checked.

Every error names the file and the line (``FILE:LINE: example 'A': …``; lines from
:mod:`.locations`).  A problem confined to one claim (an unknown quantity, an
unreadable answer) does not stop the file: the claim keeps its ``error`` and is
reported with the verdict ``unreadable`` while the other claims are checked.

>>> ex = load_examples(text="[[example]]\\nname='A'\\nscale=1\\nscores=[[0, 0]]\\n"
...                         "[[example.claim]]\\nquantity='weight[1,1]'\\nclaimed='0.5'\\n")[0]
>>> ex.claims[0].line, ex.batch_size
(7, 1)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from .._text import echo, int_text, plural, sanitize
from ..errors import ClaimError, ExampleFileError, MhaSymbolicError
from .example_values import (
    _BIAS_PARTS,
    _dim,
    _is_printout,
    _matrix_input,
    _option,
    _show,
    printout_matrix,
)
from .quantities import parse_axes, parse_quantity
from .sizes import resolve_divisions

__all__ = ["Claim", "WorkedExample", "load_examples", "select_examples"]


MAX_FILE_BYTES = 1_000_000
MAX_EXAMPLES = 500
MAX_CLAIMS = 2000
#: Work of checking a file: each claim counts CLAIM_COST plus the atoms of its value
#: (calibrated in bench/RESULTS.md, issue 15: a few seconds at the limit).
CLAIM_COST = 200
MAX_CHECK_WORK = 200_000
#: Exact work of all the examples of one file together, in the engine's terms (each
#: example on its own is bounded by ``exact.engine.MAX_WORK``; calibrated in
#: bench/RESULTS.md, issue 30: the slowest file it admits loads in seconds).
MAX_FILE_WORK = 1_000_000
#: Entries drawn by seeded initialisers (``[example.init]``) in one file, counted from
#: the draws' sizes before anything is drawn.
MAX_FILE_DRAW_ENTRIES = 262_144
_INPUT_KEYS = ("scores", "query", "key", "value", "x", "x_kv", "w_q", "w_k", "w_v", "w_o",
               "w_qkv", "b_q", "b_k", "b_v", "b_o", "b_qkv")
_OPTION_KEYS = ("heads", "kv_heads", "d_k", "scale", "mask", "causal_alignment", "masked_rows",
                "mask_fill", "mask_fill_stage", "masked", "valid_lens", "layout", "qkv_layout",
                "window", "softcap", "alibi_slopes", "sinks")
_DIM_KEYS = ("n_q", "n_k", "d_model", "d_v", "kdim", "vdim", "bias", "add_bias_kv", "batch")
_META_KEYS = ("name", "title", "notes", "claim", "inputs", "arrays", "init",
               "grad_output", "tokens")
#: Longest token name read (a figure's tick label).
MAX_TOKEN_CHARS = 40
_EXAMPLE_KEYS = {*_META_KEYS, *_INPUT_KEYS, *_OPTION_KEYS, *_DIM_KEYS}
_CLAIM_KEYS = {"quantity", "claimed", "head", "batch", "expr", "rtol", "note", "axes",
               "printer", "transposed"}


@dataclass(frozen=True)
class Claim:
    """One claim of a worked example: a quantity and its answer as printed.

    ``line`` is its line in the file (0 when unknown); ``error`` is set when the claim
    cannot be read (it is then reported as ``unreadable``)."""

    quantity: str
    claimed: str
    head: int = 1
    expr: str | None = None
    rtol: Fraction = Fraction(1, 10**6)
    note: str = ""
    batch: int = 1
    line: int = 0
    error: str | None = None
    axes: tuple[str, ...] = ()  # a shape claim's layout, as printed (batch/heads/rows/columns)
    numpy_precision: int | None = None  # printer = "numpy" (8) or "numpy:N": maxprec digits
    transposed: bool | None = None  # the printout is the quantity's transpose (.T); None: decided


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
    grad_output: Any = None  # the gradient of the concatenated head outputs (backward claims)
    source: str = ""
    line: int = 0
    printed_inputs: bool = False
    file_title: str = ""  # the file's top-level ``title`` (a derivation's title)
    #: the tokens' names, for figures: {"query": [...], "key": [...]} ("" keeps q_i / k_j)
    tokens: dict[str, list[str]] | None = None
    _attention: Any = field(default=None, repr=False)
    _gradients: Any = field(default=None, repr=False)
    _variants: dict[str, Any] = field(default_factory=dict, repr=False)
    _engine: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def has_attention(self) -> bool:
        return any(k in self.inputs for k in ("scores", "query", "x"))

    @property
    def where(self) -> str:
        """``FILE:LINE: example 'NAME'`` for messages."""
        loc = f"{self.source}:{self.line}" if self.line else self.source
        return f"{loc}: example {echo(self.name, 40)}" if loc else f"example {echo(self.name, 40)}"

    def engine_inputs(self) -> list[dict[str, Any]]:
        """Per batch element, the keyword arguments of ``exact_attention``."""
        if self._engine is None:
            from .inputs import engine_inputs

            self._engine = engine_inputs(self.inputs, self.options)
        return self._engine

    @property
    def batch_size(self) -> int:
        """The batch size (the stated ``batch``, else from the inputs; 1 without one)."""
        if self.has_attention:
            return len(self.engine_inputs())
        stated = self.dims.get("batch")
        return stated if isinstance(stated, int) else 1

    def attention(self, batch: int = 0, **changes: Any) -> Any:
        """The exact attention of the example's inputs (None for dimension-only examples)
        for batch element ``batch`` (0-based).

        ``changes`` override options (used for diagnosis variants)."""
        if not self.has_attention:
            return None
        per_batch = self.engine_inputs()
        if not 0 <= batch < len(per_batch):
            raise ClaimError(f"batch={batch + 1} but the example has {len(per_batch)} batch "
                             "element(s)")
        if not changes and batch == 0 and self._attention is not None:
            return self._attention
        key = repr((batch, sorted(changes.items(), key=lambda kv: kv[0])))
        if (changes or batch) and key in self._variants:
            return self._variants[key]
        from ..exact.engine import exact_attention

        kwargs = {**per_batch[batch], **changes}
        if kwargs.pop("_transposed", False):  # diagnosis: the weights pasted the other way round
            for w in ("w_q", "w_k", "w_v", "w_o"):
                if w in kwargs:
                    kwargs[w] = [list(col) for col in zip(*kwargs[w], strict=True)]
        result = exact_attention(**kwargs)
        if changes or batch:
            self._variants[key] = result
        else:
            self._attention = result
        return result

    def gradients(self) -> Any:
        """The exact backward pass of every head against ``grad_output``
        (:func:`mha_symbolic.exact.backward.exact_backward`), or None without one."""
        if self.grad_output is None:
            return None
        if self._gradients is None:
            from ..exact.backward import exact_backward

            att = self.attention()
            if att is None:
                from ..errors import SpecError

                raise SpecError("grad_output needs inputs to differentiate")
            self._gradients = exact_backward(att, self.grad_output)
        return self._gradients

    @property
    def spec(self) -> Any:
        """The attention specification: from the inputs, else from the stated sizes."""
        from ..exact.spec import AttentionSpec

        att = self.attention()
        stated = {k: v for k, v in {**self.dims, **self.options}.items()
                  if k in ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim",
                           "vdim", "bias", "add_bias_kv", "causal_alignment", "masked_rows")}
        if isinstance(stated.get("bias"), dict):
            stated["bias"] = tuple(stated["bias"].get(p, True) for p in _BIAS_PARTS)
        if att is not None:
            base = att.spec
            merged = {k: getattr(base, k) for k in ("n_q", "n_k", "heads", "kv_heads", "d_k",
                                                     "d_v")}
            merged.update({k: v for k, v in stated.items() if v is not None})
            inputs = att.inputs
            if merged.get("d_model") is None and inputs.get("x") is not None:
                merged["d_model"] = inputs["x"].cols  # the token width, not h·d_k
                for key, name in (("kdim", "x_kv"), ("vdim", "x_kv")):
                    if merged.get(key) is None and inputs.get(name) is not None \
                            and inputs[name] is not inputs["x"]:
                        merged[key] = inputs[name].cols
            if merged.get("d_model") is None and base.d_model is not None:
                merged["d_model"] = base.d_model
            if merged.get("d_model") is None:
                merged["d_model"] = merged["heads"] * merged["d_v"] if merged.get("d_v") else None
            return AttentionSpec(**merged)
        return AttentionSpec(**stated)


def load_examples(path: str | Path | None = None, *, text: str | None = None,
                  source: str | None = None, base_dir: str | Path | None = None
                  ) -> list[WorkedExample]:
    """Load worked examples from a TOML file (or TOML ``text``).

    Errors are :class:`~mha_symbolic.errors.ExampleFileError`, one line naming the file,
    the line, the example and the key.  Claims that cannot be read keep their ``error``
    (see :class:`Claim`).  ``source`` names ``text`` in messages; ``base_dir`` is the
    folder that file inputs (``.npy``/``.npz``, init caches) are read from (a file's
    own folder; none for text unless given).
    """
    if (path is None) == (text is None):
        raise ExampleFileError("give a path or text, not both or neither")
    src = source or "<text>"
    base = Path(base_dir) if base_dir is not None else None
    if path is not None:
        from .._io import STDIN, read_bounded

        if str(path) == STDIN:
            src = source or "<stdin>"
        else:
            p = Path(path)
            src = source or sanitize(str(p))
            base = p.parent if base is None else base
        # the size is checked before the file is read; at most the limit + 1 bytes are read
        data = read_bounded(path, MAX_FILE_BYTES)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExampleFileError(f"{src}: not UTF-8 text ({exc.reason} at byte "
                                   f"{exc.start})") from None
    assert text is not None
    if len(text) > MAX_FILE_BYTES:
        raise ExampleFileError(f"{src}: larger than {MAX_FILE_BYTES} characters")
    doc = _parse_toml(text, src)
    from .locations import locate

    loc = locate(text)
    unknown = set(doc) - {"example", "title", "source", "notes"}
    if unknown:
        key = sorted(unknown)[0]
        line = loc.top_keys.get(key, 0)
        raise ExampleFileError(f"{_at(src, line)}unknown top-level key(s) {_keys(unknown)}"
                               f"{_did_you_mean(key, ('example', 'title', 'source', 'notes'))};"
                               " examples go in [[example]] tables")
    raw = doc.get("example")
    if not isinstance(raw, list) or not raw:
        raise ExampleFileError(f"{src}: no [[example]] tables")
    if len(raw) > MAX_EXAMPLES:
        raise ExampleFileError(f"{src}: more than {MAX_EXAMPLES} examples")
    loc.check_counts(len(raw), [len(item.get("claim", [])) if isinstance(item, dict)
                                and isinstance(item.get("claim", []), list) else 0 for item in raw])
    if sum(len(item.get("claim", [])) for item in raw if isinstance(item, dict)
           and isinstance(item.get("claim", []), list)) > MAX_CLAIMS:
        raise ExampleFileError(f"{src}: more than {MAX_CLAIMS} claims")
    _check_draw_work(raw, src)
    from ..exact.budget import file_budget

    # every exact computation of the file is charged against one budget before its
    # arithmetic is done (each example is built now, so that its errors are reported here)
    with file_budget(MAX_FILE_WORK, src):
        examples = [_example(item, i, src, loc, base) for i, item in enumerate(raw)]
    title = doc.get("title", "")
    if not isinstance(title, str):
        raise ExampleFileError(f"{_at(src, loc.top_keys.get('title', 0))}title must be a string")
    for ex in examples:
        ex.file_title = title.strip()
    names = [e.name for e in examples]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ExampleFileError(f"{src}: duplicate example name(s) {_keys(dupes)}")
    _check_claim_work(examples, src)
    return examples


def _check_draw_work(raw: Sequence[Any], src: str) -> None:
    """Refuse a file whose seeded draws hold more than MAX_FILE_DRAW_ENTRIES entries in
    all, counted from the draws' sizes (each unreadable draw is reported by its example)."""
    from .seeded import draw_entries

    total = 0
    for item in raw:
        init = item.get("init") if isinstance(item, dict) else None
        draws = init.get("draws") if isinstance(init, dict) else None
        if not isinstance(draws, list):
            continue
        for text in draws[:64]:
            try:
                total += draw_entries(text)
            except ExampleFileError:
                continue
        if total > MAX_FILE_DRAW_ENTRIES:
            raise ExampleFileError(f"{src}: the seeded draws of this file hold more than "
                                   f"{MAX_FILE_DRAW_ENTRIES:,} entries in all (split the file)")


def _at(src: str, line: int) -> str:
    return f"{src}:{line}: " if line else f"{src}: "


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    """" (did you mean 'x'?)" for a near miss, else ""."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_claim_work(examples: Sequence[WorkedExample], source: str) -> None:
    """Bound the work of checking: each claim costs CLAIM_COST (reading, judging, and for
    a wrong claim the diagnoses, which redo the computation with each slip) plus the
    number of terms of the value it names (its certified evaluation, in every variant)."""
    from .quantities import parse_quantity, quantity_value

    total = 0
    for ex in examples:
        for claim in ex.claims:
            size = 1
            if claim.error is not None:  # unreadable: reported, not judged
                total += CLAIM_COST
                continue
            try:
                if parse_quantity(claim.quantity)[0] != "gap":
                    size = _leaves(quantity_value(ex, claim), MAX_CHECK_WORK)
            except MhaSymbolicError:
                pass  # reported when the claim is checked
            total += CLAIM_COST + size
            if total > MAX_CHECK_WORK:
                raise ExampleFileError(
                    f"{source}: checking these claims would take more than {MAX_CHECK_WORK:,} "
                    f"units of work (each claim counts {CLAIM_COST} plus the terms of the "
                    "value it names): split the file, or claim fewer or smaller values")


def _leaves(value: Any, cap: int) -> int:
    """Atoms in a claimed value (a number, a tuple of them, a shape), counted up to ``cap``."""
    import sympy as sp

    items = value if isinstance(value, tuple) else (value,)
    n = 0
    for item in items:
        if not isinstance(item, sp.Basic):
            n += 1
            continue
        for node in sp.preorder_traversal(item):
            if not node.args:
                n += 1
                if n > cap:
                    return n
    return n


def _keys(keys: Any, most: int = 8) -> str:
    """Names from a file for a message: quoted safely, at most ``most`` of them."""
    names = sorted(str(k) for k in keys)
    shown = ", ".join(k if k.isidentifier() and k.isascii() and len(k) <= 40 else echo(k, 40)
                      for k in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text as a dict, read at a bounded cost (see :mod:`.toml_reader`)."""
    from .toml_reader import parse_toml

    return parse_toml(text, source)


def _example(item: Any, index: int, source: str, loc: Any, base: Path | None) -> WorkedExample:
    where = f"{_at(source, loc.example(index))}example #{index + 1}"
    if not isinstance(item, dict):
        raise ExampleFileError(f"{where} is not a table")
    name = item.get("name", str(index + 1))
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise ExampleFileError(f"{where}: name must be a non-empty string")
    name = name.strip()

    def at(key: str) -> str:
        return f"{_at(source, loc.key(index, key))}example {echo(name, 40)}"

    where = f"{_at(source, loc.example(index))}example {echo(name, 40)}"
    unknown = set(item) - _EXAMPLE_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise ExampleFileError(f"{at(key)}: unknown key(s) {_keys(unknown)}"
                               f"{_did_you_mean(key, sorted(_EXAMPLE_KEYS))}")
    for key in ("title", "notes"):
        if key in item and not isinstance(item[key], str):
            raise ExampleFileError(f"{at(key)}: {key} must be a string")
    mode = item.get("inputs", "exact")
    if mode not in ("exact", "printed"):
        raise ExampleFileError(f"{at('inputs')}: inputs={_show(mode)} must be 'exact' or 'printed' "
                               "(each entry taken as the interval its printed digits state)")
    raw_inputs = {k: item[k] for k in _INPUT_KEYS if k in item}
    files = _file_inputs(item, raw_inputs, at, base)
    inputs = {k: _matrix_input(v, f"{at(k)}: {k}") for k, v in raw_inputs.items()}
    for k, v in files.items():
        if k in inputs:
            raise ExampleFileError(f"{at(k)}: {k} is given twice (in the file and by arrays/init)")
        inputs[k] = v
    options: dict[str, Any] = {}
    for key in _OPTION_KEYS:
        if key in item:
            options[key] = _option(key, item[key], at(key))
    for key in ("mask", "masked"):
        if key in files:
            options[key] = files.pop(key)
            inputs.pop(key, None)
    dims: dict[str, Any] = {}
    for key in _DIM_KEYS:
        if key in item:
            dims[key] = _dim(key, item[key], at(key))
    resolve_divisions(dims, options, at, _show)
    claims_raw = item.get("claim", [])
    if not isinstance(claims_raw, list):
        raise ExampleFileError(f"{at('claim')}: claim must be an array of tables ([[example.claim]])")
    claims = [_claim(c, j, f"{_at(source, loc.claim(index, j))}example {echo(name, 40)}",
                     lambda key, j=j: loc.claim_key(index, j, key), source)
              for j, c in enumerate(claims_raw)]
    grad_output = (_matrix_input(item["grad_output"], f"{at('grad_output')}: grad_output")
                   if "grad_output" in item else None)
    tokens = _tokens(item["tokens"], at("tokens")) if "tokens" in item else None
    ex = WorkedExample(name=name, title=item.get("title", ""), notes=item.get("notes", ""),
                       inputs=inputs, options=options, dims=dims, claims=claims, source=source,
                       line=loc.example(index), printed_inputs=mode == "printed",
                       grad_output=grad_output, tokens=tokens)
    # Build now, so that inconsistent inputs are reported at load time.
    try:
        if ex.has_attention:
            stated = dims.get("batch")
            if isinstance(stated, int) and stated != ex.batch_size:
                raise ExampleFileError(f"batch={int_text(stated)} but the inputs have a batch of "
                                       f"{ex.batch_size}")
            for b in range(ex.batch_size):
                ex.attention(b)
        ex.spec  # noqa: B018 - validates the stated sizes
        if grad_output is not None and ex.batch_size != 1:
            raise ExampleFileError("grad_output is for one batch element: this example has "
                                   f"{ex.batch_size}")
        ex.gradients()
    except MhaSymbolicError as exc:
        # an inconsistency is reported at the key it names first ("value has n_k=3 rows
        # but key has n_k=2": the line of value), not at the example's header
        raise ExampleFileError(f"{_blamed(str(exc), item, at) or where}: {exc}") from None
    if tokens is not None:
        _check_token_counts(tokens, ex, at("tokens"))
    return ex


def _tokens(raw: Any, where: str) -> dict[str, list[str]]:
    """``tokens``: one list of names (the keys', and the queries' when as many), or a
    table ``{query = [...], key = [...]}``; an empty name keeps the figure's q_i / k_j."""
    def names(value: Any, what: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ExampleFileError(f"{where}: {what} must be an array of strings")
        if any(len(v) > MAX_TOKEN_CHARS for v in value):
            raise ExampleFileError(f"{where}: a token name is longer than {MAX_TOKEN_CHARS} "
                                   "characters")
        return [v.strip() for v in value]

    if isinstance(raw, dict):
        unknown = set(raw) - {"query", "key"}
        if unknown:
            raise ExampleFileError(f"{where}: tokens takes query and key, not {_keys(unknown)}")
        return {k: names(v, f"tokens.{k}") for k, v in raw.items()}
    both = names(raw, "tokens")
    return {"key": both, "query": both}


def _check_token_counts(tokens: dict[str, list[str]], ex: WorkedExample, where: str) -> None:
    """One name per query and per key (a single list names the keys, and the queries
    only when there are as many)."""
    att = ex.attention() if ex.has_attention else None
    if att is None:
        raise ExampleFileError(f"{where}: tokens name the tokens of an example with inputs")
    n_q, n_k = att.heads[0].weights.shape
    if tokens.get("key") is tokens.get("query") and len(tokens["key"]) != n_q:
        tokens.pop("query")
    for side, n, many in (("query", n_q, "queries"), ("key", n_k, "keys")):
        if side in tokens and len(tokens[side]) != n:
            raise ExampleFileError(f"{where}: {plural(len(tokens[side]), 'name')} for the "
                                   f"{many}; the example has {int_text(n)} {many if n != 1 else side}")


def _blamed(message: str, item: dict[str, Any], at: Any) -> str | None:
    """``at(key)`` for the example's key that ``message`` starts with, if any."""
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", message)
    if m is None or m.group(0) not in item or m.group(0) in ("claim", "name"):
        return None
    return str(at(m.group(0)))


def _file_inputs(item: dict[str, Any], raw_inputs: dict[str, Any], at: Any,
                 base: Path | None) -> dict[str, Any]:
    """Inputs named by file (``x = "a.npy"``, ``arrays = "b.npz"``) or drawn by ``init``;
    removes the file-named keys from ``raw_inputs``."""
    from .arrays import exact_entries, load_array

    out: dict[str, Any] = {}
    for key in list(raw_inputs):
        if isinstance(raw_inputs[key], str) and _is_printout(raw_inputs[key]):
            raw_inputs[key] = printout_matrix(raw_inputs[key], f"{at(key)}: {key}")
        elif isinstance(raw_inputs[key], str):
            ref = raw_inputs.pop(key)
            arr = load_array(ref, base, f"{at(key)}: {key}")
            if isinstance(arr, dict):
                raise ExampleFileError(f"{at(key)}: {key}={_show(ref)} is an archive: name one array "
                                       f"('{ref}:NAME') or use arrays = {_show(ref)}")
            out[key] = exact_entries(arr, where=f"{at(key)}: {key}")
    if "arrays" in item:
        ref = item["arrays"]
        if not isinstance(ref, str):
            raise ExampleFileError(f"{at('arrays')}: arrays must be the name of an .npz file")
        data = load_array(ref, base, f"{at('arrays')}: arrays")
        if not isinstance(data, dict):
            raise ExampleFileError(f"{at('arrays')}: arrays={_show(ref)} must be an .npz archive")
        allowed = (*_INPUT_KEYS, "mask", "masked")
        for name, arr in data.items():
            if name not in allowed:
                raise ExampleFileError(f"{at('arrays')}: {_show(ref)} holds {_show(name)}, not an input key"
                                       f"{_did_you_mean(name, allowed)}")
            if name in out or name in raw_inputs:
                raise ExampleFileError(f"{at('arrays')}: {name} is given twice")
            out[name] = exact_entries(arr, allow_neg_inf=name == "mask",
                                      where=f"{at('arrays')}: {ref}:{name}")
    if "init" in item:
        from .seeded import resolve_init

        given = frozenset(k for k in (*raw_inputs, *out) if k in _INPUT_KEYS)
        for name, value in resolve_init(item["init"], base, at("init"), given).items():
            if name in out or name in raw_inputs:
                raise ExampleFileError(f"{at('init')}: init draws {name}, which is given too")
            out[name] = value
    return out


def _claim(item: Any, index: int, where: str, key_line: Any, source: str) -> Claim:
    """A claim; a claim that cannot be read keeps its ``error`` (never raises)."""
    cwhere = f"{where}, claim #{index + 1}"
    line = int(key_line("claimed")) if isinstance(item, dict) else 0
    if not isinstance(item, dict):
        return Claim("?", "?", line=line, error=f"{cwhere} is not a table")
    quantity, claimed = item.get("quantity"), item.get("claimed")
    q_text = quantity.strip() if isinstance(quantity, str) else _show(quantity)
    c_text = claimed if isinstance(claimed, str) else _show(claimed)

    def bad(key: str, message: str) -> Claim:
        ln = int(key_line(key))
        head = re.sub(r"^[^:]*:\d+: ", "", cwhere) if ln else cwhere
        prefix = f"{source}:{ln}: {head}" if ln else cwhere
        return Claim(q_text, c_text, line=ln or line,
                     error=f"{prefix} ({echo(q_text)[1:-1]}): {message}")

    unknown = set(item) - _CLAIM_KEYS
    if unknown:
        key = sorted(unknown)[0]
        return bad(key, f"unknown key(s) {_keys(unknown)}"
                        f"{_did_you_mean(key, sorted(_CLAIM_KEYS))}")
    if not isinstance(quantity, str) or not quantity.strip():
        return bad("quantity", "quantity must be a non-empty string")
    if isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
        return bad("claimed", f"claimed={_show(claimed)} must be a string, as printed "
                              f"(write claimed = \"{_show(claimed)}\")")
    if not isinstance(claimed, str) or not claimed.strip():
        return bad("claimed", "claimed must be a non-empty string (as printed)")
    numbers: dict[str, int] = {}
    for key in ("head", "batch"):
        value = item.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return bad(key, f"{key}={_show(value)} must be a positive integer (1-based)")
        numbers[key] = value
    expr = item.get("expr")
    if expr is not None and not isinstance(expr, str):
        return bad("expr", "expr must be a string")
    rtol = item.get("rtol", None)
    rtol_f = Fraction(1, 10**6)
    if rtol is not None:
        if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0 < rtol < 1:
            return bad("rtol", f"rtol={_show(rtol)} must be a number in (0, 1)")
        rtol_f = Fraction(repr(float(rtol)))
    note = item.get("note", "")
    if not isinstance(note, str):
        return bad("note", "note must be a string")
    axes: tuple[str, ...] = ()
    if "axes" in item:
        try:
            axes = parse_axes(item["axes"])
        except ClaimError as exc:
            return bad("axes", str(exc))
    numpy_precision = None
    printer = item.get("printer")
    if printer is not None:
        m = re.fullmatch(r"numpy(?::([0-9]{1,2}))?", printer) if isinstance(printer, str) else None
        if m is None or int(m.group(1) or 8) > 20:
            return bad("printer", f"printer={_show(printer)} must be \"numpy\" (precision 8) or "
                                  "\"numpy:N\" (np.set_printoptions(precision=N), N ≤ 20)")
        numpy_precision = int(m.group(1) or 8)
    transposed = item.get("transposed")
    if transposed is not None and not isinstance(transposed, bool):
        return bad("transposed", f"transposed={_show(transposed)} must be true (the printout is "
                                 "the quantity transposed, a .T view) or false")
    claim = Claim(quantity.strip(), claimed, numbers["head"], expr, rtol_f, note,
                  numbers["batch"], line, axes=axes, numpy_precision=numpy_precision,
                  transposed=transposed)
    try:
        name = parse_quantity(claim.quantity)[0]
        if name == "expr" and expr is None:
            raise ClaimError("quantity 'expr' needs expr = \"...\"")
    except ClaimError as exc:
        return bad("quantity", str(exc))
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
