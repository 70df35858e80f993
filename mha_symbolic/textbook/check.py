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

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._text import echo
from ..errors import ClaimError, ExampleFileError, MhaSymbolicError
from .alternatives import file_allowance, other_input_diagnosis
from .claims import numpy_printed, parse_printed
from .examples import Claim, WorkedExample, load_examples, select_examples
from .intermediates import PER_HEAD_INTERMEDIATES
from .quantities import MATRIX_QUANTITIES, TOKEN_QUANTITIES, parse_quantity, quantity_value
from .reports import AMBIGUOUS, CONSISTENT, CheckReport, ClaimRecord
from .roots import (
    bias_once_diagnosis,
    float32_diagnosis,
    heads_order_diagnosis,
    mask_after_softmax_diagnosis,
    row_sum_diagnosis,
    scale_constant_diagnosis,
    together,
)
from .rounded_inputs import rounded_inputs_diagnosis, unrounded_inputs_diagnosis
from .shape_claims import shape_record
from .slips import (
    approximation_diagnosis,
    count_diagnosis,
    digit_diagnosis,
    index_diagnosis,
    premature,
    variant_diagnosis,
)
from .verdicts import UNDECIDED, describe, judge, nested_shape, pairs

__all__ = [
    "CheckReport",
    "Claim",
    "ClaimRecord",
    "WorkedExample",
    "check_examples",
    "cli_check",
    "load_examples",
    "select_examples",
]


def _unreadable(ex: WorkedExample, claim: Claim, message: str) -> ClaimRecord:
    return ClaimRecord(ex.name, claim.quantity, claim.head, claim.claimed, "", "", None, "",
                       "unreadable", False, None, None, claim.note, None, file=ex.source,
                       line=claim.line, batch=claim.batch, error=message)


#: Quantities that exist once per head (their printed tensors carry a heads axis).
_PER_HEAD = ("score", "scaled_score", "weight", "head_output", "q", "k", "v",
             *PER_HEAD_INTERMEDIATES)


def _claim_value(ex: WorkedExample, claim: Claim, p: Any) -> Any:
    """The value a claim is judged against, in the orientation of its printout."""
    return _oriented(claim, p, _gathered(ex, claim, p))[0]


def _transpose(value: tuple[tuple[Any, ...], ...]) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(row[j] for row in value) for j in range(len(value[0])))


def _oriented(claim: Claim, p: Any, value: Any) -> tuple[Any, str | None]:
    """(the value laid out as the printout is, a word on it or None).  A 2-D printout
    whose shape is the quantity's transposed (columns × rows, not square) is read
    transposed; a row printed as one column (n × 1) or one row (1 × n) is the row;
    ``transposed = true`` reads a square printout transposed, ``false`` never."""
    vshape = nested_shape(value)
    if p.kind != "array" or len(p.shape) != 2 or len(vshape) not in (1, 2):
        if claim.transposed:
            raise ClaimError(f"{claim.quantity}: transposed = true needs a matrix printed as its "
                             "transpose (or a row printed as a column)")
        return value, None
    if len(vshape) == 1:
        n = vshape[0]
        if p.shape == (n, 1) and (n > 1 or claim.transposed):
            return tuple((e,) for e in value), "a column vector: read as the row it prints"
        if claim.transposed:
            raise ClaimError(f"{claim.quantity}: transposed = true, but the printout of shape "
                             f"{p.shape[0]} × {p.shape[1]} is not the row as a column ({n} × 1)")
        if p.shape == (1, n):
            return (tuple(value),), None
        return value, None
    r, c = vshape
    if claim.transposed:
        if p.shape != (c, r):
            raise ClaimError(f"{claim.quantity}: transposed = true, but the printout is "
                             f"{p.shape[0]} × {p.shape[1]} and the quantity's transpose {c} × {r}")
        return _transpose(value), "read transposed (transposed = true)"
    if claim.transposed is None and r != c and p.shape == (c, r):
        return _transpose(value), (f"read transposed: the printout is {c} × {r}, the quantity "
                                   f"{r} × {c} (a .T view)")
    return value, None


def _in_quantity_layout(p: Any, shape: tuple[int, ...]) -> Any:
    """A 2-D printout read back in the layout of its quantity (of ``shape``): a
    transposed view transposed again, a column or one row as the row it prints."""
    import dataclasses

    if p.kind != "array" or len(p.shape) != 2:
        return p
    r, c = p.shape
    if len(shape) == 1 and shape[0] == r * c:
        return dataclasses.replace(p, shape=shape)
    if shape == (c, r):
        parts = tuple(p.parts[i * c + j] for j in range(c) for i in range(r))
        return dataclasses.replace(p, parts=parts, shape=(c, r))
    return p


def _gathered(ex: WorkedExample, claim: Claim, p: Any,
              att_of: Callable[[int], Any] | None = None) -> Any:
    """The value a claim is judged against; for a printed tensor with batch and/or head
    axes (3 or 4 dimensions), the matrices gathered along them.  ``att_of(b)``: batch
    element b's attention (a diagnosis's variant), else the example's own."""
    name, _, idx = parse_quantity(claim.quantity)

    def of(c: Claim) -> Any:
        return quantity_value(ex, c, None if att_of is None else att_of(c.batch - 1))

    if name in TOKEN_QUANTITIES:  # h × d_k; printed concatenated (one row), its h·d_k entries
        value = of(claim)
        flat = (p.kind == "tuple" or (p.kind == "array" and len(p.shape) == 1)
                or (p.kind == "array" and len(p.shape) == 2 and p.shape[0] == 1 < len(value)))
        return tuple(e for row in value for e in row) if flat else value
    if p.kind != "array" or len(p.shape) <= 2 or idx or name not in MATRIX_QUANTITIES:
        return of(claim)
    import dataclasses

    axes = len(p.shape) - 2
    heads = len(ex.attention(0).heads) if ex.has_attention else 1
    batch = ex.batch_size
    per_head = name in _PER_HEAD
    order: tuple[str, ...]
    if axes == 2:
        if not per_head:
            raise ClaimError(f"{claim.quantity} has no heads axis: claim it as batch × rows × columns")
        order = ("batch", "head")
    elif per_head and heads > 1 and batch > 1:
        raise ClaimError(f"{claim.quantity}: a 3-dimensional printout is ambiguous with "
                         f"{batch} batch elements and {heads} heads; print batch × heads × rows × "
                         "columns")
    else:
        order = ("head",) if per_head and heads > 1 else ("batch",)
    sizes = {"batch": batch, "head": heads}
    for axis, n in zip(order, p.shape[:axes], strict=True):
        if n != sizes[axis]:
            raise ClaimError(f"{claim.quantity}: the printout has {n} along its {axis} axis but "
                             f"the example has {sizes[axis]}")

    def gather(level: int, fixed: dict[str, int]) -> Any:
        if level == axes:
            c = dataclasses.replace(claim, head=fixed.get("head", claim.head),
                                    batch=fixed.get("batch", claim.batch))
            return of(c)
        axis = order[level]
        return tuple(gather(level + 1, {**fixed, axis: i + 1}) for i in range(sizes[axis]))

    return gather(0, {})


def _check_claim(ex: WorkedExample, index: int, claim: Claim,
                 siblings: Sequence[WorkedExample] = ()) -> ClaimRecord:
    name, _, _ = parse_quantity(claim.quantity)
    if name == "shape":
        return shape_record(ex, claim, quantity_value(ex, claim))
    p = parse_printed(claim.claimed)
    if claim.numpy_precision is not None:
        p = numpy_printed(p, claim.numpy_precision)
    raw = _gathered(ex, claim, p)
    value, orientation = _oriented(claim, p, raw)
    import sympy as sp

    items = pairs(value, p, claim.quantity)
    values = [sp.sympify(v) for v, _ in items]
    parts = [part for _, part in items]
    judgements = [judge(v, part, claim.rtol) for v, part in zip(values, parts, strict=True)]
    # enough certified digits to see why the verdict holds: three beyond the claim's,
    # at least 15, and 20 for formulas (1 − e^(−32) only differs after 14 nines)
    big = len(values) > 16
    sig = max([part.significant_digits + (2 if big else 3) for part in parts]
              + [20 if any(part.kind == "expression" for part in parts) else 8 if big else 15])
    # a tensor's exact form is shown only when every entry has one: stop at the first
    # entry without (simplifying is the dearest step of describing a value)
    described, forms_left = [], True
    for v in values:
        d = describe(v, sig, form=forms_left)
        forms_left = forms_left and bool(d[1])
        described.append(d)
    shape = nested_shape(value)
    exact = _layout([d for d, _ in described], shape)
    forms = [f for _, f in described]
    form = _layout(forms, shape) if len(values) > 1 and all(forms) else (forms[0] if len(values) == 1
                                                                         else "")
    ok = all(j.ok for j in judgements)
    verdicts = [j.verdict for j in judgements]
    # a definite wrong part makes the claim wrong; else an undecided part, undecided
    verdict = ("wrong" if "wrong" in verdicts else UNDECIDED if UNDECIDED in verdicts
               else "exact" if all(v == "exact" for v in verdicts)
               else "approximation" if "approximation" in verdicts else "correctly rounded")
    detail = next((j.detail for j in judgements if j.detail), None)
    rounded = None
    if any(j.rounded for j in judgements) and not ok:
        rounded = _layout([j.rounded or part.text.strip() for j, part in zip(judgements, parts,
                                                                             strict=True)], shape)
    elif any(j.rounded for j in judgements) and len(parts) == 1:
        rounded = judgements[0].rounded
    errors = [j.error_units for j in judgements if j.error_units]
    entries: list[dict[str, Any]] = []
    if p.kind == "array":
        labels = _labels(shape)
        entries = [{"index": labels[i], "claimed": parts[i].text.strip(), "correct": j.rounded,
                    "error_units": j.error_value} for i, j in enumerate(judgements) if not j.ok]
        if not ok:
            errors = [f"{e['index']}: {judgements[i].error_units or 'wrong'}" for i, e in
                      zip([i for i, j in enumerate(judgements) if not j.ok], entries, strict=True)]
    error_units = ", ".join(errors[:12]) + (f", … ({len(errors)} entries)" if len(errors) > 12 else "") \
        if errors else None
    error_value = judgements[0].error_value if len(judgements) == 1 else None
    details = [j.detail for j in judgements if j.detail]
    detail = details[0] if details else None
    diagnosis = None
    p_inputs = ""
    if not ok and ex.printed_inputs:
        from .intervals import consistent_with_printed

        verdict_text, note = consistent_with_printed(ex, claim, value, p, judgements)
        if verdict_text is not None:
            from .intervals import input_decimals

            verdict, ok, detail = verdict_text, True, note
            p_inputs = f"{input_decimals(ex.engine_inputs()[claim.batch - 1])} decimals"
        elif note:
            detail = note
    if orientation and not detail:
        detail = orientation
    square = nested_shape(value)
    if verdict == "wrong" and claim.transposed is None and p.kind == "array" \
            and len(square) == 2 and square[0] == square[1] > 1 and _transpose(value) != value:
        # a square printout may be a transposed view (.T): when it holds read that way,
        # which the text meant is not decided here
        other = [judge(sp.sympify(v), part, claim.rtol) for v, part in pairs(_transpose(value), p)]
        if all(j.ok for j in other):
            verdict, detail = AMBIGUOUS, (
                "the readings disagree: as printed (rows × columns) it is wrong; read transposed "
                "(a .T view) it holds; state the orientation with the claim's transposed = "
                "true or false")
            rounded, error_units, error_value, entries = None, None, None, []
    if verdict == "wrong":
        # the slips are searched with the printout laid out as the quantity is (a .T view
        # or a column read back), so that every diagnosis pairs it with its own value
        pq = _in_quantity_layout(p, nested_shape(raw)) if orientation else p
        diagnosis = diagnose(ex, index, claim, pq, values, siblings=siblings)
    precision = p.describe_precision() if p.kind in ("tuple", "array") else "; ".join(
        d for d in dict.fromkeys(part.describe_precision() for part in parts) if d)
    if verdict == CONSISTENT:
        precision = p_inputs  # the inputs' printed precision
    return ClaimRecord(ex.name, claim.quantity, claim.head, claim.claimed, exact, form, rounded,
                       precision, verdict, ok, error_units, diagnosis, claim.note, value,
                       file=ex.source, line=claim.line, batch=claim.batch, detail=detail,
                       error_value=error_value, entries=tuple(entries))


def diagnose(ex: WorkedExample, index: int, claim: Claim, p: Any, values: list[Any],
             depth: int = 0, *, siblings: Sequence[WorkedExample] = ()) -> str | None:
    """The root of a wrong claim, walking the chain: a claim computed from earlier printed
    weights that are themselves wrong is diagnosed upstream (their own root named).  A
    diagnosis is stated only when proved; undecided means none is stated."""
    import sympy as sp

    def upstream(k: int) -> str | None:
        if depth >= 3:
            return None
        c = ex.claims[k]
        try:
            pk = parse_printed(c.claimed)
            raw = _gathered(ex, c, pk)
            oriented, word = _oriented(c, pk, raw)
            vk = [sp.sympify(v) for v, _ in pairs(oriented, pk, c.quantity)]
            pk = _in_quantity_layout(pk, nested_shape(raw)) if word else pk
            return diagnose(ex, k, c, pk, vk, depth + 1, siblings=siblings)
        except MhaSymbolicError:
            return None

    try:
        simple = together([d for d in (variant_diagnosis(ex, claim, p),
                                        scale_constant_diagnosis(ex, claim, p),
                                        mask_after_softmax_diagnosis(ex, claim, p)) if d])
        simple = simple or row_sum_diagnosis(ex, claim, p)
        diagnosis = (premature(ex, index, claim, p, upstream) or simple
                     or heads_order_diagnosis(ex, claim, p) or bias_once_diagnosis(ex, claim, p)
                     or count_diagnosis(ex, claim, p) or index_diagnosis(ex, claim, p))
        if diagnosis is None and len(values) == 1:
            diagnosis = (float32_diagnosis(ex, claim, p, values[0])
                         or digit_diagnosis(values[0], p.entries[0])
                         or approximation_diagnosis(values[0], p.entries[0], claim.rtol))
            if diagnosis is not None and diagnosis.startswith("rounded in the wrong direction"):
                # one digit rounded the other way is also what typed inputs shown rounded
                # give: when that is proved too, the two are said together
                diagnosis = together([diagnosis, *filter(None, [
                    unrounded_inputs_diagnosis(ex, claim, p)])])
        if diagnosis is None:
            # rounded inputs after the slips of the computation: the nearer root first
            def value_of(att_of: Any) -> Any:
                return _gathered(ex, claim, p, att_of)

            diagnosis = rounded_inputs_diagnosis(ex, claim, p, value_of)
            if diagnosis is None:
                # typed inputs shown rounded and another input X′ (a last digit off by one
                # is near a rounding) may both give it: then both are said
                diagnosis = together(list(filter(None, [
                    unrounded_inputs_diagnosis(ex, claim, p),
                    other_input_diagnosis(ex, claim, p, siblings, value_of=value_of)])))
    except MhaSymbolicError:  # PrecisionError included: a slip not proved is not stated
        diagnosis = None
    return diagnosis


def _labels(shape: tuple[int, ...]) -> list[str]:
    """1-based index labels of every entry, row-major: '[1,2]'."""
    import itertools

    return ["[" + ",".join(str(i + 1) for i in ix) + "]"
            for ix in itertools.product(*(range(n) for n in shape))]


def _layout(texts: list[str], shape: tuple[int, ...]) -> str:
    """Entries laid out like the value: 'x' for a number, '(a, b)' for a row, nested
    brackets for a matrix or tensor."""
    if shape == ():
        return texts[0]
    if len(shape) == 1:
        return "(" + ", ".join(texts) + ")"
    step = len(texts) // shape[0]
    rows = [_layout(texts[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
    rows = ["[" + r[1:-1] + "]" if r.startswith("(") else r for r in rows]
    return "[" + ", ".join(rows) + "]"


def check_examples(examples: Iterable[WorkedExample] | WorkedExample | str | os.PathLike[str],
                   only: Sequence[str] | None = None, *, strict: bool = False) -> CheckReport:
    """Check every claim of the examples; ``only`` restricts to examples by name.

    ``examples`` is what :func:`load_examples` returns, one example, or what users
    have: a path (``str`` or :class:`~pathlib.Path`) of a worked-example file, or its
    TOML text (a string of several lines).  ``print(report)`` prints the readable report.

    A claim that cannot be judged (unreadable answer, unknown quantity, an index out of
    range) becomes a record with the verdict ``unreadable`` and its error, and the
    other claims are still checked; ``strict=True`` raises the error instead."""
    if isinstance(examples, os.PathLike) or (isinstance(examples, str) and "\n" not in examples):
        examples = load_examples(os.fspath(examples))
    elif isinstance(examples, str):
        examples = load_examples(text=examples)
    exs = [examples] if isinstance(examples, WorkedExample) else list(examples)
    bad = next((e for e in exs if not isinstance(e, WorkedExample)), None)
    if bad is not None:
        raise ExampleFileError(f"check_examples: expected worked examples, a path or TOML "
                               f"text, got {type(bad).__name__}")
    exs = select_examples(exs, only)
    with file_allowance():
        records = _check_all(exs, strict)
    return CheckReport(tuple(exs), tuple(records))


def _check_all(exs: list[WorkedExample], strict: bool) -> list[ClaimRecord]:
    records: list[ClaimRecord] = []
    for ex in exs:
        for i, claim in enumerate(ex.claims):
            if claim.error is not None:
                if strict:
                    raise ClaimError(claim.error)
                records.append(_unreadable(ex, claim, claim.error))
                continue
            try:
                records.append(_check_claim(ex, i, claim, exs))
            except MhaSymbolicError as exc:
                loc = f"{ex.source}:{claim.line}: " if ex.source and claim.line else (
                    f"{ex.source}: " if ex.source else "")
                message = f"{loc}example {echo(ex.name, 40)}, claim {echo(claim.quantity)}: {exc}"
                if strict:
                    raise type(exc)(message) from None
                records.append(_unreadable(ex, claim, message))
    return records


def cli_check(args: Any) -> int:
    """``mha-symbolic check FILE|-|--example SET[:EXAMPLE] … [--only NAME …] [--format …]
    [-q]`` (the selection: :mod:`mha_symbolic.textbook.selection`)."""
    import sys

    from .selection import resolve

    if args.file is not None:   # an author's source (by suffix, or --input-format for -)
        from .sources.check import cli_check_source, is_author_source

        if is_author_source(args.file, getattr(args, "input_format", None)):
            return cli_check_source(args)

    selections = resolve(args.file, args.example, getattr(args, "only", None))
    if args.file == "-":
        examples = select_examples(load_examples(text=_read_stdin(), source="<stdin>"),
                                   list(selections[0].only or ()))
    else:
        examples = [ex for sel in selections for ex in sel.examples()]
    only = None
    report = check_examples(examples, only=only)
    quiet = bool(getattr(args, "quiet", False))
    if args.format == "json":
        print(report.json(quiet=quiet))
    elif args.format == "markdown":
        print(report.markdown(quiet=quiet))
    else:
        print(report.text(quiet=quiet))
    for r in report.records:
        if r.verdict == "unreadable":
            print(f"mha-symbolic check: error: {' '.join((r.error or '').split())}", file=sys.stderr)
    return report.exit_status


def _read_stdin() -> str:
    """Standard input, read up to the file-size limit (never more), as UTF-8."""
    from .._io import STDIN, read_bounded
    from .examples import MAX_FILE_BYTES

    data = read_bounded(STDIN, MAX_FILE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExampleFileError(f"<stdin>: not UTF-8 text ({exc.reason} at byte {exc.start})"
                               ) from None
