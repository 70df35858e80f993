"""Count exact.decide_sign calls and their CPU per fuzz input of seed 71 (issue 30, the
limits class): ``PYTHONPATH=$PWD python bench/limits_decide_sign.py 26839 40002 …``."""

import sys
import time

from mha_symbolic.oracle.backward import exact as ex
from tests.fuzz import long as L

orig = ex.decide_sign

acc = {"n0": 0, "t0": 0.0, "n": 0, "t": 0.0}


def ds(dec, boundary, c_arb, what):
    t = time.process_time()
    try:
        return orig(dec, boundary, c_arb, what)
    finally:
        k = "0" if boundary == 0 else ""
        acc["n" + k] += 1
        acc["t" + k] += time.process_time() - t


ex.decide_sign = ds
for i in sys.argv[1:]:
    for a in acc:
        acc[a] = 0
    kind, payload = L.make_input(71, int(i))
    t = time.process_time()
    problems, _ = L.run_input(kind, payload)
    tot = time.process_time() - t
    print(f"#{i} {kind} {payload}: {tot:.1f} CPU s; decide_sign at boundary 0 (-0.0|+0.0): "
          f"{acc['n0']} calls {acc['t0']:.1f} s; other boundaries {acc['n']} calls "
          f"{acc['t']:.1f} s; {problems}", flush=True)
