"""Host waits from the CUDA runtime's own records, inside a kernel-trace window.

torch.profiler's trace holds every CUDA runtime call of the window, so a wait made below torch's
Python entry points (inside a C++ op or a library, where ``probes.host_waits`` cannot see it) is
there too: ``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaEventSynchronize``, and a
``cudaMemcpyAsync`` whose device-side copy is from or into pageable memory. ``trace_waits`` turns
each one made inside a step's host span into a ``syncs`` row (its duration is ``blocked_ns``)
unless a wait already recorded outside the trace covers it: the trace adds what the always-on
catchers missed and never counts a wait twice. The runtime record has no Python stack, so the
site is the phase the call fell in (``<kernel trace: forward>``).
"""

from __future__ import annotations

import bisect
from typing import Any

from mrv2_prof.probes.host_waits import DEVICE_SYNC, EVENT_SYNC, PAGEABLE_COPY, STREAM_SYNC

_SYNC_CALLS = {
    "cudaDeviceSynchronize": DEVICE_SYNC,
    "cudaStreamSynchronize": STREAM_SYNC,
    "cudaEventSynchronize": EVENT_SYNC,
}
_COPY_CALLS = ("cudaMemcpyAsync", "cudaMemcpy", "cuMemcpyAsync", "cuMemcpyHtoDAsync_v2",
               "cuMemcpyDtoHAsync_v2")  # fmt: skip
KNOWN_SLACK_NS = 50_000  # a recorded wait's stamp may precede the runtime call by this much


def trace_site(phase: str | None) -> str:
    return f"<kernel trace: {phase or 'step'}>"


def trace_waits(
    events: list[dict[str, Any]],
    offset_ns: int,
    lookup,
    known: list[tuple[int, int]],
) -> list[tuple[int, int, str, str, int]]:
    """``(step, t_ns, kind, site, blocked_ns)`` rows of the waits in ``events`` (Chrome trace
    events; profiler µs + ``offset_ns`` = ``perf_counter_ns``). ``lookup(t_ns)`` gives the
    ``(step, phase)`` of a host time (step -1: outside every step); ``known`` are the
    ``(start_ns, end_ns)`` of the waits recorded outside the trace."""
    pageable = set()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy" and "Pageable" in str(e.get("name")):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                pageable.add(int(corr))
    known = sorted(known)
    starts = [s for s, _ in known]
    rows = []
    for e in events:
        name = e.get("name")
        if e.get("ph") != "X":
            continue
        kind = _SYNC_CALLS.get(name)
        if kind is None and name in _COPY_CALLS:
            corr = (e.get("args") or {}).get("correlation")
            kind = PAGEABLE_COPY if corr is not None and int(corr) in pageable else None
        if kind is None:
            continue
        t0 = round(float(e["ts"]) * 1000) + offset_ns
        t1 = t0 + round(float(e.get("dur", 0)) * 1000)
        step, phase = lookup(t0)
        if step < 0 or _covered(t0, t1, known, starts):
            continue
        rows.append((step, t0, kind, trace_site(phase), t1 - t0))
    return rows


def _covered(t0: int, t1: int, known: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether a recorded wait overlaps [t0, t1] (its start moved ``KNOWN_SLACK_NS`` earlier:
    the debug mode's warning and a wrapper's clock come before the runtime call)."""
    i = bisect.bisect_right(starts, t1)
    return any(max(e, s + KNOWN_SLACK_NS) >= t0 for s, e in known[:i])
