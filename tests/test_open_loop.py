"""The open-loop client on a fake clock: idle waits are never negative, arrivals are on time."""

from __future__ import annotations

from types import SimpleNamespace

from mrv2_prof.pipeline import open_loop


class FakeClock:
    """``time`` for ``open_loop``: sleeping advances it; a negative sleep fails as time.sleep's."""

    def __init__(self) -> None:
        self.now_ns = 0
        self.sleeps_ns: list[int] = []

    def perf_counter_ns(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        self.sleeps_ns.append(round(seconds * 1e9))
        self.now_ns += round(seconds * 1e9)


class FakeEngine:
    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.added = clock, []

    def add_request(self, req_id, prompt, params, arrival_time) -> None:
        self.added.append((req_id, self.clock.now_ns, arrival_time))

    def has_unfinished_requests(self) -> bool:
        return False  # every request is done at once: the loop only waits for arrivals


def _request(req_id: str, arrival_s: float) -> SimpleNamespace:
    return SimpleNamespace(
        req_id=req_id,
        arrival_s=arrival_s,
        prompt_token_ids=[1, 2, 3],
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        seed=None,
        max_tokens=4,
        logprobs=0,
        prompt_logprobs=0,
        ignore_eos=False,
        stop_token_ids=(),
        abort_after_tokens=None,
    )


def test_an_overdue_snapshot_after_a_slow_flush_does_not_sleep_a_negative_time(monkeypatch):
    """A flush of 400 ms leaves the next snapshot 150 ms overdue while the loop waits for an
    arrival at 3 s: the wait is clamped to 0 (it was a ValueError), the arrival still on time."""
    clock = FakeClock()
    monkeypatch.setattr(open_loop, "time", clock)
    engine = FakeEngine(clock)
    flushes, snapshots = [], []

    def slow_flush() -> None:
        flushes.append(clock.now_ns)
        clock.now_ns += 400_000_000

    live = SimpleNamespace(t0_ns=0, snapshot=lambda engine: clock.now_ns)
    probe = SimpleNamespace(fill=0.0)
    done = open_loop.drive(
        engine,
        [_request("r0", 3.0)],
        probe,
        slow_flush,
        lambda msg: snapshots.append(msg),
        live,
        should_stop=lambda: False,
    )
    assert done is True
    assert 0 in clock.sleeps_ns  # the overdue case happened and waited nothing
    assert all(0 <= s <= 50_000_000 for s in clock.sleeps_ns)
    ((req_id, added_ns, arrival_time),) = engine.added
    assert req_id == "r0" and arrival_time == 3.0
    assert 3_000_000_000 <= added_ns < 3_050_000_000  # within one 50 ms wait of its arrival
    assert flushes[0] == 1_000_000_000 and len(flushes) >= 2
