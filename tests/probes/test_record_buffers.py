"""The recording probe's buffers: they fill and grow without losing or reordering a row, and
recording allocates nothing per event once warm."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np

from mrv2_prof.probes import api
from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.columns import RecordBuffer
from mrv2_prof.probes.recording import RecordingProbe
from tests.probes.test_api import (  # noqa: F401 (clock: the fake clock fixture)
    COLUMNS,
    SITE,
    Scripted,
    clock,
    col,
    rows,
)


# ---- growth -------------------------------------------------------------------------------------
def test_record_buffer_fill_and_growth():
    b = RecordBuffer({"x": np.int64, "y": np.int32}, 2)
    assert b.fill == 0.0
    for i in range(2):
        j = b.reserve()
        b.x[j], b.y[j] = 10 * i, i
        b.n = j + 1
    assert b.capacity == 2 and b.fill == 1.0  # full, not yet grown
    j = b.reserve()
    assert (j, b.capacity) == (2, 4)
    b.x[j], b.y[j] = 20, 2
    b.n = j + 1
    assert b.fill == 0.75
    assert b.x is b.cols["x"] and b.y is b.cols["y"]
    assert b.reserve(9) == 3 and b.capacity == 12  # more than double: exactly what is asked
    out = b.take()
    assert out["x"].tolist() == [0, 10, 20] and out["y"].tolist() == [0, 1, 2]
    assert out["y"].dtype == np.int32 and b.n == 0 and b.fill == 0.0


def test_tiny_capacity_grows_without_losing_or_reordering(clock):  # noqa: F811
    p = RecordingProbe(capacity=2)
    s = Scripted(p, clock)
    counts = (1, 1, 1, 0, 1, 1, 0, 0, "none", 3, 6)
    assert p.fill == 0.0
    s.step_begin(0)
    s.step_end(*counts)
    assert p.fill == 0.5  # steps: 1 row of 2
    s.step_begin(1)
    s.step_end(*counts)
    assert p.fill == 1.0  # reported full before it grows
    s.step_begin(2)
    s.step_end(*counts)
    assert p.fill == 0.75 and p.steps.capacity == 4

    rng = random.Random(0)
    reqs = [f"r{i}" for i in range(37)]
    for r in reqs:
        p.request_arrival(r, 1, 2)
    n = 1000
    for i in range(n):
        s.token(rng.choice(reqs), i, 10 * i, 3 * i)
        s.staged_write(f"t{i % 5}", i, 2 * i, 3 * i, 4 * i)
        with s.phase(i % len(PHASES)):
            pass
        s.sync("k", f"s{i % 3}", i, i)
        s.graph_dispatch(i, i + 1, "full", "none", i % 2 == 0, "r")
    for i, r in enumerate(reqs):
        p.request_finish(r, i, 0, 0, "length", 0)
    assert p.tokens.capacity >= n > 16 * 2
    t = p.drain()
    for table in ("steps", "spans", "staged_writes", "graph_dispatch", "syncs", "tokens"):
        names = [c for c in COLUMNS[table] if c != "track"]
        assert rows(t, table, names) == s.want[table], table
    assert col(t, "requests", "req_id") == reqs
    assert col(t, "requests", "finish_ns") == list(range(len(reqs)))


# ---- no allocation per event --------------------------------------------------------------------
def record_events(p: RecordingProbe, n: int) -> None:
    """n events of each kind the runner records per step, called as the runner calls them."""
    for i in range(n):
        if i % 10 == 0:
            p.step_begin(i)
        p.begin(api.FORWARD)
        p.end(api.FORWARD)
        p.staged_write("block_table", 3, 12, 60, 2048)
        p.graph_dispatch(8, 8, "none", "none", False, "mode none requested")
        p.sync("output_wait", SITE, 1500)
        p.token("req-1", 1 + i, 123456789, 17)
        if i % 10 == 9:
            p.step_end(8, 8, 0, 0, 8, 40, 0, 1500, "none")


def traced_bytes(fn) -> int:
    """Bytes still allocated after ``fn()`` that were allocated during it (numpy included)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        fn()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


def test_recording_allocates_nothing_per_event_in_steady_state():
    p = RecordingProbe()
    p.request_arrival("req-1", 1, 4)
    record_events(p, 100)  # warm-up: interning, the first-token entry
    p.drain()
    cols = {id(b): dict(b.cols) for b in p._buffers}
    attrs = {id(b): {k: getattr(b, k) for k in b.cols} for b in p._buffers}
    n = 10_000
    grown = traced_bytes(lambda: record_events(p, n))
    assert p.spans.n == n + n // 10 and p.tokens.n == n and p.fill < 1.0
    for b in p._buffers:
        for k, arr in b.cols.items():
            assert arr is cols[id(b)][k] and getattr(b, k) is attrs[id(b)][k], k
    assert grown < 50_000, f"{grown} bytes retained for {n} events"


def test_the_allocation_bound_would_catch_a_tuple_per_event():
    """Calibrates the bound above: one small tuple per event retains far more than 50 KB."""
    sink = []
    grown = traced_bytes(lambda: sink.extend((i, i + 1, 1 << 40) for i in range(10_000)))
    assert grown > 500_000
