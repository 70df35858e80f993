"""Every exception the library raises.

One root, :class:`MhaSymbolicError`; each specific error also subclasses the
built-in it behaves like, so ``except ValueError`` keeps working for callers
who do not know this library.  Messages name the argument, what was expected
and what came (``d_model=10 is not divisible by heads=4``); the data is also on
``e.args``.
"""

from __future__ import annotations

__all__ = [
    "AttentionMismatchError",
    "ClaimError",
    "ExampleFileError",
    "InputValueError",
    "LatexError",
    "MhaSymbolicError",
    "OptionalDependencyError",
    "ParseError",
    "PrecisionError",
    "ProofError",
    "ShapeError",
    "SpecError",
    "ToleranceError",
    "UnknownOptionError",
]


class MhaSymbolicError(Exception):
    """Root of every error raised by mha_symbolic."""


class SpecError(MhaSymbolicError, ValueError):
    """An attention specification is inconsistent (dimensions, scale, mask, policy)."""


class UnknownOptionError(SpecError, TypeError):
    """A keyword option the function does not take (a TypeError, as Python's own, with
    the closest option names)."""


class ShapeError(MhaSymbolicError, ValueError):
    """Two shapes that must agree do not (matrix product, broadcast, concatenation)."""


class ParseError(MhaSymbolicError, ValueError):
    """A string is not in the restricted number/expression grammar."""


class ExampleFileError(MhaSymbolicError, ValueError):
    """A worked-example file is malformed or names something unknown."""


class ClaimError(MhaSymbolicError, ValueError):
    """A claim cannot be understood (unknown quantity, unreadable printed answer)."""


class InputValueError(MhaSymbolicError, ValueError):
    """An input holds a value the computation cannot take (NaN, Inf, fully masked row
    under the "error" policy)."""


class PrecisionError(MhaSymbolicError, ArithmeticError):
    """Certified evaluation could not decide within its precision cap (for example an
    exact tie between two representable numbers)."""


class LatexError(MhaSymbolicError, RuntimeError):
    """pdflatex is missing, failed on a document, or timed out."""


class ProofError(MhaSymbolicError, AssertionError):
    """A theorem in proofs/ did not check out."""


class AttentionMismatchError(MhaSymbolicError, AssertionError):
    """An attention output is farther from the exact answer than the tolerance allows."""


class ToleranceError(MhaSymbolicError, ArithmeticError):
    """No verdict could be given: the exact answer's enclosure or the tolerance is not
    finite, or the tolerance is vacuous (it would pass any output), for these inputs."""


class OptionalDependencyError(MhaSymbolicError, ImportError):
    """An optional integration (torch, jax, matplotlib) is needed but not installed."""

    def __init__(self, package: str, feature: str, extra: str | None = None, *,
                 hint: str | None = None) -> None:
        # "figures need matplotlib: pip install 'mha-symbolic[plot]'": one line, the fix last
        if hint is None:
            hint = f"pip install 'mha-symbolic[{extra}]'" if extra else f"pip install {package}"
        first = feature.split()[0] if feature.split() else ""
        verb = "need" if first.isalpha() and first.endswith("s") and not first.endswith("ss") else "needs"
        super().__init__(f"{feature} {verb} {package}: {hint}")
        self.package = package
        self.feature = feature
