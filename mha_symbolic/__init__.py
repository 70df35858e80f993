"""mha-symbolic: multi-head attention, exactly.

The package import is light: every public name is loaded from its module on
first use (PEP 562), so ``import mha_symbolic`` does not import SymPy, mpmath or
python-flint.

>>> import mha_symbolic as ms
>>> ms.parameter_count(d_model=512, heads=8, bias=False).total
1048576
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # specification, shapes, counts
    "AttentionSpec": "spec",
    "attention_shapes": "shapes",
    "Shape": "shapes",
    "parameter_count": "params",
    "flop_count": "params",
    # exact engine and certified numbers
    "exact_attention": "engine",
    "ExactAttention": "engine",
    "parse_number": "grammar",
    "certify": "certified",
    "CertifiedValue": "certified",
    # textbook verifier and derivations
    "load_examples": "textbook",
    "check_examples": "textbook",
    "WorkedExample": "textbook",
    "derive": "derivation",
    # proofs
    "run_proofs": "prove",
    # oracle
    "reference_attention": "oracle",
    "reference_mha": "oracle",
    "Enclosure": "oracle",
    "compare_attention": "compare",
    "assert_attention_close": "compare",
    "compare_mha": "compare",
    "assert_mha_close": "compare",
    # errors
    "MhaSymbolicError": "errors",
    "SpecError": "errors",
    "ShapeError": "errors",
    "ParseError": "errors",
    "ExampleFileError": "errors",
    "ClaimError": "errors",
    "InputValueError": "errors",
    "LatexError": "errors",
    "PrecisionError": "errors",
    "ProofError": "errors",
    "AttentionMismatchError": "errors",
    "OptionalDependencyError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mha_symbolic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mha_symbolic.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .certified import CertifiedValue, certify
    from .compare import assert_attention_close, assert_mha_close, compare_attention, compare_mha
    from .derivation import derive
    from .engine import ExactAttention, exact_attention
    from .errors import (
        AttentionMismatchError,
        ClaimError,
        ExampleFileError,
        InputValueError,
        LatexError,
        MhaSymbolicError,
        OptionalDependencyError,
        ParseError,
        PrecisionError,
        ProofError,
        ShapeError,
        SpecError,
    )
    from .grammar import parse_number
    from .oracle import Enclosure, reference_attention, reference_mha
    from .params import flop_count, parameter_count
    from .prove import run_proofs
    from .shapes import Shape, attention_shapes
    from .spec import AttentionSpec
    from .textbook import WorkedExample, check_examples, load_examples
