"""Kernel trace (opt-in, ``probes.kernel_trace``): torch.profiler with CUDA activity for a window
of steps, kernels attributed to their step and phase.

Besides kernels, the stream's copies and fills (``Memcpy HtoD (Pinned -> Device)``) are rows
too: they are device busy time. The profiler starts before step ``start`` and stops after step
``start + count - 1``; its Chrome trace is kept as a file (``raw_path``). Attribution goes
through the launch: every kernel's ``correlation`` id names the runtime call that launched it
(``cudaLaunchKernel``, ``cuLaunchKernel`` for Triton, ``cudaGraphLaunch`` for a replayed graph:
all of its kernels get that call's step and phase); the call's host time falls inside one of the
step's CPU phase spans (``prepare``, ``forward``, ``sample``; else the step). Profiler time is
put on the ``perf_counter_ns`` clock with ``record_function`` anchors: ``perf_counter_ns`` is read
just before and just after each of ``ANCHOR_TRIES`` empty ranges, and the tightest pair's
midpoint is the midpoint of its range (the first range costs the profiler tens of µs, which a
single stamp inside it would add to every time). Each row also keeps when its launch call
*returned* (``launch_ns``): before that the device cannot have the operation, so a gap before it
is waiting for the host (a graph's kernels start only after ``cudaGraphLaunch`` returns: seen on
the H200, the call itself is host time the device waits through).

The profiler is CUPTI's one subscriber: a run under Nsight Systems cannot take a kernel trace
(the CLI refuses the combination). Tracing adds host time to every launch in the window, so the
window's steps are slower than the rest; the stored kernels say where the device time goes, not
how long the untraced steps took: they are the run's perturbed steps (``steps.perturbed``).

The window also catches the host waits the always-on catchers cannot see (``probes.trace_waits``:
the runtime's synchronize calls and pageable copies), written into the probe's ``syncs``.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from time import perf_counter_ns
from typing import Any

import numpy as np

from mrv2_prof.probes.api import FORWARD, PHASES, PREPARE, SAMPLE, STEP
from mrv2_prof.probes.columns import from_rows
from mrv2_prof.probes.recording import GPU_TRACK, RecordingProbe
from mrv2_prof.probes.sync_site import wait_deliberately
from mrv2_prof.probes.trace_waits import CLOCK_TOLERANCE_NS, known_interval, trace_waits

ANCHOR_NAME = "mrv2 kernel trace anchor"
ANCHOR_TRIES = 5
Anchor = int | list[tuple[int, int]]  # an anchor's start, or (before, after) stamps of each
_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaLaunchKernelExC",
             "cuLaunchKernelEx", "cudaGraphLaunch_v10000", "cudaMemcpyAsync", "cudaMemsetAsync",
             "cudaMemcpy", "cudaMemset")  # fmt: skip
# Device operations stored as ``kernels`` rows: kernels, and the copies and fills of the stream
# (device busy time too: the exact starvation rule counts them).
_DEVICE_OPS = ("kernel", "gpu_memcpy", "gpu_memset")
_PHASE_IDS = (PREPARE, FORWARD, SAMPLE)


class KernelTrace:
    def __init__(self, start: int, count: int, trace_dir: str | None = None) -> None:
        self.start, self.count = max(int(start), 0), max(int(count), 1)
        self.trace_dir = trace_dir or tempfile.gettempdir()
        self.raw_path: str | None = None
        self._prof = None
        self._anchor_ns: Anchor = -1
        self.anchor_uncertainty_ns = 0  # half the slack of the tightest anchor
        self._spans: list[tuple[int, int, int, int]] = []  # (start_ns, end_ns, step, phase id)
        self._known_waits: list[tuple[int, int, bool]] = []  # syncs recorded in the window
        self._probe: RecordingProbe | None = None
        self.traced_steps: list[int] = []
        self.waits_found = 0
        self.columns: dict[str, np.ndarray] | None = None
        self.launch_ns: np.ndarray | None = None  # host launch time of each row (-1: unknown)
        self.error: str | None = None
        self.steps_traced = 0
        if self.start == 0:
            self._begin()

    # ---- driven by the harness after every step -----------------------------------------------
    def after_step(self, step: int, probe: RecordingProbe) -> None:
        if self._prof is not None:
            self._probe = probe
            self._keep_spans(step, probe)
            self._keep_waits(step, probe)
            self.steps_traced += 1
            self.traced_steps.append(step)
            if step >= self.start + self.count - 1:
                self.stop()
        elif self.columns is None and self.error is None and step == self.start - 1:
            self._begin()

    def _begin(self) -> None:
        from torch.profiler import ProfilerActivity, profile, record_function

        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        wait_deliberately(self._prof.__enter__)  # the profiler's own syncs are not the run's
        stamps = []
        for _ in range(ANCHOR_TRIES):
            t0 = perf_counter_ns()
            with record_function(ANCHOR_NAME):
                pass
            stamps.append((t0, perf_counter_ns()))
        self._anchor_ns = stamps
        best = min(b - a for a, b in stamps)
        self.anchor_uncertainty_ns = best // 2

    def _keep_spans(self, step: int, probe: RecordingProbe) -> None:
        """The step's CPU spans, copied from the probe's buffer before a flush drains it."""
        b = probe.spans
        for i in range(b.n - 1, -1, -1):
            if b.track[i] == GPU_TRACK:
                continue  # device spans of earlier steps resolve after this step's host spans
            if b.step[i] != step:
                if b.step[i] < step:
                    break
                continue
            name = int(b.name[i])
            if name in _PHASE_IDS or name == STEP:
                self._spans.append((int(b.start_ns[i]), int(b.end_ns[i]), step, name))

    def _keep_waits(self, step: int, probe: RecordingProbe) -> None:
        b = probe.syncs
        for i in range(b.n - 1, -1, -1):
            if b.step[i] != step:
                break
            self._known_waits.append(known_interval(int(b.t_ns[i]), int(b.blocked_ns[i])))

    def stop(self) -> None:
        """End the window (also when the run stops inside it) and attribute the kernels."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        try:
            wait_deliberately(lambda: prof.__exit__(None, None, None))
            os.makedirs(self.trace_dir, exist_ok=True)
            fd, self.raw_path = tempfile.mkstemp(
                prefix="mrv2-kernels-", suffix=".json", dir=self.trace_dir
            )
            os.close(fd)
            prof.export_chrome_trace(self.raw_path)
            with open(self.raw_path) as f:
                events = json.load(f).get("traceEvents", [])
            rows, launches = _kernel_rows(events, self._spans, self._anchor_ns)
            self.columns = from_rows("kernels", rows)
            self.launch_ns = np.array(launches, dtype=np.int64)
            offset, lookup = _clock_and_lookup(events, self._spans, self._anchor_ns)
            tolerance = CLOCK_TOLERANCE_NS + self.anchor_uncertainty_ns
            waits = trace_waits(events, offset, lookup, self._known_waits, tolerance)
            self.waits_found = len(waits)
            if self._probe is not None:
                _record_waits(self._probe, waits)
        except Exception as exc:  # a profiler problem must not lose the run
            self.error = f"{type(exc).__name__}: {exc}"

    def summary(self) -> dict[str, Any]:
        n = 0 if self.columns is None else len(self.columns["name"])
        attributed = 0 if self.columns is None else int((self.columns["step"] >= 0).sum())
        return {
            "window": [self.start, self.count],
            "steps_traced": self.steps_traced,
            "kernels": n,
            "attributed": attributed,
            "steps": self.traced_steps,
            "waits_found": self.waits_found,
            "raw_trace": self.raw_path,
            "error": self.error,
        }


def _record_waits(probe: RecordingProbe, waits: list[tuple[int, int, str, str, int]]) -> None:
    """The trace's waits into the probe's ``syncs`` buffer, each with its own step."""
    b = probe.syncs
    for step, t_ns, kind, site, blocked_ns in waits:
        i = b.reserve()
        b.step[i], b.t_ns[i], b.blocked_ns[i] = step, t_ns, blocked_ns
        b.kind[i], b.site[i] = probe.intern(kind), probe.intern(site)
        b.n = i + 1


def attribute(
    events: list[dict[str, Any]], spans: list[tuple[int, int, int, int]], anchor_ns: Anchor
) -> dict[str, np.ndarray]:
    """``kernels`` columns from Chrome trace events of torch.profiler.

    ``spans`` are host (start_ns, end_ns, step, phase id) on the ``perf_counter_ns`` clock; the
    first event named ``ANCHOR_NAME`` began at ``anchor_ns`` (an int), or the events named so
    lay, in order, inside the ``(before, after)`` stamps of a list (the tightest one is used).
    -1 marks an unattributed step."""
    return from_rows("kernels", _kernel_rows(events, spans, anchor_ns)[0])


def _kernel_rows(
    events: list[dict[str, Any]], spans: list[tuple[int, int, int, int]], anchor_ns: Anchor
) -> tuple[list[tuple], list[int]]:
    """``kernels`` rows and when each one's launch call returned (-1: no launch record found).
    The call's start attributes the row to a step and phase (it lies inside the phase's span)."""
    offset, lookup = _clock_and_lookup(events, spans, anchor_ns)
    launch_ns: dict[int, tuple[int, int]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") in _LAUNCHES:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                t0 = round(float(e["ts"]) * 1000) + offset
                launch_ns[int(corr)] = (t0, t0 + round(float(e.get("dur", 0)) * 1000))
    rows, launches = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in _DEVICE_OPS:
            continue
        args = e.get("args") or {}
        call = launch_ns.get(int(args.get("correlation", -1)))
        step, phase = lookup(call[0]) if call is not None else (-1, None)
        start = round(float(e["ts"]) * 1000) + offset
        end = start + round(float(e.get("dur", 0)) * 1000)
        rows.append((step, phase, str(e.get("name")), start, end, int(args.get("stream", -1))))
        launches.append(-1 if call is None else call[1])
    return rows, launches


def clock_offset(events: list[dict[str, Any]], anchor_ns: Anchor) -> int:
    """profiler µs × 1000 + offset = ``perf_counter_ns`` (see ``attribute`` for ``anchor_ns``)."""
    anchors = sorted(
        (float(e["ts"]), float(e.get("dur", 0))) for e in events if e.get("name") == ANCHOR_NAME
    )
    if not anchors:
        raise ValueError("the kernel trace has no anchor event")
    if isinstance(anchor_ns, int):
        return anchor_ns - round(anchors[0][0] * 1000)
    if len(anchors) != len(anchor_ns):
        raise ValueError(f"{len(anchors)} anchor events in the trace for {len(anchor_ns)} stamps")
    i = min(range(len(anchor_ns)), key=lambda k: anchor_ns[k][1] - anchor_ns[k][0])
    (ts, dur), (before, after) = anchors[i], anchor_ns[i]
    return (before + after) // 2 - round((ts + dur / 2) * 1000)


def _clock_and_lookup(
    events: list[dict[str, Any]], spans: list[tuple[int, int, int, int]], anchor_ns: Anchor
):
    """The profiler-to-run clock offset (ns) and ``lookup(t_ns) -> (step, phase)`` over the
    host spans (-1, None outside every step)."""
    offset = clock_offset(events, anchor_ns)
    phases = sorted(s for s in spans if s[3] != STEP)
    steps = sorted(s for s in spans if s[3] == STEP)
    p_starts, s_starts = [s[0] for s in phases], [s[0] for s in steps]

    def lookup(t: int) -> tuple[int, str | None]:
        i = bisect.bisect_right(p_starts, t) - 1
        if i >= 0 and phases[i][0] <= t <= phases[i][1]:
            return phases[i][2], PHASES[phases[i][3]]
        i = bisect.bisect_right(s_starts, t) - 1
        if i >= 0 and steps[i][0] <= t <= steps[i][1]:
            return steps[i][2], "step"
        return -1, None

    return offset, lookup
