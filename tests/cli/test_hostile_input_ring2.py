"""Regression tests for issue 30 (hostile input, the next ring), one section per class.

Each test holds the issue's example and a second member of its class.  Expected values
come from independent computations (numpy's own header writer, mpmath, hand algebra),
never from the code under test; tests assert behaviour (one line, exit status 2, the
limit named), never time.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli, time_limit

from mha_symbolic.errors import ClaimError, ExampleFileError
from mha_symbolic.textbook import load_examples
from mha_symbolic.textbook.examples import MAX_FILE_DRAW_ENTRIES, MAX_FILE_WORK
from mha_symbolic.textbook.quantities import parse_quantity

REPO = Path(__file__).resolve().parents[2]


def _npy_claiming(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    """A .npy file whose header (numpy's own writer) claims ``shape`` but holds 8 bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue() + b"\0" * 8


def _example_file(folder: Path, ref: str) -> Path:
    f = folder / "e.toml"
    f.write_text(f"[[example]]\nname = 'E'\nscale = 1\nscores = {json.dumps(ref)}\n"
                 "[[example.claim]]\nquantity = 'weight[1,1]'\nclaimed = '0.5'\n",
                 encoding="utf-8")
    return f


# -- 2. Array files read by their header first --------------------------------------------------

@pytest.mark.parametrize("shape", [(2**40,), (2**20, 2**20), (65_537,), (2, 2, 2, 2, 2)])
def test_an_npy_header_claiming_too_many_entries_is_refused_before_allocation(
        tmp_path: Path, shape: tuple[int, ...]) -> None:
    (tmp_path / "big.npy").write_bytes(_npy_claiming(shape))
    with time_limit(60), pytest.raises(ExampleFileError, match=r"entries; at most|dimensions"):
        load_examples(_example_file(tmp_path, "big.npy"))


def test_an_npz_member_is_read_by_its_own_header_not_the_declared_size(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
        z.writestr("scores.npy", _npy_claiming((2**40,)))
        z.writestr("other.npy", _npy_claiming((3, 2**30), "<i4"))
    for ref in ("a.npz:scores", "a.npz:other"):
        with time_limit(60), pytest.raises(ExampleFileError, match="entries; at most"):
            load_examples(_example_file(tmp_path, ref))


def test_an_npy_whose_data_is_shorter_than_its_header_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "short.npy").write_bytes(_npy_claiming((4,)))  # 32 bytes promised, 8 held
    with pytest.raises(ExampleFileError, match="bytes of data where its header"):
        load_examples(_example_file(tmp_path, "short.npy"))


def test_an_array_read_by_header_equals_numpys_own_reading(tmp_path: Path) -> None:
    arr = np.array([[0.25, -1.5], [3.0, 0.1]])
    np.save(tmp_path / "s.npy", np.asfortranarray(arr))
    (ex,) = load_examples(_example_file(tmp_path, "s.npy"))
    assert ex.inputs["scores"] == [[Fraction(*float(x).as_integer_ratio()) for x in row]
                                   for row in arr.tolist()]


@pytest.mark.parametrize("kind", ["zip", "loop", "fifo", "dir", "text", "truncated-zip"])
def test_wrong_formats_and_non_regular_files_are_one_line(tmp_path: Path, kind: str) -> None:
    name = "x.npy"
    target = tmp_path / name
    if kind == "zip":
        with zipfile.ZipFile(target, "w") as z:
            z.writestr("a.npy", b"x")
    elif kind == "loop":
        target.symlink_to(name)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "dir":
        target.mkdir()
    elif kind == "text":
        target.write_text("1 2 3", encoding="utf-8")
    else:
        name = "x.npz"
        (tmp_path / name).write_bytes(b"PK\x03\x04" + b"\0" * 30)
    with time_limit(30), pytest.raises(ExampleFileError) as info:
        load_examples(_example_file(tmp_path, name))
    assert "\n" not in str(info.value) and name in str(info.value)


def test_cli_exit_2_for_bad_array_files_and_closed_stdin(tmp_path: Path) -> None:
    (tmp_path / "big.npy").write_bytes(_npy_claiming((2**40,)))
    r = run_cli("check", str(_example_file(tmp_path, "big.npy")))
    assert r.returncode == 2 and "at most 65536" in r.stderr and "internal" not in r.stderr
    closed = subprocess.run([sys.executable, "-m", "mha_symbolic", "check", "-"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert closed.returncode in (0, 2)  # empty stdin: "no [[example]] tables"
    gone = subprocess.run([sys.executable, "-c",
                           "import os, sys; os.close(0); sys.stdin = None; "
                           "from mha_symbolic.cli import main; sys.exit(main(['check', '-']))"],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert gone.returncode == 2 and "standard input is closed" in gone.stderr


# -- quantities: whitespace is never read as part of a number -----------------------------------

@pytest.mark.parametrize("q", ["weight[1\t1]", "weight[1 1]", "weight[1\n2]", "score[1\u00a02,3]"])
def test_whitespace_inside_an_index_is_a_claim_error(q: str) -> None:
    with pytest.raises(ClaimError, match="is not of the form"):
        parse_quantity(q)


@pytest.mark.parametrize(("q", "parsed"), [("weight[ 1 ,\t2 ]", ("weight", None, (1, 2))),
                                           ("shape . q", ("shape", "q", ()))])
def test_whitespace_around_punctuation_is_allowed(q: str, parsed: tuple) -> None:
    assert parse_quantity(q) == parsed


# -- 1. Work per file bounded before it is done -------------------------------------------------

def _n64(name: str, seed: int) -> str:
    import random

    rng = random.Random(seed)
    q = [[rng.randint(-3, 3) for _ in range(4)] for _ in range(64)]
    k = [[rng.randint(-3, 3) for _ in range(4)] for _ in range(64)]
    v = [[rng.randint(0, 9) for _ in range(2)] for _ in range(64)]
    return f"[[example]]\nname = '{name}'\nquery = {q}\nkey = {k}\nvalue = {v}\n"


def test_a_file_of_many_admitted_examples_is_refused_by_the_file_work_limit() -> None:
    # each 64-token example is about 310,000 terms (inside MAX_WORK): the file's sum is not
    text = "".join(_n64(f"n{i}", i) for i in range(MAX_FILE_WORK // 300_000 + 2))
    with time_limit(120), pytest.raises(ExampleFileError, match="limit for one file is 1,000,000"):
        load_examples(text=text)


def test_seeded_draws_are_counted_per_file_before_anything_is_drawn(tmp_path: Path) -> None:
    per = 256 * 256
    n = MAX_FILE_DRAW_ENTRIES // per + 1
    draws = ", ".join(f'"w_q[{h}] = rand(256, 256)"' for h in range(1, n + 1))
    text = f"[[example]]\nname='A'\nx=[[1,2]]\n[example.init]\ntorch_seed=1\ndraws=[{draws}]\n"
    # two examples of half the draws each: the file's total counts, not one example's
    half = ", ".join(f'"w_q[{h}] = rand(256, 256)"' for h in range(1, n // 2 + 2))
    two = "".join(f"[[example]]\nname='{c}'\nx=[[1,2]]\n[example.init]\ntorch_seed=1\n"
                  f"draws=[{half}]\n" for c in "AB")
    for t in (text, two):
        with time_limit(30), pytest.raises(ExampleFileError, match="262,144 entries in all"):
            load_examples(text=t)


def test_draw_targets_are_validated_before_drawing() -> None:
    for draws, message in (('"w_q[1] = rand(2, 2)", "w_q[2] = rand(2, 2)"', "x needs w_q"),
                           ('"w_q = rand(2, 2)", "w_q = rand(2, 2)"', "twice")):
        text = f"[[example]]\nname='A'\nx=[[1,2]]\n[example.init]\ntorch_seed=1\ndraws=[{draws}]\n"
        with pytest.raises(ExampleFileError, match=message):
            load_examples(text=text)


def test_the_budget_is_per_file_not_per_process() -> None:
    text = _n64("a", 1) + _n64("b", 2)
    for _ in range(3):  # loading the same admitted file again is admitted again
        assert len(load_examples(text=text)) == 2


def test_a_version_2_header_is_checked_the_same_way(tmp_path: Path) -> None:
    # a hand-written header (not numpy's writer): version 2.0, huge shape
    hdr = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }"
    hdr += b" " * (64 - (12 + len(hdr) + 1) % 64) + b"\n"
    (tmp_path / "v2.npy").write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", len(hdr)) + hdr)
    with pytest.raises(ExampleFileError, match="entries; at most"):
        load_examples(_example_file(tmp_path, "v2.npy"))


# -- 4. Every public function validates its arguments at the door ------------------------------

BIG = 10**5000


@pytest.mark.parametrize("option", ["scale", "window", "masked_rows", "dropout_p", "softcap"])
@pytest.mark.parametrize("value", [BIG, -BIG, (BIG, 0)], ids=["big", "-big", "(big, 0)"])
def test_huge_integers_are_refused_by_their_size_without_str(option: str, value: object) -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    q = np.ones((1, 2, 4))
    with pytest.raises(SpecError, match=rf"{option}=<a(n| negative) integer of 16610 bits>"):
        ms.reference_attention(q, q, q, **{option: value})


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa", "return_weights"])
@pytest.mark.parametrize("value", ["no", "yes", 0, 1, None, [True]])
def test_boolean_options_are_strict(flag: str, value: object) -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    q = np.ones((1, 2, 4))
    with pytest.raises(SpecError, match=f"{flag}=.*expected True or False"):
        ms.reference_attention(q, q, q, **{flag: value})
    ms.reference_attention(q, q, q, **{flag: np.bool_(False)})  # numpy's bool is a bool


def test_batch_first_and_module_are_checked() -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    x = np.zeros((2, 4))
    w = {"num_heads": 1, "in_proj_weight": np.zeros((12, 4)), "out_proj_weight": np.eye(4)}
    with pytest.raises(SpecError, match="batch_first='yes'"):
        ms.reference_mha(x, x, x, batch_first="yes", **w)
    for module in ("x", 3, object()):
        with pytest.raises(SpecError, match=r"expected a torch nn\.MultiheadAttention"):
            ms.reference_mha(x, x, x, module=module)


def test_a_misspelt_keyword_of_the_exact_engine_is_named() -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import UnknownOptionError

    for wrong, right in (("scael", "scale"), ("maks", "mask")):
        with pytest.raises(UnknownOptionError, match=f"'{wrong}'; did you mean '{right}'"):
            ms.exact_attention(query=[[1]], key=[[1]], value=[[1]], **{wrong: 1})


def test_precisions_and_digit_counts_are_capped() -> None:
    import mha_symbolic as ms
    from mha_symbolic._validate import MAX_DIGITS, MAX_PREC_BITS
    from mha_symbolic.errors import SpecError

    c = ms.certify("1/3")
    q = np.ones((1, 2, 4))
    e = ms.reference_attention(q, q, q)
    calls = [lambda: c.digits(10**7), lambda: c.digits(MAX_DIGITS + 1),
             lambda: c.truncate_places(10**8), lambda: c.round_places(-10**6),
             lambda: c.digits(BIG), lambda: c.digits("5"),
             lambda: e.exact((0, 0, 0), prec=10**9), lambda: e.exact((0, 0, 0), prec=-1),
             lambda: e.exact((0, 0, 0), prec=MAX_PREC_BITS + 1), lambda: e.mpi(bits=10**6),
             lambda: e.exact((0, 0, 0), prec=2.5)]
    for call in calls:
        with time_limit(30), pytest.raises(SpecError, match="expected an integer from"):
            call()
    assert c.digits(30) == "0." + "3" * 30 + "…"  # 1/3 by hand
    assert c.truncate_places(np.int64(3)) == Fraction(333, 1000)


@pytest.mark.parametrize("other", [1.4, "1.4", None, True, np.float64(0.5)])
def test_compare_takes_exact_numbers_only(other: object) -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    with pytest.raises(SpecError, match="expected an int or a Fraction"):
        ms.certify("1/3").compare(other)  # type: ignore[arg-type]
    assert ms.certify("1/3").compare(Fraction(1, 3)) == 0 and ms.certify("1/3").compare(1) == -1


def _torch_kinds() -> list[tuple[str, object]]:
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 4)
    kinds: list[tuple[str, object]] = [("meta tensor", t.to("meta")), ("sparse", t.to_sparse()),
                                       ("nested tensor", torch.nested.nested_tensor([t[0], t[1]])),
                                       ("quantized", torch.quantize_per_tensor(t, 0.1, 0,
                                                                               torch.qint8))]
    for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
        if hasattr(torch, name):
            kinds.append((name, t.to(getattr(torch, name))))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.empty(2, 3, 4)
    kinds.append(("FakeTensor", fake))
    return kinds


def test_unsupported_tensor_kinds_are_named() -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 4)
    for kind, bad in _torch_kinds():
        with pytest.raises(SpecError, match=kind):
            ms.reference_attention(bad, t, t)

    def inner(x: object) -> object:
        ms.reference_attention(x, x, x)
        return x.sum()  # type: ignore[attr-defined]

    for transform in (torch.vmap(inner), torch.func.grad(inner)):
        with pytest.raises(SpecError, match=r"inside torch\.vmap or torch\.func\.grad"):
            transform(torch.randn(2, 2, 3, 4))


def test_jax_tracers_are_named() -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    jax = pytest.importorskip("jax")
    x = jax.numpy.ones((2, 3, 4))
    for transform in (jax.jit, jax.grad):
        with pytest.raises(SpecError, match="a jax tracer"):
            transform(lambda a: (ms.reference_attention(a, a, a), a.sum())[1])(x)


# -- 3. The float limits: no warning leaks, no "please report" for merely extreme input ---------

@pytest.mark.parametrize("scale_v", [np.finfo(np.float64).max, -np.finfo(np.float64).max, 1e300])
def test_no_runtime_warning_reaches_the_caller_at_the_float_limits(scale_v: float) -> None:
    import warnings

    import mha_symbolic as ms
    from mha_symbolic.errors import ToleranceError

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 4))
    v = np.full((1, 3, 4), scale_v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc = ms.reference_attention(q, k, v)
        # the exact output is v's common value (a convex combination of equal rows)
        inside = (enc.lower <= scale_v) & (scale_v <= enc.upper)
        assert inside.all()
        try:
            ms.compare_attention(np.full((1, 3, 4), scale_v), q, k, v)
        except ToleranceError as exc:
            assert "please report" not in str(exc) and "float64 range" in str(exc)


# -- 5. Signals and writes ----------------------------------------------------------------------

SEED = REPO / "examples" / "seed.toml"


def _cli(*argv: str, cwd: Path, env: dict[str, str] | None = None, **kw: object
         ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "mha_symbolic", *argv], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]


def test_o_folder_writes_into_it_and_a_missing_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "seed.toml").write_bytes(SEED.read_bytes())
    r = _cli("derive", "seed.toml", "-o", "out/", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "out" / "seed.tex").is_file()
    r = _cli("derive", "seed.toml", "-o", "out", cwd=tmp_path)  # an existing folder, no slash
    assert r.returncode == 0
    r = _cli("derive", "seed.toml", "-o", "new/", cwd=tmp_path)
    assert r.returncode == 2 and "folder does not exist" in r.stderr
    assert not (tmp_path / "new").exists()


def test_no_output_overwrites_an_input(tmp_path: Path) -> None:
    (tmp_path / "book.pdf").write_bytes(SEED.read_bytes())  # a worked example named .pdf
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "pdflatex").write_text("#!/bin/sh\nexit 1\n", encoding="utf-8")
    (fake / "pdflatex").chmod(0o755)
    env = {"PATH": f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = _cli("derive", "book.pdf", "-o", "book.tex", "--pdf", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "input file" in r.stderr
    assert (tmp_path / "book.pdf").read_bytes() == SEED.read_bytes()


def test_a_write_that_fails_part_way_leaves_the_old_file_whole(tmp_path: Path) -> None:
    import resource

    (tmp_path / "seed.toml").write_bytes(SEED.read_bytes())
    old = "the previous derivation\n" * 10
    (tmp_path / "out.tex").write_text(old, encoding="utf-8")

    def limit() -> None:  # a file-size limit smaller than the derivation
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    r = _cli("derive", "seed.toml", "-o", "out.tex", cwd=tmp_path, preexec_fn=limit)
    assert r.returncode == 2 and "out.tex" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "out.tex").read_text(encoding="utf-8") == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tex", "seed.toml"]


def test_closed_stdout_is_an_error() -> None:
    r = subprocess.run(
        [sys.executable, "-c", "import os, sys; os.close(1); sys.stdout = None; "
         "from mha_symbolic.cli import main; sys.exit(main(['check', sys.argv[1]]))", str(SEED)],
        capture_output=False, stderr=subprocess.PIPE, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "standard output is closed" in r.stderr


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_pdflatex_ends_it_and_removes_the_temporary_folder(
        tmp_path: Path, signame: str) -> None:
    import signal
    import time

    (tmp_path / "seed.toml").write_bytes(SEED.read_bytes())
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "started"
    (fake / "pdflatex").write_text(f"#!/bin/sh\ntouch {marker}\nexec sleep 60\n",
                                   encoding="utf-8")
    (fake / "pdflatex").chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp),
           "PATH": f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "mha_symbolic", "derive", "seed.toml", "-o",
                             "out.tex", "--pdf"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    sig = getattr(signal, signame)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and f"terminated by {signame}" in err
    assert "Traceback" not in err
    assert not [p for p in tmp.iterdir() if p.name.startswith("mha-symbolic-tex-")]


def test_echoed_file_names_are_cut(tmp_path: Path) -> None:
    name = "x" * 1000 + ".toml"
    r = _cli("check", name, cwd=tmp_path)
    assert r.returncode == 2 and "…" in r.stderr and len(r.stderr.strip()) < 300


@pytest.mark.parametrize("option", ["heads", "window", "masked_rows", "d_k", "kv_heads"])
def test_the_exact_engine_refuses_huge_counts_and_options_by_their_size(option: str) -> None:
    import mha_symbolic as ms
    from mha_symbolic.errors import SpecError

    with pytest.raises(SpecError, match=f"{option}=<an integer of 16610 bits>"):
        ms.exact_attention(query=[[1, 0]], key=[[1, 0], [0, 1]], value=[[1], [2]],
                           **{option: BIG})
    # an exact rational entry of 5001 digits is still an input the engine reads
    att = ms.exact_attention(scores=[[0, 0]], value=[[BIG], [BIG]])
    assert att.heads[0].output[0, 0] == BIG  # equal weights 1/2 each: (B + B) / 2


def test_main_in_process_leaves_the_signal_handlers_as_it_found_them() -> None:
    import signal

    from mha_symbolic.cli import main

    before = signal.getsignal(signal.SIGTERM)
    assert main(["params", "--d-model", "8", "--heads", "2"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
