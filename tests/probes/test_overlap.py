"""Overlap and bubbles against hand-worked timelines (times in ns on the CPU clock)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mrv2_prof.probes.overlap import HOST_BOUND, OTHER, run_overlap, step_overlap

NAN = math.nan

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
