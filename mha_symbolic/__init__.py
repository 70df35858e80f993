"""mha-symbolic: multi-head attention, exactly.

The package import is light: every public name is loaded from its module on
first use (PEP 562), so ``import mha_symbolic`` does not import SymPy, mpmath or
python-flint.

>>> import mha_symbolic as ms
>>> ms.parameter_count(d_model=512, heads=8, bias=False).total
1048576
"""

# (no ``from __future__ import annotations`` here: it imports the module __future__,
# Python code that would run before the start-up guard below)

# Ctrl-C in the command's start-up (issue 30): the console script and ``python -m
# mha_symbolic`` import this package first, so these lines are the earliest code of ours
# that runs.  There (and only there, never for a library user: mha_symbolic/_startup.py)
# SIGINT gets a handler that writes one line and exits 130; cli.main() hands SIGINT back
# to Python's KeyboardInterrupt once it runs.  Inline and with builtin modules only, so
# that no import of ours comes before it.
import _signal
import sys as _sys


def _is_the_command(argv: object) -> bool:
    """Whether ``sys.orig_argv`` runs the command: ``python [opts] -m mha_symbolic`` or
    the console script ``mha-symbolic`` (``-script.py``, ``.exe`` on Windows)."""
    args = [str(a) for a in argv][1:] if isinstance(argv, (list, tuple)) else []
    skip = False
    for n, arg in enumerate(args):
        if skip:  # the value of -X or -W
            skip = False
            continue
        if arg in ("-X", "-W"):
            skip = True
            continue
        if arg.startswith("-c"):
            return False
        if arg.startswith("-m"):
            name = arg[2:] or (args[n + 1] if n + 1 < len(args) else "")
            return name in ("mha_symbolic", "mha_symbolic.cli")
        if not arg.startswith("-"):
            tail = arg.replace("\\", "/").rsplit("/", 1)[-1].lower()
            for end in ("-script.pyw", "-script.py", ".exe"):
                tail = tail.removesuffix(end)
            return tail == "mha-symbolic"
    return False


def _startup_interrupt(signum: int, frame: object) -> None:
    if not _is_the_command(getattr(_sys, "orig_argv", ())):
        raise KeyboardInterrupt   # a library's import: Python's own behaviour
    import os
    try:
        os.write(2, b"mha-symbolic: interrupted\n")
    finally:
        os._exit(130)


# Installed first and then kept only for the command, so that deciding what runs (a
# loop over argv) is not a window in which a Ctrl-C is a traceback through this file;
# during that decision the handler decides itself, and for a library it raises
# KeyboardInterrupt exactly as Python's default handler does.
if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    try:  # (not contextlib.suppress: Python code to import, the window this closes)
        _signal.signal(_signal.SIGINT, _startup_interrupt)
    except (ValueError, OSError):  # not the main thread
        pass
    else:
        if not _is_the_command(getattr(_sys, "orig_argv", ())):
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)

from typing import TYPE_CHECKING  # noqa: E402

from ._lazy import lazy_exports  # noqa: E402

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # specification, shapes, counts
    "AttentionSpec": "exact.spec",
    "attention_shapes": "exact.shapes",
    "Shape": "exact.shapes",
    "parameter_count": "exact.params",
    "flop_count": "exact.params",
    # exact engine and certified numbers
    "exact_attention": "exact.engine",
    "ExactAttention": "exact.engine",
    "parse_number": "exact.grammar",
    "certify": "exact.certified",
    "CertifiedValue": "exact.certified",
    # textbook verifier and derivations
    "load_examples": "textbook.examples",
    "check_examples": "textbook.check",
    "check_source": "textbook.sources.check",
    "WorkedExample": "textbook.examples",
    "derive": "textbook.derivation",
    # proofs
    "run_proofs": "exact.prove",
    "iter_proofs": "exact.prove",
    # oracle
    "reference_attention": "oracle",
    "reference_mha": "oracle",
    "reference_attention_varlen": "oracle",
    "reference_attention_varlen_backward": "oracle",
    "softcap_score_mod": "oracle",
    "alibi_score_mod": "oracle",
    "relative_bias_score_mod": "oracle",
    "Enclosure": "oracle",
    "reference_attention_backward": "oracle",
    "AttentionGradients": "oracle",
    "reference_mha_backward": "oracle",
    "MhaGradients": "oracle",
    "gather_kv_cache": "oracle.variants.kvcache",
    "compare_attention": "testing.forward.compare",
    "compare_kvcache_decode": "testing.forward.kvcache",
    "assert_attention_close": "testing.forward.compare",
    "compare_mha": "testing.forward.mha",
    "assert_mha_close": "testing.forward.mha",
    "attention_inputs": "testing.strategies",
    "compare_attention_backward": "testing.backward.compare",
    "assert_attention_backward_close": "testing.backward.compare",
    "check_attention": "testing.check",
    "check_deterministic": "testing.determinism",
    "check_batch_invariance": "testing.determinism",
    "BitwiseCheck": "testing.determinism",
    "compare_mha_backward": "testing.backward.mha",
    "assert_mha_backward_close": "testing.backward.mha",
    "compare_attention_varlen": "testing.forward.variants",
    "assert_attention_varlen_close": "testing.forward.variants",
    # errors
    "MhaSymbolicError": "errors",
    "SpecError": "errors",
    "UnknownOptionError": "errors",
    "ShapeError": "errors",
    "ParseError": "errors",
    "ExampleFileError": "errors",
    "ClaimError": "errors",
    "InputValueError": "errors",
    "LatexError": "errors",
    "PrecisionError": "errors",
    "ProofError": "errors",
    "AttentionMismatchError": "errors",
    "ToleranceError": "errors",
    "OptionalDependencyError": "errors",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
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
        ToleranceError,
        UnknownOptionError,
    )
    from .exact.certified import CertifiedValue, certify
    from .exact.engine import ExactAttention, exact_attention
    from .exact.grammar import parse_number
    from .exact.params import flop_count, parameter_count
    from .exact.prove import iter_proofs, run_proofs
    from .exact.shapes import Shape, attention_shapes
    from .exact.spec import AttentionSpec
    from .oracle import (
        AttentionGradients,
        Enclosure,
        MhaGradients,
        alibi_score_mod,
        reference_attention,
        reference_attention_backward,
        reference_attention_varlen,
        reference_attention_varlen_backward,
        reference_mha,
        reference_mha_backward,
        relative_bias_score_mod,
        softcap_score_mod,
    )
    from .oracle.variants.kvcache import gather_kv_cache
    from .testing.backward.compare import (
        assert_attention_backward_close,
        compare_attention_backward,
    )
    from .testing.backward.mha import assert_mha_backward_close, compare_mha_backward
    from .testing.check import check_attention
    from .testing.determinism import BitwiseCheck, check_batch_invariance, check_deterministic
    from .testing.forward.compare import assert_attention_close, compare_attention
    from .testing.forward.kvcache import compare_kvcache_decode
    from .testing.forward.mha import assert_mha_close, compare_mha
    from .testing.forward.variants import (
        assert_attention_varlen_close,
        compare_attention_varlen,
    )
    from .testing.strategies import attention_inputs
    from .textbook.check import check_examples
    from .textbook.derivation import derive
    from .textbook.examples import WorkedExample, load_examples
    from .textbook.sources.check import check_source
