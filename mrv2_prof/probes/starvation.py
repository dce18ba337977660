"""Busy vs waiting-for-host: the part of each device span during which the device was starved.

A device span (``probes.gpu_timeline``) is the stream time between two events, so it includes
time the device sat idle because the host had not yet enqueued the rest of the phase. That
*starved* time is reported apart (``spans.starved_ns``, ``steps.starved_ns``); busy = span −
starved, and starved time inside a step counts as a host-bound bubble.

Two rules, one per signal:

* **from the events** (always on): phase *i* is enqueued by the host between its marks' record
  times ``h[i]`` and ``h[i+1]`` and runs on the device between the times the stream reached them,
  ``d[i]`` and ``d[i+1]`` (``d[m] >= h[m]``: the stream cannot pass an event not yet recorded).
  After ``h[i+1]`` all of the phase is enqueued, so from ``max(d[i], h[i+1])`` to ``d[i+1]`` the
  device was busy. Before that the host was still enqueueing; the device may have starved there.
  The rule charges that window, ``max(0, min(d[i+1], h[i+1]) - d[i])``, as starved. It is exact
  (within a few % of the kernel trace on the H200) when the device is behind the host (window 0:
  nothing starved) and when the phase's device work becomes runnable only as the host's last
  call returns (a CUDA-graph replay: its kernels start after ``cudaGraphLaunch`` returns, so the
  device waits through the call), with a few small host-paced operations before it. In a
  host-paced eager phase, where the device runs each kernel as it is launched and keeps up, it
  charges the kernels' own time as starved too: there the value is an upper bound of the
  starvation (busy = span − starved a lower bound), off by the kernels' busy time (about 90 % of
  it eager, measured), except that the device's pick-up of the phase's end mark after the host
  recorded it (about 20 µs under a kernel trace) counts as busy; the kernel-trace window gives
  the exact value.
* **from the kernel trace** (exact, inside a kernel-trace window): starved = the span minus the
  time its device operations (kernels, copies) ran and the gaps whose next operation was already
  queued (``store.device_busy``). It runs after the run over the stored spans
  (``store.step_timeline.kernel_starved``).
"""

from __future__ import annotations

from collections.abc import Sequence


def starved_from_marks(host_ns: Sequence[int], device_ns: Sequence[int]) -> list[int]:
    """Starved ns of each phase between consecutive marks, by the events rule."""
    return [
        max(0, min(device_ns[i + 1], host_ns[i + 1]) - device_ns[i])
        for i in range(len(device_ns) - 1)
    ]
