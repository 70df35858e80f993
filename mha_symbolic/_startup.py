"""SIGINT during the command's start-up (issue 30): handing it back.

The console script (``mha_symbolic.cli:main``, pyproject ``[project.scripts]``) and
``python -m mha_symbolic`` both import the package ``mha_symbolic`` before anything
else of ours, so the first lines of its ``__init__`` are the earliest point where a
Ctrl-C can be ours rather than a KeyboardInterrupt traceback out of an import.  There
SIGINT gets ``_startup_interrupt`` first (when Python's default handler holds it), and
keeps it only when ``sys.orig_argv`` names the command (never for a library imported in
a session or a test: the default handler is put back at once; a Ctrl-C in between is
the handler's own decision, and for a library it raises KeyboardInterrupt as Python's
would).  For the command it writes one line with ``os.write`` (no Python I/O objects,
safe at any point of an import) and calls ``os._exit(130)`` (nothing has been written
that needs cleaning up).  Installing before deciding leaves as the only window the two
builtin imports and two ``def`` statements before it.  The code is inline in ``__init__`` and uses the
builtin ``_signal`` only: ``import signal`` (enums) or any module of ours would be
milliseconds of Python in which a Ctrl-C is still a traceback.

:func:`release`, called by ``cli.main``, gives SIGINT back to Python's own handler, so
that the commands see KeyboardInterrupt as before and leave their ``with`` blocks
cleanly.  A Ctrl-C in the interpreter's own start-up, before this package is imported
(``site``, the console script's ``import re``, the search for the package), remains
Python's: no code of ours runs there (bench/RESULTS.md, "Issue 30: ring 3").
"""

from __future__ import annotations

__all__ = ["release"]


def release() -> object:
    """Give SIGINT back to Python's KeyboardInterrupt if the start-up handler holds it;
    returns that handler, to be restored when the command ends (None: nothing changed)."""
    try:
        import _signal

        from . import _startup_interrupt

        if _signal.getsignal(_signal.SIGINT) is _startup_interrupt:
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
            return _startup_interrupt
    except (ImportError, AttributeError, ValueError, OSError):
        pass
    return None
