"""Busy vs waiting-for-host on hand-worked timelines: the events rule, the exact kernel rule,
the overlap that leaves starved time out of "hidden", and the write-back into the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mrv2_prof.probes import gpu_timeline as gt
from mrv2_prof.probes.overlap import against_previous, step_columns
from mrv2_prof.probes.starvation import starved_from_marks
from mrv2_prof.store import Store
from mrv2_prof.store.device_busy import busy_intervals, starved_from_kernels, union_ns
from mrv2_prof.store.step_timeline import kernel_starved, starved_windows


def test_the_events_rule_on_three_phases():
    # host records marks at 0, 100, 130, 200; the device reaches them at 10, 300, 305, 400.
    # prepare: the host enqueued until 100, the device started at 10 and was behind only
    #   after 100: starved 10..100 = 90 (the device had caught up; it waited for the host).
    # forward: the device started at 300, after the host had enqueued all of it (130): 0.
    # sample: started at 305, everything enqueued by 200: 0.
    assert starved_from_marks([0, 100, 130, 200], [10, 300, 305, 400]) == [90, 0, 0]
    # a host-paced sample phase: host 1000..1056, device 1002..1057 -> starved 1002..1056
    assert starved_from_marks([1000, 1056], [1002, 1057]) == [54]
    # a device behind the host at the start of every phase: nothing starved
    assert starved_from_marks([0, 5, 6, 7], [50, 80, 90, 95]) == [0, 0, 0]


def test_union_and_the_kernel_rule():
    # kernels [5,15) [10,12) [30,45) [60,70): in [0,40) busy 5..15 and 30..40 = 20 -> 20 starved;
    # in [50,100) busy 60..70 = 10 -> 40 starved; an empty span [100,120) -> 20 starved
    starts, ends = np.array([30, 5, 10, 60]), np.array([45, 15, 12, 70])
    assert union_ns(starts, ends, 0, 100) == 10 + 15 + 10
    assert union_ns(starts, ends, 6, 35) == 9 + 5
    got = starved_from_kernels(np.array([0, 50, 100]), np.array([40, 100, 120]), starts, ends)
    assert got.tolist() == [20, 40, 20]
    # a long kernel that began before the span covers all of it
    got = starved_from_kernels(
        np.array([10]), np.array([20]), np.array([0, 11]), np.array([30, 12])
    )
    assert got.tolist() == [0]


def test_a_gap_is_busy_only_when_its_next_operation_was_already_queued():
    # span 0..100; ops [10,20) launched (call returned) at 5, [30,40) at 25, [50,60) at 0
    # (queued long before: the gap 40..50 is the device's own latency, as inside a CUDA graph),
    # [62,64) at 61 (launched after the previous op ended: host-paced), nothing after 64 until
    # the end mark at 100.
    # gaps: 0..10 before the first op (no previous op: waiting), 20..30 (its op was launched at
    # 25, after the gap began at 20: waiting, pick-up latency included), 40..50 (queued at 0:
    # busy), 60..62 (launched at 61 > 60: waiting), 64..100 (the end mark: waiting)
    # waiting: 10 + 10 + 2 + 36 = 58; busy: 10..20, 30..60, 62..64 = 10 + 30 + 2 = 42
    starts, ends = np.array([10, 30, 50, 62]), np.array([20, 40, 60, 64])
    launches = np.array([5, 25, 0, 61])
    assert busy_intervals(starts, ends, launches, 0, 100) == [(10, 20), (30, 60), (62, 64)]
    got = starved_from_kernels(np.array([0]), np.array([100]), starts, ends, launches)
    assert got.tolist() == [58]
    # without launch times every gap is waiting: 100 - 32 = 68
    assert starved_from_kernels(np.array([0]), np.array([100]), starts, ends).tolist() == [68]


def test_host_prep_under_a_starved_window_is_not_hidden():
    # previous step on the device 100..500, starved 100..180 (waiting for the host);
    # the next step's host prep 150..400: under the device window 150..400 = 250, of which
    # 150..180 = 30 the device was starved -> hidden 220
    prep, hidden, bubble, kind = against_previous(150, 400, 600, 100, 500, [(100, 180)])
    # the bubble 500..600 is "other": the step was enqueued (400) before the device was done
    assert (prep, hidden, bubble, kind) == (250, 220, 100, "other")
    assert against_previous(150, 400, 600, 100, 500)[1] == 250


def test_step_columns_carry_the_starved_total():
    cols = step_columns(
        np.array([0, 150]), np.array([90, 400]), np.array([100, 600]), np.array([500, 700]),
        [[(100, 180), (300, 310)], []],
    )  # fmt: skip
    assert cols["starved_ns"] == [90, 0]
    # step 1's prep 150..400 under step 0's 100..500 less 150..180 and 300..310: 250-30-10
    assert cols["hidden_prep_ns"] == [None, 210]


class _Event:
    def __init__(self, dev) -> None:
        self.dev, self.t = dev, None

    def record(self) -> None:
        self.t = self.dev.pop(0)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return float(np.float32((other.t - self.t) / 1e6))


def test_the_timeline_hands_each_span_its_starved_time(monkeypatch):
    host = iter([1_000_000, 1_000_000, 1_000_100, 1_000_200, 1_000_230, 1_000_300, 1_000_300])
    monkeypatch.setattr(gt, "perf_counter_ns", lambda: next(host))
    device: list[int] = [500]  # the anchor: device 500 <-> host 1_000_000
    spans: list[tuple] = []

    class Fake(gt.GpuTimeline):
        def _new_event(self):
            return _Event(device)

        def _sync_stream(self) -> None:
            pass

        def _current_stream(self):
            return None  # the fake events record on the fake device

    t = Fake(lambda *span: spans.append(span), capacity=2, with_starved=True)
    t.anchor()
    # marks recorded at host 100, 200, 230, 300 (after the anchor); the device reaches them at
    # 110, 400, 405, 500 -> prepare starved 110..200 = 90, forward and sample 0
    device.extend([610, 900, 905, 1000])
    for m in range(4):
        t.mark(0, m, 1_000_050)
    t.poll()
    base = 1_000_000
    assert spans == [
        (0, 0, base + 110, base + 400, 90),
        (0, 1, base + 400, base + 405, 0),
        (0, 2, base + 405, base + 500, 0),
    ]
    assert t.live.starved_ns == 90


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "r.duckdb")
    s.begin_run("r", scenario_name="x", label="x", matrix_combo=None, scenario_yaml="",
                device="cuda", versions={}, started_ns=0)  # fmt: skip
    yield s
    s.close()


def test_a_kernel_window_replaces_the_events_value_with_the_exact_one(store):
    # step 1 (traced): forward 1000..2000 with kernels 1100..1500 and 1600..1900 -> starved 300;
    # sample 2000..2100 with a kernel 2050..2060 -> 90. Step 2 (not traced) keeps its 40.
    store.append("r", "spans", {
        "step": [1, 1, 2], "track": ["gpu"] * 3, "name": ["forward", "sample", "forward"],
        "start_ns": [1000, 2000, 3000], "end_ns": [2000, 2100, 3500],
        "starved_ns": [500, 80, 40],
    })  # fmt: skip
    store.append("r", "kernels", {
        "step": [1, 1, 1, 2], "phase": ["forward", "forward", "sample", "forward"],
        "name": ["a", "b", "c", "d"], "start_ns": [1100, 1600, 2050, 3010],
        "end_ns": [1500, 1900, 2060, 3490], "stream": [7, 7, 7, 7],
    })  # fmt: skip
    assert kernel_starved(store, "r", [1]) == 2
    rows = store.connection.execute(
        "SELECT step, name, starved_ns FROM spans ORDER BY step, start_ns"
    ).fetchall()
    assert rows == [(1, "forward", 300), (1, "sample", 90), (2, "forward", 40)]
    assert starved_windows(store, "r", np.array([0, 1, 2])) == [
        [],
        [(1000, 1300), (2000, 2090)],
        [(3000, 3040)],
    ]


def test_after_the_run_the_window_is_exact_perturbed_and_counted_per_step(store):
    """Steps 0..3, a kernel-trace window over steps 1..2 (step 3 perturbed too: it waited for
    the trace's export). Each step: host prep (schedule..execute) and one forward device span."""
    from types import SimpleNamespace

    from mrv2_prof.pipeline.probe_results import store_probe_results

    n = 4
    store.append("r", "steps", {"step": list(range(n))})
    cpu = []
    for s in range(n):  # schedule at 1000 s, execute ends at 1000 s + 400
        cpu += [(s, "schedule", 1000 * s, 1000 * s + 100), (s, "execute", 1000 * s + 100,
                                                               1000 * s + 400)]  # fmt: skip
    # device spans: step s at 1000 s + 500 .. 1000 s + 1300, events-rule starved 200 each
    store.append("r", "spans", {
        "step": [c[0] for c in cpu] + list(range(n)),
        "track": ["cpu"] * len(cpu) + ["gpu"] * n,
        "name": [c[1] for c in cpu] + ["forward"] * n,
        "start_ns": [c[2] for c in cpu] + [1000 * s + 500 for s in range(n)],
        "end_ns": [c[3] for c in cpu] + [1000 * s + 1300 for s in range(n)],
        "starved_ns": [None] * len(cpu) + [200] * n,
    })  # fmt: skip
    # kernels of step 1 (1500..2300): 1500..1600 and 1700..2300; step 2: none run in
    # 2500..3300 -> starved 800
    kernels = {"step": np.array([1, 1]), "phase": np.array(["forward", "forward"], dtype=object),
               "name": np.array(["a", "b"], dtype=object), "start_ns": np.array([1500, 1700]),
               "end_ns": np.array([1600, 2300]), "stream": np.array([7, 7])}  # fmt: skip
    # a launched at 1400, b at 1550: b was queued before the gap 1600..1700 began, so that gap
    # is the device's own latency, not waiting: step 1 starved 0
    kt = SimpleNamespace(columns=kernels, traced_steps=[1, 2], launch_ns=np.array([1400, 1550]))
    session = SimpleNamespace(kernel_trace=kt, timeline=object(), perturbed_steps=lambda: [1, 2, 3])
    store_probe_results(store, "r", session, {})
    rows = store.connection.execute(
        "SELECT step, starved_ns, perturbed, hidden_prep_ns FROM steps ORDER BY step"
    ).fetchall()
    # hidden: step s's prep 1000 s..1000 s+400 under step s-1's device span 1000 s-500..
    # 1000 s+300 less its starved head (1000 s-500 .. +starved): step 1: 1000..1300 minus
    # 500..700 -> 300; step 2: 2000..2300, nothing starved in step 1 -> 300; step 3: 3000..3300
    # minus 2500..3300 -> 0
    assert rows == [(0, 200, False, None), (1, 0, True, 300), (2, 800, True, 300),
                    (3, 200, True, 0)]  # fmt: skip


def test_a_step_that_captured_a_graph_on_first_use_is_perturbed(store):
    """``runner.piecewise_capture``: a PIECEWISE size captured by the step that first needs it
    puts the capture's time in that step's; its ``graph_captures`` row carries the step (-1:
    captured at start-up, no step perturbed). No probe window: only the capturing steps."""
    from types import SimpleNamespace

    from mrv2_prof.pipeline.probe_results import store_probe_results

    store.append("r", "steps", {"step": list(range(5))})
    store.append("r", "graph_captures", {
        "key": ["full:1", "full:2", "piecewise:16", "piecewise:32", "piecewise:8"],
        "mode": ["full", "full", "piecewise", "piecewise", "piecewise"],
        "num_tokens": [1, 2, 16, 32, 8], "capture_s": [0.01] * 5, "mem_bytes": [0] * 5,
        "step": [-1, -1, 0, 3, 3],  # two sizes captured by step 3
    })  # fmt: skip
    session = SimpleNamespace(kernel_trace=None, timeline=None, perturbed_steps=lambda: [])
    store_probe_results(store, "r", session, {})
    rows = store.connection.execute("SELECT step, perturbed FROM steps ORDER BY step").fetchall()
    assert rows == [(0, True), (1, False), (2, False), (3, True), (4, False)]
