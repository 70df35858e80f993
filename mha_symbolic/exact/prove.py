"""Machine-checked proofs of the closed forms of attention, for general sizes.

Each theorem lives in its own module under ``proofs/`` (shipped in the wheel
as ``mha_symbolic/proofs``) and exposes ``THEOREM = Theorem(...)``:

* ``prove()`` builds a :class:`Derivation`: a chain of steps, each one either
  *decided* by SymPy (``simplify(lhs - rhs) == 0`` on indexed sums with a
  symbolic upper limit ``n``, a sign decided from assumptions, a limit of a
  plain exponential) or an *elementary fact* stated explicitly (``exp`` is
  increasing, a finite sum can be re-indexed by a bijection).  A step that
  SymPy cannot decide raises :class:`~mha_symbolic.errors.ProofError` at once.
* ``cross_check(rng)`` fills a :class:`CrossCheck` (:mod:`.proof_checks`) with
  independent numerical checks at random points: Arb balls (python-flint) or exact
  rationals, never floats and never ``mpmath.iv``.  A ball that excludes the claimed
  value, or a certified inequality that does not hold, raises ``ProofError`` too.

:func:`run_proofs` runs them all and returns one :class:`ProofResult` each (in a
:class:`ProofReport`; ``on_result`` is called as each finishes, :func:`iter_proofs`
yields them); ``mha-symbolic prove`` streams the table row by row and exits 0 only
when all hold.  How results print (LaTeX, text, Markdown, HTML) is
:mod:`.proof_render`.

>>> from mha_symbolic.exact.prove import run_proofs
>>> [r.status for r in run_proofs(only=["uniform"])]
['proved']
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import MhaSymbolicError, ProofError
from .proof_checks import CheckRecord, CrossCheck, _short

__all__ = [
    "CheckRecord",
    "CrossCheck",
    "Derivation",
    "ProofResult",
    "Step",
    "Theorem",
    "load_theorems",
    "proofs_dir",
    "proofs_latex",
    "run_proofs",
    "run_theorem",
    "write_latex",
]

DEFAULT_SEED = 20240605  # fixes the random points of the cross-checks (reproducible runs)
_PACKAGE_NAME = "_mha_symbolic_proofs"

# Step kinds -> how the step was established (shown in the LaTeX and the JSON).
_DECIDED_BY: dict[str, str] = {
    "definition": "definition",
    "identity": "SymPy: simplify(lhs - rhs) = 0",
    "sign": "SymPy: sign decided from the assumptions",
    "inequality": "SymPy: sign of rhs - lhs decided from the assumptions",
    "limit": "SymPy: limit of an elementary expression (not a softmax)",
    "fact": "elementary fact, stated (not machine-checked)",
}
# How each kind of step is marked in the LaTeX rendering.
_TAG: dict[str, str] = {
    "definition": "",
    "identity": r" \textbf{[SymPy]}",
    "sign": r" \textbf{[SymPy]}",
    "inequality": r" \textbf{[SymPy]}",
    "limit": r" \textbf{[SymPy]}",
    "fact": r" \textbf{[stated]}",
}
_RELATION_LATEX: dict[str, str] = {
    ":=": r"\mathrel{:=}",
    "=": "=",
    "<": "<",
    "<=": r"\le",
    ">": ">",
    ">=": r"\ge",
    "->": r"\to",
}


# ---------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One line of a proof: ``lhs relation rhs``, why it holds, and how it was checked.

    ``lhs``/``rhs`` are LaTeX strings (rendered by ``sympy.latex`` when the
    step was recorded); ``kind`` is one of ``definition``, ``identity``,
    ``sign``, ``inequality``, ``limit``, ``fact``; ``scope`` says for which
    sizes the step was decided ("all sizes" unless an instance was checked).
    """

    kind: str
    lhs: str
    relation: str
    rhs: str
    reason: str
    scope: str = "all sizes"

    @property
    def decided_by(self) -> str:
        return _DECIDED_BY[self.kind]

    @property
    def machine_checked(self) -> bool:
        return self.kind not in ("definition", "fact")

    def latex(self) -> str:
        from .._latex import latex_text

        rel = _RELATION_LATEX.get(self.relation, self.relation)
        tag = _TAG[self.kind]
        note = f"{latex_text(self.reason)}{tag}"
        if self.kind == "fact":  # full width, outside the alignment
            return (f"\\intertext{{\\raggedright\\footnotesize Fact: ${self.rhs}$ "
                    f"\\quad({note})}}")
        # the justification is a tag at the right margin: amsmath moves it below the
        # equation when the two would not fit side by side (never an overfull line)
        return (f"{self.lhs} &{rel} {self.rhs} "
                f"\\tag*{{\\parbox[t]{{11em}}{{\\raggedright\\footnotesize {note}}}}}")

    def to_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind, "lhs": self.lhs, "relation": self.relation, "rhs": self.rhs,
            "reason": self.reason, "scope": self.scope, "decided_by": self.decided_by,
        }


def _latex_of(x: Any) -> str:
    from .proof_render import book_latex

    return book_latex(x)


class Derivation:
    """A proof under construction: every method records one step or raises ``ProofError``.

    >>> import sympy
    >>> n = sympy.Symbol("n", integer=True, positive=True)
    >>> d = Derivation()
    >>> d.identity(n / n, 1, "cancel")
    >>> d.steps[0].kind
    'identity'
    """

    def __init__(self, display: dict[Any, Any] | None = None) -> None:
        self.steps: list[Step] = []
        self.conclusion: str = ""
        # substitutions applied to what is *shown* only (never to what is decided): a
        # proof may decide with n = N + 1 (so that SymPy knows n >= 2) and print n
        self.display: dict[Any, Any] = dict(display or {})

    def _shown(self, x: Any) -> str:
        if self.display and not isinstance(x, str) and hasattr(x, "subs"):
            x = x.subs(self.display)
        return _latex_of(x)

    # -- helpers -----------------------------------------------------------
    def _fail(self, reason: str, message: str) -> ProofError:
        err = ProofError(f"step {len(self.steps) + 1} ({reason}): {message}")
        err.derivation = self  # type: ignore[attr-defined]  # the steps that did hold
        return err

    def _record(self, kind: str, lhs: Any, relation: str, rhs: Any, reason: str,
                scope: str) -> None:
        self.steps.append(Step(kind=kind, lhs=self._shown(lhs) if lhs is not None else "",
                               relation=relation, rhs=self._shown(rhs), reason=reason,
                               scope=scope))

    # -- step kinds --------------------------------------------------------
    def define(self, lhs: Any, rhs: Any, reason: str) -> None:
        """Record a definition ``lhs := rhs`` (nothing to decide)."""
        self._record("definition", lhs, ":=", rhs, reason, "all sizes")

    def identity(self, lhs: Any, rhs: Any, reason: str, *, assume: Any = None,
                 scope: str = "all sizes", show: tuple[Any, Any] | None = None) -> None:
        """Decide ``lhs = rhs``: ``simplify((lhs - rhs).doit())``, refined by the SymPy
        predicate ``assume`` (e.g. ``Q.le(k, n)`` for an index in range), must be 0.

        Works for scalars, explicit matrices (every entry) and matrix expressions.
        ``show`` replaces the pair displayed in the LaTeX (e.g. an unevaluated form).
        """
        residual = _residual(lhs, rhs, assume)
        if residual is not None:
            raise self._fail(reason, f"could not show {_short(lhs)} = {_short(rhs)}; "
                                     f"simplify(lhs - rhs) = {_short(residual)}, not 0")
        a, b = show if show is not None else (lhs, rhs)
        self._record("identity", a, "=", b, reason, scope)

    def sign(self, expr: Any, relation: str, reason: str, *, show: Any = None) -> None:
        """Decide ``expr > 0`` (``relation='>'``) or ``expr >= 0`` (``'>='``) from the
        assumptions on its symbols (``expr.is_positive`` / ``is_nonnegative`` is True)."""
        if relation not in (">", ">="):
            raise ValueError(f"relation={relation!r} must be '>' or '>='")
        prop = expr.is_positive if relation == ">" else expr.is_nonnegative
        if prop is not True:
            raise self._fail(reason, f"could not decide {_short(expr)} {relation} 0 from the "
                                     f"assumptions (SymPy says {prop})")
        self._record("sign", show if show is not None else expr, relation, 0, reason,
                     "all sizes")

    def inequality(self, lhs: Any, relation: str, rhs: Any, reason: str, *,
                   assume: Any = None) -> None:
        """Decide ``lhs <= rhs`` or ``lhs < rhs``: the sign of ``simplify(rhs - lhs)``
        must follow from the assumptions."""
        import sympy

        if relation not in ("<=", "<"):
            raise ValueError(f"relation={relation!r} must be '<=' or '<'")
        diff = sympy.simplify(sympy.sympify(rhs - lhs).doit())
        if assume is not None:
            diff = sympy.simplify(sympy.refine(diff, assume))
        prop = None
        for form in (diff, sympy.factor(diff)):
            prop = form.is_nonnegative if relation == "<=" else form.is_positive
            if prop is True:
                break
        if prop is not True:
            raise self._fail(reason, f"could not decide {_short(lhs)} {relation} {_short(rhs)}: "
                                     f"rhs - lhs = {_short(diff)}, sign undecided ({prop})")
        self._record("inequality", lhs, relation, rhs, reason, "all sizes")

    def limit(self, expr: Any, var: Any, point: Any, value: Any, reason: str) -> None:
        """Decide ``lim_{var -> point} expr = value`` with ``sympy.limit``.

        Only for elementary expressions such as ``exp(-beta*g)`` with ``g > 0``;
        softmax limits are never handed to ``sympy.limit`` (it is wrong on them,
        REFERENCES.md section 5): they are reduced to such terms by an identity
        first, and cross-checked numerically.
        """
        import sympy

        got = sympy.limit(expr, var, point)
        if sympy.simplify(got - value) != 0:
            raise self._fail(reason, f"limit of {_short(expr)} as {var} -> {point} is "
                                     f"{_short(got)}, not {_short(value)}")
        arrow = f"\\lim_{{{self._shown(var)} \\to {self._shown(point)}}}"
        self._record("limit", f"{arrow} {self._shown(expr)}", "=", value, reason, "all sizes")

    def fact(self, statement_latex: str, reason: str) -> None:
        """State an elementary fact the proof relies on, without machine checking it."""
        self.steps.append(Step(kind="fact", lhs="", relation="", rhs=statement_latex,
                               reason=reason))

    def conclude(self, statement_latex: str) -> None:
        """The statement that the steps establish (shown after the steps)."""
        self.conclusion = statement_latex

    # -- summaries ---------------------------------------------------------
    @property
    def scopes(self) -> list[str]:
        return sorted({s.scope for s in self.steps if s.scope != "all sizes"})

    @property
    def facts(self) -> int:
        return sum(1 for s in self.steps if s.kind == "fact")


def _residual(lhs: Any, rhs: Any, assume: Any) -> Any:
    """``None`` when ``lhs - rhs`` simplifies to 0, else the residual."""
    import sympy
    from sympy.matrices import MatrixBase
    from sympy.matrices.expressions import MatrixExpr

    if isinstance(lhs, MatrixBase) or isinstance(rhs, MatrixBase):
        lm, rm = sympy.Matrix(lhs), sympy.Matrix(rhs)
        if lm.shape != rm.shape:
            return f"shapes {lm.shape} and {rm.shape} differ"
        for a, b in zip(lm, rm, strict=True):
            r = _scalar_residual(a - b, assume)
            if r is not None:
                return r
        return None
    if isinstance(lhs, MatrixExpr) or isinstance(rhs, MatrixExpr):
        if lhs.shape != rhs.shape:
            return f"shapes {lhs.shape} and {rhs.shape} differ"
        r = lhs - rhs
        if assume is not None:  # e.g. Q.orthogonal(P): P^T P -> I
            r = sympy.refine(r, assume)
        r = sympy.simplify(r.doit())
        if r == sympy.ZeroMatrix(*lhs.shape) or getattr(r, "is_ZeroMatrix", False):
            return None
        return None if r == 0 else r
    return _scalar_residual(sympy.sympify(lhs) - sympy.sympify(rhs), assume)


def _scalar_residual(diff: Any, assume: Any) -> Any:
    """``None`` when the scalar ``diff`` is 0, else what is left of it.

    Normal forms tried, cheapest first: ``doit`` + ``cancel``; then with
    ``e^{a+b} -> e^a e^b`` and common factors pulled out of sums
    (``factor_terms``); then with the bound index of every outermost Sum
    renamed to one canonical name, since SymPy does not identify
    ``Sum(f(i), (i, 1, n))`` with ``Sum(f(j), (j, 1, n))`` (REFERENCES.md
    section 5; alpha-renaming is sound); ``simplify`` last.
    """
    import sympy

    def prep(e: Any) -> Any:
        e = e.doit() if hasattr(e, "doit") else e
        if assume is not None:
            e = sympy.refine(e, assume)
            e = e.doit() if hasattr(e, "doit") else e
        return e

    base = prep(diff)
    pulled = _canonical_dummies(sympy.factor_terms(sympy.expand_power_exp(base)))
    forms = (base, pulled, _canonical_dummies(base))
    for form in forms:
        if sympy.cancel(sympy.together(form)) == 0:
            return None
    last: Any = None
    for form in forms:
        try:
            r = sympy.simplify(form)
            if assume is not None:
                r = sympy.simplify(sympy.refine(r, assume))
            if r == 0:
                return None
            if sympy.simplify(_canonical_dummies(r)) == 0:
                return None
        except Exception as exc:  # a SymPy bug while simplifying: undecided, not proved
            r = f"{form} (SymPy raised {type(exc).__name__} while simplifying it)"
        last = r if last is None else last
    return last


def _canonical_dummies(expr: Any) -> Any:
    """Rename the bound index of each outermost single-limit ``Sum`` to ``_idx``."""
    import sympy

    canon = sympy.Symbol("_idx", integer=True)

    def walk(e: Any) -> Any:
        if isinstance(e, sympy.Sum):
            if len(e.limits) == 1 and canon not in e.free_symbols:
                var = e.limits[0][0]
                return e.xreplace({var: canon})
            return e
        if not e.args or isinstance(e, (sympy.Indexed, sympy.IndexedBase)):
            return e
        return e.func(*[walk(a) for a in e.args])

    return walk(expr)


@dataclass(frozen=True)
class Theorem:
    """A theorem module's interface: ``THEOREM = Theorem(...)``.

    ``name`` is the short identifier used by ``--only``; ``statement_latex`` is
    the statement in LaTeX (a paragraph, may contain inline math);
    ``prove()`` returns a :class:`Derivation`; ``cross_check(rng)`` returns a
    :class:`CrossCheck` built at random points drawn from ``rng``.
    """

    name: str
    title: str
    statement_latex: str
    prove: Callable[[], Derivation]
    cross_check: Callable[[random.Random], CrossCheck]
    number: int = 0


@dataclass(frozen=True, repr=False)
class ProofResult:
    """The outcome of one theorem: status ``proved``, ``FAILED`` (a step or a check
    does not hold) or ``ERROR`` (the proof code raised something else).

    ``str(result)`` is a readable report (the statement, the steps, the cross-check
    table); in a notebook it shows as Markdown or HTML, every text escaped.
    """

    name: str
    number: int
    title: str
    statement_latex: str
    method: str
    status: str
    seconds: float
    message: str = ""
    steps: tuple[Step, ...] = ()
    checks: tuple[CheckRecord, ...] = ()
    conclusion: str = ""
    facts: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "proved"

    @property
    def skipped_checks(self) -> int:
        """How many cross-checks could not run (shown as skipped, never as passed)."""
        return sum(1 for c in self.checks if c.status == "skipped")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "number": self.number, "title": self.title,
            "method": self.method, "status": self.status,
            "seconds": round(self.seconds, 3), "message": self.message,
            "stated_facts": self.facts, "skipped_checks": self.skipped_checks,
            "steps": [s.to_dict() for s in self.steps],
            "checks": [c.to_dict() for c in self.checks],
        }

    def __repr__(self) -> str:
        return (f"<ProofResult {self.number} {self.name}: {self.status}, "
                f"{len(self.steps)} steps, {len(self.checks)} checks, {self.seconds:.2f} s>")

    def __str__(self) -> str:
        from .proof_render import result_text

        return result_text(self)

    def _repr_markdown_(self) -> str:
        from .proof_render import result_markdown

        return result_markdown(self)

    def _repr_html_(self) -> str:
        from .proof_render import result_html

        return result_html(self)

    def latex(self) -> str:
        """This proof as a LaTeX fragment (a ``\\section`` with aligned steps and a
        booktabs table of the cross-checks)."""
        from .proof_render import result_latex

        return result_latex(self)


class ProofReport(list[ProofResult]):
    """The results of :func:`run_proofs`: a list, printed as a summary table
    (``str``, Markdown and HTML in a notebook) instead of a dump of dataclasses."""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self)

    def __str__(self) -> str:
        from .proof_render import results_text

        return results_text(self)

    def _repr_markdown_(self) -> str:
        from .proof_render import results_markdown

        return results_markdown(self)

    def _repr_html_(self) -> str:
        from .proof_render import results_html

        return results_html(self)


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------


def _method(derivation: Derivation | None, check: CrossCheck | None) -> str:
    if derivation is None:
        sym = "symbolic"
    elif derivation.scopes:
        sym = "symbolic for " + ", ".join(derivation.scopes)
    else:
        sym = "symbolic (all sizes)"
    if check is None:
        return sym
    return f"{sym} + {check.kind} check"


def run_theorem(theorem: Theorem, *, seed: int = DEFAULT_SEED) -> ProofResult:
    """Prove one theorem and cross-check it; never raises for a false statement.

    A step that does not decide, or a numerical check that fails, gives
    status ``FAILED`` with the step and the residual in ``message``.
    """
    start = time.perf_counter()
    derivation: Derivation | None = None
    check: CrossCheck | None = None
    status, message = "proved", ""
    try:
        derivation = theorem.prove()
        if not isinstance(derivation, Derivation):
            raise ProofError(f"prove() returned {type(derivation).__name__}, not a Derivation")
        check = theorem.cross_check(random.Random(f"{seed}:{theorem.name}"))
        if not isinstance(check, CrossCheck):
            raise ProofError(f"cross_check() returned {type(check).__name__}, not a CrossCheck")
    except ProofError as exc:
        status, message = "FAILED", str(exc)
        derivation = getattr(exc, "derivation", derivation)
        check = getattr(exc, "cross_check", check)
    except Exception as exc:  # the proof code itself broke: report, do not hide
        status, message = "ERROR", f"{type(exc).__name__}: {_short(exc, 400)}"
    seconds = time.perf_counter() - start
    if not isinstance(derivation, Derivation):
        derivation = None
    if not isinstance(check, CrossCheck):
        check = None
    steps = tuple(derivation.steps) if derivation is not None else ()
    return ProofResult(
        name=theorem.name, number=theorem.number, title=theorem.title,
        statement_latex=theorem.statement_latex,
        method=_method(derivation, check), status=status, seconds=seconds, message=message,
        steps=steps, checks=tuple(check.records) if check is not None else (),
        conclusion=derivation.conclusion if derivation is not None else "",
        facts=derivation.facts if derivation is not None else 0,
    )


def proofs_dir() -> Path:
    """Where the theorem modules are: ``mha_symbolic/proofs`` in an installed wheel,
    else ``proofs/`` at the root of the source checkout."""
    package = Path(__file__).resolve().parent.parent  # mha_symbolic/
    candidates = (package / "proofs", package.parent / "proofs")
    for candidate in candidates:
        if (candidate / "__init__.py").is_file():
            return candidate
    raise MhaSymbolicError(
        f"no proofs directory: looked for {candidates[0]} and {candidates[1]}"
    )


def _load_package(directory: Path) -> ModuleType:
    existing = sys.modules.get(_PACKAGE_NAME)
    if existing is not None:
        if Path(str(existing.__file__)).parent == directory:
            return existing
        # another proofs directory was loaded before: forget its modules
        for name in [k for k in sys.modules if k == _PACKAGE_NAME
                     or k.startswith(_PACKAGE_NAME + ".")]:
            del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        _PACKAGE_NAME, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - defensive
        raise MhaSymbolicError(f"cannot load the proofs package from {directory}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE_NAME] = package
    spec.loader.exec_module(package)
    return package


def _load_module(directory: Path, path: Path) -> ModuleType:
    name = f"{_PACKAGE_NAME}.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - defensive
        raise MhaSymbolicError(f"cannot load the theorem module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_theorems(directory: Path | None = None) -> list[Theorem]:
    """Every ``THEOREM`` of the modules ``tNN_<name>.py``, in file order."""
    directory = proofs_dir() if directory is None else Path(directory).resolve()
    _load_package(directory)
    theorems: list[Theorem] = []
    for path in sorted(directory.glob("t[0-9][0-9]_*.py")):
        try:
            module = _load_module(directory, path)
        except Exception as exc:  # a broken theorem module: say which, in one line
            raise MhaSymbolicError(
                f"theorem module {path.name} failed to load: {type(exc).__name__}: "
                f"{_short(exc, 300)}"
            ) from exc
        thm = getattr(module, "THEOREM", None)
        if not isinstance(thm, Theorem):
            raise MhaSymbolicError(f"{path.name} defines no THEOREM = Theorem(...)")
        if thm.name != path.stem[4:]:
            raise MhaSymbolicError(f"{path.name} defines THEOREM.name={thm.name!r}; the file "
                                   f"name says {path.stem[4:]!r}")
        number = int(path.stem[1:3])
        theorems.append(thm if thm.number == number else _renumber(thm, number))
    return theorems


def _renumber(thm: Theorem, number: int) -> Theorem:
    return replace(thm, number=number)


def _select(theorems: list[Theorem], only: Iterable[str] | None) -> list[Theorem]:
    if only is None:
        return theorems
    wanted = list(only)
    by_key: dict[str, Theorem] = {}
    for t in theorems:
        by_key[t.name] = t
        by_key[str(t.number)] = t
        by_key[f"t{t.number:02d}"] = t
    unknown = [w for w in wanted if w not in by_key]
    if unknown:
        from .._text import echo

        names = ", ".join(t.name for t in theorems)
        raise MhaSymbolicError(f"only={echo(unknown[0])} names no theorem; known: {names}")
    chosen = {by_key[w].name for w in wanted}
    return [t for t in theorems if t.name in chosen]


def theorem_names(directory: Path | None = None) -> list[str]:
    """The names of the theorems, from the file names ``tNN_<name>.py`` alone (nothing
    is imported: cheap enough for ``--help``).  :func:`load_theorems` checks that each
    module's ``THEOREM.name`` is its file's.

    >>> theorem_names()[:3]
    ['uniform', 'convex', 'shift']
    """
    directory = proofs_dir() if directory is None else Path(directory)
    return [p.stem[4:] for p in sorted(directory.glob("t[0-9][0-9]_*.py"))]


def select_theorems(only: Sequence[str] | str | None = None) -> list[Theorem]:
    """The theorems named in ``only`` (a name such as ``"uniform"``, a number ``"4"``
    or ``"t04"``; all when None), in file order; an unknown name is a
    :class:`~mha_symbolic.errors.MhaSymbolicError` that lists the names."""
    if isinstance(only, str):
        only = [only]
    return _select(load_theorems(), only)


def iter_proofs(only: Sequence[str] | str | None = None, *,
                seed: int = DEFAULT_SEED) -> Iterator[ProofResult]:
    """Prove the theorems one by one, yielding each result as soon as it is known.

    The names in ``only`` are checked before anything runs (an unknown one raises at
    once, not at the first ``next``).

    >>> next(iter_proofs(["shift"])).status
    'proved'
    """
    theorems = select_theorems(only)
    return (run_theorem(t, seed=seed) for t in theorems)


def run_proofs(only: Sequence[str] | str | None = None, latex_dir: str | Path | None = None,
               *, seed: int = DEFAULT_SEED,
               on_result: Callable[[ProofResult], None] | None = None) -> ProofReport:
    """Run the theorems of ``proofs/`` (all, or those named in ``only``: a name such
    as ``"uniform"``, a number ``"4"`` or ``"t04"``) and return their results.

    ``on_result`` is called with each result as soon as its theorem is done (the
    command line prints its row then).  With ``latex_dir``, write ``proofs.tex`` (a
    complete document) and one fragment ``tNN_<name>.tex`` per theorem there.
    ``seed`` fixes the random points of the numerical cross-checks.
    """
    report = ProofReport()
    for result in iter_proofs(only, seed=seed):
        report.append(result)
        if on_result is not None:
            on_result(result)
    if latex_dir is not None:
        write_latex(report, latex_dir)
    return report


def proofs_latex(results: Sequence[ProofResult]) -> str:
    """A complete LaTeX document with every proof of ``results``: an introduction, the
    notation (defined once, for every theorem), a summary table, then the proofs."""
    from .proof_render import proofs_document

    return proofs_document(results)


def write_latex(results: Sequence[ProofResult], latex_dir: str | Path) -> Path:
    """Write ``proofs.tex`` and the per-theorem fragments into ``latex_dir``; return
    the path of ``proofs.tex``."""
    from .._io import check_name
    from .._text import echo

    check_name(latex_dir, "--latex ")
    out = Path(latex_dir)
    if out.exists() and not out.is_dir():
        raise MhaSymbolicError(f"--latex {echo(str(out))} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        (out / f"t{r.number:02d}_{r.name}.tex").write_text(r.latex(), encoding="utf-8")
    master = out / "proofs.tex"
    master.write_text(proofs_latex(results), encoding="utf-8")
    return master


def write_pdf(results: Sequence[ProofResult], pdf: str | Path) -> Path:
    """Typeset ``results`` with pdflatex (through :func:`mha_symbolic._latex.compile_tex`:
    a private folder, no shell escape) and write the PDF to ``pdf``."""
    import shutil
    import tempfile

    from .._latex import compile_tex

    target = Path(pdf)
    with tempfile.TemporaryDirectory(prefix="mha-symbolic-proofs-") as tmp:
        master = write_latex(results, tmp)
        built = compile_tex(master, runs=1)
        shutil.copyfile(built, target)
    return target

