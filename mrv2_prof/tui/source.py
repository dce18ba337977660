"""Where the live dashboard gets its snapshots from: the parent's end of the runner's queue.

The dashboard only sees this protocol, so it can be driven by a scripted fake in tests and never
imports the runner (the runner lives in its own process; architecture: Processes and data flow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mrv2_prof.views.snapshot import Snapshot


class SnapshotSource(Protocol):
    """A non-blocking feed of live snapshots from one run."""

    def poll(self) -> tuple[Snapshot | None, bool]:
        """Return the newest snapshot since the last poll (``None`` if none came) and ``done``.

        ``done`` is true once the run has ended (finished, stopped, aborted or failed) and every
        snapshot it sent has been returned. Must not block.
        """
        ...

    def request_stop(self, signum: int = 0) -> None:
        """Ask the runner to stop cleanly, keeping the data recorded so far. Must not block.
        ``signum``: the signal the stop stands for (Ctrl-C in the dashboard is ``SIGINT``, so the
        CLI exits 130 as it does for a Ctrl-C outside it); 0 for a plain quit."""
        ...

    def gpu_samples(self) -> tuple[Sequence[Sequence[float]], str | None]:
        """Recent NVML samples, oldest first, each ``(t_ns, gpu_util, mem_used_bytes, power_w,
        sm_clock_mhz)`` as in ``gpu_samples`` (NaN where the GPU did not say), and the note saying
        why there are none (a CPU run, NVML missing); ``([], None)`` until sampling starts."""
        ...
