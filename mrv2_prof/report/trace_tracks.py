"""What goes on each track of the exported trace: the rows of ``analysis/trace_rows``, as slices.

Each generator turns one track's rows (in time order) into ``Slice``s (or counter events) in the
order ``chrome_trace.laminar`` needs: by start, the enclosing slice first. The track layout and
the flow form are described in ``trace_export``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from mrv2_prof.analysis.trace_rows import cpu_rows, gpu_rows, kernel_rows, rank_rows
from mrv2_prof.analysis.trace_window import TrackQuery
from mrv2_prof.probes.nvtx_ranges import DOMAIN, NVTX_NAMES, batch_shape
from mrv2_prof.report.chrome_trace import Event, Slice, us

CPU_PID, GPU_PID = 1, 2
RANK_PID = 10  # + rank: each tensor-parallel rank's own process track (rank_steps)
PHASE_TID = STREAM_TID = 1
FIRST_KERNEL_TID = 2
COUNTER_TID = 100
KERNEL_CATEGORY = "cuda_kernel"


def _args(step: int | None, payload: bool = True, **extra: Any) -> dict[str, Any]:
    """Slice args without NULLs; an NVTX range's ``payload`` is its step, as in nsys."""
    args: dict[str, Any] = {} if step is None else {"step": step}
    if payload and step is not None:
        args["payload"] = step
    for key, value in extra.items():
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            args[key] = value
    return args


def cpu_slices(q: TrackQuery) -> Iterator[Slice]:
    """The CPU phase spans; ``step`` slices carry the batch shape, ``execute`` the flow start."""
    for step, name, start, end, flow_out, reqs, tokens, prefill, decode, mode in cpu_rows(q):
        batch = None
        if None not in (reqs, tokens, prefill, mode):
            batch = batch_shape(reqs, tokens, prefill, mode)
        event: Event = {
            "name": NVTX_NAMES.get(name, name),
            "cat": DOMAIN,
            "pid": CPU_PID,
            "tid": PHASE_TID,
            "args": _args(
                step,
                num_reqs=reqs,
                num_tokens=tokens,
                num_prefill_tokens=prefill,
                num_decode_tokens=decode,
                graph_mode=mode,
                batch=batch,
            ),
        }
        if flow_out:
            event.update(bind_id=step + 1, flow_out=True)
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def rank_slices(q: TrackQuery, rank: int) -> Iterator[Slice]:
    """One tensor-parallel rank's step spans (``rank_steps``), with their collective time."""
    for step, start, end, comm in rank_rows(q, rank):
        event: Event = {
            "name": f"step {step}",
            "cat": DOMAIN,
            "pid": RANK_PID + rank,
            "tid": PHASE_TID,
            "args": _args(step, comm_us=None if comm is None else us(comm)),
        }
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def gpu_slices(q: TrackQuery) -> Iterator[Slice]:
    """Per step a GPU ``step`` slice (``gpu_start_ns``..``gpu_end_ns``, widened to hold the step's
    GPU spans, with the step's overlap, bubble, starved time and perturbed flag) around the GPU
    phase spans (each with its starved time: the device waiting for the host inside it); the
    first span of a step ends the flow from its CPU ``execute``."""
    for row in gpu_rows(q):
        step, name, start, end, _, flow_in, overlap, bubble, kind, prep, hidden, starved, pert = row
        event: Event = {
            "name": NVTX_NAMES.get(name, name),
            "cat": DOMAIN,
            "pid": GPU_PID,
            "tid": STREAM_TID,
            "args": _args(
                step,
                overlap_frac=overlap,
                bubble_ns=bubble,
                bubble_kind=kind,
                host_prep_ns=prep,
                hidden_prep_ns=hidden,
                starved_ns=starved,
                perturbed=pert or None,
            ),
        }
        if flow_in:
            event.update(bind_id=step + 1, flow_in=True)
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def kernel_slices(q: TrackQuery, stream: int, tid: int) -> Iterator[Slice]:
    """The kernel trace's kernels of one stream (``-1``: stream unknown), CUDA's names."""
    for step, phase, name, start, end in kernel_rows(q, stream):
        event: Event = {
            "name": name or "[kernel]",
            "cat": KERNEL_CATEGORY,
            "pid": GPU_PID,
            "tid": tid,
            "args": _args(step, payload=False, phase=phase),
        }
        yield Slice(start - q.origin_ns, end - q.origin_ns, event)


def counters(
    q: TrackQuery, pid: int, names: tuple[str, ...], rows: Iterable[tuple[Any, ...]]
) -> Iterator[Event]:
    """``C`` events, one per counter and row, in time order on the (pid, COUNTER_TID) track:
    ``rows`` are ``(t_ns, *values)``, a value per name of ``names``."""
    for t_ns, *values in rows:
        ts = us(t_ns - q.origin_ns)
        for name, value in zip(names, values, strict=True):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                yield {"ph": "C", "name": name, "pid": pid, "tid": COUNTER_TID, "ts": ts,
                       "args": {"value": value}}  # fmt: skip
