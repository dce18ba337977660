"""Memory history (opt-in, ``probes.memory_history: [first step, steps]``): the CUDA caching
allocator's record of every allocation and free over a window of steps, kept as the pickled
snapshot PyTorch's memory visualizer opens (pytorch.org/memory_viz, ``torch.cuda._memory_viz``:
its ``segments`` and ``device_traces``).

Recording starts before step ``start`` (``torch.cuda.memory._record_memory_history``, at most
``MAX_ENTRIES`` events with their Python stacks) and stops after step ``start + steps - 1``,
when the snapshot is dumped (``_dump_snapshot``) into a file of its own in ``out_dir`` (the
``memory_history/`` folder beside the database). Pinned host memory has no history in the
snapshot: the caching host allocator's bytes (``torch.cuda.host_memory_stats``) at the window's
start and end and its peak inside it are the summary's. Recording stacks costs host time on
every allocation, and the dump holds up the next step: the window's steps and the one after it
are perturbed (``steps.perturbed``), as a kernel-trace window's are. A CPU run records nothing:
``CPU_NOTE`` is its note.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from mrv2_prof.probes.sync_site import wait_deliberately

MAX_ENTRIES = 200_000  # allocator events kept (a ring: the window's last ones)
CPU_NOTE = "probes.memory_history: the run is on the CPU; there is no device memory to record"


class MemoryHistory:
    def __init__(self, start: int, count: int, out_dir: str | None = None) -> None:
        self.start, self.count = max(int(start), 0), max(int(count), 1)
        self.out_dir = out_dir or tempfile.gettempdir()
        self.path: str | None = None
        self.error: str | None = None
        self.steps: list[int] = []
        self.pinned: dict[str, int | None] = {}
        self._on = False
        if self.start == 0:
            self._begin()

    def after_step(self, step: int) -> None:
        """Driven by the harness after every step: start before the window, stop after it."""
        if self._on:
            self.steps.append(step)
            if step >= self.start + self.count - 1:
                self.stop()
        elif self.path is None and self.error is None and step == self.start - 1:
            self._begin()

    def _begin(self) -> None:
        import torch

        try:
            self.pinned["start_bytes"] = _pinned(torch, reset_peak=True)
            wait_deliberately(
                lambda: torch.cuda.memory._record_memory_history(
                    "all", context="all", stacks="python", max_entries=MAX_ENTRIES
                )
            )
            self._on = True
        except Exception as exc:  # a recording problem must not lose the run
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        """End the window (also when the run stops inside it) and dump the snapshot."""
        if not self._on:
            return
        import torch

        self._on = False
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix="mrv2-memory-", suffix=".pickle", dir=self.out_dir)
            os.close(fd)
            wait_deliberately(lambda: torch.cuda.memory._dump_snapshot(path))
            self.path = path
            self.pinned["end_bytes"] = _pinned(torch)
            self.pinned["peak_bytes"] = _pinned(torch, key="allocated_bytes.peak")
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            torch.cuda.memory._record_memory_history(None)

    def perturbed_steps(self) -> list[int]:
        """The window's steps and the one after it (its start waited for the dump)."""
        return [*self.steps, self.steps[-1] + 1] if self.steps else []

    def summary(self) -> dict[str, Any]:
        return {
            "window": [self.start, self.count],
            "steps": self.steps,
            "file": self.path,
            "max_entries": MAX_ENTRIES,
            "pinned_host": self.pinned,
            "error": self.error,
        }


def _pinned(torch, key: str = "allocated_bytes.current", reset_peak: bool = False) -> int | None:
    """Bytes of the caching host allocator's pinned blocks (None where torch does not say)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return None
    try:
        if reset_peak and hasattr(torch.cuda, "reset_peak_host_memory_stats"):
            torch.cuda.reset_peak_host_memory_stats()
        return int(stats()[key])
    except (KeyError, RuntimeError):
        return None
