"""The textbook verifier: worked-example files, checked claim by claim.

A worked-example file is TOML (see ``docs/worked-example-format.md``)::

    [[example]]
    name = "A"
    query = [[1, 0], [0, 1]]
    key   = [[1, 0], [0, 1]]
    value = [[2, 0], [0, 4]]

    [[example.claim]]
    quantity = "weight[1,1]"     # 1-based, as books count
    claimed  = "≈ 0.6698"        # exactly as printed

Each claim is judged at the precision its printed digits state
(:mod:`mha_symbolic.textbook.claims`), against the exact value from the engine, with
certified digits (:mod:`mha_symbolic.exact.certified`).  A wrong claim is diagnosed
when a specific slip provably reproduces it: truncation instead of rounding,
rounding in the wrong direction, premature rounding of an earlier printed
value, scaling by d_k (or not at all) instead of sqrt(d_k), softmax over the
query axis, a transposed shape, biases counted or W^O left out.

>>> report = check_examples(load_examples(text='''
... [[example]]
... name = "C"
... scores = [[2, 2, 2]]
... value = [[10], [20], [30]]
... [[example.claim]]
... quantity = "output[1,1]"
... claimed = "20"
... '''))
>>> report.records[0].verdict, report.ok
('exact', True)
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..errors import ClaimError, ExampleFileError, MhaSymbolicError
from .claims import PrintedAnswer, parse_printed

__all__ = [
    "CheckReport",
    "Claim",
    "ClaimRecord",
    "WorkedExample",
    "check_examples",
    "cli_check",
    "load_examples",
]

MAX_FILE_BYTES = 1_000_000
MAX_EXAMPLES = 500
MAX_CLAIMS = 5000

_INPUT_KEYS = ("scores", "query", "key", "value", "x", "x_kv", "w_q", "w_k", "w_v", "w_o",
               "b_q", "b_k", "b_v", "b_o")
_OPTION_KEYS = ("heads", "kv_heads", "d_k", "scale", "mask", "causal_alignment", "masked_rows")
_DIM_KEYS = ("n_q", "n_k", "d_model", "d_v", "kdim", "vdim", "bias", "add_bias_kv")
_EXAMPLE_KEYS = {"name", "title", "notes", "claim", *_INPUT_KEYS, *_OPTION_KEYS, *_DIM_KEYS}
_CLAIM_KEYS = {"quantity", "claimed", "head", "expr", "rtol", "note"}

_MATRIX_QUANTITIES = {
    "score": "scores Q_i K_i^T",
    "scaled_score": "scaled scores",
    "weight": "softmax weights",
    "head_output": "head output A_i V_i",
    "concat": "concatenated heads",
    "output": "block output",
    "q": "queries", "k": "keys", "v": "values",
}
_SHAPE_NAMES = ("x", "x_kv", "w_q", "w_k", "w_v", "q", "k", "v", "scores", "weights", "head",
                "concat", "w_o", "output")
_DIM_NAMES = ("n_q", "n_k", "d_model", "heads", "kv_heads", "d_k", "d_v", "kdim", "vdim",
              "concat_width")
_PARAM_NAMES = ("total", "weights", "biases", "w_q", "w_k", "w_v", "w_o", "w_q_head", "w_k_head",
                "w_v_head", "qkv")
_QUANTITY = re.compile(r"^(?P<name>[a-z_]+)(?:\.(?P<sub>[a-z_]+))?(?:\[(?P<idx>[\d,\s]*)\])?$")


# --------------------------------------------------------------------------- model
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


@dataclass(frozen=True)
class ClaimRecord:
    """The verdict on one claim."""

    example: str
    quantity: str
    head: int
    claimed: str
    exact: str  # certified digits (or the exact integer / shape)
    exact_form: str  # the exact value, symbolically, where it is short
    rounded: str | None  # the correct answer at the claim's precision
    precision: str
    verdict: str  # "exact" | "correctly rounded" | "approximation" | "wrong"
    ok: bool
    error_units: str | None  # signed error in units of the last printed digit
    diagnosis: str | None
    note: str = ""
    exact_expr: Any = field(default=None, compare=False, repr=False)  # SymPy value / tuple / Shape

    def as_dict(self) -> dict[str, Any]:
        return {
            "example": self.example, "quantity": self.quantity, "head": self.head,
            "claimed": self.claimed, "exact": self.exact, "exact_form": self.exact_form,
            "rounded": self.rounded, "precision": self.precision, "verdict": self.verdict,
            "ok": self.ok, "error_units": self.error_units, "diagnosis": self.diagnosis,
        }


@dataclass(frozen=True)
class CheckReport:
    """Verdicts on every claim of a set of worked examples."""

    examples: tuple[WorkedExample, ...]
    records: tuple[ClaimRecord, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records)

    def summary(self) -> dict[str, int]:
        counts = {"claims": len(self.records), "hold": sum(r.ok for r in self.records),
                  "wrong": sum(not r.ok for r in self.records)}
        for verdict in ("exact", "correctly rounded", "approximation", "wrong"):
            counts[verdict] = sum(r.verdict == verdict for r in self.records)
        counts["diagnosed"] = sum(r.diagnosis is not None for r in self.records if not r.ok)
        return counts

    def by_example(self) -> list[tuple[WorkedExample, list[ClaimRecord]]]:
        return [(ex, [r for r in self.records if r.example == ex.name]) for ex in self.examples]

    # -- renderings ------------------------------------------------------------------
    def text(self) -> str:
        out: list[str] = []
        for ex, records in self.by_example():
            out.append(f"Example {ex.name}" + (f" — {ex.title}" if ex.title else ""))
            if not records:
                out.append("  (no claims)")
            qw = max((len(_label(r)) for r in records), default=8)
            cw = max((len(r.claimed) for r in records), default=8)
            for r in records:
                mark = "✓" if r.ok else "✗"
                line = f"  {mark} {_label(r).ljust(qw)}  {r.claimed.ljust(cw)}  {r.verdict}"
                if r.verdict in ("correctly rounded", "wrong") and r.precision:
                    line += f" ({r.precision})"
                out.append(line)
                out.append(f"      exact: {r.exact}" + (f" = {r.exact_form}" if r.exact_form
                                                          and r.exact_form != r.exact else ""))
                if not r.ok:
                    if r.rounded is not None:
                        out.append(f"      correct answer: {r.rounded}"
                                   + (f"; off by {r.error_units} in the last printed digit"
                                      if r.error_units else ""))
                    if r.diagnosis:
                        out.append(f"      diagnosis: {r.diagnosis}")
            out.append("")
        s = self.summary()
        out.append(f"{s['claims']} claims: {s['hold']} hold ({s['exact']} exact, "
                   f"{s['correctly rounded']} correctly rounded, {s['approximation']} "
                   f"approximations), {s['wrong']} wrong ({s['diagnosed']} diagnosed).")
        out.append("Digits shown as exact are certified (exact rational arithmetic or Arb "
                   "enclosures); '…' means the expansion continues.")
        return "\n".join(out)

    def json(self) -> str:
        return json.dumps({"claims": [r.as_dict() for r in self.records],
                           "summary": {**self.summary(), "ok": self.ok}},
                          indent=2, ensure_ascii=False)

    def markdown(self) -> str:
        out: list[str] = []
        for ex, records in self.by_example():
            out.append(f"### Example {ex.name}" + (f" — {ex.title}" if ex.title else ""))
            out.append("")
            out.append("| | quantity | claimed | exact (certified digits) | verdict | diagnosis |")
            out.append("|---|---|---|---|---|---|")
            for r in records:
                verdict = r.verdict + (f" ({r.precision})" if r.verdict != "exact" else "")
                if not r.ok and r.rounded is not None:
                    verdict += f"; correct: {r.rounded}"
                cells = ["✓" if r.ok else "✗", f"`{_label(r)}`", _md(r.claimed), _md(r.exact),
                         _md(verdict), _md(r.diagnosis or "")]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        s = self.summary()
        out.append(f"**{s['claims']} claims: {s['hold']} hold, {s['wrong']} wrong "
                   f"({s['diagnosed']} diagnosed).**")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        rows = []
        for r in self.records:
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                "✓" if r.ok else "✗", r.example, _label(r), r.claimed, r.exact, r.verdict,
                r.diagnosis or "")) + "</tr>")
        head = "".join(f"<th>{h}</th>" for h in ("", "example", "quantity", "claimed", "exact",
                                                  "verdict", "diagnosis"))
        return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _label(r: ClaimRecord) -> str:
    return r.quantity + (f" (head {r.head})" if r.head != 1 else "")


def _md(s: str) -> str:
    return s.replace("|", "\\|")


# --------------------------------------------------------------------------- loading
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
        _parse_quantity(claim.quantity)
        if _parse_quantity(claim.quantity)[0] == "expr" and expr is None:
            raise ClaimError("quantity 'expr' needs expr = \"...\"")
    except ClaimError as exc:
        raise ExampleFileError(f"{cwhere}: {exc}") from None
    return claim


def _parse_quantity(q: str) -> tuple[str, str | None, tuple[int, ...]]:
    m = _QUANTITY.match(q.replace(" ", ""))
    if not m:
        raise ClaimError(f"quantity={q!r} is not of the form name, name[i], name[i,j] or "
                         "shape.name / dim.name / params.name")
    name, sub, idx = m.group("name"), m.group("sub"), m.group("idx")
    indices = tuple(int(i) for i in idx.split(",") if i) if idx else ()
    if any(i < 1 for i in indices):
        raise ClaimError(f"quantity={q!r}: indices are 1-based")
    if name in _MATRIX_QUANTITIES:
        if sub or len(indices) not in (1, 2):
            raise ClaimError(f"quantity={q!r}: {name} needs [row] or [row,column]")
    elif name in ("weight_sum", "gap"):
        if sub or len(indices) != 1:
            raise ClaimError(f"quantity={q!r}: {name} needs [row]")
    elif name in ("expr", "scale"):
        if sub or indices:
            raise ClaimError(f"quantity={q!r}: {name} takes no index")
    elif name in ("shape", "dim", "params"):
        allowed = {"shape": _SHAPE_NAMES, "dim": _DIM_NAMES, "params": _PARAM_NAMES}[name]
        if sub not in allowed or indices:
            raise ClaimError(f"quantity={q!r}: {name}.NAME with NAME one of {', '.join(allowed)}")
    else:
        known = sorted([*_MATRIX_QUANTITIES, "weight_sum", "gap", "scale", "expr", "shape.*",
                        "dim.*", "params.*"])
        raise ClaimError(f"unknown quantity={q!r}; known: {', '.join(known)}")
    return name, sub, indices


# --------------------------------------------------------------------------- values
def _quantity_value(ex: WorkedExample, claim: Claim, att: Any = None) -> Any:
    """The exact value of a claim's quantity: a SymPy scalar, a tuple, a Shape or an int."""
    name, sub, idx = _parse_quantity(claim.quantity)
    if name == "expr":
        from ..exact.grammar import parse_number

        assert claim.expr is not None
        return parse_number(claim.expr)
    if name == "shape":
        from ..exact.shapes import attention_shapes

        return attention_shapes(ex.spec)[sub or ""].shape
    if name == "dim":
        spec = ex.spec
        if sub == "concat_width":
            return _count(spec.heads) * _count(spec.d_v)
        return _count(getattr(spec, sub or ""))
    if name == "params":
        return _param(ex.spec, sub or "")
    att = att if att is not None else ex.attention()
    if att is None:
        raise ClaimError(f"{claim.quantity}: example {ex.name!r} gives no inputs to compute it")
    h = claim.head - 1
    if not 0 <= h < len(att.heads):
        raise ClaimError(f"{claim.quantity}: head={claim.head} but the example has "
                         f"{len(att.heads)} head(s)")
    head = att.heads[h]
    if name == "scale":
        return att.scale
    if name in ("weight_sum", "gap"):
        import sympy as sp

        w = head.weights if name == "weight_sum" else head.scaled
        r = idx[0] - 1
        _check_index(claim.quantity, r, w.rows, "row")
        row = [w[r, j] for j in range(w.cols)]
        if name == "weight_sum":
            return sp.Add(*row)
        # gap: the top scaled score minus the runner-up (certified ordering)
        finite = [e for e in row if e != -sp.oo]
        if len(finite) < 2:
            raise ClaimError(f"{claim.quantity}: the row has fewer than two unmasked scores")
        from functools import cmp_to_key

        from ..exact.certified import certify

        def descending(a: Any, b: Any) -> int:
            return certify(b - a).sign()

        ordered = sorted(finite, key=cmp_to_key(descending))
        return ordered[0] - ordered[1]
    matrix = {
        "score": head.scores, "scaled_score": head.scaled, "weight": head.weights,
        "head_output": head.output, "concat": att.concat, "output": att.final()
        if att.concat is not None else None, "q": head.q, "k": head.k, "v": head.v,
    }[name]
    if matrix is None:
        raise ClaimError(f"{claim.quantity}: example {ex.name!r} does not give what this needs")
    r = idx[0] - 1
    _check_index(claim.quantity, r, matrix.rows, "row")
    if len(idx) == 2:
        c = idx[1] - 1
        _check_index(claim.quantity, c, matrix.cols, "column")
        return matrix[r, c]
    return tuple(matrix[r, c] for c in range(matrix.cols))


def _check_index(q: str, i: int, n: int, what: str) -> None:
    if not 0 <= i < n:
        raise ClaimError(f"{q}: {what} {i + 1} is out of range 1..{n}")


def _count(x: Any) -> Any:
    if x is None:
        raise ClaimError("the example does not state this size")
    return x


def _param(spec: Any, part: str) -> Any:
    from ..exact.params import parameter_count

    if spec.d_model is None or spec.d_k is None or spec.d_v is None:
        raise ClaimError("parameter counts need d_model (and heads, or d_k and d_v): "
                         "the example does not state them")
    pc = parameter_count(spec)
    by = {n: c for n, _, c in pc.parts}
    table = {
        "total": pc.total, "weights": pc.weights, "biases": pc.biases,
        "w_q": by["W^Q"], "w_k": by["W^K"], "w_v": by["W^V"], "w_o": by["W^O"],
        "w_q_head": spec.d_model * spec.d_k, "w_k_head": spec.kdim * spec.d_k,
        "w_v_head": spec.vdim * spec.d_v, "qkv": by["W^Q"] + by["W^K"] + by["W^V"],
    }
    return table[part]


# --------------------------------------------------------------------------- judging
@dataclass(frozen=True)
class _Judgement:
    verdict: str
    ok: bool
    rounded: str | None = None
    error_units: str | None = None


def _fraction_text(x: Fraction, unit: Fraction) -> str:
    """Exact decimal text of x, a multiple of ``unit`` (a power of ten)."""
    from ..exact.certified import _format_fraction
    from .claims import _places

    return _format_fraction(x, max(_places(unit), 0))


def _decimal_text(x: Fraction) -> str:
    """A terminating decimal Fraction as its exact decimal text."""
    from ..exact.certified import certify

    return certify(x).digits(60)


def _judge_decimal(value: Any, p: PrintedAnswer) -> _Judgement:
    from ..exact.certified import certify

    assert p.value is not None and p.unit is not None
    cv = certify(value)
    if cv.compare(p.value) == 0:
        return _Judgement("exact", True)
    from .claims import _places

    places = _places(p.unit)
    rounded = cv.round_places(places)
    text = _fraction_text(rounded, p.unit)
    if rounded == p.value:
        return _Judgement("correctly rounded", True, text)
    # An exact tie: both neighbours are correct roundings (half-up and half-even).
    # An exact tie (the value half-way between the printed answer and its neighbour, also
    # as a rational in disguise) accepts both neighbours. compare() is 0 only for an exact
    # equality; the costly exact algebra runs only when the enclosures cannot separate.
    half = p.unit / 2
    if cv.compare(p.value + half) == 0 or cv.compare(p.value - half) == 0:
        return _Judgement("correctly rounded", True, text)
    exact = cv.exact
    err = certify((p.value - cv.expr) / p.unit if exact is None else (p.value - exact) / p.unit)
    return _Judgement("wrong", False, text, _signed(err))


def _signed(cv: Any) -> str:
    """A signed error size with 2 significant digits, for any magnitude (no float overflow)."""
    x = cv.round_significant(2)
    if x == 0:
        return "+0"
    from ..exact.certified import _exponent10

    k = _exponent10(x)
    if -4 <= k <= 15:
        return f"{float(x):+.2g}"
    m = x / Fraction(10) ** k
    return f"{float(m):+.2g}e{k:+d}"


def _judge_expression(value: Any, p: PrintedAnswer, rtol: Fraction) -> _Judgement:
    from ..exact.certified import certify

    diff = certify(value - p.expr)
    if diff.sign() == 0:
        return _Judgement("exact", True)
    if p.approx:
        target = certify(value)
        if target.sign() == 0:
            return _Judgement("wrong", False)
        rel = certify(abs(value - p.expr) / abs(value))
        ok = rel.compare(rtol) <= 0
        size = rel.round_significant(2)
        return _Judgement("approximation" if ok else "wrong", ok,
                          error_units=f"relative error {float(size):.2g}")
    return _Judgement("wrong", False)


def _special(value: Any) -> str | None:
    """'-inf' for a masked (−∞) entry, 'nan' for a NaN one, else None."""
    import sympy as sp

    if value == -sp.oo:
        return "-inf"
    if value is sp.nan:
        return "nan"
    return None


def _judge(value: Any, p: PrintedAnswer, rtol: Fraction) -> _Judgement:
    special = _special(value)
    if special is not None or p.kind == "special":
        ok = special == p.expr
        return _Judgement("exact" if ok else "wrong", ok,
                          None if ok else {"-inf": "−∞", "nan": "NaN"}.get(special or ""))
    if p.kind == "decimal":
        return _judge_decimal(value, p)
    if p.kind == "expression":
        return _judge_expression(value, p, rtol)
    raise ClaimError(f"claimed={p.text!r} cannot be compared with a single number")


# --------------------------------------------------------------------------- diagnosis
def _claimed_weights(ex: WorkedExample, upto: int) -> dict[tuple[int, int, int], Fraction]:
    """Weights printed by the example's earlier claims: (head, row, col) -> value (0-based).

    The values are :class:`_Printed` fractions, which remember the text as printed."""
    got: dict[tuple[int, int, int], Fraction] = {}
    for claim in ex.claims[:upto]:
        try:
            name, _, idx = _parse_quantity(claim.quantity)
            if name != "weight":
                continue
            p = parse_printed(claim.claimed)
        except MhaSymbolicError:
            continue
        h = claim.head - 1
        if len(idx) == 2 and p.kind == "decimal" and p.value is not None:
            got[(h, idx[0] - 1, idx[1] - 1)] = _Printed(p.value, p.text)
        elif len(idx) == 1 and p.kind == "tuple":
            for c, part in enumerate(p.parts):
                if part.kind == "decimal" and part.value is not None:
                    got[(h, idx[0] - 1, c)] = _Printed(part.value, part.text)
    return got


class _Printed(Fraction):
    """A Fraction that remembers how it was printed ("0.0900", not "0.09")."""

    text: str

    def __new__(cls, value: Fraction, text: str) -> _Printed:
        self = super().__new__(cls, value)
        self.text = text.strip().lstrip("≈~= ").strip()
        return self


def _premature(ex: WorkedExample, index: int, claim: Claim, p: PrintedAnswer) -> str | None:
    """Does the claim equal the computation redone with earlier printed (rounded) weights?"""
    name, _, idx = _parse_quantity(claim.quantity)
    att = ex.attention()
    if att is None or name not in ("head_output", "weight", "weight_sum", "output", "concat"):
        return None
    h = claim.head - 1
    weights = _claimed_weights(ex, index)
    r = idx[0] - 1
    n_k = att.heads[h].weights.cols
    if name == "weight" and len(idx) == 2:
        # the complement: w_rc = 1 - (sum of the other printed weights of the row)
        others = [weights.get((h, r, j)) for j in range(n_k) if j != idx[1] - 1]
        if any(o is None for o in others) or not others:
            return None
        value = 1 - sum(o for o in others if o is not None)
        how = "1 − (the other printed weights of the row)"
        candidates = [value]
    else:
        if name in ("output", "concat") and (len(att.heads) != 1 or att.output is not None):
            return None
        row = [weights.get((h, r, j)) for j in range(n_k)]
        exact_row = att.heads[h].weights.row(r)
        for j, w in enumerate(row):
            if w is None and exact_row[j] == 0:
                row[j] = Fraction(0)
        if any(w is None for w in row):
            return None
        if name == "weight_sum":
            candidates = [sum(w for w in row if w is not None)]
        else:
            v = att.heads[h].v
            cols = [idx[1] - 1] if len(idx) == 2 else list(range(v.cols))
            candidates = []
            for c in cols:
                total = Fraction(0)
                for j, w in enumerate(row):
                    assert w is not None
                    vj = v[j, c]
                    if not vj.is_Rational:
                        return None
                    total += w * Fraction(int(vj.p), int(vj.q))
                candidates.append(total)
        how = "the rounded weights printed earlier (" + ", ".join(
            w.text if isinstance(w, _Printed) else _decimal_text(w) for w in row
            if w is not None) + ")"
    parts = p.parts if p.kind == "tuple" else (p,)
    if len(parts) != len(candidates):
        return None
    for part, cand in zip(parts, candidates, strict=True):
        if part.kind != "decimal" or part.value is None or part.unit is None:
            return None
        import sympy as sp

        from ..exact.certified import certify
        from .claims import _places

        cv = certify(sp.Rational(cand.numerator, cand.denominator))
        if cv.round_places(_places(part.unit)) != part.value:
            return None
    exact = all(part.value == cand for part, cand in zip(parts, candidates, strict=True))
    return ("premature rounding: the printed answer is " + ("exactly " if exact else "")
            + f"what {how} give; computed from exact weights it differs")


def _variant_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    """Does the claim match a classic slip (wrong scale, softmax over the wrong axis)?"""
    name, _, _ = _parse_quantity(claim.quantity)
    if name not in _MATRIX_QUANTITIES and name != "weight_sum":
        return None
    att = ex.attention()
    if att is None or name in ("score", "q", "k", "v"):
        return None
    import sympy as sp

    d_k = att.spec.d_k
    variants: list[tuple[str, dict[str, Any]]] = []
    if d_k is not None and ex.options.get("scale") is None:
        variants += [
            (f"scaled by 1/d_k = 1/{d_k} instead of 1/sqrt(d_k)", {"scale": sp.Rational(1, d_k)}),
            ("not scaled at all (the 1/sqrt(d_k) factor is missing)", {"scale": 1}),
            ("multiplied by sqrt(d_k) instead of divided", {"scale": sp.sqrt(d_k)}),
        ]
    if name not in ("scaled_score", "weight_sum") and att.spec.n_q > 1:
        variants.append(("softmax taken over the query axis (columns) instead of the keys",
                         {"softmax_over": "queries"}))
    parts = p.parts if p.kind == "tuple" else (p,)
    # A one-digit answer matches too many variants to single one out, unless a
    # variant gives it exactly.
    coarse = all(part.kind == "decimal" and part.significant_digits < 2 for part in parts)
    for text, changes in variants:
        try:
            alt = ex.attention(**changes)
            value = _quantity_value(ex, claim, alt)
            if _holds(value, p, claim.rtol, exactly=coarse):
                return text
        except MhaSymbolicError:
            continue
    return None


def _holds(value: Any, p: PrintedAnswer, rtol: Fraction, *, exactly: bool = False) -> bool:
    """Whether the printed answer holds for ``value`` (``exactly``: with verdict exact)."""
    def ok(v: Any, part: PrintedAnswer) -> bool:
        j = _judge(v, part, rtol)
        return j.verdict == "exact" if exactly else j.ok

    if p.kind == "tuple":
        if not isinstance(value, tuple) or len(value) != len(p.parts):
            return False
        return all(ok(v, part) for v, part in zip(value, p.parts, strict=True))
    if isinstance(value, tuple):
        return False
    return ok(value, p)


def _digit_diagnosis(value: Any, p: PrintedAnswer) -> str | None:
    """Truncation, or rounding the wrong way, for one decimal claim."""
    if _special(value) == "-inf":
        return "the entry is masked out (−∞): no finite score is right, and its weight is exactly 0"
    if p.kind != "decimal" or p.value is None or p.unit is None or _special(value):
        return None
    from ..exact.certified import certify
    from .claims import _places

    cv = certify(value)
    places = _places(p.unit)
    if cv.truncate_places(places) == p.value:
        return "digits truncated instead of rounded"
    err = cv.compare(p.value - p.unit) > 0 and cv.compare(p.value + p.unit) < 0
    if err:
        return "rounded in the wrong direction (within one unit of the last digit)"
    return None


def _count_diagnosis(ex: WorkedExample, claim: Claim, p: PrintedAnswer) -> str | None:
    name, sub, _ = _parse_quantity(claim.quantity)
    if name != "params" or p.kind not in ("decimal", "expression"):
        return None
    import dataclasses

    from ..exact.params import parameter_count

    spec = ex.spec
    claimed = p.value if p.kind == "decimal" else p.expr
    flipped = dataclasses.replace(spec, bias=not spec.bias)
    pc, pf = parameter_count(spec), parameter_count(flipped)
    wo = dict((n, c) for n, _, c in pc.parts)["W^O"]
    candidates = {
        ("counts the biases too" if not spec.bias else "leaves the biases out"): pf.total,
        "leaves W^O out (counts only W^Q, W^K, W^V)": pc.total - wo,
        "counts one head's projections instead of all heads": spec.d_model * spec.d_k * 3 + wo,
    }
    if sub == "total":
        for text, value in candidates.items():
            if value == claimed:
                return text
    return None


def _shape_record(ex: WorkedExample, claim: Claim, value: Any) -> ClaimRecord:
    from ..exact.shapes import Shape, same_size

    p = parse_printed(claim.claimed, shape=True)
    import sympy as sp

    def size(x: Any) -> Any:
        return x if isinstance(x, int) else sp.Symbol(x, integer=True, positive=True)

    claimed = Shape(size(p.sizes[0]), size(p.sizes[1]))
    ok = same_size(claimed.rows, value.rows) and same_size(claimed.cols, value.cols)
    diagnosis = None
    if not ok and same_size(claimed.rows, value.cols) and same_size(claimed.cols, value.rows):
        diagnosis = "transposed: rows and columns swapped"
    return ClaimRecord(ex.name, claim.quantity, claim.head, claim.claimed, str(value), "",
                       None if ok else str(value), "shape", "exact" if ok else "wrong", ok,
                       None, diagnosis, claim.note, value)


def _describe(value: Any, sig: int) -> tuple[str, str]:
    """(certified digits, short exact form) of a value."""
    import sympy as sp

    from ..exact.certified import certify

    special = _special(value)
    if special is not None:
        return ("−∞" if special == "-inf" else "NaN"), ""
    cv = certify(value)
    digits = cv.digits(sig)
    form = str(sp.together(value) if value.is_Add else value).replace("**", "^")
    if len(form) > 60 or form == digits:
        form = ""
    return digits, form


def _check_claim(ex: WorkedExample, index: int, claim: Claim) -> ClaimRecord:
    name, _, _ = _parse_quantity(claim.quantity)
    value = _quantity_value(ex, claim)
    if name == "shape":
        return _shape_record(ex, claim, value)
    p = parse_printed(claim.claimed)
    import sympy as sp

    values = value if isinstance(value, tuple) else (value,)
    parts = p.parts if p.kind == "tuple" else (p,)
    if p.kind == "tuple" and not isinstance(value, tuple):
        raise ClaimError(f"{claim.quantity} is one number but claimed={claim.claimed!r} is a tuple")
    if isinstance(value, tuple) and len(parts) != len(values):
        raise ClaimError(f"{claim.quantity} has {len(values)} entries but claimed="
                         f"{claim.claimed!r} has {len(parts)}")
    judgements = [_judge(sp.sympify(v), part, claim.rtol) for v, part in zip(values, parts, strict=True)]
    # enough certified digits to see why the verdict holds: three beyond the claim's,
    # at least 15, and 20 for formulas (1 − e^(−32) only differs after 14 nines)
    sig = max([part.significant_digits + 3 for part in parts]
              + [20 if any(part.kind == "expression" for part in parts) else 15])
    described = [_describe(sp.sympify(v), sig) for v in values]
    exact = ", ".join(d for d, _ in described)
    form = ", ".join(f for _, f in described if f)
    if len(values) > 1:
        exact = f"({exact})"
        form = f"({form})" if form and all(f for _, f in described) else ""
    ok = all(j.ok for j in judgements)
    verdicts = [j.verdict for j in judgements]
    verdict = ("wrong" if not ok else "exact" if all(v == "exact" for v in verdicts)
               else "approximation" if "approximation" in verdicts else "correctly rounded")
    rounded = None
    if any(j.rounded for j in judgements):
        rounded_parts = [j.rounded or part.text.strip() for j, part in zip(judgements, parts, strict=True)]
        rounded = rounded_parts[0] if len(parts) == 1 else "(" + ", ".join(rounded_parts) + ")"
    errors = [j.error_units for j in judgements if j.error_units]
    error_units = ", ".join(errors) if errors else None
    diagnosis = None
    if not ok:
        diagnosis = (_premature(ex, index, claim, p) or _variant_diagnosis(ex, claim, p)
                     or _count_diagnosis(ex, claim, p))
        if diagnosis is None and len(values) == 1:
            diagnosis = _digit_diagnosis(sp.sympify(values[0]), parts[0])
    precision = "; ".join(d for d in dict.fromkeys(part.describe_precision() for part in parts) if d)
    return ClaimRecord(ex.name, claim.quantity, claim.head, claim.claimed, exact, form, rounded,
                       precision, verdict, ok, error_units, diagnosis, claim.note, value)


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


def check_examples(examples: Iterable[WorkedExample] | WorkedExample,
                   only: Sequence[str] | None = None) -> CheckReport:
    """Check every claim of the examples; ``only`` restricts to examples by name."""
    exs = [examples] if isinstance(examples, WorkedExample) else list(examples)
    exs = select_examples(exs, only)
    records: list[ClaimRecord] = []
    for ex in exs:
        for i, claim in enumerate(ex.claims):
            try:
                records.append(_check_claim(ex, i, claim))
            except MhaSymbolicError as exc:
                raise type(exc)(f"example {ex.name!r}, claim {claim.quantity!r}: {exc}") from None
    return CheckReport(tuple(exs), tuple(records))


def cli_check(args: Any) -> int:
    examples = load_examples(args.file)
    report = check_examples(examples, only=args.example)
    if args.format == "json":
        print(report.json())
    elif args.format == "markdown":
        print(report.markdown())
    else:
        print(report.text())
    return 0 if report.ok else 1
