#!/usr/bin/env bash
# The prepared GPU check of issue 17 — one command on the device machine:
#
#     bench/gpu_check.sh                 # results under $OUT (else ./gpu_check_out)
#     bench/gpu_check.sh --quick         # the smaller plan
#     PYTHON=/path/to/python bench/gpu_check.sh --device cpu --quick   # dry run on CPU
#
# Every torch SDPA backend forced in turn (FLASH_ATTENTION, EFFICIENT_ATTENTION,
# CUDNN_ATTENTION, MATH) and FlexAttention (torch.compile), forward and backward, in
# fp16 and bf16, head dims 64/128, L and S from 1 to 8192, judged by the oracle on all
# CPU cores; a wall-time budget of 420 s for the run (bench/device_sdpa.py) plus
# start-up and calibration: under 9 minutes.  Details: bench/gpu_check.py.
set -u
cd "$(dirname "$0")/.." || exit 2
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    for c in python3 python; do
        if command -v "$c" >/dev/null 2>&1; then PY="$c"; break; fi
    done
fi
if [ -z "$PY" ]; then
    echo "gpu_check: no python3 on PATH (set PYTHON=/path/to/python)" >&2
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" bench/gpu_check.py "$@"
