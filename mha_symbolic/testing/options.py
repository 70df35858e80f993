"""The keyword options of the checks, defined once.

Every ``compare_*`` function spells out its options as keyword-only parameters (its
signature is the one definition); :func:`checked` makes a misspelt option an error
that names the function the user called, with :mod:`difflib`'s closest match, and
:func:`passes_options_to` lists the options a function hands on to another (the
multi-head block's options of :func:`mha_symbolic.reference_mha`) in its signature.
:func:`asserting` turns a ``compare_*`` function into its ``assert_*`` twin: the same
signature plus ``msg=`` (``help()``, ``inspect.signature`` and notebook tooltips show
every parameter), and an :class:`~mha_symbolic.errors.AttentionMismatchError` whose
first line is the headline, ``FAIL [bug class] …`` in at most 60 characters, then the
one-line summary (pytest prints the first line in its short summary,
"FAILED test_x.py::test_y - …").

``msg`` follows ``torch.testing.assert_close``: a callable receives the default
message and returns the message raised (it replaces it); a string, unlike torch's,
does not drop the report: it becomes the first line, above the default message
(numpy.testing's ``err_msg`` keeps its report too).

>>> from mha_symbolic.testing.options import close_matches
>>> close_matches("rtoll", ["rtol", "atol", "rule"])
['rtol', 'atol']
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .._validate import close_matches, door, unknown_option
from ..errors import AttentionMismatchError, SpecError
from ..oracle.variants.protocol import keyword_owner

__all__ = ["Msg", "asserting", "check_names", "check_names_for", "checked", "close_matches", "mismatch_error",
           "passes_options_to", "unknown_option"]

F = TypeVar("F", bound=Callable[..., Any])

#: The type of ``msg=``: None (the default message), a string placed above it, or a
#: callable from the default message to the message raised.
Msg = str | Callable[[str], str] | None


def _keywords(sig: inspect.Signature) -> set[str]:
    return {p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_names(func: str, given: Iterable[str], sig: inspect.Signature) -> None:
    """Raise :func:`unknown_option` for the first name in ``given`` that ``sig`` does not
    take as a keyword."""
    known = _keywords(sig)
    for name in given:
        if name not in known:
            raise unknown_option(func, name, known)


def check_names_for(func: str, given: Iterable[str], target: Callable[..., Any]) -> None:
    """:func:`check_names` against ``target``'s signature, reported as from ``func``
    (the pytest fixture's methods, which hand their options on)."""
    check_names(func, given, inspect.signature(target))


def checked(fn: F) -> F:
    """``fn`` checking its keyword names first: a misspelt option is reported as coming
    from ``fn`` with the closest names (Python's own TypeError suggests none)."""
    sig = inspect.signature(fn)
    name = fn.__name__
    at_door = door(fn, quiet=True)  # strict booleans, integers by their size (mha_symbolic._validate)
    # a door taking ``**variants`` takes every registered variant's keywords (its
    # signature lists those registered when it was defined; the registry has them all)
    takes_variants = any(p.kind is p.VAR_KEYWORD and p.name == "variants"
                         for p in sig.parameters.values())

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        names = [k for k in kwargs if not (takes_variants and keyword_owner(k) is not None)]
        check_names(name, names, getattr(run, "__signature__", sig))
        return at_door(*args, **kwargs)

    return run  # type: ignore[return-value]


def passes_options_to(target: Callable[..., Any], only: Iterable[str] | None = None,
                      ) -> Callable[[F], F]:
    """For a function whose ``**options`` go on to ``target``: its signature lists
    ``target``'s keyword-only options (those named in ``only``, if given) after its own,
    without the ``**``, and a name neither takes is reported as coming from it."""
    keep = None if only is None else set(only)

    def wrap(fn: F) -> F:
        own = inspect.signature(fn)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in params}
        params += [p for p in inspect.signature(target).parameters.values()
                   if p.kind is p.KEYWORD_ONLY and p.name not in names
                   and (keep is None or p.name in keep)]
        out = checked(fn)
        out.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        return out

    return wrap


def mismatch_error(comparison: Any, msg: Msg = None, *,
                   attribute: str = "comparison") -> AttentionMismatchError:
    """The error of a failed check: ``comparison.report()`` (first line: the headline,
    then the one-line summary) shaped by ``msg``; the findings as ``.comparison`` (or
    ``attribute``)."""
    text = comparison.report()
    if callable(msg):
        text = str(msg(text))
    elif msg is not None:
        if not isinstance(msg, str):
            raise SpecError(f"msg={msg!r} ({type(msg).__name__}) must be a string or a "
                            "callable taking the default message")
        text = f"{msg}\n{text}"
    exc = AttentionMismatchError(text)
    setattr(exc, attribute, comparison)
    return exc


_MSG = inspect.Parameter("msg", inspect.Parameter.KEYWORD_ONLY, default=None,
                         annotation="str | Callable[[str], str] | None")


def asserting(compare: Callable[..., Any]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The ``assert_*`` twin of ``compare``: the decorated function's docstring and name,
    ``compare``'s signature plus ``msg``; raises :func:`mismatch_error` unless the
    comparison passed."""
    base = inspect.signature(compare)
    params = [p for p in base.parameters.values() if p.kind is not p.VAR_KEYWORD]
    var = [p for p in base.parameters.values() if p.kind is p.VAR_KEYWORD]
    sig = base.replace(parameters=[*params, _MSG, *var], return_annotation="None")

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        name = fn.__name__

        @functools.wraps(fn)
        def run(*args: Any, msg: Msg = None, **kwargs: Any) -> None:
            __tracebackhide__ = True
            if not var:
                check_names(name, kwargs, sig)
            comparison = compare(*args, **kwargs)
            if not comparison.passed:
                raise mismatch_error(comparison, msg) from None

        del run.__wrapped__  # help() and inspect show the signature below, not fn's
        run.__signature__ = sig  # type: ignore[attr-defined]
        return run

    return wrap
