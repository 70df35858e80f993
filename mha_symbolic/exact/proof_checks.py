"""The numerical side of a proof: :class:`CrossCheck` (independent checks at random
points, with Arb balls or exact rationals) and its :class:`CheckRecord` entries.

Split from :mod:`.prove` (which re-exports both): a check names a *claim* and the
*case* it was checked in, so that the printed proof can show one table row per claim
(:mod:`.proof_render`); a check that cannot run is recorded as *skipped*, never as a
pass; an agreement records the least ``k`` with ``|difference| < 10^k`` certified.

>>> from flint import arb, fmpq
>>> c = CrossCheck("Arb")
>>> c.agree("$w = 1/3$", arb(1) / 3, fmpq(1, 3), bits=40, case={"n": 3})
>>> c.records[0].status, c.records[0].bound_exp is not None
('ok', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ProofError

__all__ = ["CheckRecord", "CrossCheck"]


@dataclass(frozen=True)
class CheckRecord:
    """One numerical cross-check: the claim checked, the case, the outcome.

    ``what`` is the claim in the library's markup (text with ``$...$`` math), the same
    for every case of one claim so that the cases group into one table row; ``case``
    holds the parameters of this instance (``(("n", 5), ("c", "3/16"))``); ``status``
    is ``ok``, ``FAILED``, ``skipped`` (the check could not run: ``detail`` says why;
    never counted as a pass) or ``note`` (a certified number printed, nothing compared).
    ``bound_exp`` is ``k`` when the check certified ``|difference| < 10^k``.
    """

    what: str
    detail: str
    status: str = "ok"
    case: tuple[tuple[str, Any], ...] = ()
    bound_exp: int | None = None
    detail_latex: str = ""

    @property
    def ok(self) -> bool:
        """True for a check that passed (or a note); False for FAILED and skipped."""
        return self.status in ("ok", "note")

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "detail": self.detail, "ok": self.ok,
                "status": self.status, "case": {k: str(v) for k, v in self.case},
                "bound_exp": self.bound_exp}



def _short(x: Any, limit: int = 160) -> str:
    text = " ".join(str(x).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CrossCheck:
    """Independent numerical checks at random points (Arb balls or exact rationals).

    ``agree`` passes when ``a - b`` is a ball that contains 0 and is narrower
    than ``2**-bits``: the two computations agree to that many bits (for an
    exact pair, ``a == b``).  ``holds`` takes a predicate computed with Arb,
    whose comparisons are true only when certain, or with exact arithmetic.
    ``skip`` records a check that could not run (an optional package missing): it
    is shown as skipped with its reason, never as a pass.

    Every check names a *claim* (``what``, the same text for all its cases) and the
    parameters of the case (``case={"n": 5}``), so that the printed proof shows one
    table row per claim: how many cases, their range, the result.

    >>> from flint import arb, fmpq
    >>> c = CrossCheck("Arb")
    >>> c.agree("one third", arb(1) / 3, fmpq(1, 3), bits=40)
    >>> c.records[0].ok
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.records: list[CheckRecord] = []

    @staticmethod
    def _case(case: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
        return tuple((str(k), v) for k, v in (case or {}).items())

    def _ok(self, what: str, detail: str, case: dict[str, Any] | None = None, *,
            bound_exp: int | None = None) -> None:
        self.records.append(CheckRecord(what, detail, "ok", self._case(case), bound_exp))

    def _bad(self, what: str, detail: str, case: dict[str, Any] | None = None) -> ProofError:
        self.records.append(CheckRecord(what, detail, "FAILED", self._case(case)))
        where = ", ".join(f"{k}={v}" for k, v in self._case(case))
        from .proof_render import plain_text

        err = ProofError(f"cross-check {len(self.records)} ({plain_text(what)}"
                         f"{'; ' + where if where else ''}): {detail}")
        err.cross_check = self  # type: ignore[attr-defined]  # the checks made so far
        return err

    def agree(self, what: str, a: Any, b: Any, *, bits: int = 90,
              case: dict[str, Any] | None = None) -> None:
        """``a`` and ``b`` (arb, fmpq, fmpz or int) agree: exactly, or as balls to ``bits`` bits."""
        from flint import arb, fmpq, fmpz

        exact = (int, fmpq, fmpz)
        if isinstance(a, exact) and isinstance(b, exact):
            if fmpq(a) != fmpq(b):
                raise self._bad(what, f"{a} != {b} (exact)", case)
            self._ok(what, f"{a} (exact)", case)
            return
        d = arb(a) - arb(b)
        if not d.contains(0):
            raise self._bad(what, f"{_short(a)} and {_short(b)} differ: their difference "
                                  f"{_short(d)} excludes 0", case)
        if not d.rad() < arb(2) ** (-bits):
            raise self._bad(what, f"difference {_short(d)} is wider than 2^-{bits}: "
                                  "too little precision to compare", case)
        upper = abs(d).upper()
        k = _decimal_exponent_above(upper)
        shown = upper.str(3, radius=False)
        if isinstance(b, exact) and fmpq(b) == 0:  # a is itself a difference
            self._ok(what, f"0 <= |difference| <= {shown}", case, bound_exp=k)
            return
        self._ok(what, f"{arb(a).str(12, radius=False)} vs {arb(b).str(12, radius=False)}: "
                       f"|difference| <= {shown}", case, bound_exp=k)

    def holds(self, what: str, flag: bool, detail: str = "", *,
              case: dict[str, Any] | None = None) -> None:
        """A certified predicate (Arb comparison or exact arithmetic) is true."""
        if flag is not True:
            raise self._bad(what, f"does not hold ({detail})" if detail else "does not hold",
                            case)
        self._ok(what, detail, case)

    def note(self, what: str, value: Any, *, case: dict[str, Any] | None = None) -> None:
        """A certified number worth printing (no comparison): an Arb ball is shown with
        the digits Arb certifies (to within one unit of the last), in scientific notation
        when it is very small or very large."""
        from .proof_render import sci_latex

        if isinstance(value, str):
            text, tex = value, ""
        else:
            from flint import arb

            text = arb(value).str(8, radius=False)
            tex = rf"\approx {sci_latex(text)}"
            text = f"~ {text}"
        self.records.append(CheckRecord(what, text, "note", self._case(case),
                                        detail_latex=tex))

    def skip(self, what: str, reason: str, *, case: dict[str, Any] | None = None) -> None:
        """A check that could not run (``reason``: e.g. ``torch is not installed``)."""
        self.records.append(CheckRecord(what, reason, "skipped", self._case(case)))


def _decimal_exponent_above(upper: Any) -> int | None:
    """The least integer ``k`` with ``upper < 10^k`` certified by Arb (None for 0).

    ``k`` starts from the midpoint of ``log10(upper)`` and is raised until Arb
    certifies the comparison, so the printed bound ``< 10^k`` is never too small."""
    from flint import arb

    if upper == 0:
        return None
    est = (upper.log() / arb(10).log()).mid()
    k = int(float(est.floor())) if est.is_finite() else 0
    for _ in range(4):
        if bool(upper < arb(10) ** k):
            # k - 1 might also do when the estimate sat on a boundary: try it
            return k - 1 if bool(upper < arb(10) ** (k - 1)) else k
        k += 1
    return None  # pragma: no cover - an infinite or NaN bound never passes agree()
