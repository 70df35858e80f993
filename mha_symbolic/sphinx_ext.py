"""A Sphinx extension (also for Jupyter Book 1, which builds with Sphinx): the numbers in
every page's math are checked as the page is read, and the build fails on a wrong one.

In ``conf.py``::

    extensions = ["myst_parser", "mha_symbolic.sphinx_ext"]
    mha_check_not_judged = False   # True: a warning for each statement not judged
    mha_check_fail = True          # False: wrong numbers are errors in the log only

In a Jupyter Book's ``_config.yml``::

    sphinx:
      extra_extensions: [mha_symbolic.sphinx_ext]

Each wrong statement is logged as an error at ``page.md:LINE`` (undecided ones as
warnings), and at the end of the build a wrong number anywhere sets the exit status to 1,
so ``sphinx-build`` (and ``jupyter-book build``) fail.  The ``mha-check`` directive
(```` ```{mha-check} ```` in MyST, ``.. mha-check::`` in reST) renders nothing:
its TOML is for the checker only.  The
verdicts are kept in the build environment, so an incremental build that does not
re-read a wrong page still fails.  Sphinx is imported only by Sphinx itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["setup"]

_SUFFIXES = {".md": "markdown", ".qmd": "markdown", ".rst": "rst", ".ipynb": "notebook",
             ".tex": "latex"}


def _directive() -> Any:
    from docutils.parsers.rst import Directive

    class MhaCheck(Directive):
        """``mha-check``: worked-example TOML for the checker; renders nothing."""

        has_content = True
        optional_arguments = 1
        final_argument_whitespace = True

        def run(self) -> list[Any]:
            return []

    return MhaCheck


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    from sphinx.util import logging

    from .errors import MhaSymbolicError
    from .textbook.sources import check_source
    from .textbook.sources.check import _text_record

    logger = logging.getLogger("mha_symbolic")
    path = str(app.env.doc2path(docname))
    fmt = next((f for s, f in _SUFFIXES.items() if path.lower().endswith(s)), None)
    store = _store(app.env)
    store.pop(docname, None)
    if fmt is None:
        return
    try:
        report = check_source(text=source[0], fmt=fmt, name=path)
    except MhaSymbolicError as exc:
        logger.error(f"mha-check: {' '.join(str(exc).split())}", location=docname)
        store[docname] = [(0, str(exc))]
        return
    wrong: list[tuple[int, str]] = []
    for r in report.records:
        message = " | ".join(x.strip() for x in _text_record(r)[1:]) or r.text
        text = f"mha-check: {r.verdict}: {' '.join(r.text.split())[:120]} — {message[:400]}"
        if r.verdict in ("wrong", "unreadable"):  # an unreadable mha-check claim fails too
            logger.error(text, location=(docname, r.line))
            wrong.append((r.line, text))
        elif r.verdict in ("undecided", "ambiguous"):
            logger.warning(text, location=(docname, r.line))
        elif r.verdict == "not judged" and app.config.mha_check_not_judged:
            logger.warning(f"mha-check: not judged: {r.text[:120]} ({r.reason})",
                           location=(docname, r.line))
    if wrong:
        store[docname] = wrong


def _store(env: Any) -> dict[str, list[tuple[int, str]]]:
    if not hasattr(env, "mha_check_wrong"):
        env.mha_check_wrong = {}
    return env.mha_check_wrong


def _purge(app: Any, env: Any, docname: str) -> None:
    _store(env).pop(docname, None)


def _merge(app: Any, env: Any, docnames: Any, other: Any) -> None:
    _store(env).update({d: v for d, v in _store(other).items() if d in docnames})


def _finished(app: Any, exception: BaseException | None) -> None:
    """A wrong number anywhere: one error line naming the pages, and exit status 1
    (``app.statuscode``; Sphinx then reports "build finished with problems")."""
    if exception is not None or not app.config.mha_check_fail:
        return
    wrong = _store(app.env)
    count = sum(len(v) for v in wrong.values())
    if count:
        from sphinx.util import logging

        pages = ", ".join(sorted(wrong))
        logging.getLogger("mha_symbolic").error(
            f"mha-check: {count} wrong number(s) in {pages} (each reported above at its page "
            "and line); the build fails")
        app.statuscode = 1


def setup(app: Any) -> dict[str, Any]:
    from . import __version__

    app.add_config_value("mha_check_not_judged", False, "env")
    app.add_config_value("mha_check_fail", True, "env")
    app.add_directive("mha-check", _directive())
    app.connect("source-read", _source_read)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("build-finished", _finished)
    return {"version": __version__, "parallel_read_safe": True, "parallel_write_safe": True,
            "env_version": 1}
