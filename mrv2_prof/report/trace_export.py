"""Chrome/Perfetto trace of one stored run: ``mrv2-prof export``.

Tracks (``pid``/``tid``):

* 1/1 ``phases``: the CPU phase spans as ``X`` slices named like the NVTX ranges (``NVTX_NAMES``,
  category = the NVTX domain ``mrv2``), args ``step`` and ``payload`` (= the step index, the NVTX
  payload); the ``step`` slice also carries the batch shape (the text of the step's NVTX mark).
  The run-start NVTX mark is an instant with the same message.
* 1/100 runner counters from ``steps`` at each step's CPU start: ``kv_used_blocks``,
  ``num_running``, ``num_waiting``.
* 2/1 ``compute stream``: the GPU phase spans (device time on the CPU clock) inside a GPU ``step``
  slice per step (from ``steps.gpu_start_ns``/``gpu_end_ns``, widened to hold the step's spans).
* 2/2… one track per CUDA stream of the kernel trace (kernel names are CUDA's).
* 2/100 NVML counters: ``gpu_util``, ``mem_used_bytes``, ``power_w``, ``sm_clock_mhz``.
* 3/1… ``requests``: a slice per request from arrival to finish on lanes, with its counts,
  latencies and decoded prompt and output text (``request_track``).

Counters are ``C`` events whose series is ``value``. Flows use the JSON flow v2 form that
Perfetto's JSON importer (and chrome://tracing) read: the step's CPU ``execute`` slice carries
``bind_id`` + ``flow_out`` and the step's first GPU span the same ``bind_id`` + ``flow_in``, so
each arrow is bound to exactly those two slices (no ``s``/``f`` events whose binding depends on
timestamps). Times are µs since ``otherData.origin_ns`` (a ``perf_counter_ns`` value: the run's
start, or an earlier stored event); ``otherData`` also holds the NVTX anchor and how to line the
trace up with an Nsight Systems capture of the same run.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import duckdb

from mrv2_prof import __version__
from mrv2_prof.analysis.trace_rows import (
    GPU_COUNTERS,
    RUNNER_COUNTERS,
    gpu_counter_rows,
    runner_counter_rows,
    track_counts,
)
from mrv2_prof.analysis.trace_window import TrackQuery, first_stored_ns, run_header, step_ids
from mrv2_prof.probes.nvtx_ranges import DOMAIN, RUN_START_MARK
from mrv2_prof.report.chrome_trace import Event, Slice, laminar, metadata, write_trace
from mrv2_prof.report.request_track import REQUEST_PID, request_lanes, request_slices
from mrv2_prof.report.trace_tracks import (
    COUNTER_TID,
    CPU_PID,
    FIRST_KERNEL_TID,
    GPU_PID,
    PHASE_TID,
    RANK_PID,
    STREAM_TID,
    counters,
    cpu_slices,
    gpu_slices,
    kernel_slices,
    rank_slices,
)
from mrv2_prof.store.db import Store, no_run_error

ANCHOR_MARK = RUN_START_MARK  # the run-start NVTX mark's message

_STEPS_RE = re.compile(r"\s*(-?\d+)?\s*:\s*(-?\d+)?\s*")


class ExportError(Exception):
    """Bad export input (a ``--steps`` the run cannot satisfy); ``str()`` is one line."""


def parse_steps(text: str) -> slice:
    """``A:B`` as a python slice over the run's steps: A included, B excluded, either may be
    left out, negative values count from the end (``-100:`` is the last 100 steps)."""
    match = _STEPS_RE.fullmatch(text)
    if match is None:
        raise ExportError(
            f"--steps {text!r}: expected A:B (a python slice of the run's steps: A included, "
            "B excluded, either may be left out), e.g. --steps 100:200"
        )
    start, stop = (int(g) if g is not None else None for g in match.groups())
    return slice(start, stop)


def slice_text(steps: slice) -> str:
    return (
        f"{'' if steps.start is None else steps.start}:{'' if steps.stop is None else steps.stop}"
    )


@dataclass(frozen=True)
class ExportResult:
    run_id: str
    num_events: int
    first_step: int | None  # the exported window of steps (None: the run has no steps)
    last_step: int | None
    gpu_timeline: bool


def export_trace(
    store: Store, run_id: str, out: TextIO, steps: slice | None = None
) -> ExportResult:
    """Write the trace of ``run_id`` (an exact id) to ``out``; ``steps`` selects a window."""
    con = store.connection
    row = run_header(con, run_id)
    if row is None:
        raise no_run_error(store.path, run_id)
    label, scenario_name, status, device, started_ns, ended_ns, info_json = row
    info = json.loads(info_json) if info_json else {}
    anchor_ns = info.get("nvtx_anchor_ns")
    window = _step_window(con, run_id, steps)
    q = TrackQuery(con, run_id, 0, window if steps is not None else None)
    q.origin_ns = _origin_ns(q, started_ns, anchor_ns)
    has = _availability(q)
    gpu_timeline = bool(has["gpu_spans"] or has["gpu_steps"])
    other: dict[str, Any] = {
        "exporter": f"mrv2-prof {__version__}",
        "run_id": run_id,
        "label": label,
        "scenario_name": scenario_name,
        "status": status,
        "device": device,
        "clock": "time.perf_counter_ns() (CLOCK_MONOTONIC), the clock of every stored *_ns value",
        "origin_ns": q.origin_ns,
        "ts": "µs since origin_ns: perf_counter_ns = origin_ns + round(ts * 1000)",
        "started_ns": started_ns,
        "ended_ns": ended_ns,
        "steps": None if window is None else {"first": window[0], "last": window[1]},
        "steps_selection": None if steps is None else slice_text(steps),
        "nvtx_domain": DOMAIN,
        "nvtx_anchor_ns": anchor_ns,
        "nvtx_anchor_mark": _anchor_mark(run_id, anchor_ns),
        "align_with_nsys": _alignment_text(run_id, q.origin_ns, anchor_ns),
        "flows": "JSON flow v2: CPU 'execute' slice (bind_id, flow_out) -> the step's first GPU "
        "span (same bind_id, flow_in); bind_id = step + 1",
        "gpu_timeline": gpu_timeline,
        "kernel_trace": bool(has["streams"]),
        "notes": _notes(device, info, gpu_timeline, has, anchor_ns),
    }
    events = _events(q, run_id, anchor_ns, has, gpu_timeline)
    stats = write_trace(out, events, other)
    return ExportResult(
        run_id,
        stats.num_events,
        None if window is None else window[0],
        None if window is None else window[1],
        gpu_timeline,
    )


def _step_window(
    con: duckdb.DuckDBPyConnection, run_id: str, steps: slice | None
) -> tuple[int, int] | None:
    """First and last step id (inclusive) that ``steps`` selects; None for a run without steps."""
    ids = step_ids(con, run_id)
    chosen = ids if steps is None else ids[steps]
    if len(chosen):
        return int(chosen[0]), int(chosen[-1])
    if steps is None:
        return None
    have = f"has {len(ids)} steps ({ids[0]}..{ids[-1]})" if len(ids) else "has no steps"
    raise ExportError(f"--steps {slice_text(steps)} selects no steps: run {run_id} {have}")


def _availability(q: TrackQuery) -> dict[str, Any]:
    """What the window holds beyond the CPU spans: it decides the tracks and the notes."""
    return {
        **track_counts(q),
        "request_lanes": request_lanes(q),
    }


def _origin_ns(q: TrackQuery, started_ns: int | None, anchor_ns: int | None) -> int:
    """The run's start, or the earliest stored time of the run if one came before it."""
    first = first_stored_ns(q)
    candidates = [t for t in (started_ns, anchor_ns, first) if t is not None]
    return int(min(candidates)) if candidates else 0


def _anchor_mark(run_id: str, anchor_ns: int | None) -> str | None:
    return None if anchor_ns is None else ANCHOR_MARK.format(run_id=run_id, t_ns=anchor_ns)


def _alignment_text(run_id: str, origin_ns: int, anchor_ns: int | None) -> str:
    if anchor_ns is None:
        return (
            "This run carries no NVTX anchor (probes.nvtx was off). Ranges still have the NVTX "
            f"names and payload = step index (domain {DOMAIN}); in an nsys capture match a "
            "'step' range by its payload."
        )
    return (
        f"In the Nsight Systems capture of this run find the NVTX mark "
        f"'{_anchor_mark(run_id, anchor_ns)}' (domain {DOMAIN}); at its nsys time T_mark the "
        f"run's clock read perf_counter_ns={anchor_ns}. An event at ts (µs) in this trace is at "
        f"nsys time T_mark + ({origin_ns} + ts*1000 - {anchor_ns}) ns. Ranges carry the NVTX "
        "names and payload = step index, so a step is found by its payload in both."
    )


def _notes(
    device: str | None, info: dict, gpu_timeline: bool, has: dict, anchor_ns: int | None
) -> list[str]:
    notes = []
    if not gpu_timeline:
        why = (
            f"the run was on {device}"
            if device and not device.startswith("cuda")
            else "the run stored no GPU spans (probes.cuda_events off?)"
        )
        notes.append(f"no GPU timeline: {why}; the trace has the CPU phase track and counters only")
    elif not has["streams"]:
        notes.append("no kernel tracks: the run took no kernel trace (probes.kernel_trace off)")
    if info.get("kernel_trace_file"):
        notes.append(f"full kernel trace: {info['kernel_trace_file']}")
    if anchor_ns is None:
        notes.append("no NVTX anchor mark: probes.nvtx was off for this run")
    return notes


def _events(
    q: TrackQuery, run_id: str, anchor_ns: int | None, has: dict[str, Any], gpu_timeline: bool
) -> Iterator[Event]:
    """Metadata first, then track after track, each in time order."""
    yield metadata(CPU_PID, PHASE_TID, "process_name", name="mrv2-prof runner (CPU)")
    yield metadata(CPU_PID, PHASE_TID, "process_sort_index", sort_index=CPU_PID)
    yield metadata(CPU_PID, PHASE_TID, "thread_name", name="phases")
    if has["step_counters"]:
        yield metadata(CPU_PID, COUNTER_TID, "thread_name", name="runner counters")
    streams = has["streams"]
    gpu = gpu_timeline or streams or has["gpu_samples"]
    if gpu:
        yield metadata(GPU_PID, STREAM_TID, "process_name", name="GPU")
        yield metadata(GPU_PID, STREAM_TID, "process_sort_index", sort_index=GPU_PID)
    if gpu_timeline:
        yield metadata(GPU_PID, STREAM_TID, "thread_name", name="compute stream (phase spans)")
    for i, stream in enumerate(streams):
        name = f"stream {stream} kernels" if stream >= 0 else "kernels (stream unknown)"
        yield metadata(GPU_PID, FIRST_KERNEL_TID + i, "thread_name", name=name)
    if has["gpu_samples"]:
        yield metadata(GPU_PID, COUNTER_TID, "thread_name", name="NVML")
    for rank in has["ranks"]:
        yield metadata(RANK_PID + rank, PHASE_TID, "process_name", name=f"rank {rank}")
        yield metadata(RANK_PID + rank, PHASE_TID, "process_sort_index", sort_index=RANK_PID + rank)
        yield metadata(RANK_PID + rank, PHASE_TID, "thread_name", name="steps (tensor parallel)")
    lanes = has["request_lanes"]
    if lanes:
        yield metadata(REQUEST_PID, 1, "process_name", name="requests")
        yield metadata(REQUEST_PID, 1, "process_sort_index", sort_index=REQUEST_PID)
        for lane in range(max(lanes) + 1):
            yield metadata(REQUEST_PID, 1 + lane, "thread_name", name=f"lane {lane}")

    cpu: Iterator[Slice] = cpu_slices(q)
    if anchor_ns is not None:
        at = anchor_ns - q.origin_ns
        mark = Slice(at, at, _anchor_event(run_id, anchor_ns), instant=True)
        cpu = heapq.merge(cpu, [mark], key=lambda s: (s.start_ns, -s.end_ns))
    yield from laminar(cpu)
    yield from counters(q, CPU_PID, RUNNER_COUNTERS, runner_counter_rows(q))
    if gpu_timeline:
        yield from laminar(gpu_slices(q))
    for i, stream in enumerate(streams):
        yield from laminar(kernel_slices(q, stream, FIRST_KERNEL_TID + i))
    if has["gpu_samples"]:
        yield from counters(q, GPU_PID, GPU_COUNTERS, gpu_counter_rows(q))
    for rank in has["ranks"]:
        yield from laminar(rank_slices(q, rank))
    if lanes:  # a lane's requests never overlap: no clipping needed
        yield from (s.to_event() for s in request_slices(q, lanes))


def _anchor_event(run_id: str, anchor_ns: int) -> Event:
    return {
        "name": ANCHOR_MARK.format(run_id=run_id, t_ns=anchor_ns),
        "cat": DOMAIN,
        "pid": CPU_PID,
        "tid": PHASE_TID,
        "args": {"perf_counter_ns": anchor_ns},
    }
