"""Overlap and bubbles against hand-worked timelines (times in ns on the CPU clock)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from mrv2_prof.probes.overlap import HOST_BOUND, OTHER, StepOverlap, step_overlap

NAN = math.nan


@dataclass
class RunOverlap:
    overlap: float | None  # hidden host prep / all host prep, over steps that have an overlap
    bubble_ns: int  # all GPU idle time between steps
    host_bound_bubble_ns: int
    other_bubble_ns: int


def run_overlap(
    prep_start_ns: np.ndarray,
    enqueue_end_ns: np.ndarray,
    per_step: StepOverlap,
) -> RunOverlap:
    """A run's totals from its per-step values: what the run summary's SQL (``store.metrics``)
    computes from the stored ``host_prep_ns``, ``hidden_prep_ns`` and ``bubble_*`` columns."""
    defined = ~np.isnan(per_step.overlap_frac)
    prep = (enqueue_end_ns - prep_start_ns)[defined]
    hidden = (per_step.overlap_frac[defined] * prep).sum()
    bubbles = np.where(per_step.bubble_ns > 0, per_step.bubble_ns, 0)
    kinds = per_step.bubble_kind
    host = sum(int(b) for b, k in zip(bubbles, kinds, strict=True) if k == HOST_BOUND)
    total = int(bubbles.sum())
    return RunOverlap(
        overlap=float(hidden / prep.sum()) if prep.sum() > 0 else None,
        bubble_ns=total,
        host_bound_bubble_ns=host,
        other_bubble_ns=total - host,
    )


# (name, steps as (prep start, enqueue end, gpu start, gpu end), per-step (overlap, bubble, kind),
#  run (overlap, bubble, host-bound bubble))
CASES = [
    (
        # synchronous: step 1 is prepared after the GPU finished step 0, nothing is hidden, and
        # the GPU waits 16 ns for the host
        "sync",
        [(0, 10, 12, 50), (55, 65, 66, 100)],
        [(NAN, -1, None), (0.0, 16, HOST_BOUND)],
        (0.0, 16, 16),
    ),
    (
        # async: step 1 is prepared entirely while step 0 runs (20 of 20 ns hidden); 10 of
        # step 2's 25 ns fall inside step 1's GPU time; no gaps on the GPU
        "async",
        [(0, 10, 10, 60), (20, 40, 60, 110), (45, 70, 110, 150)],
        [(NAN, -1, None), (1.0, 0, None), (0.4, 0, None)],
        (30 / 45, 0, 0),
    ),
    (
        # queued in time (enqueue ends at 30, the GPU is busy until 50) yet the GPU starts
        # step 1 only at 70: a 20 ns bubble that is not the host's fault
        "other",
        [(-5, 0, 0, 50), (10, 30, 70, 90)],
        [(NAN, -1, None), (1.0, 20, OTHER)],
        (1.0, 20, 0),
    ),
    (
        # step 1 ran nothing on the GPU: it has no overlap or bubble, and step 2 measures
        # against step 0, so the 32 ns the GPU sat idle across the empty step are kept
        "empty step",
        [(0, 5, 5, 40), (45, 47, -1, -1), (60, 70, 72, 90)],
        [(NAN, -1, None), (NAN, -1, None), (0.0, 32, HOST_BOUND)],
        (0.0, 32, 32),
    ),
    (
        # no GPU data at all (a CPU run): nothing is defined
        "cpu run",
        [(0, 5, -1, -1), (6, 9, -1, -1)],
        [(NAN, -1, None), (NAN, -1, None)],
        (None, 0, 0),
    ),
    (
        # partial overlap at the start of the prep: GPU busy [0, 30], prep [20, 60] -> 10/40
        "partial",
        [(-10, -5, 0, 30), (20, 60, 61, 80)],
        [(NAN, -1, None), (0.25, 31, HOST_BOUND)],
        (0.25, 31, 31),
    ),
]


@pytest.mark.parametrize("name, steps, want, run", CASES, ids=[c[0] for c in CASES])
def test_overlap_and_bubbles(name, steps, want, run):
    cols = [np.array(c, dtype=np.int64) for c in zip(*steps, strict=True)]
    got = step_overlap(*cols)
    for i, (overlap, bubble, kind) in enumerate(want):
        if math.isnan(overlap):
            assert math.isnan(got.overlap_frac[i]), (name, i)
        else:
            assert got.overlap_frac[i] == pytest.approx(overlap), (name, i)
        assert (got.bubble_ns[i], got.bubble_kind[i]) == (bubble, kind), (name, i)
    r = run_overlap(cols[0], cols[1], got)
    if run[0] is None:
        assert r.overlap is None
    else:
        assert r.overlap == pytest.approx(run[0])
    assert (r.bubble_ns, r.host_bound_bubble_ns, r.other_bubble_ns) == (
        run[1],
        run[2],
        run[1] - run[2],
    )


def test_step_columns_are_what_the_steps_table_gets_and_round_trip_through_the_store(tmp_path):
    """The async case above, through ``step_columns`` into a run's ``steps`` rows and read
    back from its spans with ``step_times``."""
    from mrv2_prof.probes.overlap import step_columns
    from mrv2_prof.store import Store
    from mrv2_prof.store.step_timeline import step_times, update_steps

    steps = [(0, 10, 10, 60), (20, 40, 60, 110), (45, 70, 110, 150), (80, 85, -1, -1)]
    with Store.open(tmp_path / "r.duckdb") as store:
        store.begin_run(
            "abc123", scenario_name="s", label="s", matrix_combo=None, scenario_yaml="",
            device="cuda:0", versions={}, started_ns=0,
        )  # fmt: skip
        store.append("abc123", "steps", {"step": [0, 1, 2, 3]})
        spans: dict[str, list] = {k: [] for k in ("step", "track", "name", "start_ns", "end_ns")}

        def span(step, track, name, start, end):
            for k, v in zip(spans, (step, track, name, start, end), strict=True):
                spans[k].append(v)

        for i, (prep, enq, g0, g1) in enumerate(steps):
            span(i, "cpu", "schedule", prep, prep + 2)
            span(i, "cpu", "execute", prep + 3, enq)
            if g0 >= 0:  # three device phases splitting [g0, g1]
                third = (g1 - g0) // 3
                span(i, "gpu", "prepare", g0, g0 + third)
                span(i, "gpu", "forward", g0 + third, g0 + 2 * third)
                span(i, "gpu", "sample", g0 + 2 * third, g1)
        store.append("abc123", "spans", spans)

        t = step_times(store, "abc123")
        assert t["prep_start_ns"].tolist() == [s[0] for s in steps]
        assert t["enqueue_end_ns"].tolist() == [s[1] for s in steps]
        assert t["gpu_start_ns"].tolist() == [s[2] for s in steps]
        assert t["gpu_end_ns"].tolist() == [s[3] for s in steps]

        cols = step_columns(*(t[k] for k in ("prep_start_ns", "enqueue_end_ns",
                                             "gpu_start_ns", "gpu_end_ns")))  # fmt: skip
        update_steps(store, "abc123", t["step"], cols)
        got = store.connection.execute(
            "SELECT step, gpu_start_ns, gpu_end_ns, overlap_frac, bubble_ns, bubble_kind, "
            "host_prep_ns, hidden_prep_ns FROM steps ORDER BY step"
        ).fetchall()
    assert got == [
        (0, 10, 60, None, None, None, None, None),
        (1, 60, 110, 1.0, 0, None, 20, 20),  # 20 of 20 ns of prep hidden under step 0
        (2, 110, 150, 0.4, 0, None, 25, 10),
        (3, None, None, None, None, None, None, None),  # an empty step: no device work
    ]
