"""CPU/GPU overlap and GPU bubbles per step, from the host spans and the GPU spans.

All times are ``perf_counter_ns`` (GPU times already mapped onto the CPU clock). For step N:

* host prep = from the start of its ``schedule`` to the end of enqueueing its GPU work
  (``execute``);
* GPU busy = from its first GPU operation to its last, or missing (-1) for a step that ran
  nothing on the GPU (an empty step, a CPU run);
* **overlap** of step N = the part of its host prep during which the GPU was busy with the
  previous step that had GPU work, over its host prep; per run, hidden prep over all prep;
* **bubble** before step N = max(0, GPU start of N − GPU end of that previous step). It is
  *host-bound* when the host finished enqueueing step N after the GPU had finished the previous
  step (the GPU waited for the host), *other* when the work was queued in time and the GPU was
  idle for another reason.

The device is not busy with step N where it was starved inside it (``probes.starvation``): host
prep that ran while the device waited for the host is not hidden. Starved time inside a step is
a host-bound bubble too; it is stored as ``steps.starved_ns``, beside the gap before the step.

Steps without GPU data get no overlap and no bubble; the step after them measures against the
last step that had GPU work, so the idle time across an empty step is not lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MISSING = -1  # a time that was not measured
HOST_BOUND, OTHER = "host_bound", "other"


def _meet(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def against_previous(
    prep_start: int,
    enqueue_end: int,
    gpu_start: int,
    prev_start: int,
    prev_end: int,
    prev_starved: Sequence[tuple[int, int]] = (),
) -> tuple[int, int, int, str | None]:
    """One step with GPU work against the GPU window of the previous one (less its starved
    windows, disjoint and inside it): its host prep, the hidden part of it, the bubble before it
    and the bubble's kind (None without a bubble)."""
    prep = enqueue_end - prep_start
    hidden = 0
    if prep > 0:
        hidden = _meet(prep_start, enqueue_end, prev_start, prev_end)
        hidden -= sum(_meet(prep_start, enqueue_end, a, b) for a, b in prev_starved)
    bubble = max(0, gpu_start - prev_end)
    kind = None if bubble == 0 else HOST_BOUND if enqueue_end > prev_end else OTHER
    return prep, hidden, bubble, kind


@dataclass
class StepOverlap:
    overlap_frac: np.ndarray  # [N] float64, NaN where undefined
    bubble_ns: np.ndarray  # [N] int64, -1 where undefined
    bubble_kind: list[str | None]  # [N] host-bound | other | None


def step_overlap(
    prep_start_ns: np.ndarray,  # [N] start of schedule
    enqueue_end_ns: np.ndarray,  # [N] end of enqueueing (execute)
    gpu_start_ns: np.ndarray,  # [N] first GPU operation, -1 if none
    gpu_end_ns: np.ndarray,  # [N] last GPU operation, -1 if none
    starved: Sequence[Sequence[tuple[int, int]]] | None = None,  # [N] starved windows
) -> StepOverlap:
    n = len(prep_start_ns)
    overlap = np.full(n, np.nan)
    bubble = np.full(n, MISSING, dtype=np.int64)
    kind: list[str | None] = [None] * n
    prev = None  # index of the last step with GPU work
    for i in range(n):
        has_gpu = gpu_start_ns[i] != MISSING and gpu_end_ns[i] != MISSING
        if prev is not None and has_gpu:
            prep, hidden, bubble[i], kind[i] = against_previous(
                int(prep_start_ns[i]),
                int(enqueue_end_ns[i]),
                int(gpu_start_ns[i]),
                int(gpu_start_ns[prev]),
                int(gpu_end_ns[prev]),
                starved[prev] if starved is not None else (),
            )
            if prep > 0:
                overlap[i] = hidden / prep
        if has_gpu:
            prev = i
    return StepOverlap(overlap, bubble, kind)


def step_columns(
    prep_start_ns: np.ndarray,
    enqueue_end_ns: np.ndarray,
    gpu_start_ns: np.ndarray,
    gpu_end_ns: np.ndarray,
    starved: Sequence[Sequence[tuple[int, int]]] | None = None,
) -> dict[str, list]:
    """The ``steps`` columns the timeline fills, per step; None where undefined (NULL).
    With ``starved`` (each step's starved windows) also ``starved_ns``."""
    ov = step_overlap(prep_start_ns, enqueue_end_ns, gpu_start_ns, gpu_end_ns, starved)
    prep = enqueue_end_ns - prep_start_ns
    defined = ~np.isnan(ov.overlap_frac)
    has_gpu = (gpu_start_ns != MISSING) & (gpu_end_ns != MISSING)

    def ns(values: np.ndarray, ok: np.ndarray) -> list[int | None]:
        return [int(v) if k else None for v, k in zip(values, ok, strict=True)]

    hidden = np.rint(np.nan_to_num(ov.overlap_frac) * prep)
    extra = {}
    if starved is not None:
        total = [sum(b - a for a, b in w) for w in starved]
        extra["starved_ns"] = [t if k else None for t, k in zip(total, has_gpu, strict=True)]
    return {
        "gpu_start_ns": ns(gpu_start_ns, has_gpu),
        "gpu_end_ns": ns(gpu_end_ns, has_gpu),
        "overlap_frac": [
            float(f) if k else None for f, k in zip(ov.overlap_frac, defined, strict=True)
        ],
        "bubble_ns": ns(ov.bubble_ns, ov.bubble_ns != MISSING),
        "bubble_kind": list(ov.bubble_kind),
        "host_prep_ns": ns(prep, defined),
        "hidden_prep_ns": ns(hidden, defined),
        **extra,
    }
