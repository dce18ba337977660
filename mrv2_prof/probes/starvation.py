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
  when the device is behind the host (window 0: nothing starved) and when the host is the only
  pace-setter of a phase with little device work (a phase whose kernels wait for the host's
  Python between launches, or a gap between a mark and the phase's first launch); it overstates
  starvation when the device has long kernels queued inside that window. The window lies at the
  head of the span, where such a gap is.
* **from the kernel trace** (exact, inside a kernel-trace window): starved = the span minus the
  time its device operations (kernels, copies) ran and the gaps between them after the next one
  had been launched (``store.device_busy``). It runs after the run over the stored spans
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
