"""Constants of the oracle's error analysis (binary64, round to nearest, gradual
underflow), kept in one module that the fast paths, the Arb fallback and the
enclosure import.  Each constant states the fact it encodes; the ones that are
bit patterns of irrational numbers are checked against Arb in
tests/oracle/arith/test_oracle_kernels.py."""

from __future__ import annotations

U = 2.0**-53  # unit roundoff: |fl(x) - x| <= u|x| for a normal result
ETA = 2.0**-1074  # smallest subnormal; an underflowing product errs by <= ETA/2
UP = 1.0 + 2.0**-40  # inflates a bound computed in floats: each of its <= 2**12
#                       nonnegative round-to-nearest operations can lose a
#                       factor (1-u), and (1-u)**-4096 < 1 + 2**-40
TINY_N = 2.0**-1022  # the smallest normal double: stands for η (or S·η) in bound formulas
#                      evaluated per element, where it is an upper bound of them; a
#                      subnormal operand costs a microcode assist (~100 cycles) on x86
FLOOR = 2.0**-1000  # absolute slack for underflow inside the bound formulas
#                      (each loses <= ETA per operation; far fewer than 2**70 ops)

# ---- tier 1: float64 exp (expo.exp_double)
EXP1_CUT = -708.0  # exp(-708) = 3.3e-308 > 2**-1022: results stay normal
RHO_EXP1 = 2.0**-48  # proved relative error of exp_double (< 15.1u = 2**-49.08 needed)
TINY1 = 2.0**-1019  # >= exp(-707) (2**-1020.0): bounds |w - w~| for keys below the cut
INV_LN2_128 = float.fromhex("0x1.71547652b82fep+7")  # RN(128/ln 2)
LN2_128_HI = float.fromhex("0x1.62e42fefa0000p-8")  # ln2/128 truncated to 36 bits
LN2_128_LO = float.fromhex("0x1.cf79abc9e3b3ap-47")  # RN(ln2/128 - HI); |rest| < 2**-100
EXP1_C3 = 1.0 / 6.0  # RN(1/6): IEEE division is correctly rounded
EXP1_C4 = 1.0 / 24.0  # RN(1/24)

# ---- tier 2: double-double exp (expo.exp_dd)
EXP2_CUT = -600.0  # dd weights >= e**-600 > 2**-866: hi and lo parts stay normal
RHO_EXP2 = 2.0**-84  # proved relative error of exp_dd (about 2**-86.8 needed)
TINY2 = 2.0**-864  # >= exp(-599) (2**-864.2): bounds |w - w~| for keys below the cut
INV_LN2_1024 = float.fromhex("0x1.71547652b82fep+10")  # RN(1024/ln 2)
LN2_1024_A = float.fromhex("0x1.62e42fef00000p-11")  # 33 significant bits
LN2_1024_B = float.fromhex("0x1.473de6af00000p-44")  # 33 significant bits
LN2_1024_C = float.fromhex("0x1.3c7673007e5edp-79")  # RN(ln2/1024 - A - B); rest < 2**-130
EXP2_C = (1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0)  # RN(1/k!), k=3..7

# ---- error budgets of the tiers
MAX_SCORE_ERR = 2.0**-10  # tier 1 hands a row on when its score error exceeds this
MAX_SCORE_DD = 2.0**40  # tier 2 handles rows whose |row max score| is below this
DD_ERR_CAP = 2.0**-30  # tier 2 hands a row on when its score error exceeds this

# ---- Arb fallback
START_PREC = {53: 128}  # first Arb precision per target precision (default 96)
MAX_PREC = 1 << 14
RATIONAL_AT_PREC = 256  # try the exact rational decision from this precision on

# ---- chunking (memory O(chunk), working set near the cache)
CHUNK_ELEMS = 1 << 16  # score elements per block of the tiers (rows x keys)
KEY_BLOCK = 512  # keys per exact W·V block in tier 2 (beta_w + beta_v <= 52 - 9 - 1)


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability, §3.1), rounded up."""
    nu = n * U
    return nu / (1.0 - nu) * UP
