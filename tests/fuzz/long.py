"""The long fuzz run: a million hostile inputs, counted (issue 15).

    python -m tests.fuzz.long --inputs 1000000 --workers 2 --checkpoint fuzz-long.json

Each input ``i`` is generated from ``(seed, i)`` alone (:mod:`.generators`), so any
failure can be replayed: ``python -m tests.fuzz.long --replay 123456``.  The mix:

=================  =====  ==================================================================
kind               share  what runs
=================  =====  ==================================================================
number           37.5 %  ``parse_number``
api                 3 %   a public function with arguments of every type and size (issue 30)
arrays              2 %   ``.npy``/``.npz`` files with hostile headers as inputs (issue 30)
claim              33 %   ``parse_printed`` (also as a shape), ``judge``/``holds``/``describe``
document           10 %   ``load_examples`` + ``check_examples`` + text/JSON/Markdown/HTML
derivation          2 %   ``derive`` as LaTeX document, fragment and Markdown
cli                2.8 %  ``mha_symbolic.cli.main(argv)`` in a sandbox folder (check, derive,
                          plot, shapes, params, prove, usage errors)
cli-subprocess     0.2 %  ``python -m mha_symbolic`` in a fresh interpreter, with
                          PYTHONIOENCODING utf-8/ascii/cp1252/latin-1
limits              2 %   attention at the float64 limits, forward and backward (issue 30,
                          ring 3: :mod:`.ring3`)
bounded             2 %   the over-time classes of seed 41 (huge exponents, tiny softcaps)
signals            0.3 %  SIGINT at a random time in a command's first 400 ms
concurrent         0.2 %  two ``derive --pdf`` runs on one output
=================  =====  ==================================================================

Per input: a limit of ``--limit`` (5) CPU seconds (``ITIMER_PROF`` in the worker, and the
child's CPU time for subprocesses; CPU rather than wall time because the machine is
shared), and a memory cap (``RLIMIT_AS``, ``--memory-gb``, 4) in every worker.  A worker
that stops reporting for ``--hang`` (300) wall seconds is killed and its input counted
as over the limit.  Counted: inputs per kind, non-package exceptions, inputs over the
limit, files written outside the output folder, control characters in reports and
printed output, TeX injections, bad messages and exit codes.  The counts are
checkpointed to a JSON file every 30 s (``--resume`` continues from it); failing
inputs are written, with their index, to ``--crashes`` (a folder).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import generators as g
from . import properties as prop
from . import ring2, ring3

KINDS: tuple[tuple[str, int], ...] = (  # shares in tenths of a percent (sum 1000)
    ("number", 375), ("api", 30), ("arrays", 20), ("source", 50), ("claim", 330),
    ("document", 100), ("derivation", 20), ("cli", 28), ("cli-subprocess", 2),
    ("limits", 20), ("bounded", 20), ("signals", 3), ("concurrent", 2),
)
PROBLEMS = ("foreign-exception", "over-time", "file-outside", "control-in-report",
            "tex-injection", "markup-injection", "bad-message", "bad-exit", "harness-error")


class OverLimit(BaseException):
    """Raised by the CPU-time alarm inside an input that runs past the limit (a
    BaseException, so that no ``except Exception`` of the code under test swallows it)."""


#: ``--only``: restrict a run to some kinds (a scouting run); empty means the mix above.
ONLY: tuple[str, ...] = ()


def kind_of(seed: int, i: int) -> str:
    if ONLY:
        return g.RandomSource((seed, i, "kind")).choice(ONLY)
    r = g.RandomSource((seed, i, "kind")).integer(0, 999)
    for kind, share in KINDS:
        if r < share:
            return kind
        r -= share
    raise AssertionError(r)  # pragma: no cover


def make_input(seed: int, i: int) -> tuple[str, Any]:
    kind = kind_of(seed, i)
    src = g.RandomSource((seed, i))
    if kind == "number":
        return kind, g.number_text(src)
    if kind == "claim":
        return kind, (g.printed_text(src), g.number_text(src) if src.chance(0.3)
                      else src.choice([*g.BOOK_NUMBERS[:20], "1/2", "exp(-1000)/(1+exp(-1000))"]))
    if kind == "document":
        return kind, g.document_text(src)
    if kind == "derivation":
        return kind, (g.document_text(src), src.choice(["tex", "fragment", "markdown"]))
    if kind == "source":
        return kind, g.source_text(src)
    if kind == "api":
        return kind, ring2.api_call(src)
    if kind == "arrays":
        return kind, ring2.array_file(src)
    if kind == "limits":
        return kind, ring3.limits_input(src)
    if kind == "bounded":
        return kind, ring3.bounded_input(src)
    if kind == "signals":
        return kind, ring3.signals_input(src)
    if kind == "concurrent":
        return kind, ring3.concurrent_input(src)
    return kind, g.cli_call(src)


def run_input(kind: str, payload: Any) -> tuple[list[tuple[str, str]], float]:
    """Problems of one input, and the CPU seconds of any child process it ran."""
    if kind == "number":
        return prop.run_number(payload), 0.0
    if kind == "claim":
        return prop.run_claim(*payload), 0.0
    if kind == "document":
        return prop.run_document(payload), 0.0
    if kind == "derivation":
        return prop.run_derivation(*payload), 0.0
    if kind == "source":
        return prop.run_source(*payload), 0.0
    if kind == "api":
        return ring2.run_api(payload), 0.0
    if kind == "arrays":
        return ring2.run_array(payload), 0.0
    if kind == "cli":
        return prop.run_cli_inprocess(payload), 0.0
    if kind == "limits":
        return ring3.run_limits(payload), 0.0
    if kind == "bounded":
        return ring3.run_bounded(payload), 0.0
    if kind == "signals":
        return ring3.run_signals(payload)
    if kind == "concurrent":
        return ring3.run_concurrent(payload)
    return prop.run_cli_subprocess(payload)


def _alarm(signum: int, frame: Any) -> None:
    raise OverLimit()


_WARM_KINDS = ("number", "claim", "source", "api", "arrays", "document", "derivation", "cli",
               "bounded")


def _warm_up(seed: int) -> float:
    """Run, untimed and uncounted, a few inputs of every in-process kind (of another seed)
    and the ``limits`` kind at every scale of queries, values and dO, so that numba's
    kernels are compiled (or loaded from its cache) before the CPU limit applies: the
    first input of a fresh checkout that reaches a kernel otherwise pays its compilation
    (10-20 CPU s), an over-time that is the harness's, not the input's.  The workers are
    forked after it and inherit the compiled kernels.  Returns the CPU seconds spent."""
    t0 = time.process_time()
    signal.signal(signal.SIGPROF, _alarm)
    todo = [("limits", (1, iv, ido, iq, 2, 3, eq)) for iq in range(4) for iv in (0, 1, 5)
            for ido in (0, 5) for eq in (0, 1)]
    left = dict.fromkeys(_WARM_KINDS, 3)
    for j in range(2000):
        if not any(left.values()):
            break
        kind = kind_of(seed + 1_000_003, j)
        if left.get(kind, 0) > 0:
            left[kind] -= 1
            todo.append(make_input(seed + 1_000_003, j))
    for kind, payload in todo:
        signal.setitimer(signal.ITIMER_PROF, 60.0)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                run_input(kind, payload)
        except BaseException:   # a warm-up input's own problem is not counted
            pass
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    return time.process_time() - t0


def _worker(seed: int, indices: range, limit: float, memory_gb: float, state: Any,
            conn: Any, crashes: str) -> None:
    if memory_gb > 0:
        cap = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    os.environ.pop("MHA_SYMBOLIC_DEBUG", None)
    _worker_tempdir(indices.start)
    signal.signal(signal.SIGPROF, _alarm)
    for i in indices:
        state[0] = i
        state[1] = time.time()
        t0, w0 = time.process_time(), time.perf_counter()
        child = 0.0
        kind, payload = "harness", None
        signal.setitimer(signal.ITIMER_PROF, limit)
        try:
            kind, payload = make_input(seed, i)
            problems, child = run_input(kind, payload)
        except OverLimit:
            problems = [("over-time", f"stopped after {limit} CPU seconds")]
        except BaseException as exc:
            problems = [("harness-error", f"{type(exc).__name__}: {exc}")]
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        cpu = time.process_time() - t0 + child
        wall = time.perf_counter() - w0
        if cpu > limit and not any(p[0] == "over-time" for p in problems):
            problems.append(("over-time", f"{cpu:.1f} CPU seconds"))
        if problems:
            _record(crashes, seed, i, kind, payload, problems)
        conn.send((i, kind, sorted({p[0] for p in problems}), cpu, wall))
    conn.send(None)


def _record(crashes: str, seed: int, i: int, kind: str, payload: Any,
            problems: list[tuple[str, str]]) -> None:
    folder = Path(crashes)
    folder.mkdir(parents=True, exist_ok=True)
    if len(list(folder.iterdir())) > 500:
        return
    entry = {"seed": seed, "index": i, "kind": kind, "problems": problems,
             "input": json.loads(g.describe(payload)) if kind.startswith("cli") else (
                 repr(payload)[:4000] if kind in ("api", "arrays") else payload)}
    (folder / f"{kind}-{i}.json").write_text(json.dumps(entry, ensure_ascii=True, indent=1))


def _tally(by_kind: dict[str, dict[str, float]], kind: str, cpu: float, wall: float) -> None:
    """Add one input's CPU and wall seconds to its kind's row of the checkpoint."""
    row = by_kind.setdefault(kind, {"inputs": 0, "cpu_s": 0.0, "wall_s": 0.0, "max_cpu_s": 0.0})
    row["inputs"] += 1
    row["cpu_s"] += cpu
    row["wall_s"] += wall
    row["max_cpu_s"] = max(row["max_cpu_s"], cpu)


def _by_kind_table(by_kind: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The per-kind rows as the checkpoint stores them: totals (so that ``--resume`` adds
    to them), each kind's share of all CPU seconds, and its mean CPU milliseconds."""
    total = sum(row["cpu_s"] for row in by_kind.values()) or 1.0
    return {kind: {"inputs": row["inputs"], "cpu_s": round(row["cpu_s"], 3),
                   "wall_s": round(row["wall_s"], 3), "max_cpu_s": round(row["max_cpu_s"], 3),
                   "mean_cpu_ms": round(1000 * row["cpu_s"] / max(row["inputs"], 1), 2),
                   "cpu_share": round(row["cpu_s"] / total, 4)}
            for kind, row in sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"])}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _worker_tempdir(first: int) -> None:
    """A temporary folder of the worker's own inside the run's: with two workers, one's
    ``derive --pdf`` (a ``mha-symbolic-tex-*`` folder that exists while pdflatex runs)
    was counted as left behind by the other's input (seed 73 #382638, a ``derive
    --format fragment`` that runs no pdflatex)."""
    import tempfile

    own = tempfile.mkdtemp(prefix=f"worker-{first}-")
    os.environ["TMPDIR"] = own
    tempfile.tempdir = own


def _private_tempdir() -> None:
    """Give this run (and its workers and subprocesses) a temporary folder of its own, so
    that the check for pdflatex folders left behind sees only this run's: another program
    running pdflatex at the same time is no problem of the input under test."""
    import atexit
    import shutil
    import tempfile

    private = tempfile.mkdtemp(prefix="mha-symbolic-fuzz-")
    os.environ["TMPDIR"] = private
    tempfile.tempdir = private
    atexit.register(shutil.rmtree, private, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.long", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--limit", type=float, default=5.0, help="CPU seconds per input")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space cap per worker")
    ap.add_argument("--hang", type=float, default=300.0, help="wall seconds before a worker is killed")
    ap.add_argument("--checkpoint", default="fuzz-long.json")
    ap.add_argument("--crashes", default="fuzz-crashes")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    ap.add_argument("--start", type=int, default=0, metavar="I",
                    help="first input index of a fresh run (a run continued without its checkpoint:"
                         " inputs are drawn from (seed, i) alone, so [I, --inputs) is the rest)")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="skip compiling the kernels before the first timed input")
    ap.add_argument("--replay", type=int, metavar="I", help="run input I alone and print it")
    ap.add_argument("--only", default="", metavar="KINDS",
                    help="comma-separated kinds to run (a scouting run), e.g. document,cli")
    args = ap.parse_args(argv)
    global ONLY
    ONLY = tuple(k for k in args.only.split(",") if k)
    unknown = set(ONLY) - {k for k, _ in KINDS}
    if unknown:
        sys.exit(f"--only: unknown kind(s) {', '.join(sorted(unknown))}")

    if args.replay is not None:
        kind, payload = make_input(args.seed, args.replay)
        print(kind, g.describe(payload) if kind.startswith("cli") else repr(payload)[:4000])
        t0 = time.process_time()
        problems, child = run_input(kind, payload)
        print(f"{time.process_time() - t0 + child:.2f} CPU s", json.dumps(problems, indent=1))
        return 1 if problems else 0

    _private_tempdir()
    ckpt = Path(args.checkpoint)
    saved = _load(ckpt) if args.resume else {}
    if saved and (saved.get("seed") != args.seed or saved.get("workers") != args.workers):
        sys.exit("--resume needs the checkpoint's --seed and --workers")
    counts: Counter[str] = Counter(saved.get("counts", {}))
    if args.start < 0:
        sys.exit("--start must be >= 0")
    nexts = saved.get("next", [args.start + w for w in range(args.workers)])
    elapsed0 = saved.get("elapsed_s", 0.0)
    cpu_max = saved.get("max_cpu_s", 0.0)
    wall_max = saved.get("max_wall_s", 0.0)
    by_kind: dict[str, dict[str, float]] = saved.get("by_kind", {})
    if not args.no_warm_up:
        print(f"warm-up: {_warm_up(args.seed):.1f} CPU s", file=sys.stderr, flush=True)
    ctx = mp.get_context("fork")
    start = time.monotonic()
    workers: dict[int, Any] = {}

    def launch(w: int) -> None:
        state = ctx.Array("d", [-1.0, time.time()], lock=False)
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, daemon=True, args=(
            args.seed, range(nexts[w], args.inputs, args.workers), args.limit, args.memory_gb,
            state, child, args.crashes))
        proc.start()
        child.close()
        workers[w] = (proc, parent, state)

    def checkpoint(final: bool = False) -> dict[str, Any]:
        done = counts["inputs"]
        elapsed = elapsed0 + time.monotonic() - start
        data = {
            "command": "python -m tests.fuzz.long " + " ".join(sys.argv[1:] if argv is None else argv),
            "seed": args.seed, "workers": args.workers, "inputs_target": args.inputs,
            "start": saved.get("start", args.start),
            "limit_cpu_s": args.limit, "memory_gb": args.memory_gb, "inputs": done,
            "next": nexts, "elapsed_s": round(elapsed, 1),
            "rate_per_s": round(done / elapsed, 1) if elapsed else None,
            "max_cpu_s": round(cpu_max, 2), "max_wall_s": round(wall_max, 2),
            "problems": {p: counts.get(p, 0) for p in PROBLEMS},
            "counts": dict(counts), "by_kind": _by_kind_table(by_kind),
            "finished": final, "loadavg": os.getloadavg(),
        }
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(ckpt)
        return data

    for w in range(args.workers):
        if nexts[w] < args.inputs:
            launch(w)
    last = time.monotonic()
    while workers:
        by_conn = {conn: w for w, (_, conn, _) in workers.items()}
        for conn in mp.connection.wait(list(by_conn), timeout=1.0):
            w = by_conn[conn]
            while conn.poll():
                try:
                    msg = conn.recv()
                except EOFError:
                    break
                if msg is None:
                    nexts[w] = args.inputs
                    break
                i, kind, categories, cpu, wall = msg
                counts["inputs"] += 1
                counts[f"kind:{kind}"] += 1
                counts.update(categories)
                cpu_max, wall_max = max(cpu_max, cpu), max(wall_max, wall)
                _tally(by_kind, kind, cpu, wall)
                nexts[w] = i + args.workers
        for w, (proc, _conn, state) in list(workers.items()):
            if nexts[w] >= args.inputs:
                proc.join(timeout=5)
                del workers[w]
                continue
            current, started = int(state[0]), state[1]
            stuck = current >= nexts[w] and time.time() - started > args.hang
            if stuck or not proc.is_alive():
                proc.kill()
                proc.join()
                # every input before `current` was reported; count the stuck (or
                # crashed) one, and restart the worker after it
                i = current if current >= nexts[w] else nexts[w]
                category = "over-time" if stuck else "foreign-exception"
                kind, payload = make_input(args.seed, i)
                counts["inputs"] += 1
                counts[f"kind:{kind}"] += 1
                counts[category] += 1
                _record(args.crashes, args.seed, i, kind, payload,
                        [(category, f"worker {'hung' if stuck else 'died'} (exit {proc.exitcode})")])
                nexts[w] = i + args.workers
                del workers[w]
                if nexts[w] < args.inputs:
                    launch(w)
        if time.monotonic() - last > 30:
            data = checkpoint()
            last = time.monotonic()
            print(f"{data['inputs']:>9} inputs  {data['rate_per_s']}/s  problems {data['problems']}",
                  flush=True)
    data = checkpoint(final=True)
    print(json.dumps(data, indent=1))
    return 0 if not any(data["problems"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
