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
# A recorded wait without a time (the debug mode's warning comes just before the runtime call)
# covers the runtime calls that begin this soon after its stamp; a timed one (a wrapper's clock
# runs around its runtime calls) those that lie inside it, give or take the clock tie between the
# profiler and perf_counter_ns (about a µs).
UNTIMED_COVER_NS, CLOCK_TOLERANCE_NS = 50_000, 2_000


def known_interval(t_ns: int, blocked_ns: int) -> tuple[int, int, bool]:
    """``(start, end, timed)`` of a wait recorded outside the trace (``blocked_ns`` < 0:
    untimed, stamped when noticed)."""
    if blocked_ns < 0:
        return t_ns, t_ns + UNTIMED_COVER_NS, False
    return t_ns, t_ns + blocked_ns, True


def trace_site(phase: str | None) -> str:
    return f"<kernel trace: {phase or 'step'}>"


def trace_waits(
    events: list[dict[str, Any]],
    offset_ns: int,
    lookup,
    known: list[tuple[int, int, bool]],
    tolerance_ns: int = CLOCK_TOLERANCE_NS,
) -> list[tuple[int, int, str, str, int]]:
    """``(step, t_ns, kind, site, blocked_ns)`` rows of the waits in ``events`` (Chrome trace
    events; profiler µs + ``offset_ns`` = ``perf_counter_ns``). ``lookup(t_ns)`` gives the
    ``(step, phase)`` of a host time (step -1: outside every step); ``known`` are the
    ``known_interval`` of each wait recorded outside the trace: a runtime call inside a timed one
    (or beginning just after an untimed one's stamp) is that wait, give or take ``tolerance_ns``
    (the clock tie's uncertainty)."""
    pageable = set()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy" and "Pageable" in str(e.get("name")):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                pageable.add(int(corr))
    known = sorted(known)
    starts = [k[0] for k in known]
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
        if step < 0 or _covered(t0, t1, known, starts, tolerance_ns):
            continue
        rows.append((step, t0, kind, trace_site(phase), t1 - t0))
    return rows


def _covered(
    t0: int, t1: int, known: list[tuple[int, int, bool]], starts: list[int], tol: int
) -> bool:
    i = bisect.bisect_right(starts, t0 + tol)
    for s, e, timed in known[:i]:
        if timed and s - tol <= t0 and t1 <= e + tol:
            return True
        if not timed and s - tol <= t0 <= e:
            return True
    return False
