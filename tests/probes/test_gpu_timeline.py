"""The GPU timeline on a fake device (CPU), then on the real one (``-m gpu``).

The fake device gives every event the device time the test scripts for it, reports it complete
once the test says the device got that far, and answers ``elapsed_time`` in float32 ms as CUDA
does. Host time is a fake ``perf_counter_ns``. Expected values are worked out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.probes import gpu_timeline as gt
from mrv2_prof.probes.api import G_END, G_FORWARD, G_PREPARE, G_SAMPLE

MARKS = (G_PREPARE, G_FORWARD, G_SAMPLE, G_END)


class FakeDevice:
    def __init__(self) -> None:
        self.script: list[int] = []  # device times handed to the next records, in order
        self.done_until = 0  # events at or before this device time are complete
        self.host_ns = 1_000_000
        self.records = 0

    def perf_counter_ns(self) -> int:
        return self.host_ns


class FakeEvent:
    def __init__(self, dev: FakeDevice) -> None:
        self.dev, self.t = dev, None

    def record(self) -> None:
        self.t = self.dev.script.pop(0)
        self.dev.records += 1

    def query(self) -> bool:
        return self.t is not None and self.t <= self.dev.done_until

    def synchronize(self) -> None:
        assert self.query(), "the fake device would wait forever"

    def elapsed_time(self, other: FakeEvent) -> float:
        return float(np.float32((other.t - self.t) / 1e6))


@pytest.fixture
def timeline(monkeypatch):
    dev = FakeDevice()
    monkeypatch.setattr(gt, "perf_counter_ns", dev.perf_counter_ns)
    spans: list[tuple[int, int, int, int]] = []

    class Fake(gt.GpuTimeline):
        def _new_event(self):
            return FakeEvent(dev)

        def _sync_stream(self) -> None:
            pass

        def _current_stream(self):
            return None  # the fake events record on the fake device

    def make(capacity: int = 4, anchor_device_ns: int = 500) -> gt.GpuTimeline:
        t = Fake(lambda *span: spans.append(span), capacity)
        dev.script.append(anchor_device_ns)
        dev.done_until = anchor_device_ns
        t.anchor()  # host 1_000_000 <-> device 500
        return t

    return make, dev, spans


def run_step(t, dev, step: int, device_times: list[int], prep_start: int = -1) -> None:
    dev.script.extend(device_times)
    for m in MARKS:
        t.mark(step, m, prep_start)


def test_spans_are_mapped_from_the_anchor_and_resolved_only_when_complete(timeline):
    make, dev, spans = timeline
    t = make()
    assert t.anchors[0].t_ns == 1_000_000 and t.anchors[0].drift_ns is None
    run_step(t, dev, 0, [600, 700, 1_700, 1_900])
    dev.done_until = 1_899  # the step's last event has not happened yet
    assert t.poll() == 0 and spans == []
    dev.done_until = 1_900
    assert t.poll() == 1
    # device 600 is 100 ns after the anchor's 500 -> host 1_000_100, and so on
    assert spans == [
        (0, 0, 1_000_100, 1_000_200),
        (0, 1, 1_000_200, 1_001_200),
        (0, 2, 1_001_200, 1_001_400),
    ]


def test_the_output_wait_resolves_only_while_the_device_is_busy_and_the_backstop_one_step(
    timeline,
):
    make, dev, spans = timeline
    t = make(capacity=8)
    run_step(t, dev, 0, [600, 700, 800, 900])
    run_step(t, dev, 1, [1_000, 1_100, 1_200, 1_300])
    ready = FakeEvent(dev)  # step 1's output, waited for next
    ready.t = 1_300
    dev.done_until = 1_300  # the device is done: the wait would not block
    assert t.poll_while(ready) == 0 and spans == [] and t.in_flight == 2
    assert t.backstop() == 0  # two in flight (async scheduling's steady state)
    run_step(t, dev, 2, [1_400, 1_500, 1_600, 1_700])
    assert t.backstop() == 1 and [s[0] for s in spans] == [0, 0, 0]  # one step, not the pool
    assert t.in_flight == 2
    ready.t = 1_700  # step 2's output: still running on the device
    assert t.poll_while(ready) == 1 and [s[0] for s in spans[3:]] == [1, 1, 1]
    dev.done_until = 1_700
    assert t.poll_while(ready) == 0 and t.in_flight == 1  # done: left to the backstop
    assert t.poll(limit=1) == 1 and t.poll() == 0 and t.in_flight == 0


def test_events_are_reused_only_after_their_step_resolved_and_a_full_pool_drops_a_step(timeline):
    make, dev, spans = timeline
    t = make(capacity=2)
    run_step(t, dev, 0, [600, 700, 800, 900])
    run_step(t, dev, 1, [1_000, 1_100, 1_200, 1_300])
    records = dev.records
    # both slots in flight, nothing complete: no wait, step 2 dropped and no event handed out
    assert [t.mark(2, m, -1) for m in MARKS] == [None] * 4
    assert t.dropped == 1 and dev.records == records
    dev.done_until = 900
    run_step(t, dev, 3, [1_400, 1_500, 1_600, 1_700])  # step 0 resolves, its slot is reused
    dev.done_until = 10_000
    t.poll()
    assert [s[0] for s in spans] == [0, 0, 0, 1, 1, 1, 3, 3, 3]
    assert spans[-1] == (3, 2, 1_000_000 + 1_600 - 500, 1_000_000 + 1_700 - 500)


def test_far_from_the_anchor_the_reference_moves_so_float32_stays_exact(timeline):
    make, dev, spans = timeline
    t = make()
    base = 500
    for k in range(12):  # one step every 2.5 s for 30 s
        d0 = base + 2_500_000_000 * (k + 1)
        run_step(t, dev, k, [d0, d0 + 1_001, d0 + 2_003, d0 + 3_007])
        dev.done_until = d0 + 3_007
        t.poll()
    start, end = spans[-1][2], spans[-1][3]
    d0 = base + 2_500_000_000 * 12
    # float32 ms straight from the anchor: ulp 2 µs at 30 s; from a reference at most ~2.5 s
    # back: ulp 0.25 µs, so within 0.13 µs
    assert abs(start - (1_000_000 + d0 + 2_003 - base)) <= 130
    assert abs(end - (1_000_000 + d0 + 3_007 - base)) <= 130
    assert end - start == pytest.approx(1_004, abs=130)


def test_a_new_anchor_records_the_drift_of_the_device_clock(timeline):
    make, dev, spans = timeline
    t = make()
    dev.host_ns = 1_000_000 + 2_000_000_000  # 2 s later on the host ...
    dev.script.append(500 + 2_000_000_000 + 20_000)  # ... the device counted 20 µs more
    dev.done_until = 10**12
    a = t.anchor()
    assert a.drift_ns == pytest.approx(-20_000, abs=130)  # float32 ms at 2 s: ulp 0.12 µs
    assert a.since_ns == 2_000_000_000
    assert t.summary()["max_abs_drift_ns"] == abs(a.drift_ns)


def test_live_totals_follow_the_overlap_definitions(timeline):
    make, dev, spans = timeline
    t = make()
    # step 0: host prep 100..200, device 1_000_100..1_000_600 (device 600..1_100)
    dev.host_ns = 1_000_200
    run_step(t, dev, 0, [600, 700, 800, 1_100], prep_start=1_000_100)
    # step 1 prepared 1_000_300..1_000_800 (300 of its 500 ns under step 0's device time),
    # device starts 1_000_900: a 300 ns bubble, host-bound (enqueued after step 0 ended)
    dev.host_ns = 1_000_800
    run_step(t, dev, 1, [1_400, 1_500, 1_600, 1_700], prep_start=1_000_300)
    dev.done_until = 2_000
    t.poll()
    live = t.live
    assert (live.prep_ns, live.hidden_ns) == (500, 300)
    assert live.overlap == pytest.approx(0.6)
    assert (live.host_bound_bubble_ns, live.other_bubble_ns) == (300, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_a_known_sleep_is_measured_and_the_clock_drift_is_small():
    spans = []
    t = gt.GpuTimeline(lambda *span: spans.append(span))
    t.anchor()
    for step in range(20):
        t.mark(step, G_PREPARE, -1)
        torch.cuda._sleep(200_000)  # ~100 µs of device time on an H200 (cycles)
        t.mark(step, G_FORWARD, -1)
        torch.cuda._sleep(400_000)
        t.mark(step, G_SAMPLE, -1)
        t.mark(step, G_END, -1)
        t.poll()
    t.finish()
    assert len(spans) == 60 and t.dropped == 0
    by_phase = {p: [e - s for st, q, s, e in spans if q == p] for p in range(3)}
    assert all(e >= s for _, _, s, e in spans)
    ratio = np.median(by_phase[1]) / np.median(by_phase[0])
    assert 1.6 < ratio < 2.4  # twice the cycles, twice the time
    assert abs(t.anchors[-1].drift_ns) < 50_000


def test_a_mark_hands_out_its_event_and_the_end_event_is_the_steps_completion(timeline):
    make, dev, spans = timeline
    t = make()
    dev.script.extend([600, 700, 800, 900])
    events = [t.mark(0, m, -1) for m in MARKS]
    assert len({id(e) for e in events}) == 4 and [e.t for e in events] == [600, 700, 800, 900]
    end = events[-1]  # the runner's output waits on it
    dev.done_until = 899
    assert not end.query() and t.poll() == 0
    dev.done_until = 900
    assert end.query() and t.poll() == 1 and spans[-1] == (0, 2, 1_000_300, 1_000_400)
