"""The switchable probes of one run, set up from the scenario's ``probes`` section.

``ProbeSession`` turns the section into what the run records on its device: the GPU timeline
(``cuda_events``), the copy audit (``copy_audit``), the sync finder (``sync_finder``), the
kernel trace window (``kernel_trace``) and the memory-history window (``memory_history``: its
file in ``memory_history/`` beside ``trace_dir``, the database's ``kernel_traces/``). A probe
asked for that the run cannot record (a CPU run has no CUDA events, syncs, kernels or device
memory) becomes a note on the run, never a silent skip. The harness calls ``after_step`` after
every engine step (the backstop of the GPU timeline's resolution, which runs in the runner's
output wait while the device is busy; drive the kernel trace and memory-history windows),
``at_idle`` while it waits for arrivals (re-anchor the GPU clock) and ``finish`` at the end
(resolve everything, take the last anchor, collect the facts to store).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from time import perf_counter_ns
from typing import Any

from mrv2_prof.probes.memory_history import CPU_NOTE, MemoryHistory
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.support import cpu_probe_notes

ANCHOR_INTERVAL_NS = 1_000_000_000  # at most one idle re-anchor a second


class ProbeSession:
    def __init__(
        self,
        probes: dict[str, Any],
        probe: RecordingProbe,
        device: str,
        notes: list[str],
        trace_dir: str | None = None,
    ) -> None:
        self.probe = probe
        self.cuda = device.startswith("cuda")
        self.timeline = None
        self.kernel_trace = None
        self.memory_history: MemoryHistory | None = None
        self._next_anchor = 0
        self.find_syncs = bool(probes.get("sync_finder")) and self.cuda
        if not self.cuda:
            notes.extend(cpu_probe_notes(probes))
            notes.extend([CPU_NOTE] if probes.get("memory_history") else [])
            return
        if probes.get("cuda_events"):
            from mrv2_prof.probes.gpu_timeline import GpuTimeline

            self.timeline = GpuTimeline(probe.gpu_span, with_starved=True)
            self.timeline.anchor()
            probe.timeline = self.timeline
        probe.audits_copies = bool(probes.get("copy_audit"))
        if probes.get("kernel_trace"):
            from mrv2_prof.probes.kernel_trace import KernelTrace

            start, count = probes.get("kernel_trace_steps") or (10, 20)
            self.kernel_trace = KernelTrace(start, count, trace_dir)
        if probes.get("memory_history"):
            start, count = probes["memory_history"]
            where = trace_dir and os.path.join(os.path.dirname(trace_dir), "memory_history")
            self.memory_history = MemoryHistory(start, count, where)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around the step loop: the sync finder's debug mode and the host-wait catcher, and the
        kernel trace's profiler closed however the loop ends."""
        with contextlib.ExitStack() as stack:
            if self.find_syncs:
                from mrv2_prof.probes.host_waits import HostWaits
                from mrv2_prof.probes.sync_finder import SyncFinder

                stack.enter_context(SyncFinder(self.probe))
                stack.enter_context(HostWaits(self.probe))
            try:
                yield
            finally:
                if self.kernel_trace is not None:
                    self.kernel_trace.stop()
                if self.memory_history is not None:
                    self.memory_history.stop()

    def after_step(self, step: int) -> None:
        if self.timeline is not None:  # resolved in the output wait; this is the backstop
            self.timeline.backstop()
        if self.kernel_trace is not None:
            self.kernel_trace.after_step(step, self.probe)
        if self.memory_history is not None:
            self.memory_history.after_step(step)

    def at_idle(self) -> None:
        now = perf_counter_ns()
        if self.timeline is not None and now >= self._next_anchor:
            self.timeline.anchor()
            self._next_anchor = now + ANCHOR_INTERVAL_NS

    def perturbed_steps(self) -> list[int]:
        """Steps a probe slowed: the kernel-trace window's, and the step after it (its start
        waited for the trace's export); the memory-history window's likewise."""
        kt = self.kernel_trace
        steps = [*kt.traced_steps, kt.traced_steps[-1] + 1] if kt and kt.traced_steps else []
        if self.memory_history is not None:
            steps += self.memory_history.perturbed_steps()
        return sorted(set(steps))

    def finish(self, facts: dict[str, Any]) -> None:
        """End of the run (also a stopped or failed one): the facts the run row keeps."""
        if self.timeline is not None:
            self.timeline.finish()
            facts["gpu_timeline"] = self.timeline.summary()
        if self.kernel_trace is not None:
            facts["kernel_trace"] = self.kernel_trace.summary()
        if self.memory_history is not None:
            facts["memory_history"] = self.memory_history.summary()
            facts["memory_history_file"] = self.memory_history.path
