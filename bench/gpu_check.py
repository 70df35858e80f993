"""The prepared GPU check of issue 17: every torch SDPA backend forced in turn and
FlexAttention (compiled), forward and backward, on the GPU, judged by the oracle on
the CPU cores — one command, results under ``$OUT``.

    bench/gpu_check.sh                                  # on the device machine
    python bench/gpu_check.py --device cpu --quick --out /tmp/gc   # the dry run on CPU

Steps: (1) the packages it needs are importable (else one line naming them, exit 2:
pip may not reach the internet on the device machine); (2) a calibration — one
oracle verdict timed on this machine — scales bench/device_sdpa.py's estimate of the
plan, and the longest sequence lengths are dropped (printed) until the estimate fits
the budget on ``--jobs`` workers; (3) device_sdpa's run, forward and backward, with a
wall-time budget (what is not judged by then is reported as such, never as a pass);
(4) ``$OUT/gpu_check.json`` (every row, every failure's report), ``gpu_check.md``
(the table), ``gpu_check.log`` (the progress) and ``environment.txt``.

Exit status: 0 when no false alarm, refusal or internal error of ours; 1 when there
were some (the files say which); 2 for a missing package or a bad option.
"""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

NEEDED = ("numpy", "ml_dtypes", "mpmath", "flint", "torch")


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


def _check_packages() -> None:
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    if missing:
        print(f"gpu_check: missing Python packages: {', '.join(missing)} (python "
              f"{sys.executable}); install them or set PYTHON to an interpreter that has "
              "them", file=sys.stderr)
        raise SystemExit(2)


def _calibrate() -> float:
    """Seconds of one fp16 forward verdict at L = S = 512, E = 128, one head, on this
    machine, ÷ the plan's estimate for it: the factor to scale the estimate by."""
    import device_sdpa as ds
    import numpy as np

    from mha_symbolic import compare_attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 512, 128)).astype(np.float16) for _ in range(3))
    out = np.zeros_like(q)
    compare_attention(out[..., :8, :], q[..., :8, :], k, v, diagnose_bugs=False)  # warm
    t0 = time.process_time()
    compare_attention(out, q, k, v, diagnose_bugs=False)
    took = time.process_time() - t0
    return took / ds.estimate(ds.Spec("float16", 512, 512, 128, "none", 1, 1), "fwd")


def _environment(out: Path, device: str) -> str:
    lines = [f"python {sys.version.split()[0]} ({sys.executable}); {platform.platform()}",
             f"cpus {os.cpu_count()}; load {Path('/proc/loadavg').read_text().strip()}"
             if Path("/proc/loadavg").exists() else f"cpus {os.cpu_count()}"]
    for name in (*NEEDED, "numba", "triton"):
        try:
            mod = importlib.import_module(name)
            lines.append(f"{name} {getattr(mod, '__version__', '?')}")
        except Exception:
            lines.append(f"{name}: not importable")
    if device == "cuda" and shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
            lines.append(smi.stdout)
        except (OSError, subprocess.SubprocessError) as exc:
            lines.append(f"nvidia-smi: {exc}")
    text = "\n".join(lines)
    (out / "environment.txt").write_text(text + "\n")
    return text


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="gpu_check.py", add_help=True,
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu_check_out"))
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--estimate-only", action="store_true")
    own, rest = ap.parse_known_args(argv)
    bench_args = ["--device", own.device, "--jobs", str(own.jobs),
                  *(["--quick"] if own.quick else []), *rest]
    import device_cli as dc

    a = dc.parser("gpu_check.py").parse_args(bench_args)
    specs, backends, budget, _ = dc.configure(a)
    directions = ("fwd", "bwd")
    if own.estimate_only:
        dc.main([*bench_args, "--estimate-only"], directions, "gpu_check.py")
        return 0
    _check_packages()
    out = Path(own.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "gpu_check.log").open("w")
    sys.stdout = _Tee(sys.__stdout__ or sys.stdout, log)
    print(_environment(out, own.device), flush=True)
    t0 = time.perf_counter()
    factor = _calibrate()
    sizes = sorted({s.S for s in specs if not s.flex})
    _, total, big = dc.plan_estimate(specs, backends, directions)
    print(f"calibration: this machine runs the oracle at {factor:.2f}x the plan's "
          f"estimate ({time.perf_counter() - t0:.1f} s)", flush=True)
    # drop the longest lengths until the estimate fits 80 % of the budget
    while len(sizes) > 1 and max(total * factor / own.jobs, big * factor) > 0.8 * budget:
        dropped = sizes.pop()
        a = dc.parser("gpu_check.py").parse_args([*bench_args, "--sizes",
                                                  ",".join(map(str, sizes))])
        specs, backends, budget, _ = dc.configure(a)
        _, total, big = dc.plan_estimate(specs, backends, directions)
        print(f"estimate over budget: length {dropped} dropped", flush=True)
    if "--sizes" not in bench_args:
        bench_args += ["--sizes", ",".join(map(str, sizes))]
    print(f"estimated oracle wall: {max(total * factor / own.jobs, big * factor):.0f} s on "
          f"{own.jobs} workers, budget {budget:.0f} s", flush=True)
    res = dc.main([*bench_args, "--json", str(out / "gpu_check.json")], directions,
                  "gpu_check.py")
    assert res is not None
    md = [f"# gpu_check ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
          f"command: {' '.join(['bench/gpu_check.py', *argv])}", "",
          f"device: {res.meta.get('device_name')}; torch {res.meta.get('torch')}; "
          f"FlexAttention {res.meta.get('flex')}; jobs {own.jobs}; wall "
          f"{res.meta['wall_s']:.0f} s; device read check {res.meta['device_read_check']}",
          "", dc.table(res), ""]
    bad = list(res.failures)
    for f in bad:
        md.append(f"- {f['verdict']}: {f['backend']} {f['direction']} {f['case']}: "
                  f"{f.get('diagnoses', f.get('message', ''))}")
    (out / "gpu_check.md").write_text("\n".join(md) + "\n")
    print(f"results: {out}/gpu_check.md, gpu_check.json, gpu_check.log; "
          f"total {time.perf_counter() - t0:.0f} s", flush=True)
    sys.stdout = sys.__stdout__
    log.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
