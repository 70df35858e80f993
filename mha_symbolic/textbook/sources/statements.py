"""Statements in an author's math, judged: chains of ``=`` (exact) and ``≈`` (at the printed
precision of the decimal side), with the symbols bound earlier in the same section.

One math span may hold several statements (``w_{11} \\approx 0.6698, w_{12} \\approx 0.3302``;
``\\quad``, ``;``, ``\\\\`` and ``\\text{and}`` separate them too); an ``align`` line that
starts with ``&=`` continues the chain above it.  In a chain ``m₀ r₁ m₁ r₂ m₂ …``:

* a leading run of lone names followed by ``=`` binds them (``d_k = 2``, ``w_1 = \\frac{…}{…}``,
  ``head_1 = v_1 = (1, 2)``) to the first member after them, for the rest of the section;
* every adjacent pair ``mᵢ rᵢ₊₁ mᵢ₊₁`` whose two sides are closed (numbers, bound names)
  is judged: against a printed number (``0.9820``, ``4.85 \\times 10^{8}``, ``(1.3396, 1.3208)``)
  by :func:`mha_symbolic.textbook.verdicts.judge`, the verifier of the TOML claims (an ``=``
  to an integer must hold exactly; a printed decimal is judged at its printed precision,
  since books write ``= 198.20`` for a rounded result); two formulas by ``=`` exactly, by
  ``≈`` within a relative 10⁻⁶ (a larger gap is not judged: ``≈`` between formulas states no
  precision); ``<``, ``≤``, ``>``, ``≥``, ``≠`` exactly;
* a decimal input in a formula (the ``0.707`` of ``e^{0.707}``) is first read exactly; if that
  reading is wrong, it is read as the interval its digits state ([0.7065, 0.7075]), and the
  statement holds if some input in that box gives the printed answer (a witness corner, or
  two corners on either side and the intermediate value theorem over a box on which Arb
  proves the formula finite), and is wrong only if an Arb enclosure over the whole box
  misses the printed interval; otherwise it is undecided;
* free symbols, O(·), limits, ranges, shape notation ``(3 \\times 5) \\cdot (5 \\times 64)`` and
  anything outside :mod:`.latex_math` make the pair (or the statement) "not judged".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..._text import echo
from ...errors import MhaSymbolicError, PrecisionError
from .boxes import consistent, interval
from .latex_math import (
    JUDGED_RELATIONS,
    MAX_STATEMENT,
    NotJudged,
    Tok,
    _exact,
    _short,
    parse_member,
    tokenize,
)

__all__ = ["Relation", "Section", "Statement", "judge_statement", "split_statements"]

#: Relative tolerance of "≈" between two formulas.
FORMULA_RTOL = Fraction(1, 10**6)
#: Most rounded inputs read as intervals in one statement (2^k corners are tried).
MAX_INTERVAL_INPUTS = 6
#: Longest grammar text built for one value once its symbols are substituted.
MAX_VALUE_TEXT = 2000

CORRECTLY_ROUNDED = "correctly rounded"
HOLDS = ("exact", CORRECTLY_ROUNDED, "approximation", "holds for the printed inputs")
_SEPARATOR_WORDS = frozenset({"and", "or", "so", "thus", "hence", "where", "with", "i.e.",
                              "e.g.", "while", "then", "since", "because", ","})


class Free(NotJudged):
    """A name that no earlier statement of the section binds."""


@dataclass
class Statement:
    """One statement: its members (token lists) and the relations between them."""

    members: list[list[Tok]]
    relations: list[str]
    start: int
    end: int
    label: str | None = None
    leading: bool = False  # it starts with a relation: the left side is in the prose
    scale: str = ""  # a scale word just after the math ("≈ 85$ million"): part of the number
    unit: str = ""  # a prefixed unit just after the math ("= 0.125$ ms"): it may rescale it


@dataclass(frozen=True)
class Relation:
    """The verdict on one relation of a chain."""

    left: str
    relation: str
    right: str
    verdict: str  # exact | correctly rounded | approximation | holds for the printed inputs
    #               | wrong | undecided | not judged
    ok: bool
    exact: str = ""  # certified digits of the value side
    rounded: str | None = None
    detail: str | None = None
    diagnosis: str | None = None


@dataclass
class Section:
    """The names bound so far in one section: name → (shape, grammar texts)."""

    bindings: dict[str, tuple[tuple[int, ...], list[str]]] = field(default_factory=dict)
    #: "printed": a decimal input of a formula stands for its printed interval when the
    #: exact reading is wrong; "exact": it is exactly what it prints (the file says so)
    inputs: str = "printed"
    #: "e = d - y" above: e is a variable of this section, not Euler's number
    e_is_a_name: bool = False


def split_statements(text: str, base: int = 0) -> list[Statement]:
    """The statements of one math span (``base``: its offset in the file)."""
    toks = tokenize(text, base)
    parts: list[tuple[list[Tok], bool]] = []  # (tokens, after a line break)
    cur: list[Tok] = []
    depth = 0
    label: dict[int, str] = {}
    after_break = False
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "cmd" and t.text in ("\\label", "\\tag") and i + 1 < len(toks) \
                and toks[i + 1].text == "{":
            j = i + 2
            name: list[str] = []
            while j < len(toks) and toks[j].text != "}" and len(name) < 40:
                name.append(toks[j].text)
                j += 1
            if t.text == "\\label":
                label[len(parts)] = "".join(name)
            i = j + 1
            continue
        if t.text in ("(", "[", "{") or (t.kind == "cmd" and t.text == "\\begin"):
            depth += 1
        elif t.text in (")", "]", "}") or (t.kind == "cmd" and t.text == "\\end"):
            depth -= 1
        if depth <= 0 and t.text == "&":
            i += 1
            continue
        separator = depth <= 0 and (
            t.kind == "sep" or t.text in ("\\quad", "\\qquad")
            or (t.kind == "text" and t.text.strip().lower() in _SEPARATOR_WORDS)
            or (t.text == "," and _relation_ahead(toks, i + 1)))
        if separator:
            if cur:
                parts.append((cur, after_break))
            cur = []
            after_break = t.kind == "sep" and t.text == "\\\\"
            i += 1
            continue
        cur.append(t)
        i += 1
    if cur:
        parts.append((cur, after_break))
    statements: list[Statement] = []
    for k, (part, broke) in enumerate(parts):
        members, relations = _members(part)
        leading = not members[0]
        if leading and broke and statements:
            prev = statements[-1]  # "&= c" on the next align line continues the chain
            prev.members.extend(members[1:])
            prev.relations.extend(relations)
            prev.end = part[-1].end
            continue
        if not relations:
            continue
        statements.append(Statement(members, relations, part[0].pos, part[-1].end,
                                    label.get(k), leading))
    return statements


def _relation_ahead(toks: list[Tok], i: int) -> bool:
    """Whether a relation follows (at depth 0) before the next top-level comma."""
    depth = 0
    for t in toks[i:]:
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and t.text == ",":
            return False
        elif depth == 0 and t.kind == "rel":
            return True
    return False


def _members(part: list[Tok]) -> tuple[list[list[Tok]], list[str]]:
    from .latex_math import RELATIONS

    members: list[list[Tok]] = [[]]
    relations: list[str] = []
    depth = 0
    for t in part:
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        if t.kind == "rel" and depth <= 0:
            relations.append(RELATIONS[t.text])
            members.append([])
        else:
            members[-1].append(t)
    return members, relations


# -- values ---------------------------------------------------------------------------------

def _text_of(source: str, toks: list[Tok]) -> str:
    if not toks:
        return ""
    return " ".join(source[toks[0].pos:toks[-1].end].split())


def value_texts(node: Any, section: Section) -> tuple[tuple[int, ...], list[str]]:
    """(shape, the grammar text of each entry) of a tree; NotJudged outside the grammar."""
    kind = node[0]
    if kind == "num":
        return (), [node[1]]
    if kind == "const":
        return (), [node[1]]
    if kind == "sym":
        if node[1] not in section.bindings:
            raise Free(f"free symbol {echo(node[1], 40)}")
        return section.bindings[node[1]]
    if kind == "neg":
        shape, texts = value_texts(node[1], section)
        return shape, [f"-({t})" for t in texts]
    if kind == "pct":
        shape, texts = _scalar(node[1], section, "a percentage")
        return shape, [f"({texts[0]})/100"]
    if kind == "add":
        sum_shape: tuple[int, ...] | None = None
        sum_texts: list[str] | None = None
        for sign, term in node[1]:
            s, ts = value_texts(term, section)
            ts = [f"({t})" if sign > 0 else f"-({t})" for t in ts]
            if sum_shape is None:
                sum_shape, sum_texts = s, ts
            elif s != sum_shape:
                raise NotJudged("a sum of a number and a vector, or of different shapes")
            else:
                assert sum_texts is not None
                sum_texts = [f"{a} + {b}" for a, b in zip(sum_texts, ts, strict=True)]
        assert sum_shape is not None and sum_texts is not None
        return _bounded(sum_shape, sum_texts)
    if kind == "mul":
        shape, texts = (), ["1"]
        for factor in node[1]:
            s, ts = value_texts(factor, section)
            if s == ():
                texts = [f"({a})*({ts[0]})" for a in texts]
            elif shape == ():
                texts = [f"({texts[0]})*({b})" for b in ts]
                shape = s
            else:
                raise NotJudged("a product of two vectors or matrices")
        return _bounded(shape, texts)
    if kind == "div":
        shape, texts = value_texts(node[1], section)
        _, den = _scalar(node[2], section, "a divisor")
        return _bounded(shape, [f"({t})/({den[0]})" for t in texts])
    if kind == "pow":
        _, base = _scalar(node[1], section, "the base of a power")
        _, exp = _scalar(node[2], section, "an exponent")
        return _bounded((), [f"({base[0]})^({exp[0]})"])
    if kind == "func":
        _, arg = _scalar(node[2], section, f"the argument of {node[1]}")
        return _bounded((), [f"{node[1]}({arg[0]})"])
    if kind == "root":
        _, deg = _scalar(node[1], section, "a root's degree")
        _, arg = _scalar(node[2], section, "a root")
        return _bounded((), [f"({arg[0]})^(1/({deg[0]}))"])
    if kind == "tuple":
        texts = [_scalar(item, section, "a tuple entry")[1][0] for item in node[1]]
        return (len(texts),), texts
    if kind == "matrix":
        rows = node[1]
        texts = [_scalar(x, section, "a matrix entry")[1][0] for r in rows for x in r]
        return (len(rows), len(rows[0])), texts
    raise NotJudged(f"unknown notation {kind}")  # pragma: no cover - the parser builds no other


def _scalar(node: Any, section: Section, what: str) -> tuple[tuple[int, ...], list[str]]:
    shape, texts = value_texts(node, section)
    if shape != ():
        raise NotJudged(f"{what} is a vector or matrix")
    return shape, texts


def _bounded(shape: tuple[int, ...], texts: list[str]) -> tuple[tuple[int, ...], list[str]]:
    if any(len(t) > MAX_VALUE_TEXT for t in texts):
        raise NotJudged(f"longer than {MAX_VALUE_TEXT} characters once its names are replaced")
    return shape, texts


def printed(node: Any) -> tuple[str, bool] | None:
    """(the claims-syntax text, whether every entry is an integer) of a member that is a
    printed number: a decimal, ``d \\times 10^{k}``, ``10^{k}``, a percentage, a tuple or
    matrix of them; None for a formula."""
    kind = node[0]
    if kind == "num":
        return node[1], "." not in node[1] and "e" not in node[1].lower()
    if kind == "neg":
        inner = printed(node[1])
        if inner is None or node[1][0] != "num":
            return None
        return "-" + inner[0], inner[1]
    if kind == "mul" and len(node[1]) == 2 and node[1][0][0] == "num":
        p = node[1][1]
        k = _int_exponent(p)
        if k is not None:
            return f"{node[1][0][1]} × 10^{k}", False
        return None
    if kind == "pow":  # 10^{6}: an integer (exact under "="), a power of ten under "≈"
        k = _int_exponent(node)
        return (f"10^{k}", k >= 0) if k is not None else None
    if kind == "pct" and node[1][0] == "num":
        return node[1][1] + "%", False
    if kind == "tuple":
        items = [printed(x) for x in node[1]]
        if any(x is None or "×" in x[0] or "%" in x[0] for x in items):
            return None
        return "(" + ", ".join(x[0] for x in items if x) + ")", all(x[1] for x in items if x)
    if kind == "matrix":
        rows = [[printed(x) for x in r] for r in node[1]]
        if any(x is None or "×" in x[0] for r in rows for x in r):
            return None
        text = "[" + ", ".join("[" + ", ".join(x[0] for x in r if x) + "]" for r in rows) + "]"
        return text, all(x[1] for r in rows for x in r if x)
    return None


def _int_exponent(node: Any) -> int | None:
    """k for the tree of 10^{k} (k an integer, perhaps negative), else None."""
    if node[0] != "pow" or node[1] != ("num", "10"):
        return None
    e = node[2]
    neg = e[0] == "neg"
    if neg:
        e = e[1]
    if e[0] == "num" and e[1].isdigit() and len(e[1]) <= 4:
        return -int(e[1]) if neg else int(e[1])
    return None


def rounded_inputs(node: Any, out: list[Any] | None = None) -> list[Any]:
    """The decimal literals of a formula (``0.707``): inputs read as intervals if needed."""
    out = [] if out is None else out
    if node[0] == "num":
        if "." in node[1] and "e" not in node[1].lower() and node not in out:
            out.append(node)
        return out
    for child in node[1:]:
        if isinstance(child, tuple):
            rounded_inputs(child, out)
        elif isinstance(child, list):
            for c in child:
                if isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], int):
                    rounded_inputs(c[1], out)
                elif isinstance(c, list):
                    for x in c:
                        rounded_inputs(x, out)
                elif isinstance(c, tuple):
                    rounded_inputs(c, out)
    return out


_SHAPE_GROUP = re.compile(r"^\(\s*[\w{}\\]+\s*(?:\\times|×)\s*[\w{}\\]+\s*\)$")


def shape_notation(member_text: str) -> bool:
    """``(3 \\times 5) \\cdot (5 \\times 64)``, ``(3 \\times 64)``: sizes, not numbers."""
    groups = re.split(r"\s*(?:\\cdot|\\times|·|×)?\s*(?=\()", member_text.strip())
    groups = [g for g in groups if g.strip()]
    return bool(groups) and all(_SHAPE_GROUP.match(g.strip()) for g in groups)


# -- judging ----------------------------------------------------------------------------------

def judge_statement(st: Statement, source: str, section: Section) -> tuple[list[Relation], str | None]:
    """The relations' verdicts (binding names as it goes) and, when nothing could be judged,
    why (the first reason)."""
    members = st.members[1:] if st.leading else st.members
    relations = st.relations
    texts = [_text_of(source, m) for m in members]
    if any(len(t) > MAX_STATEMENT for t in texts):
        return [], f"a statement longer than {MAX_STATEMENT} characters"
    if any(shape_notation(t) for t in texts):
        return [], "shape notation (a × b) · (b × c): sizes, not numbers"
    nodes: list[Any] = []
    reasons: list[str] = []
    for m in members:
        try:
            nodes.append(parse_member(m))
        except NotJudged as exc:
            nodes.append(None)
            reasons.append(str(exc))
    if st.leading and len(members) < 2:
        return [], "its left side is in the prose"
    if nodes and nodes[0] == ("const", "e") and relations and relations[0] == "=":
        section.e_is_a_name = True  # Euler's number is never assigned: "e = d - y = 0.3"
        return [], "e = …: a variable named e (an error, an edge), not Euler's number"
    if section.e_is_a_name and any(_has_euler(n) for n in nodes):
        return [], "e is a variable of this section (e = … above), not Euler's number"
    # the leading run of lone names bound by "="
    k = 0
    while k < len(nodes) - 1 and nodes[k] is not None and nodes[k][0] == "sym" \
            and relations[k] == "=":
        k += 1
    if k and nodes[k] is not None:
        try:
            value = value_texts(nodes[k], section)
            _exact(*value)  # bind only what reads exactly
        except NotJudged as exc:
            reasons.append(str(exc))
        else:
            for node in nodes[:k]:
                section.bindings[node[1]] = value
    results: list[Relation] = []
    for i in range(k, len(nodes) - 1):
        rel = relations[i]
        left, right = nodes[i], nodes[i + 1]
        if left is None or right is None:
            continue
        if rel not in JUDGED_RELATIONS:
            reasons.append(f"the relation {rel} is not judged")
            continue
        if _lone_name_equation(left, right) or (rel not in ("=", "≈") and (
                left[0] == "sym" or right[0] == "sym")):
            try:  # a free symbol is the better reason
                value_texts(left, section)
                value_texts(right, section)
            except NotJudged as exc:
                reasons.append(str(exc))
            else:
                reasons.append("a lone name on one side (\"2D = T\", \"n < 0\"): a "
                               "definition, a condition or an equation to solve, not a "
                               "computation")
            continue
        if i + 1 == len(nodes) - 1 and st.unit and printed(right) is not None:
            reasons.append(f"a unit after the number ({echo(st.unit, 12)}) may rescale it: "
                           "the left side is in other units")
            continue
        try:
            scale = st.scale if i + 1 == len(nodes) - 1 else ""
            results.append(judge_pair(left, rel, right, texts[i], texts[i + 1], section,
                                      scale=scale))
        except NotJudged as exc:
            reasons.append(str(exc))
    if not results:
        if k and not reasons:
            return [], "a definition"
        return [], reasons[0] if reasons else "nothing to judge"
    if reasons:
        results.append(Relation("", "", "", "not judged", True, detail=reasons[0]))
    return results, None


_FLIP = {"<": ">", ">": "<", "≤": "≥", "≥": "≤"}


def _has_euler(node: Any, depth: int = 0) -> bool:
    if node == ("const", "e"):
        return True
    if depth > 60 or not isinstance(node, (tuple, list)):
        return False
    return any(_has_euler(x, depth + 1) for x in node if isinstance(x, (tuple, list)))


def _lone_name_equation(left: Any, right: Any) -> bool:
    """A lone name on one side and no printed number on the other (past the leading names
    a chain binds): an earlier binding of that name may belong to another case of the
    text ("during generation, T = 1"), so the pair is not judged."""
    return (left[0] == "sym" and printed(right) is None) or \
        (right[0] == "sym" and printed(left) is None)


def judge_pair(left: Any, rel: str, right: Any, ltext: str, rtext: str,
               section: Section, *, scale: str = "") -> Relation:
    """One relation of a chain, judged (see the module's docstring); ``scale``: a scale
    word the prose puts after the right side ("million")."""
    pr, pl = printed(right), printed(left)
    if scale and pr is not None and "×" not in pr[0] and not pr[0].startswith("("):
        pr = (f"{pr[0]} {scale}", False)
        rtext = f"{rtext} {scale}"
    if pr is None and pl is not None:
        left, right, ltext, rtext, pr = right, left, rtext, ltext, pl
        rel = _FLIP.get(rel, rel)
    shape, texts = value_texts(left, section)
    value = _exact(shape, texts)
    from ..verdicts import describe

    exact_digits = _describe(value, describe)
    if rel in ("=", "≈") and pr is not None:
        p = _printed_answer(pr[0], rel, pr[1])
        rel_result = _judge_printed(value, p)
        verdict, ok, rounded, detail = rel_result
        if verdict == "wrong" and rel == "=" and pr[1] and not _is_integer(value):
            # "= 22" for 22.49: books write "=" for a result rounded to an integer
            p, (verdict, ok, rounded, detail) = _integer_rounded(value, pr[0], rel_result)
        if verdict == "wrong":
            box = _box_check(left, section, p)
            if box is not None:
                verdict, ok, detail = box
        diagnosis = _diagnose(left, p, section) if verdict == "wrong" else None
        return Relation(ltext, rel, rtext, verdict, ok, exact_digits, rounded, detail, diagnosis)
    rshape, rtexts = value_texts(right, section)
    other = _exact(rshape, rtexts)
    if rshape != shape:
        raise NotJudged(f"the sides have different shapes ({shape} and {rshape})")
    from ...exact.certified import certify

    signs = []
    try:
        for a, b in zip(_flat(value), _flat(other), strict=True):
            signs.append(certify(a - b).sign())
    except PrecisionError as exc:
        return Relation(ltext, rel, rtext, "undecided", False, exact_digits, detail=_short(exc))
    if rel == "≈":
        from ..claims import PrintedAnswer
        from ..verdicts import judge

        for a, b in zip(_flat(value), _flat(other), strict=True):
            j = judge(a, PrintedAnswer(rtext, "expression", approx=True, expr=b), FORMULA_RTOL)
            if not j.ok:
                raise NotJudged("≈ between two formulas states no precision (they differ by "
                                f"more than a relative {float(FORMULA_RTOL):g})")
        return Relation(ltext, rel, rtext, "approximation" if any(signs) else "exact", True,
                        exact_digits, detail="a relative error below 1e-06" if any(signs) else None)
    holds = {"=": all(s == 0 for s in signs), "≠": any(s != 0 for s in signs),
             "<": all(s < 0 for s in signs), ">": all(s > 0 for s in signs),
             "≤": all(s <= 0 for s in signs), "≥": all(s >= 0 for s in signs)}[rel]
    if holds:
        return Relation(ltext, rel, rtext, "exact", True, exact_digits)
    if rel == "=" and shape == ():
        box = _box_check(("add", [(1, left), (-1, right)]), section, None)
        if box is not None:
            return Relation(ltext, rel, rtext, box[0], box[1], exact_digits, detail=box[2])
    if rounded_inputs(left) or rounded_inputs(right):
        raise NotJudged(f"an exact {rel} between formulas with rounded inputs")
    return Relation(ltext, rel, rtext, "wrong", False, exact_digits,
                    detail=f"the right side is {_describe(other, describe)}")


#: Smallest integer that an "=" may state as a value rounded to an integer ("= 22" for
#: 22.49); "= 1" for 0.98 is not judged: one digit says too little to call it rounded.
MIN_ROUNDED_INTEGER = 10


def _is_integer(value: Any) -> bool:
    """Whether every entry is exactly an integer (a SymPy Integer, not merely near one)."""
    return all(getattr(v, "is_Integer", False) for v in _flat(value))


def _integer_rounded(value: Any, text: str, exact_result: Any) -> tuple[Any, Any]:
    """An "=" to an integer that the exact value (not an integer) is not: read as the value
    rounded to an integer.  It holds (correctly rounded) only where the integer is the
    correct rounding and has at least two digits; a one-digit integer that the value rounds
    to is not judged; otherwise it stays wrong, diagnosed as a "≈" is."""
    from ..claims import parse_printed

    p = parse_printed("≈ " + text)
    result = _judge_printed(value, p)
    parts = p.parts if p.kind in ("tuple", "array") else (p,)
    if result[1]:
        if any(q.value is None or abs(q.value) < MIN_ROUNDED_INTEGER for q in parts):
            raise NotJudged("an \"=\" to a one-digit integer that the exact value only rounds "
                            "to (write \\approx to have it judged)")
        return p, (CORRECTLY_ROUNDED, True, None,
                   "\"=\" to an integer read as the value rounded to an integer (its exact "
                   "value is not an integer)")
    return p, result


def _flat(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [x for v in value for x in _flat(v)]
    return [value]


def _describe(value: Any, describe: Any) -> str:
    parts = []
    for v in _flat(value)[:16]:
        try:
            parts.append(describe(v, 12)[0])
        except MhaSymbolicError:
            parts.append("(digits undecided)")
    text = ", ".join(parts)
    return f"({text})" if isinstance(value, tuple) else text


def _printed_answer(text: str, rel: str, integers: bool) -> Any:
    """The claim as the TOML verifier reads it; an "=" to integers must hold exactly."""
    from ..claims import PrintedAnswer, parse_printed

    p = parse_printed(("≈ " if rel == "≈" else "") + text)
    if rel == "=" and integers:
        import sympy as sp

        def exact(q: Any) -> Any:
            if q.kind in ("decimal", "expression") and q.value is not None:
                return PrintedAnswer(q.text, "expression",
                                     expr=sp.Rational(q.value.numerator, q.value.denominator))
            return q
        if p.kind in ("tuple", "array"):
            return PrintedAnswer(p.text, p.kind, parts=tuple(exact(q) for q in p.parts),
                                 shape=p.shape)
        return exact(p)
    return p


def _judge_printed(value: Any, p: Any) -> tuple[str, bool, str | None, str | None]:
    from ...errors import ClaimError
    from ..verdicts import UNDECIDED, judge, pairs

    try:
        items = pairs(value, p)
    except ClaimError as exc:
        raise NotJudged(_short(exc)) from None
    verdicts = [judge(v, part, FORMULA_RTOL) for v, part in items]
    if any(j.verdict == UNDECIDED for j in verdicts):
        return UNDECIDED, False, None, next(j.detail for j in verdicts if j.detail)
    wrong = [j for j in verdicts if not j.ok]
    rounded = [j.rounded for j in verdicts]
    shown = None
    if wrong and all(r is not None for r in rounded):
        shown = rounded[0] if len(rounded) == 1 else "(" + ", ".join(
            r for r in rounded if r) + ")"
    if wrong:
        units = [j.error_units for j in wrong if j.error_units]
        detail = ("off by " + ", ".join(units) + " in the last printed digit") if units and \
            not units[0].startswith("relative") else (units[0] if units else None)
        return "wrong", False, shown, detail
    order = ["approximation", "correctly rounded", "exact"]
    verdict = min((j.verdict for j in verdicts), key=lambda v: order.index(v) if v in order else 0)
    return verdict, True, None, None


# -- rounded inputs read as intervals ----------------------------------------------------------

def _box_check(node: Any, section: Section, p: Any) -> tuple[str, bool, str] | None:
    """Whether some input within the printed digits of the formula's decimals gives the
    printed answer ``p`` (None: the formula is 0 somewhere, for an exact "=").  Returns
    (verdict, ok, detail) or None when the formula has no rounded input."""
    inputs = rounded_inputs(node)
    if not inputs or section.inputs == "exact":
        return None
    if len(inputs) > MAX_INTERVAL_INPUTS:
        return ("undecided", False, f"more than {MAX_INTERVAL_INPUTS} rounded inputs to read "
                "as intervals")

    try:
        result = consistent(node, inputs, section, p)
    except (NotJudged, MhaSymbolicError, ArithmeticError, ValueError) as exc:
        return "undecided", False, f"the printed inputs as intervals: {_short(exc)}"
    shown = ", ".join(f"{n[1]} ∈ {lo}…{hi}" for n, (lo, hi) in zip(
        inputs, (_interval_text(n[1]) for n in inputs), strict=True))
    if result is True:
        return ("holds for the printed inputs", True,
                f"wrong with the inputs read exactly, but an input within their printed "
                f"digits ({shown}) gives the printed answer")
    if result is False:
        return ("wrong", False, f"no input within the printed digits ({shown}) gives the "
                "printed answer")
    return ("undecided", False, f"wrong with the inputs read exactly; not decided over the "
            f"intervals they print ({shown})")


def _interval_text(text: str) -> tuple[str, str]:
    lo, hi = interval(text)
    places = len(text.split(".")[1]) + 1
    return _dec(lo, places), _dec(hi, places)


def _dec(x: Fraction, places: int) -> str:
    from ...exact.certified import _format_fraction

    return _format_fraction(x, places)


# -- diagnoses ------------------------------------------------------------------------------

def _diagnose(node: Any, p: Any, section: Section) -> str | None:
    """A slip that explains a wrong statement, proved by judging the corrected statement:
    d_k where √d_k belongs (or the reverse), or a truncation instead of a rounding."""
    for variant, what in _sqrt_variants(node, section):
        try:
            shape, texts = value_texts(variant, section)
            verdict = _judge_printed(_exact(shape, texts), p)
        except (NotJudged, MhaSymbolicError):
            continue
        if verdict[1]:
            names = [n for n, (s, t) in section.bindings.items()
                     if s == () and t[0] == what[0] and re.match(r"^d_?\{?k\}?$", n)]
            dk = f"; {names[0]} = {what[0]} in this section" if names else ""
            return (f"d_k vs √d_k: with {what[1]} in place of {what[2]} it holds — the text "
                    f"divides by d_k where the scale is 1/√d_k (or the reverse){dk}")
    if p.kind == "decimal" and p.value is not None and p.unit is not None:
        from ...exact.certified import certify
        from ..claims import _places

        try:
            shape, texts = value_texts(node, section)
            value = _exact(shape, texts)
            if shape == () and certify(value).truncate_places(_places(p.unit)) == p.value:
                return "truncation: the printed digits are the value cut off, not rounded"
        except (NotJudged, MhaSymbolicError):
            return None
    return None


def _sqrt_variants(node: Any, section: Section,
                   limit: int = 8) -> list[tuple[Any, tuple[str, str, str]]]:
    """The tree with one integer k ≥ 2 (written, or a name bound to it) replaced by √k,
    or one √x by x."""
    found: list[tuple[Any, tuple[str, str, str]]] = []

    def walk(n: Any, rebuild: Any) -> None:
        if len(found) >= limit or not isinstance(n, tuple):
            return
        if n[0] == "sym" and section.bindings.get(n[1], ((1,), []))[0] == ():
            bound = section.bindings[n[1]][1][0]
            if bound.isdigit() and 2 <= int(bound) <= 10**6:
                found.append((rebuild(("func", "sqrt", n)), (bound, f"√{n[1]}", n[1])))
            return
        if n[0] == "num" and n[1].isdigit() and 2 <= int(n[1]) <= 10**6:
            found.append((rebuild(("func", "sqrt", n)), (n[1], f"√{n[1]}", n[1])))
            return
        if n[0] == "func" and n[1] == "sqrt" and n[2][0] == "num":
            found.append((rebuild(n[2]), (n[2][1], n[2][1], f"√{n[2][1]}")))
            return
        for idx, child in enumerate(n):
            if idx == 0:
                continue
            if isinstance(child, tuple):
                walk(child, lambda c, idx=idx: rebuild((*n[:idx], c, *n[idx + 1:])))
            elif isinstance(child, list):
                for j, c in enumerate(child):
                    if isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], int):
                        walk(c[1], lambda x, idx=idx, j=j, c=c, child=child: rebuild(
                            (*n[:idx], [*child[:j], (c[0], x), *child[j + 1:]], *n[idx + 1:])))
                    elif isinstance(c, tuple):
                        walk(c, lambda x, idx=idx, j=j, child=child: rebuild(
                            (*n[:idx], [*child[:j], x, *child[j + 1:]], *n[idx + 1:])))

    walk(node, lambda x: x)
    return found
