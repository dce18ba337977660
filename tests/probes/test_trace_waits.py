"""Waits from the CUDA runtime's records in a kernel-trace window (hand-built trace events): each
synchronize call and pageable copy inside a step becomes a row, unless a wait recorded outside
the trace already covers it; waits outside every step (an idle anchor) are left out."""

from __future__ import annotations

from mrv2_prof.probes.trace_waits import known_interval, trace_waits

US = 1000


def lookup(t: int):
    if 1000 * US <= t <= 2000 * US:
        return 4, "forward"
    if 2000 * US < t <= 3000 * US:
        return 5, "sample"
    return -1, None


def x(name: str, ts: float, dur: float, corr: int | None = None, cat: str = "cuda_runtime"):
    e = {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_runtime_waits_inside_steps_become_rows_once():
    events = [
        x("cudaDeviceSynchronize", 1100, 40),  # missed by the catchers: a row
        x("cudaStreamSynchronize", 1300, 25),  # covered by a recorded wait (untimed)
        x("cudaStreamSynchronize", 1400, 25),  # inside a timed recorded wait
        x("cudaMemcpyAsync", 1401, 2, corr=6),  # inside it too (a blocking copy's two calls)
        x("Memcpy DtoH (Device -> Pageable)", 1402, 1, corr=6, cat="gpu_memcpy"),
        x("cudaDeviceSynchronize", 1433, 3),  # right after that timed wait: a row
        x("cudaMemcpyAsync", 1500, 12, corr=7),  # pageable (its device copy says so): a row
        x("Memcpy HtoD (Pageable -> Device)", 1510, 3, corr=7, cat="gpu_memcpy"),
        x("cudaMemcpyAsync", 1600, 2, corr=8),  # pinned: no wait
        x("Memcpy HtoD (Pinned -> Device)", 1601, 1, corr=8, cat="gpu_memcpy"),
        x("cudaEventSynchronize", 2500, 100),  # step 5's
        x("cudaStreamSynchronize", 5000, 30),  # outside every step: an idle anchor
        x("cudaLaunchKernel", 1200, 3, corr=9),  # not a wait
    ]
    # the debug mode's stamp 20 µs before the call; a wrapper that timed 1398..1430 µs
    known = [known_interval(1280 * US, -1), known_interval(1398 * US, 32 * US)]
    rows = trace_waits(events, 0, lookup, known)
    assert rows == [
        (4, 1100 * US, "device_sync", "<kernel trace: forward>", 40 * US),
        (4, 1433 * US, "device_sync", "<kernel trace: forward>", 3 * US),
        (4, 1500 * US, "copy", "<kernel trace: forward>", 12 * US),
        (5, 2500 * US, "event_sync", "<kernel trace: sample>", 100 * US),
    ]


def test_the_profiler_clock_offset_applies():
    rows = trace_waits([x("cudaDeviceSynchronize", 100, 5)], 1000 * US, lookup, [])
    assert rows == [(4, 1100 * US, "device_sync", "<kernel trace: forward>", 5 * US)]
