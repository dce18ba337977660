"""Each latency the runner observed since the last snapshot, in seconds, for the metrics exporter.

The snapshot's percentiles cannot feed a Prometheus histogram, which counts every observation:
``NewLatencies`` keeps the TTFTs (arrival to first token), ITLs (the gap between two tokens of a
request) and E2E latencies (arrival to the finish of a completed request) that ``LiveStats``
computed since the previous snapshot, and hands them over in batches of at most ``BATCH`` values
of each kind so a snapshot stays small; what does not fit waits for the next one, and a snapshot
taken with nothing left to run (the run's last) carries all that is left.
"""

from __future__ import annotations

from collections import deque

BATCH = 16_384  # values of one kind a snapshot carries at most (the rest wait for the next)


class NewLatencies:
    """The TTFT, ITL and E2E values (seconds) not yet handed to a snapshot, oldest first."""

    def __init__(self, batch: int = BATCH) -> None:
        self.batch = batch
        self.ttft: deque[float] = deque()
        self.itl: deque[float] = deque()
        self.e2e: deque[float] = deque()

    def take(self, everything: bool = False) -> dict[str, tuple[float, ...]]:
        """The snapshot's ``new_ttft_s``, ``new_itl_s`` and ``new_e2e_s``: up to ``batch`` of
        each, or everything left (``everything``: the last snapshot of a run)."""
        return {
            "new_ttft_s": self._take(self.ttft, everything),
            "new_itl_s": self._take(self.itl, everything),
            "new_e2e_s": self._take(self.e2e, everything),
        }

    def _take(self, values: deque[float], everything: bool) -> tuple[float, ...]:
        n = len(values) if everything else min(len(values), self.batch)
        return tuple(values.popleft() for _ in range(n))

    def __len__(self) -> int:
        return len(self.ttft) + len(self.itl) + len(self.e2e)
