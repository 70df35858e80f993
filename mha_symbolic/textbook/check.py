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

from collections.abc import Iterable, Sequence
from typing import Any

from .._text import echo
from ..errors import ClaimError, MhaSymbolicError, PrecisionError
from .claims import parse_printed
from .examples import Claim, WorkedExample, load_examples, select_examples
from .quantities import parse_quantity, quantity_value
from .reports import CheckReport, ClaimRecord
from .slips import count_diagnosis, digit_diagnosis, premature, variant_diagnosis
from .verdicts import UNDECIDED, describe, judge

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


def _check_claim(ex: WorkedExample, index: int, claim: Claim) -> ClaimRecord:
    name, _, _ = parse_quantity(claim.quantity)
    value = quantity_value(ex, claim)
    if name == "shape":
        return _shape_record(ex, claim, value)
    p = parse_printed(claim.claimed)
    import sympy as sp

    values = value if isinstance(value, tuple) else (value,)
    parts = p.parts if p.kind == "tuple" else (p,)
    if p.kind == "tuple" and not isinstance(value, tuple):
        raise ClaimError(f"{claim.quantity} is one number but claimed={echo(claim.claimed)} is a tuple")
    if isinstance(value, tuple) and len(parts) != len(values):
        raise ClaimError(f"{claim.quantity} has {len(values)} entries but claimed="
                         f"{echo(claim.claimed)} has {len(parts)}")
    judgements = [judge(sp.sympify(v), part, claim.rtol) for v, part in zip(values, parts, strict=True)]
    # enough certified digits to see why the verdict holds: three beyond the claim's,
    # at least 15, and 20 for formulas (1 − e^(−32) only differs after 14 nines)
    sig = max([part.significant_digits + 3 for part in parts]
              + [20 if any(part.kind == "expression" for part in parts) else 15])
    described = [describe(sp.sympify(v), sig) for v in values]
    exact = ", ".join(d for d, _ in described)
    form = ", ".join(f for _, f in described if f)
    if len(values) > 1:
        exact = f"({exact})"
        form = f"({form})" if form and all(f for _, f in described) else ""
    ok = all(j.ok for j in judgements)
    verdicts = [j.verdict for j in judgements]
    # a definite wrong part makes the claim wrong; else an undecided part, undecided
    verdict = ("wrong" if "wrong" in verdicts else UNDECIDED if UNDECIDED in verdicts
               else "exact" if all(v == "exact" for v in verdicts)
               else "approximation" if "approximation" in verdicts else "correctly rounded")
    detail = next((j.detail for j in judgements if j.detail), None)
    rounded = None
    if any(j.rounded for j in judgements):
        rounded_parts = [j.rounded or part.text.strip() for j, part in zip(judgements, parts, strict=True)]
        rounded = rounded_parts[0] if len(parts) == 1 else "(" + ", ".join(rounded_parts) + ")"
    errors = [j.error_units for j in judgements if j.error_units]
    error_units = ", ".join(errors) if errors else None
    diagnosis = None
    if verdict == "wrong":
        try:  # a diagnosis is stated only when proved; undecided means none is stated
            diagnosis = (premature(ex, index, claim, p) or variant_diagnosis(ex, claim, p)
                         or count_diagnosis(ex, claim, p))
            if diagnosis is None and len(values) == 1:
                diagnosis = digit_diagnosis(sp.sympify(values[0]), parts[0])
        except PrecisionError:
            diagnosis = None
    precision = "; ".join(d for d in dict.fromkeys(part.describe_precision() for part in parts) if d)
    return ClaimRecord(ex.name, claim.quantity, claim.head, claim.claimed, exact, form, rounded,
                       precision, verdict, ok, error_units, diagnosis, claim.note, value,
                       detail=detail)


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
                raise type(exc)(f"example {echo(ex.name)}, claim {echo(claim.quantity)}: {exc}") from None
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
    return report.exit_status
