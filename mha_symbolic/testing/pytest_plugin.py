"""pytest plugin: the ``attention_oracle`` fixture.

Registered under the ``pytest11`` entry point, so it loads in every pytest run of
every project that installs mha-symbolic.  It therefore imports nothing but pytest
and the standard library at import time; numpy, python-flint and the oracle are
imported on the first call of a fixture method.

>>> # in a test file of yours:
>>> # def test_my_kernel(attention_oracle):
>>> #     attention_oracle.assert_close(my_attention(q, k, v), q, k, v, is_causal=True)

A failed check raises :class:`mha_symbolic.errors.AttentionMismatchError` (an
``AssertionError``), which pytest reports as a test failure showing the report
(shapes and dtype, mismatched elements, the worst element with its exact value,
the error in ulps and as a multiple of the tolerance, the diagnosis), not a
traceback through the library: the assert functions set ``__tracebackhide__``.
pytest's short summary ("FAILED test_x.py::test_y - …", cut to the terminal's width)
shows the error's first line, ``FAIL [bug class] …``, without the 44 characters of
``mha_symbolic.errors.AttentionMismatchError: `` before it.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["AttentionOracle", "attention_oracle"]


class AttentionOracle:
    """What the ``attention_oracle`` fixture returns: the testing tool bound to
    optional defaults (for example ``rule="ulp", ulps=8``)."""

    def __init__(self, **defaults: Any) -> None:
        self.defaults = defaults
        _sign_methods()

    def with_options(self, **defaults: Any) -> AttentionOracle:
        """A copy with more default options (``rule``, ``accumulation_dtype``, ...)."""
        return AttentionOracle(**{**self.defaults, **defaults})

    def assert_close(self, actual: Any, query: Any, key: Any, value: Any, **options: Any) -> None:
        """:func:`mha_symbolic.assert_attention_close` with this oracle's defaults."""
        __tracebackhide__ = True
        from .forward.compare import assert_attention_close

        _names("assert_close", {**self.defaults, **options}, assert_attention_close)
        assert_attention_close(actual, query, key, value, **{**self.defaults, **options})

    def compare(self, actual: Any, query: Any, key: Any, value: Any, **options: Any) -> Any:
        """:func:`mha_symbolic.compare_attention` (returns the findings, never raises)."""
        from .forward.compare import compare_attention

        _names("compare", {**self.defaults, **options}, compare_attention)
        return compare_attention(actual, query, key, value, **{**self.defaults, **options})

    def assert_mha_close(self, actual: Any, query: Any, key: Any, value: Any,
                         **options: Any) -> None:
        """:func:`mha_symbolic.testing.forward.mha.assert_mha_close` with this oracle's defaults."""
        __tracebackhide__ = True
        from .forward.mha import assert_mha_close

        _names("assert_mha_close", {**self.defaults, **options}, assert_mha_close)
        assert_mha_close(actual, query, key, value, **{**self.defaults, **options})

    def check(self, fn: Any, query: Any, key: Any, value: Any, **options: Any) -> Any:
        """:func:`mha_symbolic.check_attention`: run ``fn`` forward and (torch, jax)
        backward, and check the output and every gradient; raises on failure."""
        __tracebackhide__ = True
        from .check import check_attention

        _names("check", {**self.defaults, **options}, check_attention)
        return check_attention(fn, query, key, value, **{**self.defaults, **options})

    def assert_varlen_close(self, actual: Any, query: Any, key: Any, value: Any,
                            cu_seqlens_q: Any, cu_seqlens_k: Any, *args: Any,
                            **options: Any) -> None:
        """:func:`mha_symbolic.assert_attention_varlen_close` (packed sequences) with this
        oracle's defaults."""
        __tracebackhide__ = True
        from .forward.variants import assert_attention_varlen_close

        _names("assert_varlen_close", {**self.defaults, **options}, assert_attention_varlen_close)
        assert_attention_varlen_close(actual, query, key, value, cu_seqlens_q, cu_seqlens_k,
                                      *args, **{**self.defaults, **options})

    def reference(self, query: Any, key: Any, value: Any, **options: Any) -> Any:
        """The exact answer: :func:`mha_symbolic.reference_attention`."""
        from ..oracle import reference_attention

        _names("reference", options, reference_attention)
        return reference_attention(query, key, value, **options)

    def reference_mha(self, query: Any, key: Any, value: Any, **options: Any) -> Any:
        """The exact multi-head block: :func:`mha_symbolic.reference_mha`."""
        from ..oracle import reference_mha

        _names("reference_mha", options, reference_mha)
        return reference_mha(query, key, value, **options)


_SIGNED: list[bool] = []


def _sign_methods() -> None:
    """Give each method the signature of the function it hands its options to (so that
    ``help()`` and notebook tooltips list them), once, on the first oracle made: the
    plugin's import stays light, and only a test that uses the fixture pays."""
    if _SIGNED:
        return
    _SIGNED.append(True)
    import inspect

    from ..oracle import reference_attention, reference_mha
    from .check import check_attention
    from .forward.compare import assert_attention_close, compare_attention
    from .forward.mha import assert_mha_close
    from .forward.variants import assert_attention_varlen_close

    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for name, target in (("assert_close", assert_attention_close),
                         ("compare", compare_attention), ("assert_mha_close", assert_mha_close),
                         ("check", check_attention),
                         ("assert_varlen_close", assert_attention_varlen_close),
                         ("reference", reference_attention), ("reference_mha", reference_mha)):
        sig = inspect.signature(target)
        method = getattr(AttentionOracle, name)
        method.__signature__ = sig.replace(parameters=[me, *sig.parameters.values()])


def _names(method: str, options: dict[str, Any], target: Any) -> None:
    """A misspelt option is reported as coming from the fixture's method, with the
    closest option names."""
    __tracebackhide__ = True
    from .options import check_names_for

    check_names_for(f"attention_oracle.{method}", options, target)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """For a failure raised by this library's checks, the short summary's message is the
    error's text (its first line, the one-line summary, is what pytest shows), not the
    error's dotted class name followed by as much of it as the width leaves."""
    outcome = yield
    exc = call.excinfo.value if call.excinfo is not None else None
    if type(exc).__name__ != "AttentionMismatchError":
        return
    from ..errors import AttentionMismatchError

    if isinstance(exc, AttentionMismatchError):
        crash = getattr(outcome.get_result().longrepr, "reprcrash", None)
        if crash is not None:
            crash.message = str(exc)


@pytest.fixture
def attention_oracle() -> AttentionOracle:
    """The attention testing tool: ``.assert_close(actual, q, k, v, **options)``,
    ``.compare(...)``, ``.assert_mha_close(...)``, ``.check(fn, q, k, v, ...)`` (forward
    and backward), ``.assert_varlen_close(...)``, ``.reference(...)``."""
    return AttentionOracle()


#: The suffixes collected with --mha-check-sources (authors' sources: their math checked).
SOURCE_SUFFIXES = (".md", ".qmd", ".rst", ".tex", ".ipynb")


def pytest_addoption(parser: Any) -> None:
    """Opt-in collection of authors' sources: nothing changes for a suite that does not ask."""
    group = parser.getgroup("mha-symbolic")
    group.addoption("--mha-check-sources", action="store_true", default=False,
                    help="collect .md/.qmd/.rst/.tex/.ipynb files and check the numbers in "
                    "their math: one test per judged statement or mha-check claim")
    group.addoption("--mha-check-not-judged", action="store_true", default=False,
                    help="with --mha-check-sources: list statements not judged (as skipped)")
    parser.addini("mha_check_sources", type="bool", default=False,
                  help="collect authors' sources as with --mha-check-sources")


def pytest_collect_file(file_path: Any, parent: Any) -> Any:
    config = parent.config
    if not (config.getoption("mha_check_sources") or config.getini("mha_check_sources")):
        return None
    if file_path.suffix.lower() not in SOURCE_SUFFIXES:
        return None
    from .source_items import SourceFile

    return SourceFile.from_parent(parent, path=file_path)
