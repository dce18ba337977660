"""LiveStats: the runner-side aggregates behind each dashboard snapshot.

Hand-worked steps on a real ``RecordingProbe`` (its buffers drained in between, as the harness's
flush does), and one real quickstart run whose last snapshot must agree with the stored tables.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from mrv2_prof.pipeline.live_stats import LiveStats
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.store import Store
from mrv2_prof.views.snapshot import Snapshot

NS = 1_000_000_000
MISS = "num_tokens 600 > largest capture size 512"


@dataclass
class Req:
    request_id: str
    arrival_time: float  # s, perf_counter clock
    num_output_tokens: int
    num_prompt_tokens: int = 0  # what the prompt-token counter adds when it first schedules
    is_finished: bool = False
    finish_reason: str | None = None


@dataclass
class Result:
    updated: list[Req]
    write_stats: dict = field(default_factory=dict)


def engine(probe=None, device: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(
        num_waiting=0,
        num_running=1,
        num_kv_blocks_used=2,
        scheduler=SimpleNamespace(num_preemptions=0),
        probe=probe,
        info=SimpleNamespace(device=device),
    )


def step(probe: RecordingProbe, i: int, syncs=(), dispatch=None) -> None:
    """Record step ``i`` with its syncs ``(kind, site, blocked_ns)`` and one graph dispatch."""
    probe.step_begin(i)
    for kind, site, blocked_ns in syncs:
        probe.sync(kind, site, blocked_ns)
    if dispatch is not None:
        mode, hit, reason = dispatch
        probe.graph_dispatch(4, 8, "full", mode, hit, reason)
    probe.step_end(1, 4, 0, 0, 1, 2, 0, 0, dispatch[0] if dispatch else "none")


def test_syncs_graphs_and_tpot_over_steps_and_a_flush() -> None:
    probe = RecordingProbe(capacity=16)
    live = LiveStats("r", "label", num_requests=2, num_kv_blocks=10, probe=probe)
    a = Req("a", arrival_time=0.9, num_output_tokens=1)

    step(probe, 0, [("output_wait", "m/a.py:1", 2_000_000)], ("full", True, "replay"))
    live.on_step(Result([a]), 1 * NS)  # a's first token: TTFT 100 ms

    step(
        probe,
        1,
        [("implicit", "m/b.py:7", -1), ("output_wait", "m/a.py:1", 1_000_000)],
        ("none", False, MISS),
    )
    a.num_output_tokens, a.is_finished, a.finish_reason = 2, True, "length"
    live.on_step(Result([a]), 1 * NS + 10_000_000)  # TPOT (10 ms) / (2 - 1) = 10 ms

    probe.drain()  # the harness flush: the buffers start again at row 0
    step(
        probe,
        2,
        [("output_wait", "m/a.py:1", 3_000_000)] + [("implicit", "m/c.py:9", -1)] * 3,
        ("piecewise", True, "replay"),
    )
    live.on_step(Result([]), 2 * NS)

    s = live.snapshot(engine(probe))
    assert s.num_syncs == 7  # 1 + 2 + 4, every sync once
    assert s.sync_blocked_ns == 6_000_000  # implicit syncs have no blocked time
    assert s.top_sync_sites == (("m/a.py:1", 3), ("m/c.py:9", 3), ("m/b.py:7", 1))
    assert s.graph_mode_counts == (("full", 1), ("none", 1), ("piecewise", 1))
    assert s.graph_hit_rate == pytest.approx(2 / 3)
    assert s.top_fallback_reasons == ((MISS, 1),)
    assert s.ttft_ms_p50 == pytest.approx(100.0)
    assert s.tpot_ms_p50 == pytest.approx(10.0)
    assert s.tpot_ms_p99 == pytest.approx(10.0)
    assert s.itl_ms_p50 == pytest.approx(10.0)
    assert s.num_finished == 1
    assert s.device == "cpu"
    # GPU timeline fields stay at their defaults here (filled from the timeline elsewhere)
    assert (s.overlap_frac, s.bubble_host_bound_ns, s.bubble_other_ns) == (None, 0, 0)

    step(probe, 3, [("output_wait", "m/a.py:1", 0)], None)
    live.on_step(Result([]), 3 * NS)
    again = live.snapshot(engine(probe))
    assert again.num_syncs == 8  # nothing counted twice on the next look
    assert again.top_sync_sites[0] == ("m/a.py:1", 4)
    assert again.graph_mode_counts == s.graph_mode_counts
    assert pickle.loads(pickle.dumps(again)) == again  # crosses the process boundary


def test_the_engines_probe_is_found_at_the_first_snapshot() -> None:
    probe = RecordingProbe(capacity=16)
    live = LiveStats("r", "label", num_requests=1, num_kv_blocks=10)
    for i in range(3):  # before any snapshot: the rows wait in the probe's buffers
        step(probe, i, [("output_wait", "m/a.py:1", 1_000_000)], ("none", False, MISS))
        live.on_step(Result([]), i * NS)
    s = live.snapshot(engine(probe))
    assert (s.num_syncs, s.sync_blocked_ns) == (3, 3_000_000)
    assert s.graph_mode_counts == (("none", 3),)
    assert s.graph_hit_rate == 0.0
    assert s.top_fallback_reasons == ((MISS, 3),)


def test_an_aborted_request_adds_no_tpot_and_no_probe_means_no_counts() -> None:
    live = LiveStats("r", "label", num_requests=1, num_kv_blocks=10)
    r = Req("x", arrival_time=0.0, num_output_tokens=1)
    live.on_step(Result([r]), NS)
    r.num_output_tokens, r.is_finished, r.finish_reason = 3, True, "abort"
    live.on_step(Result([r]), 2 * NS)
    s = live.snapshot(engine(probe=None))
    assert s.tpot_ms_p50 is None and s.num_finished == 0
    assert (s.num_syncs, s.graph_hit_rate, s.graph_mode_counts) == (0, None, ())


def test_the_last_snapshot_of_a_real_run_agrees_with_the_store(run_in_process) -> None:
    job, sent = run_in_process()
    snapshots = [payload for kind, payload in sent if kind == "snapshot"]
    assert snapshots and all(isinstance(s, Snapshot) for s in snapshots)
    last = snapshots[-1]
    with Store.open(job.db_path, read_only=True) as store:
        con = store.connection
        (num_syncs,) = con.execute("SELECT count(*) FROM syncs").fetchone()
        modes = con.execute(
            "SELECT mode, count(*) FROM graph_dispatch GROUP BY mode ORDER BY 2 DESC, 1"
        ).fetchall()
        (hit_rate,) = con.execute("SELECT avg(hit::DOUBLE) FROM graph_dispatch").fetchone()
        (num_tpot,) = con.execute(
            "SELECT count(*) FROM requests "
            "WHERE finish_reason IN ('stop', 'length') AND output_tokens > 1"
        ).fetchone()
        (steps,) = con.execute("SELECT count(*) FROM steps").fetchone()
    assert last.num_syncs == num_syncs > 0  # the designed output wait of each step
    assert list(last.graph_mode_counts) == modes  # cudagraph_mode: none on the quickstart
    assert last.graph_hit_rate == hit_rate == 0.0
    assert last.steps == steps
    assert num_tpot > 0 and last.tpot_ms_p50 is not None and last.tpot_ms_p50 > 0
    assert last.device == "cpu"


def test_spec_slots_and_the_latest_decision_over_steps_and_a_flush() -> None:
    probe = RecordingProbe(capacity=16)
    live = LiveStats("r", "label", num_requests=1, num_kv_blocks=10, probe=probe)
    # (k, reserved, reclaimed, sat out, expected tokens, cost ratio) per step
    spec = [(2, 4, 0, 1, None, None), (2, 4, 3, 0, 2.5, 1.25), (0, 0, 2, 2, 1.1, 1.5)]
    for i, (k, reserved, reclaimed, sat_out, expected, cost) in enumerate(spec):
        probe.step_begin(i)
        probe.spec_step(k, reserved, [], reserved=reserved, reclaimed=reclaimed,
                        sat_out=sat_out, expected_tokens=expected, cost_ratio=cost)  # fmt: skip
        probe.step_end(1, 1 + reserved, 0, 0, 1, 2, 0, 0, "none")
        live.on_step(Result([]), i * NS)
        if i == 1:
            first = live.snapshot(engine(probe))
            probe.drain()  # the harness flush: the step rows start again at row 0
    # after steps 0-1: 8 reserved, 3 reclaimed, 1 sat out; k 2; the decision of step 1
    assert (first.spec_reserved_slots, first.spec_reclaimed_slots, first.spec_sat_out) == (8, 3, 1)
    assert (first.spec_k, first.spec_expected_tokens, first.spec_cost_ratio) == (2, 2.5, 1.25)
    s = live.snapshot(engine(probe))  # step 2 added, nothing counted twice
    assert (s.spec_reserved_slots, s.spec_reclaimed_slots, s.spec_sat_out) == (8, 5, 3)
    assert (s.spec_k, s.spec_expected_tokens, s.spec_cost_ratio) == (0, 1.1, 1.5)
    probe.step_begin(3)  # a step with no spec_step: its defaults change nothing
    probe.step_end(1, 1, 0, 0, 1, 2, 0, 0, "none")
    live.on_step(Result([]), 3 * NS)
    again = live.snapshot(engine(probe))
    assert (again.spec_reserved_slots, again.spec_k, again.spec_expected_tokens) == (8, 0, 1.1)


def test_tokens_left_counts_max_tokens_less_tokens_so_far() -> None:
    """Three requests of max_tokens 10, 5 and 4: a stop token ends ``a`` after 3 tokens (its 7
    others will not come), ``c`` is aborted before its first token."""
    live = LiveStats(
        "r", "label", num_requests=3, num_kv_blocks=10, max_tokens={"a": 10, "b": 5, "c": 4}
    )
    assert live.snapshot(engine()).tokens_left == 19
    a, b = Req("a", 0.0, 1), Req("b", 0.0, 1)
    live.on_step(Result([a, b]), NS)
    assert live.snapshot(engine()).tokens_left == 19 - 2
    a.num_output_tokens, b.num_output_tokens = 2, 2
    live.on_step(Result([a, b]), 2 * NS)
    assert live.snapshot(engine()).tokens_left == (10 - 2) + (5 - 2) + 4
    a.num_output_tokens, a.is_finished, a.finish_reason = 3, True, "stop"
    b.num_output_tokens = 3
    live.on_step(Result([a, b]), 3 * NS)
    live.on_abort("c")
    assert live.snapshot(engine()).tokens_left == 0 + (5 - 3) + 0
    assert LiveStats("r", "label", 1, 10).snapshot(engine()).tokens_left is None  # not given
