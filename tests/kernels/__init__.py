"""Self-tests of bench/verdict_kernels.py: the correct and planted-buggy attention kernels
that measure the oracle (each checked against a float64 reference computed here)."""
