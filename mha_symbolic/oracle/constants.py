"""Constants of the oracle's error analysis (binary64, round to nearest, gradual
underflow), kept in one module that the fast path, the Arb fallback and the
enclosure import.  Each constant states the fact it encodes."""

from __future__ import annotations

import math
from fractions import Fraction

U = 2.0**-53  # unit roundoff: |fl(x) - x| <= u|x| for a normal result
ETA = 2.0**-1074  # smallest subnormal; an underflowing product errs by <= ETA/2
UP = 1.0 + 2.0**-40  # inflates a bound computed in floats: each of its <= 2**12
#                       nonnegative round-to-nearest operations can lose a
#                       factor (1-u), and (1-u)**-4096 < 1 + 2**-40
FLOOR = 2.0**-1000  # absolute slack for underflow inside the bound formulas
#                      (each loses <= ETA per operation; far fewer than 2**70 ops)
EXP_CUT = -700.0  # exp(t) for t < EXP_CUT is taken as 0, with weight <= TINY_W
TINY_W = 2.0**-1008  # >= exp(-699) (exp(-699) ~ 2**-1008.4); used as a bound
RHO_EXP = 2.0**-46  # proved relative error bound of exp_nonpos (about 60u needed)
MAX_SCORE_ERR = 2.0**-10  # beyond this the fast path hands the row to Arb

# ln 2 = LN2_HI + LN2_LO + d with |d| <= 2**-86 (LN2_LO = RN(ln 2 - LN2_HI) and
# |ln 2 - LN2_HI| < 2**-32); LN2_HI has 32 significant bits so k·LN2_HI is exact
# for |k| < 2**21.  Checked against Arb in tests/test_oracle.py.
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
EXP_DEGREE = 14
# c_i = RN(1/i!) (Python's int/int division is correctly rounded)
EXP_COEFFS = [1.0 / math.factorial(i) if i < 2 else float(Fraction(1, math.factorial(i)))
               for i in range(EXP_DEGREE + 1)]

START_PREC = {53: 128}  # first Arb precision per target precision (default 96)
MAX_PREC = 1 << 14
RATIONAL_AT_PREC = 256  # try the exact rational decision from this precision on

CHUNK_ELEMS = 1 << 21  # fast path: scores processed at most ~2M at a time


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability, §3.1), rounded up."""
    nu = n * U
    return nu / (1.0 - nu) * UP



SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's splitting constant for binary64
