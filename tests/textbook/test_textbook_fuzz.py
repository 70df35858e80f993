"""Property-based robustness of the textbook verifier.

Random bytes, random TOML documents (generated structures with random keys and
values) and mutated copies of the seed file are thrown at ``load_examples`` and
``check_examples``.  The only exceptions allowed out are ``MhaSymbolicError``
subclasses, and every example must finish within a per-example deadline.

The deadline is enforced with ``SIGALRM`` (hypothesis's own ``deadline`` only
reports *after* a call returns, so it cannot catch a hang): a call still running
after ``DEADLINE_S`` raises :class:`Hang` inside it, which fails the test.  Runs
are derandomized so CI sees the same examples every time.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha_symbolic.errors import MhaSymbolicError
from mha_symbolic.textbook import check_examples, load_examples

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed.toml"
SEED_TEXT = SEED.read_text(encoding="utf-8")
DEADLINE_S = 10

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGALRM")

FUZZ: dict[str, Any] = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


class Hang(Exception):
    """A call ran past the per-example deadline."""


@contextmanager
def deadline(seconds: float = DEADLINE_S) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_checker(text: str) -> None:
    """Load and check ``text``; render every format.  Only MhaSymbolicError may escape."""
    with deadline():
        try:
            report = check_examples(load_examples(text=text))
            report.text()
            json.loads(report.json())
            report.markdown()
        except MhaSymbolicError as exc:
            message = str(exc)
            assert message.strip(), "an error must say what went wrong"
            assert len(message) < 5000


def test_harness_catches_crashes_and_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The properties below can fail: a foreign exception escapes, a slow call is stopped."""
    import time

    import mha_symbolic.textbook.check as tb

    def crash(*args: Any, **kwargs: Any) -> None:
        raise TypeError("not ours")

    monkeypatch.setattr(sys.modules[__name__], "check_examples", crash)
    with pytest.raises(TypeError):
        run_checker(SEED_TEXT)
    monkeypatch.undo()
    with pytest.raises(Hang), deadline(0.2):
        while True:
            time.sleep(0.01)
    assert tb.check_examples is check_examples


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    # import SymPy / flint once, outside any per-example deadline
    check_examples(load_examples(SEED), only=["A"])


# --------------------------------------------------------------------------- random bytes
@settings(**FUZZ, max_examples=200)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(data: bytes) -> None:
    run_checker(data.decode("utf-8", errors="replace"))


@settings(**FUZZ, max_examples=60)
@given(st.binary(max_size=200))
def test_random_bytes_from_a_file(data: bytes) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".toml", delete=False) as f:
        f.write(data)
        name = f.name
    try:
        with deadline(), suppress(MhaSymbolicError):
            check_examples(load_examples(name))
    finally:
        Path(name).unlink()


# --------------------------------------------------------------------------- TOML structures
NUMBER_STRINGS = ["1/3", "e", "sqrt(2)", "-inf", "0.707", "e^2", "-3", "1e-3", "", "x",
                  "1e999", "10^10^10", "e^(-2)", "ln(2)", "2^-1", "0.5", "pi", "√2", "(1",
                  "1 - e^(−32)", "3.0"]
CLAIMS = ["0.5", "≈ 0.6698", "(1, 0)", "(0.3302, 0.6698)", "1/2", "e^2/(3 e^2)", "70%",
          "4.85 × 10^8", "≈ 10^6", "3 × 5", "≈ 1 − e^(−32)", "-0.0", "0", "1", "20", "(1)",
          "()", "(,)", "((1, 2))", "≈", "= 3", "about 2", "1.8e-2", "-25.76", "2^20",
          "4 × 512^2", "n × n", "0.00", "1.000000000000000000001"]
QUANTITY_NAMES = ["score", "scaled_score", "weight", "head_output", "concat", "output", "q",
                  "k", "v", "weight_sum", "gap", "scale", "expr", "shape.q", "shape.scores",
                  "shape.w_o", "shape.head", "dim.d_k", "dim.d_model", "dim.concat_width",
                  "params.total", "params.w_o", "params.qkv", "params.biases"]


def _ident() -> st.SearchStrategy[str]:
    return st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


scalars = st.one_of(
    st.integers(-5, 5),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0, 0.1, 2.5]),
    st.sampled_from(NUMBER_STRINGS),
    st.booleans(),
    st.text(max_size=6),
)
rows = st.lists(scalars, min_size=0, max_size=4)
matrices = st.one_of(st.lists(rows, min_size=0, max_size=4), rows, scalars,
                     st.lists(st.lists(rows, min_size=1, max_size=3), min_size=1, max_size=3))


@st.composite
def quantities(draw: Any) -> str:
    name = draw(st.sampled_from(QUANTITY_NAMES))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return name
    idx = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    if kind == 3:
        return draw(st.text(max_size=12))
    return f"{name}[{','.join(map(str, idx))}]"


@st.composite
def claims(draw: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "quantity": draw(st.one_of(quantities(), scalars)),
        "claimed": draw(st.one_of(st.sampled_from(CLAIMS), st.text(max_size=15), scalars)),
    }
    if draw(st.booleans()):
        c["head"] = draw(st.one_of(st.integers(-1, 3), scalars))
    if draw(st.integers(0, 5)) == 0:
        c["expr"] = draw(st.sampled_from(NUMBER_STRINGS))
    if draw(st.integers(0, 5)) == 0:
        c["rtol"] = draw(scalars)
    if draw(st.integers(0, 8)) == 0:
        c[draw(_ident())] = draw(scalars)
    return c


EXAMPLE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(st.sampled_from(["A", "B", "A"]), st.text(max_size=5), scalars),
    "title": st.one_of(st.text(max_size=10), scalars),
    "scores": matrices, "query": matrices, "key": matrices, "value": matrices,
    "x": matrices, "w_q": matrices, "w_k": matrices, "w_v": matrices, "w_o": matrices,
    "b_q": matrices, "b_o": matrices,
    "heads": st.one_of(st.integers(0, 4), scalars), "kv_heads": st.one_of(st.integers(0, 4)),
    "d_k": st.one_of(st.integers(0, 8), scalars), "scale": scalars,
    "mask": st.one_of(st.just("causal"), matrices, scalars),
    "causal_alignment": st.sampled_from(["top_left", "bottom_right", "middle"]),
    "masked_rows": st.sampled_from(["zero", "nan", "error", "other"]),
    "n_q": st.one_of(st.integers(-1, 6), st.sampled_from(["n", "n_q", "1x"])),
    "n_k": st.one_of(st.integers(-1, 6), scalars),
    "d_model": st.one_of(st.integers(0, 1024), st.sampled_from(["d", "10**9"]), scalars),
    "bias": st.one_of(st.booleans(), scalars),
}


@st.composite
def examples(draw: Any) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(EXAMPLE_VALUES)), max_size=6, unique=True))
    ex = {k: draw(EXAMPLE_VALUES[k]) for k in keys}
    if draw(st.integers(0, 12)) == 0:
        ex[draw(_ident())] = draw(scalars)
    if draw(st.booleans()):
        ex["claim"] = draw(st.one_of(st.lists(claims(), max_size=4), scalars))
    return ex


@st.composite
def documents(draw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if draw(st.integers(0, 6)) > 0:
        doc["example"] = draw(st.one_of(st.lists(examples(), min_size=1, max_size=3),
                                        scalars))
    if draw(st.booleans()):
        doc["title"] = draw(st.one_of(st.text(max_size=10), scalars))
    if draw(st.integers(0, 12)) == 0:
        doc[draw(_ident())] = draw(scalars)
    return doc


def toml_value(v: Any) -> str:
    """A value as TOML (inline tables and arrays on one line)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        # JSON strings are TOML basic strings (raw UTF-8: TOML refuses \\ud83d-style escapes)
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_value(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml_document(doc: dict[str, Any]) -> str:
    return "\n".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in doc.items()) + "\n"


def test_toml_writer_round_trips() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11; the loader uses tomli before

    doc = {"example": [{"name": "A", "scores": [[1, 2.5, "e"]], "claim": [
        {"quantity": "weight[1,1]", "claimed": "≈ 0.5"}]}], "title": "t"}
    assert tomllib.loads(toml_document(doc)) == doc


@settings(**FUZZ, max_examples=300)
@given(documents())
def test_random_toml_structures_never_crash(doc: dict[str, Any]) -> None:
    run_checker(toml_document(doc))


# Plausible documents: well-formed inputs of random sizes and entries, valid quantity names
# with random indices, and printed answers from a generator of number-like text.  These get
# past the loader, so they exercise the engine, the reading of claims and the judging.
small_numbers = st.one_of(
    st.integers(-9, 9),
    st.decimals(min_value=-50, max_value=50, places=3, allow_nan=False).map(str),
    st.sampled_from(["1/3", "e", "sqrt(2)", "-0.5", "ln(2)", "e^(-2)", "0.707", "2^-3",
                     "1e-3", "-1e2", "30", "1e-308"]),
)
# (huge entries, 1e308 or e^(10^9), are thrown at the CLI in test_textbook.py, one at a time
# in a subprocess with a timeout: here they would only turn every shrink step into a hang)


@st.composite
def printed_answers(draw: Any) -> str:
    kind = draw(st.integers(0, 7))
    prefix = draw(st.sampled_from(["", "", "≈ ", "~", "= ", "about "]))
    dec = st.decimals(min_value=-1000, max_value=1000, places=draw(st.integers(0, 12)),
                      allow_nan=False, allow_infinity=False).map(str)
    if kind == 0:
        return prefix + draw(dec)
    if kind == 1:
        return prefix + f"{draw(dec)} × 10^{draw(st.integers(-400, 400))}"
    if kind == 2:
        return prefix + f"{draw(dec)}%"
    if kind == 3:
        return prefix + "(" + ", ".join(draw(st.lists(dec, min_size=1, max_size=4))) + ")"
    if kind == 4:
        return f"{draw(st.integers(-3, 70))} × {draw(st.integers(-3, 70))}"
    if kind == 5:
        return prefix + draw(st.sampled_from(CLAIMS + NUMBER_STRINGS))
    if kind == 6:
        return prefix + f"{draw(dec)}e{draw(st.integers(-400, 400))}"
    return draw(st.text(alphabet="0123456789.,-+()×^e/% ≈", min_size=1, max_size=14))


@st.composite
def plausible_documents(draw: Any) -> dict[str, Any]:
    n_q, n_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 1, 2]))
    ex: dict[str, Any] = {"name": "P"}
    if draw(st.booleans()):
        mat = st.lists(st.lists(small_numbers, min_size=n_k, max_size=n_k),
                       min_size=n_q, max_size=n_q)
        ex["scores"] = draw(mat) if heads == 1 else [draw(mat) for _ in range(heads)]
        if draw(st.booleans()):
            ex["scale"] = draw(small_numbers)
        elif draw(st.booleans()):
            ex["d_k"] = draw(st.integers(1, 9))
    else:
        d = heads * draw(st.integers(1, 2))
        qk = st.lists(st.lists(small_numbers, min_size=d, max_size=d), min_size=n_q,
                      max_size=n_q)
        ex["query"] = draw(qk)
        ex["key"] = draw(st.lists(st.lists(small_numbers, min_size=d, max_size=d),
                                  min_size=n_k, max_size=n_k))
    if heads > 1:
        ex["heads"] = heads
    if draw(st.booleans()):
        d_v = heads * draw(st.integers(1, 2))
        ex["value"] = draw(st.lists(st.lists(small_numbers, min_size=d_v, max_size=d_v),
                                    min_size=n_k, max_size=n_k))
    if draw(st.integers(0, 3)) == 0:
        ex["mask"] = draw(st.one_of(
            st.just("causal"),
            st.lists(st.lists(st.booleans(), min_size=n_k, max_size=n_k), min_size=n_q,
                     max_size=n_q),
            st.lists(st.lists(st.sampled_from([0, "-inf", -1, "1/2"]), min_size=n_k,
                              max_size=n_k), min_size=n_q, max_size=n_q)))
        if draw(st.booleans()):
            ex["masked_rows"] = draw(st.sampled_from(["zero", "nan", "error"]))
    if draw(st.integers(0, 3)) == 0:
        ex.update(d_model=draw(st.sampled_from([4, 8, 512, 12])), n_q=n_q)
    claims_ = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(QUANTITY_NAMES))
        claimed = draw(printed_answers())
        if name in ("weight_sum", "gap"):
            name += f"[{draw(st.integers(1, n_q))}]"
        elif "." not in name and name not in ("scale", "expr"):
            row = draw(st.integers(1, n_q))
            if name in ("score", "scaled_score", "weight") and draw(st.booleans()):
                # a whole row, as a tuple with the right number of parts
                name += f"[{row}]"
                claimed = "(" + ", ".join(draw(printed_answers()).strip("()") or "0"
                                          for _ in range(n_k)) + ")"
            else:
                name += f"[{row},1]"
        c: dict[str, Any] = {"quantity": name, "claimed": claimed}
        if name == "expr":
            c["expr"] = draw(st.sampled_from(NUMBER_STRINGS[:9]))
        if heads > 1 and draw(st.booleans()):
            c["head"] = draw(st.integers(1, heads))
        claims_.append(c)
    ex["claim"] = claims_
    return {"example": [ex]}


@settings(**FUZZ, max_examples=300)
@given(plausible_documents())
def test_plausible_documents_never_crash(doc: dict[str, Any]) -> None:
    run_checker(toml_document(doc))


# --------------------------------------------------------------------------- seed mutations
_BLOCKS = re.split(r"(?m)^(?=\[\[example\]\])", SEED_TEXT)
SEED_HEADER, SEED_EXAMPLES = _BLOCKS[0], _BLOCKS[1:]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
REPLACEMENTS = ["0", "-1", "1e308", "2", "9999999", "0.5", "\"1/3\"", "[]", "[[1]]", "\"\"",
                "true", "-0.0", "64", "3", "\"e^(10^3)\"", "\"≈ 0.1\"", "1e-9"]


@st.composite
def mutated_seed(draw: Any) -> str:
    block = draw(st.sampled_from(SEED_EXAMPLES))
    lines = block.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.integers(0, 6))
        if op == 0:  # delete a line
            del lines[i]
        elif op == 1:  # duplicate a line
            lines.insert(i, lines[i])
        elif op == 2:  # replace one number
            nums = list(_NUMBER.finditer(lines[i]))
            if nums:
                m = draw(st.sampled_from(nums))
                rep = draw(st.sampled_from(REPLACEMENTS))
                lines[i] = lines[i][:m.start()] + rep + lines[i][m.end():]
        elif op == 3:  # replace one character
            if lines[i]:
                j = draw(st.integers(0, len(lines[i]) - 1))
                ch = draw(st.characters(codec="utf-8"))
                lines[i] = lines[i][:j] + ch + lines[i][j + 1:]
        elif op == 4:  # swap two lines
            k = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[k] = lines[k], lines[i]
        elif op == 5:  # change a claimed string
            if lines[i].startswith("claimed"):
                lines[i] = "claimed = " + json.dumps(draw(st.one_of(st.sampled_from(CLAIMS),
                                                                    st.text(max_size=10))))
        else:  # truncate the block here
            lines = lines[:i]
    return SEED_HEADER + "\n".join(lines) + "\n"


@settings(**FUZZ, max_examples=150)
@given(mutated_seed())
def test_mutated_seed_never_crashes(text: str) -> None:
    run_checker(text)


def test_unmutated_blocks_check() -> None:
    # the mutation strategy starts from valid files: every block alone loads and checks
    for block in SEED_EXAMPLES:
        report = check_examples(load_examples(text=SEED_HEADER + block))
        assert report.records
