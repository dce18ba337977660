"""A sampling profiler of the runner's Python stack (``probes.host_sampling_hz``).

A daemon thread wakes ``hz`` times a second, reads the step loop thread's frame from
``sys._current_frames()`` and records its stack (root first, ``qualname (file)`` per frame, in
the collapsed-stack format of flame graphs: frames joined by ``;``), stamped with the step and
the CPU phase the probe has open at that moment (``RecordingProbe.phase``: the innermost one;
``step`` inside a step but outside its phases, ``idle`` between steps). Started without a probe
(the harness starts it before the engine is built), it stamps its samples ``startup`` and step
-1 until ``follow`` hands it the run's probe: where start-up goes (torch's import, the weights,
the profiling run, the warm-up, the graph capture) is in the same table. Stacks are interned to
ids in the sampler's own table, so a sample is five numbers in a preallocated buffer;
``drain()`` hands the rows over as the ``host_samples`` table.

Why a thread and not py-spy: py-spy reads another process's memory (it needs ptrace rights and
an installed binary, neither of which a GPU host is sure to give), while a thread needs
nothing. The thread takes the GIL for each sample (tens of µs for a stack of a few dozen
frames); ``cost_ns`` sums what the samples cost, and the harness stores it with the run.
A sample falls where the step loop thread gave up the GIL: at the interpreter's switch
interval inside Python code, or on a call that releases it (a device wait, a sleep).
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns

import numpy as np

from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.columns import RecordBuffer, buffer_dtypes

IDLE = "idle"  # no phase open: the loop between steps, the harness
STARTUP = "startup"  # before the run's probe is followed: the runner's start-up
MAX_DEPTH = 128
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def frame_label(code) -> str:
    """``qualname (file)``: the file relative to the package's parent for mrv2_prof's own
    code, else its last two path components."""
    path = code.co_filename
    if path.startswith(_PACKAGE_ROOT):
        short = "mrv2_prof" + path[len(_PACKAGE_ROOT) :]
    else:
        short = "/".join(path.replace("\\", "/").split("/")[-2:])
    return f"{code.co_qualname} ({short})"


class HostSampler:
    """Samples the stack of the thread that created it (the step loop) ``hz`` times a second;
    ``probe`` None: start-up samples (``STARTUP``, step -1) until ``follow``."""

    def __init__(self, hz: float, probe=None, capacity: int = 1 << 12) -> None:
        if hz <= 0:
            raise ValueError(f"probes.host_sampling_hz must be > 0 to sample, got {hz}")
        self.period_s = 1.0 / hz
        self.probe = probe  # a RecordingProbe: its ``step`` and ``phase`` stamp each sample
        self.target = threading.get_ident()
        self.buffer = RecordBuffer(buffer_dtypes("host_samples"), capacity)
        self._labels: dict[object, str] = {}  # code object -> frame label
        self._stacks: dict[str, int] = {}
        self._stack_list: list[str] = []
        self._phases = [*PHASES, IDLE, STARTUP]
        self._lock = threading.Lock()  # the buffer: written here, swapped by the step loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mrv2-host-sampler", daemon=True)
        self.num_samples = 0
        self.cost_ns = 0

    def start(self) -> HostSampler:
        self._thread.start()
        return self

    def follow(self, probe) -> None:
        """From now on stamp samples with ``probe``'s step and phase: start-up is over."""
        self.probe = probe

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        """One sample of the target thread (skipped when it has no frame, e.g. it ended)."""
        t0 = perf_counter_ns()
        frame = sys._current_frames().get(self.target)
        if frame is None:
            return
        probe = self.probe
        if probe is None:
            step, phase = -1, len(PHASES) + 1  # STARTUP
        else:
            step, phase = probe.step, probe.phase
            phase = phase if phase >= 0 else len(PHASES)  # IDLE
        labels = []
        while frame is not None and len(labels) < MAX_DEPTH:
            code = frame.f_code
            label = self._labels.get(code)
            if label is None:
                label = self._labels[code] = frame_label(code)
            labels.append(label)
            frame = frame.f_back
        del frame
        stack = ";".join(reversed(labels))
        sid = self._stacks.get(stack)
        if sid is None:
            sid = self._stacks[stack] = len(self._stack_list)
            self._stack_list.append(stack)
        with self._lock:
            b = self.buffer
            i = b.reserve()
            b.step[i] = step
            b.t_ns[i] = t0
            b.phase[i] = phase
            b.stack[i] = sid
            b.depth[i] = len(labels)
            b.n = i + 1
        self.num_samples += 1
        self.cost_ns += perf_counter_ns() - t0

    def swap(self) -> dict[str, np.ndarray]:
        """The samples since the last hand-over, in the buffer's own arrays (no copy)."""
        with self._lock:
            return self.buffer.swap()

    def decode(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``swap``'s columns as ``host_samples`` rows, phase and stack as strings."""
        out = dict(cols)
        out["phase"] = np.array(self._phases, dtype=object)[cols["phase"]]
        out["stack"] = np.array([*self._stack_list, None], dtype=object)[cols["stack"]]
        return out

    def drain(self) -> dict[str, np.ndarray]:
        """The samples since the last drain, as ``host_samples`` columns."""
        return self.decode(self.swap())

    def facts(self) -> dict[str, float | int]:
        """What sampling cost, for ``runs.info``."""
        mean_us = self.cost_ns / self.num_samples / 1e3 if self.num_samples else 0.0
        return {
            "host_samples": self.num_samples,
            "host_sample_cost_us": round(mean_us, 2),
            "host_sampling_hz": round(1.0 / self.period_s, 3),
        }
