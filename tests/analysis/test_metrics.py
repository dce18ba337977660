"""run_summary against a hand-worked run: every expected number is derived in the comments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mrv2_prof.analysis.metrics import Percentiles, run_summary
from mrv2_prof.store import Store, StoreError

MS = 1_000_000  # ns
T0 = 5_000_000_000_000  # a realistic perf_counter_ns origin; only differences matter

# Run "abc123", times in ms after T0:
#   req  arrival first finish prompt out preempt reason cached  token times
#   r0      0     10    40    100    4     0    stop     32    10 20 30 40
#   r1      5     25    85     50    3     1    length    0    25 45 85
#   r2     20     50    60     30    2     2    abort    16    50 60
#   r3     30      -     -     20    0     0    (none)    0    -
#   r4     40     45    45     60    1     0    stop      0    45
REQUESTS = {
    "req_id": ["r0", "r1", "r2", "r3", "r4"],
    "arrival_ns": [T0 + ms * MS for ms in (0, 5, 20, 30, 40)],
    "first_token_ns": [T0 + 10 * MS, T0 + 25 * MS, T0 + 50 * MS, None, T0 + 45 * MS],
    "finish_ns": [T0 + 40 * MS, T0 + 85 * MS, T0 + 60 * MS, None, T0 + 45 * MS],
    "prompt_tokens": [100, 50, 30, 20, 60],
    "output_tokens": [4, 3, 2, 0, 1],
    "num_preemptions": [0, 1, 2, 0, 0],
    "finish_reason": ["stop", "length", "abort", None, "stop"],
    "cached_tokens": [32, 0, 16, 0, 0],
}
TOKEN_MS = {"r0": [10, 20, 30, 40], "r1": [25, 45, 85], "r2": [50, 60], "r4": [45]}


def _begin(store: Store, run_id: str, info: dict | None = None) -> None:
    store.begin_run(
        run_id,
        scenario_name="mix",
        label="mix[runner.cudagraph_mode=full]",
        matrix_combo={"runner.cudagraph_mode": "full"},
        scenario_yaml="name: mix\n",
        device="cpu",
        versions={},
        started_ns=T0,
        info=info,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "runs.duckdb")
    _begin(store, "abc123", info={"dtype": "float32", "notes": ["cpu: no cuda events"]})
    store.append("abc123", "requests", REQUESTS)
    # tokens stored in reverse order: ITL must order them by idx, not by insertion
    rows = [(req, idx, ms) for req, times in TOKEN_MS.items() for idx, ms in enumerate(times)]
    rows.reverse()
    store.append(
        "abc123",
        "tokens",
        {
            "req_id": [req for req, _, _ in rows],
            "idx": np.array([idx for _, idx, _ in rows], dtype=np.int32),
            "t_ns": np.array([T0 + ms * MS for _, _, ms in rows], dtype=np.int64),
            "token_id": np.arange(len(rows)),
        },
    )
    store.append("abc123", "steps", {"step": np.arange(3)})
    store.append(
        "abc123",
        "staged_writes",
        {
            "step": [0, 1],
            "tensor": ["block_table", "num_computed_tokens"],
            "staged_bytes": [96, 16],
            "dense_bytes": [4096, 4096],
        },
    )
    store.append("abc123", "syncs", {"step": [0, 2], "blocked_ns": [1_500_000, 500_000]})
    store.append(
        "abc123",
        "graph_dispatch",
        {
            "step": [0, 1, 2, 3],
            "hit": [1, 1, 0, 1],
            "mode": ["full", "piecewise", "none", "full"],
            "reason": ["a", "a", "prefill", "a"],
        },
    )

    # another run in the same file, with colliding request ids: must not leak into abc123
    _begin(store, "def456")
    store.append(
        "def456",
        "requests",
        {
            "req_id": ["r0"],
            "arrival_ns": [0],
            "first_token_ns": [900 * MS],
            "finish_ns": [9_000 * MS],
            "prompt_tokens": [1000],
            "output_tokens": [50],
            "finish_reason": ["stop"],
            "cached_tokens": [1000],
        },
    )
    store.append("def456", "tokens", {"req_id": ["r0", "r0"], "idx": [0, 1], "t_ns": [0, 10**12]})
    store.append("def456", "staged_writes", {"staged_bytes": [10**9], "dense_bytes": [10**9]})
    store.append("def456", "syncs", {"blocked_ns": [10**9]})
    store.append("def456", "graph_dispatch", {"hit": [False] * 10, "reason": ["other"] * 10})
    store.append("def456", "steps", {"step": np.arange(10)})
    yield store
    store.close()


def _assert_percentiles(got: Percentiles, p50, p90, p95, p99, mean, count, values) -> None:
    assert (got.p50, got.p90, got.p95, got.p99, got.mean) == pytest.approx(
        (p50, p90, p95, p99, mean)
    )
    assert got.count == count
    # cross-check of the hand-worked numbers against numpy's default (linear) percentile
    assert np.percentile(values, [50, 90, 95, 99]) == pytest.approx([p50, p90, p95, p99])
    assert np.mean(values) == pytest.approx(mean)


def test_run_summary_hand_worked(store: Store) -> None:
    s = run_summary(store, "abc123")
    assert (s.run_id, s.label, s.scenario_name, s.status, s.error, s.device) == (
        "abc123",
        "mix[runner.cudagraph_mode=full]",
        "mix",
        "running",
        None,
        "cpu",
    )
    assert s.info == {"dtype": "float32", "notes": ["cpu: no cuda events"]}

    # counts: 5 requests; completed r0, r1, r4; aborted r2; unfinished r3
    assert (s.num_requests, s.num_completed, s.num_aborted, s.num_unfinished) == (5, 3, 1, 1)
    assert s.steps == 3
    assert s.prompt_tokens == 100 + 50 + 30 + 20 + 60 == 260
    assert s.output_tokens == 4 + 3 + 2 + 0 + 1 == 10
    assert s.num_preemptions == 3

    # duration: last finish 85 ms (r1) - first arrival 0 ms (r0) = 0.085 s
    assert s.duration_s == pytest.approx(0.085)
    assert s.requests_per_s == pytest.approx(3 / 0.085)  # 35.29 completed requests/s
    assert s.output_tokens_per_s == pytest.approx(10 / 0.085)  # 117.6 tokens/s

    # TTFT over completed r0, r1, r4: 10, 20, 5 -> sorted 5, 10, 20; rank = q * (3 - 1)
    # p50 rank 1 -> 10; p90 rank 1.8 -> 10 + 0.8 * 10 = 18; p95 -> 19; p99 -> 19.8; mean 35/3
    _assert_percentiles(s.ttft_ms, 10, 18, 19, 19.8, 35 / 3, 3, [10, 20, 5])

    # TPOT: r0 (40 - 10) / 3 = 10; r1 (85 - 25) / 2 = 30; r4 has one token, so none
    # sorted 10, 30; rank = q: p50 20, p90 28, p95 29, p99 29.8; mean 20
    _assert_percentiles(s.tpot_ms, 20, 28, 29, 29.8, 20, 2, [10, 30])

    # ITL: r0 gaps 10, 10, 10; r1 gaps 20, 40; r4 none; r2's 10 is aborted, excluded
    # sorted 10, 10, 10, 20, 40; rank = 4q: p50 rank 2 -> 10; p90 rank 3.6 -> 20 + 0.6 * 20 = 32;
    # p95 rank 3.8 -> 36; p99 rank 3.96 -> 39.2; mean 90 / 5 = 18
    _assert_percentiles(s.itl_ms, 10, 32, 36, 39.2, 18, 5, [10, 10, 10, 20, 40])

    # E2E over r0, r1, r4: 40, 80, 5 -> sorted 5, 40, 80; rank = 2q
    # p50 40; p90 rank 1.8 -> 40 + 0.8 * 40 = 72; p95 76; p99 79.2; mean 125 / 3
    _assert_percentiles(s.e2e_ms, 40, 72, 76, 79.2, 125 / 3, 3, [40, 80, 5])

    # prefix cache: (32 + 16) cached of 260 prompt tokens
    assert s.prefix_cache_hit_rate == pytest.approx(48 / 260)
    assert (s.staged_bytes, s.dense_bytes) == (96 + 16, 2 * 4096)
    assert s.num_syncs == 2
    assert s.sync_blocked_ms == pytest.approx(2.0)  # 1.5 ms + 0.5 ms
    assert s.graph_hit_rate == pytest.approx(0.75)  # 3 hits of 4 dispatches
    assert s.graph_fallback_reason == "prefill"  # the reason of the one miss, not of hits
    assert s.graph_modes == {"full": 2, "none": 1, "piecewise": 1}  # by count, then name


def test_run_summary_of_an_empty_run(store: Store) -> None:
    _begin(store, "0a0a0a")
    store.finish_run("0a0a0a", "aborted", ended_ns=T0 + 1, error="KeyboardInterrupt")
    s = run_summary(store, "0a0a0a")
    assert (s.status, s.error, s.info) == ("aborted", "KeyboardInterrupt", {})
    assert (s.duration_s, s.requests_per_s, s.output_tokens_per_s) == (0.0, 0.0, 0.0)
    assert (s.num_requests, s.steps, s.num_syncs, s.staged_bytes) == (0, 0, 0, 0)
    none = Percentiles(p50=None, p90=None, p95=None, p99=None, mean=None, count=0)
    assert s.ttft_ms == s.tpot_ms == s.itl_ms == s.e2e_ms == none
    assert s.prefix_cache_hit_rate is None
    assert s.graph_hit_rate is None and s.graph_modes == {}


def test_run_summary_unknown_run(store: Store) -> None:
    with pytest.raises(StoreError, match="no run 'zzz999'"):
        run_summary(store, "zzz999")


def test_summary_graph_line(store: Store) -> None:
    """The summary's CUDA-graph line: share (never rounded to 100% when a step missed), the
    mode mix, the usual fallback and the capture cost from runs.info."""
    import dataclasses

    from mrv2_prof.analysis.summary import _graphs

    s = run_summary(store, "abc123")
    assert _graphs(s) == (
        "75% of steps replayed a graph (full 2, none 1, piecewise 1); most fallbacks: prefill"
    )
    info = {"num_graphs": 86, "capture_s": 3.86, "graph_memory_bytes": 126 * 2**20}
    s = dataclasses.replace(s, graph_hit_rate=255 / 256, info=info)
    text = _graphs(s)
    assert text.startswith("99.6% of steps replayed a graph")
    assert text.endswith("; 86 keys captured in 3.9 s, 126.0 MiB")
    info |= {"graph_keys_replayed": 2, "unused_capture_s": 3.5, "unused_graph_bytes": 2**20}
    text = _graphs(dataclasses.replace(s, info=info))
    assert text.endswith("126.0 MiB, 84 never replayed (3.5 s, 1.0 MiB)")
    text = _graphs(dataclasses.replace(s, info=info | {"sample_graph_replays": 1234}))
    assert text.endswith(
        "(3.5 s, 1.0 MiB); 1,234 FULL decode steps sampled in a graph (every FULL decode step "
        "builds its inputs in its graph)"
    )
    text = _graphs(dataclasses.replace(s, info=info | {"sample_graph_replays": 1}))
    assert "; 1 FULL decode step sampled in a graph" in text
    s = dataclasses.replace(s, graph_hit_rate=0.0, graph_fallback_reason="mode none requested")
    assert _graphs(dataclasses.replace(s, info={})) == (
        "0% of steps replayed a graph; most fallbacks: mode none requested"
    )


def test_run_overlap_and_bubbles_in_the_summary(store: Store) -> None:
    """Run overlap = hidden / all host prep over steps that have one; bubbles summed by kind.
    Hand-worked: prep 20 + 25 + 40 ns, hidden 20 + 10 + 0 -> 30/85; bubbles 0 + 16 (host) + 4."""
    from mrv2_prof.analysis.summary import _overlap

    s = run_summary(store, "abc123")  # the fixture's run has no GPU timeline
    assert (s.overlap, s.bubble_ms, s.host_bound_bubble_ms) == (None, None, None)
    assert s.peak_gpu_mem_bytes is None  # no NVML samples
    assert _overlap(s).startswith("- (no GPU timeline")
    _begin(store, "0b0b0b")
    store.append(
        "0b0b0b",
        "steps",
        {
            "step": [0, 1, 2, 3, 4],
            "host_prep_ns": [None, 20, 25, 40, None],
            "hidden_prep_ns": [None, 20, 10, 0, None],
            "bubble_ns": [None, 0, 16_000_000, 4_000_000, None],
            "bubble_kind": [None, None, "host_bound", "other", None],
        },
    )
    store.append("0b0b0b", "gpu_samples", {"t_ns": [1, 2, 3], "mem_used_bytes": [5, 9, None]})
    s = run_summary(store, "0b0b0b")
    assert s.peak_gpu_mem_bytes == 9
    assert s.overlap == pytest.approx(30 / 85)
    assert (s.bubble_ms, s.host_bound_bubble_ms) == (20.0, 16.0)
    assert _overlap(s) == (
        "35.3% of host prep hidden under GPU work; GPU idle between steps 20.0 ms "
        "(16.0 ms waiting for the host)"
    )


def test_starved_time_is_a_host_bound_bubble_and_perturbed_steps_are_left_out(store: Store):
    """Steps 0..3; step 2 is perturbed (a kernel-trace window, host 30..40 ms).
    Kept steps 0, 1, 3: prep 20 + 40 + 10, hidden 10 + 20 + 10 -> 40/70; gaps 2 (host) + 3
    (other) ms, starved 1 + 0.5 ms -> idle 6.5 ms, host-bound 2 + 1.5 = 3.5 ms.
    Syncs: 2 of step 1 (1 ms, 2 ms) kept, 1 of step 2 (8 ms) left out.
    ITL of r9: tokens at 10, 20, 35, 50 ms: the gap ending at 35 (inside step 2) is left out."""
    from mrv2_prof.analysis.summary import _overlap, _perturbed

    _begin(store, "p")
    store.append("p", "steps", {
        "step": [0, 1, 2, 3],
        "cpu_start_ns": [T0, T0 + 10 * MS, T0 + 30 * MS, T0 + 40 * MS],
        "cpu_end_ns": [T0 + 9 * MS, T0 + 29 * MS, T0 + 40 * MS, T0 + 50 * MS],
        "host_prep_ns": [20, 40, 100, 10], "hidden_prep_ns": [10, 20, 0, 10],
        "bubble_ns": [2 * MS, 3 * MS, 50 * MS, 0],
        "bubble_kind": ["host_bound", "other", "host_bound", None],
        "starved_ns": [MS, 0, 9 * MS, MS // 2], "perturbed": [False, False, True, False],
    })  # fmt: skip
    store.append("p", "syncs", {"step": [1, 1, 2], "blocked_ns": [MS, 2 * MS, 8 * MS]})
    store.append("p", "requests", {
        "req_id": ["r9"], "arrival_ns": [T0], "first_token_ns": [T0 + 10 * MS],
        "finish_ns": [T0 + 50 * MS], "prompt_tokens": [4], "output_tokens": [4],
        "num_preemptions": [0], "finish_reason": ["stop"], "cached_tokens": [0],
    })  # fmt: skip
    store.append("p", "tokens", {
        "req_id": ["r9"] * 4, "idx": np.arange(4, dtype=np.int32),
        "t_ns": np.array([T0 + ms * MS for ms in (10, 20, 35, 50)]), "token_id": np.arange(4),
    })  # fmt: skip
    s = run_summary(store, "p")
    assert s.overlap == pytest.approx(40 / 70)
    assert (s.bubble_ms, s.host_bound_bubble_ms, s.starved_ms) == (6.5, 3.5, 1.5)
    assert (s.num_syncs, s.sync_blocked_ms) == (2, 3.0)
    assert (s.itl_ms.count, s.itl_ms.p50) == (2, 12.5)  # gaps 10 and 15 ms
    assert s.perturbed_steps == 1 and s.steps == 4
    assert _perturbed(s) == (
        "1 perturbed steps (traced or capturing) left out of overlap, bubbles, syncs and ITL"
    )
    assert _overlap(s).endswith("(3.5 ms waiting for the host, 1.5 ms inside steps)")
    a = run_summary(store, "p", include_perturbed=True)
    # all four: prep 170, hidden 40; idle 55 + 10.5; host-bound 52 + 10.5; 3 syncs, 11 ms
    assert a.overlap == pytest.approx(40 / 170)
    assert (a.bubble_ms, a.host_bound_bubble_ms, a.starved_ms) == (65.5, 62.5, 10.5)
    assert (a.num_syncs, a.sync_blocked_ms, a.itl_ms.count) == (3, 11.0, 3)
    assert _perturbed(a) == "1 perturbed steps (traced or capturing) included"
