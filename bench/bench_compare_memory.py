"""Peak memory and time of ``compare_attention`` at production sizes.

    python bench/bench_compare_memory.py            # L = S = 4096, H = 16, E = 128, fp32
    python bench/bench_compare_memory.py --quick    # L = S = 1024, H = 4

Each size runs in a fresh subprocess: inputs (seeded normal, float32) and a correct
output (torch SDPA, or a chunked numpy kernel without torch) are made first; the
peak resident set size (VmHWM) is then reset to the current RSS (/proc/self/clear_refs)
and read after ``compare_attention``: the difference is "peak above inputs" (target:
under 2 GB at the full size).  Thread counts are pinned (OMP/OpenBLAS/MKL and torch) to --threads.
Times are wall and CPU (``time.process_time``); the machine load (/proc/loadavg) is
printed beside them.  A memory measurement, not a timing target: the lead re-runs it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r'''
import json, os, sys, time
import numpy as np
sys.path.insert(0, {root!r})
B, H, L, E = {B}, {H}, {L}, {E}
rng = np.random.default_rng(2026)
q, k, v = (rng.standard_normal((B, H, L, E)).astype(np.float32) for _ in range(3))

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024.0
    return float("nan")

try:
    import torch
    torch.set_num_threads({threads})
    with torch.no_grad():
        out = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(a) for a in (q, k, v))).numpy()
    kernel = "torch SDPA"
except ImportError:
    out = np.empty((B, H, L, E), np.float32)
    for h in range(H):
        for i in range(0, L, 256):
            s = (q[:, h, i:i + 256] @ np.swapaxes(k[:, h], -1, -2)) / np.float32(E ** 0.5)
            w = np.exp(s - s.max(-1, keepdims=True))
            out[:, h, i:i + 256] = (w / w.sum(-1, keepdims=True)) @ v[:, h]
    kernel = "numpy"
from mha_symbolic import compare_attention
import mha_symbolic.oracle, mha_symbolic.testing.forward.compare, flint  # noqa: F401  (imports first)
try:                      # reset the high-water mark to the current RSS (Linux >= 4.0)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
except OSError:
    pass
base_rss, base_hwm = status("VmRSS"), status("VmHWM")
t0, c0 = time.perf_counter(), time.process_time()
r = compare_attention(out, q, k, v, diagnose_bugs=False)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps(dict(kernel=kernel, passed=bool(r.passed), wall=wall, cpu=cpu,
                      base_rss=base_rss, base_hwm=base_hwm, peak=status("VmHWM"),
                      inputs_mb=3 * q.nbytes / 2**20 + out.nbytes / 2**20,
                      load=open("/proc/loadavg").read().split()[:3])))
'''


def run(B: int, H: int, L: int, E: int, threads: int) -> dict[str, object]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    code = _CHILD.format(root=str(ROOT), B=B, H=H, L=L, E=E, threads=threads)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=False)
    if res.returncode != 0:
        raise SystemExit(f"child failed ({res.returncode}):\n{res.stderr[-2000:]}")
    out: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="L = S = 1024, H = 4 only")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sizes = [(1, 4, 1024, 128)] if args.quick else [(1, 4, 1024, 128), (1, 16, 2048, 128),
                                                     (1, 16, 4096, 128)]
    print(f"# bench_compare_memory: threads {args.threads}, float32 inputs, seed 2026\n")
    print("| B·H | L = S | E | correct kernel | verdict | wall (s) | CPU (s) | inputs + output "
          "(MB) | peak RSS above them (MB) | load |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---|")
    for B, H, L, E in sizes:
        r = run(B, H, L, E, args.threads)
        above = float(r["peak"]) - float(r["base_rss"])  # type: ignore[arg-type]
        print(f"| {B * H} | {L} | {E} | {r['kernel']} | {'pass' if r['passed'] else 'FAIL'} | "
              f"{float(r['wall']):.1f} | {float(r['cpu']):.1f} | "  # type: ignore[arg-type]
              f"{float(r['inputs_mb']):.0f} | {above:.0f} | "  # type: ignore[arg-type]
              f"{' '.join(r['load'])} |", flush=True)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
