"""Progress bars for long oracle calls: a tqdm bar on stderr when the call is
expected to take more than about two seconds, stderr is a terminal, tqdm is
installed, the call runs outside pytest and ``progress`` is not False.  Nothing
is imported unless a bar is shown."""

from __future__ import annotations

import os
import sys
from typing import Any

# Rough cost model on one core (seconds per score element), for deciding whether a
# call is long enough to deserve a bar; measured by bench/bench_oracle.py.
SECONDS_PER_SCORE = {"tier1": 2.5e-8, "tier2": 2.0e-7}
SHOW_AFTER_S = 2.0


def _terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """Decides once whether bars are shown; :meth:`bar` returns a tqdm bar or None."""

    def __init__(self, progress: bool | None, expected_s: float) -> None:
        self.enabled = False
        if progress is False:
            return
        if "PYTEST_CURRENT_TEST" in os.environ or not _terminal():
            return
        if progress is None and expected_s < SHOW_AFTER_S:
            return
        try:
            import tqdm  # noqa: F401
        except ImportError:
            return
        self.enabled = True

    def bar(self, total: int, desc: str) -> Any:
        if not self.enabled or total <= 1:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=f"mha_symbolic: {desc}", file=sys.stderr, leave=False,
                    unit="block")


def expected_seconds(n_scores: int, tier: str) -> float:
    return n_scores * SECONDS_PER_SCORE[tier]
