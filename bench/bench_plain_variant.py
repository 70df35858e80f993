"""Time plain_variant: the correct evaluation and every bug class of one call with window,
softcap, ALiBi and sinks (issue 23, h23f: the testing hooks must not slow it).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/bench_plain_variant.py
"""

from __future__ import annotations

import time

import numpy as np

from mha_symbolic.oracle.variants.registry import variant_options
from mha_symbolic.testing.call import AttentionCall
from mha_symbolic.testing.forward.bugs_variants import plain_variant, variant_bug_classes


def main() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 256, 64)).astype(np.float32).astype(np.float64)
               for _ in range(3))
    o = variant_options(window=(64, 0), softcap=20.0, alibi_slopes=np.linspace(0.1, 0.8, 8),
                        sinks=np.zeros(8))
    x = AttentionCall(q, k, v, opts=o, is_causal=True, in_format="float32")
    bugs = [b for b in variant_bug_classes() if b.applies(x)]

    def run() -> None:
        plain_variant(x)
        for b in bugs:
            plain_variant(x, **b.switches(x))

    run()
    cpu, wall = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(f"{len(bugs) + 1} plain_variant calls: wall min {min(wall):.3f} med "
          f"{sorted(wall)[2]:.3f} s, cpu min {min(cpu):.3f} med {sorted(cpu)[2]:.3f} s")


if __name__ == "__main__":
    main()
