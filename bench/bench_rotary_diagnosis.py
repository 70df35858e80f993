"""Diagnosis counts of planted rotary bugs at bf16/fp16 (issue 24 fixes, task h24v).

For every rotary bug class a plain-torch kernel can plant (rotary on v, the other
convention, positions not offset, rotary_dim ignored), both 16-bit dtypes, two shapes
and ``--seeds`` seeds: ``compare_attention(..., rotary_base=10000)`` on the buggy output;
counts how often the planted class is named first ("right"), another class is named
first ("wrong", with the names), nothing is named ("none"), and the correct kernel's
false alarms.  Run on two trees to compare:

    PYTHONPATH=/work/main python bench/bench_rotary_diagnosis.py --seeds 3
    PYTHONPATH=$PWD       python bench/bench_rotary_diagnosis.py --seeds 3
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import torch

import mha_symbolic as ms

F = torch.nn.functional
BUGS = ("rotary_on_v", "rotary_interleaved_swapped", "rotary_positions_not_offset",
        "rotary_dim_ignored")


def rope(x, pos, rdim=None, interleaved=False, base=10000.0):
    E = x.shape[-1]
    r = E if rdim is None else rdim
    inv = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    th = pos.double()[:, None] * inv[None]
    c, s = th.cos(), th.sin()
    x = x.double()
    xr, rest = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        o = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        o = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    return torch.cat((o, rest), -1)


def kernel(q, k, v, bug, dt, rdim):
    L, S = q.shape[-2], k.shape[-2]
    qpos = torch.arange(L) if bug == "rotary_positions_not_offset" else torch.arange(S - L, S)
    inter = bug == "rotary_interleaved_swapped"
    r = None if bug == "rotary_dim_ignored" else rdim
    qr, kr = rope(q, qpos, r, inter), rope(k, torch.arange(S), r, inter)
    vr = rope(v, torch.arange(S), r, inter) if bug == "rotary_on_v" else v
    return F.scaled_dot_product_attention(qr.to(dt).float(), kr.to(dt).float(),
                                          vr.to(dt).float()).to(dt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print(f"mha_symbolic: {ms.__file__}; load {os.getloadavg()}; "
          f"threads {torch.get_num_threads()}")
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    t0, c0 = time.perf_counter(), time.process_time()
    for dt in (torch.bfloat16, torch.float16):
        for (L, S, E) in ((8, 64, 16), (4, 32, 32)):
            for seed in range(args.seeds):
                g = torch.Generator().manual_seed(seed)
                q, k, v = (torch.randn(1, 2, n, E, generator=g).to(dt) for n in (L, S, S))
                for bug in (None, *BUGS):
                    rdim = E // 2 if bug == "rotary_dim_ignored" else None
                    kw = {"rotary_base": 10000.0} | ({} if rdim is None else
                                                     {"rotary_dim": rdim})
                    comp = ms.compare_attention(kernel(q, k, v, bug, dt, rdim), q, k, v,
                                                **kw)
                    names = [d.bug for d in comp.diagnoses]
                    key = bug or "correct kernel"
                    if bug is None:
                        counts[key]["pass" if comp.passed else "FALSE ALARM"] += 1
                    elif comp.passed:
                        counts[key]["passed (missed)"] += 1
                    elif names[:1] == [bug]:
                        counts[key]["right"] += 1
                    elif names:
                        counts[key][f"wrong: {names[0]}"] += 1
                    else:
                        counts[key]["none"] += 1
    for key, c in counts.items():
        print(f"{key:30s} " + ", ".join(f"{n} {m}" for n, m in sorted(c.items())))
    print(f"wall {time.perf_counter() - t0:.1f} s, cpu {time.process_time() - c0:.1f} s")


if __name__ == "__main__":
    main()
