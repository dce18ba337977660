"""When the device was busy and when it waited for the host, from its operations' intervals.

A device span (``probes.gpu_timeline``) runs from the moment the stream reached one mark to the
moment it reached the next. Inside it the device ran operations (kernels, copies, fills: the
kernel trace's rows) with gaps between them. A gap counts as busy when the operation that ends it
was already queued as the gap began, that is its launch call had returned by then: the gap is
the device's own latency between queued work (between the kernels of one CUDA graph, all
launched by one call, every gap is that). Otherwise the device had nothing to run and the whole
gap is *waiting for the host* (starved), including the device's pick-up latency after a late
launch: host-paced launching costs that too. The gap before the span's end mark is the device
waiting for the host to record it. Without launch times every gap counts as waiting (busy = the
union of the operations).
"""

from __future__ import annotations

import numpy as np

NO_LAUNCH = np.iinfo(np.int64).max  # an operation whose launch is unknown: its gap is a wait


def union_ns(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    """Length of the union of the intervals ``[starts, ends)`` clipped to ``[lo, hi)``."""
    return sum(e - s for s, e in busy_intervals(starts, ends, None, lo, hi))


def busy_intervals(
    op_start: np.ndarray, op_end: np.ndarray, op_launch: np.ndarray | None, lo: int, hi: int
) -> list[tuple[int, int]]:
    """The disjoint parts of ``[lo, hi)`` during which the device was not waiting for the host:
    while an operation ran, and in a gap whose next operation had been launched (its launch call
    returned, ``op_launch``) before the gap began."""
    s = np.clip(np.asarray(op_start, dtype=np.int64), lo, hi)
    e = np.clip(np.asarray(op_end, dtype=np.int64), lo, hi)
    launch = (
        np.full(len(s), NO_LAUNCH, dtype=np.int64)
        if op_launch is None
        else np.asarray(op_launch, dtype=np.int64)
    )
    keep = e > s
    s, e, launch = s[keep], e[keep], launch[keep]
    order = np.argsort(s, kind="stable")
    out: list[tuple[int, int]] = []
    cur = lo
    for start, end, at in zip(
        s[order].tolist(), e[order].tolist(), launch[order].tolist(), strict=True
    ):
        if end <= cur:
            continue
        if start > cur:  # a gap: queued work (busy) or waiting for the host (starved)
            if at <= cur:
                _add(out, cur, start)
            cur = start
        _add(out, cur, end)
        cur = end
    return out


def _add(out: list[tuple[int, int]], start: int, end: int) -> None:
    if out and out[-1][1] >= start:
        out[-1] = (out[-1][0], max(out[-1][1], end))
    else:
        out.append((start, end))


def starved_from_kernels(
    span_start: np.ndarray,
    span_end: np.ndarray,
    op_start: np.ndarray,
    op_end: np.ndarray,
    op_launch: np.ndarray | None = None,
) -> np.ndarray:
    """Starved ns of each span ``[span_start, span_end)``: its length minus its busy time
    (``busy_intervals`` of the operations inside it; ``op_launch`` None: their union)."""
    order = np.argsort(op_start, kind="stable")
    op_start, op_end = np.asarray(op_start)[order], np.asarray(op_end)[order]
    launch = None if op_launch is None else np.asarray(op_launch)[order]
    reach = np.maximum.accumulate(op_end) if len(op_end) else op_end
    out = np.zeros(len(span_start), dtype=np.int64)
    for k, (lo, hi) in enumerate(zip(span_start, span_end, strict=True)):
        lo, hi = int(lo), int(hi)
        # operations that can touch [lo, hi): started before hi, and not all ended before lo
        a = int(np.searchsorted(reach, lo, side="right"))
        b = int(np.searchsorted(op_start, hi, side="left"))
        ops = slice(a, b)
        busy = busy_intervals(
            op_start[ops], op_end[ops], None if launch is None else launch[ops], lo, hi
        )
        out[k] = max(0, hi - lo - sum(e - s for s, e in busy))
    return out
