"""Diagnosis counts on rotary kernels written in plain torch (issue 24, task h24w).

Independent of the library's rotary code: each kernel builds its cos/sin tables as HF's
``LlamaRotaryEmbedding`` does (inv_freq = 1 / base^(2m/r) in float32, angles pos·inv_freq
in float32), casts them to the activations' dtype and rotates q and k in that dtype
(``x * cos + rotate_half(x) * sin``, GPT-NeoX half-split, or GPT-J's interleaved pairs),
the first ``rotary_dim`` dims only, the queries at positions S - L … S - 1 (a cache of
S - L keys before them); then torch's ``scaled_dot_product_attention`` in the same dtype.
Bugs planted (each seen in shipped code):

- ``sign_flip``: ``rotate_half`` returning ``cat((x2, -x1))`` — a rotation by −θ;
- ``conv_swapped``: the other pair convention (interleaved ↔ half-split);
- ``no_offset``: queries rotated at positions 0 … L - 1 (L < S only);
- ``rotary_on_v``: v rotated at the key positions too;
- ``no_scale``: SDPA with ``scale=1``;
- ``cos_sin_bf16``: positions, inv_freq, angles and cos/sin in bfloat16 (gpt-neox#1003);
- ``rotary_dim_ignored``: every dim rotated, inv_freq over the head dim (partial only).

For each case: the verdict of ``compare_attention(out, q, k, v, rotary_base=…, …)``
(pass / fail / refused: a ToleranceError or another library error) and the names it
gives.  Counted per bug and dtype: right (the planted class among the names), first
(named first), wrong extra names (another class named beside or instead of it), missing
(failed, planted class not named), passed (the bug below the verdict's tolerance).
Correct kernels: false alarms (fail) and refusals must be 0.  Run on two trees:

    PYTHONPATH=/tmp/before OMP_NUM_THREADS=1 python bench/diagnosis_rope_counts.py
    PYTHONPATH=$PWD        OMP_NUM_THREADS=1 python bench/diagnosis_rope_counts.py
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from dataclasses import dataclass

import torch

import mha_symbolic as ms

F = torch.nn.functional
BASE = 10000.0

#: the library's name of each planted bug (no name: the library has no class for it)
EXPECT = {"sign_flip": "rotary_sign_flipped", "conv_swapped": "rotary_interleaved_swapped",
          "no_offset": "rotary_positions_not_offset", "rotary_on_v": "rotary_on_v",
          "no_scale": "no_scale", "cos_sin_bf16": "rotary_angles_bf16",
          "rotary_dim_ignored": "rotary_dim_ignored"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Shape:
    name: str
    H: int
    L: int
    S: int
    E: int
    rdim: int | None      # None: every dim rotated
    interleaved: bool
    causal: bool          # only with L == S (torch's is_causal is top-left)
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    big: bool = False
    fp32_rotation: bool = False   # FlashAttention's kernel: rotate in float32, store


SHAPES = (
    Shape("offset_partial", 2, 8, 64, 32, 16, False, False),
    Shape("offset_gptj", 2, 4, 48, 32, None, True, False),
    Shape("causal_gptj_partial", 2, 32, 32, 64, 32, True, True),
    Shape("decode", 2, 1, 256, 64, None, False, False),
    Shape("prefill512_neox", 4, 512, 512, 128, None, False, False, ("bf16",), True),
    Shape("prefill512_gptj_causal", 4, 512, 512, 128, None, True, True, ("bf16",), True),
    Shape("chunk512_fa", 4, 512, 1024, 128, None, False, False, ("bf16",), True, True),
    Shape("decode4096", 2, 1, 4096, 128, None, False, False, ("bf16", "fp16"), True),
    Shape("decode4096_fa", 2, 1, 4096, 128, None, True, False, ("bf16",), True, True),
)


def tables(n: int, r: int, low: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (n, r/2): HF's float32 tables, or (``low``) all in bfloat16."""
    inv = 1.0 / (BASE ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    if low:
        t = torch.arange(n).to(torch.bfloat16)
        th = t[:, None] * inv.to(torch.bfloat16)[None, :]
    else:
        th = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    return th.cos(), th.sin()


def rotate(x: torch.Tensor, pos: torch.Tensor, r: int, interleaved: bool, low: bool,
           flip: bool, fp32: bool = False) -> torch.Tensor:
    """x (B, H, n, E) rotated at ``pos`` (n,), the first r dims: in its own dtype (HF),
    or (``fp32``) in float32 and stored in its dtype (FlashAttention's kernel)."""
    if fp32:
        return rotate(x.float(), pos, r, interleaved, low, flip).to(x.dtype)
    c, s = tables(int(pos.max()) + 1, r, low)
    c, s = c[pos].to(x.dtype), s[pos].to(x.dtype)
    xr, rest = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        if flip:   # GPT-J's rotate_every_two with the wrong sign: (x2, -x1)
            o = torch.stack((x1 * c + x2 * s, x2 * c - x1 * s), -1).flatten(-2)
        else:
            o = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        half = torch.cat((x2, -x1), -1) if flip else torch.cat((-x2, x1), -1)
        o = xr * torch.cat((c, c), -1) + half * torch.cat((s, s), -1)
    return torch.cat((o, rest), -1)


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sh: Shape,
           bug: str | None) -> torch.Tensor:
    L, S, E = sh.L, sh.S, sh.E
    r = E if bug == "rotary_dim_ignored" or sh.rdim is None else sh.rdim
    inter = (not sh.interleaved) if bug == "conv_swapped" else sh.interleaved
    low, flip = bug == "cos_sin_bf16", bug == "sign_flip"
    qpos = torch.arange(L) if bug == "no_offset" else torch.arange(S - L, S)
    kpos = torch.arange(S)
    f32 = sh.fp32_rotation
    qr = rotate(q, qpos, r, inter, low, flip, f32)
    kr = rotate(k, kpos, r, inter, low, flip, f32)
    vr = rotate(v, kpos, r, inter, low, flip, f32) if bug == "rotary_on_v" else v
    return F.scaled_dot_product_attention(qr, kr, vr, is_causal=sh.causal,
                                          scale=1.0 if bug == "no_scale" else None)


def bugs_of(sh: Shape) -> tuple[str | None, ...]:
    out: list[str | None] = [None, "sign_flip", "conv_swapped", "rotary_on_v", "no_scale",
                             "cos_sin_bf16"]
    if sh.L < sh.S:
        out.append("no_offset")
    if sh.rdim is not None:
        out.append("rotary_dim_ignored")
    return tuple(out)


def judge(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          sh: Shape) -> tuple[str, list[str]]:
    kw: dict[str, object] = {"rotary_base": BASE, "rotary_interleaved": sh.interleaved}
    if sh.rdim is not None:
        kw["rotary_dim"] = sh.rdim
    try:
        comp = ms.compare_attention(out, q, k, v, is_causal=sh.causal, **kw)
    except ms.MhaSymbolicError as e:
        return f"refused ({type(e).__name__})", []
    return ("pass" if comp.passed else "fail"), [d.bug for d in comp.diagnoses]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the small shapes")
    ap.add_argument("--big-seeds", type=int, default=2, help="seeds of the 512 shapes")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default all)")
    ap.add_argument("--rows", action="store_true", help="print every case")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"mha_symbolic: {ms.__file__}; load {os.getloadavg()}")
    pick = set(filter(None, args.shapes.split(",")))
    tally: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    extras: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    rows = []
    t0, c0 = time.perf_counter(), time.process_time()
    for sh in SHAPES:
        if pick and sh.name not in pick:
            continue
        for dname in sh.dtypes:
            dt = DTYPES[dname]
            for seed in range(args.big_seeds if sh.big else args.seeds):
                g = torch.Generator().manual_seed(1000 * seed + sh.E + sh.L)
                q = torch.randn(1, sh.H, sh.L, sh.E, generator=g).to(dt)
                k = torch.randn(1, sh.H, sh.S, sh.E, generator=g).to(dt)
                v = torch.randn(1, sh.H, sh.S, sh.E, generator=g).to(dt)
                for bug in bugs_of(sh):
                    c1 = time.process_time()
                    verdict, names = judge(kernel(q, k, v, sh, bug), q, k, v, sh)
                    cpu = time.process_time() - c1
                    key = (bug or "correct", dname)
                    t = tally[key]
                    t["cases"] += 1
                    t[verdict] += 1
                    if bug is not None and verdict == "fail":
                        want = EXPECT[bug]
                        t["right"] += want in names
                        t["first"] += names[:1] == [want]
                        t["missing"] += want not in names
                        other = [n for n in names if n != want]
                        t["wrong extra"] += bool(other)
                        extras[key].update(other)
                    rows.append((sh.name, dname, seed, bug or "correct", verdict,
                                 ",".join(names) or "-", cpu))
                    if args.rows:
                        print(*rows[-1][:-1], f"{cpu:.1f}s", flush=True)
    print("\n| bug (planted) | dtype | cases | pass | fail | refused | right | first | "
          "wrong extra names | missing | extra names given |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (bug, dname), t in sorted(tally.items(), key=lambda kv: (kv[0][0] != "correct",
                                                                  kv[0])):
        refused = sum(n for key, n in t.items() if key.startswith("refused"))
        ex = ", ".join(f"{n} {m}" for n, m in extras[(bug, dname)].most_common()) or "-"
        print(f"| {bug} | {dname} | {t['cases']} | {t['pass']} | {t['fail']} | {refused} | "
              f"{t['right']} | {t['first']} | {t['wrong extra']} | {t['missing']} | {ex} |")
    corr = [t for (b, _), t in tally.items() if b == "correct"]
    fa = sum(t["fail"] for t in corr)
    ref = sum(n for t in corr for key, n in t.items() if key.startswith("refused"))
    bug_t = [t for (b, _), t in tally.items() if b != "correct"]
    print(f"\ncorrect kernels: {sum(t['cases'] for t in corr)} cases, false alarms {fa}, "
          f"refused {ref}")
    print(f"buggy kernels: {sum(t['cases'] for t in bug_t)} cases, failed "
          f"{sum(t['fail'] for t in bug_t)}, right {sum(t['right'] for t in bug_t)}, "
          f"wrong extra {sum(t['wrong extra'] for t in bug_t)}, missing "
          f"{sum(t['missing'] for t in bug_t)}")
    print("\ncases with a wrong name (shape dtype seed bug verdict names):")
    for r in rows:
        if r[3] != "correct" and r[4] == "fail" and any(n != EXPECT[r[3]]
                                                         for n in r[5].split(",") if n != "-"):
            print("  ", *r[:-1])
    print(f"wall {time.perf_counter() - t0:.1f} s, cpu {time.process_time() - c0:.1f} s, "
          f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
