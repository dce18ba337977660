"""A small run database with hand-picked values for the run browser's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrv2_prof.store import Store

MS = 1_000_000


def _run(store: Store, run_id: str, label: str, device: str, started_at: str) -> None:
    store.begin_run(
        run_id,
        scenario_name=label,
        label=label,
        matrix_combo=None,
        scenario_yaml="name: " + label,
        device=device,
        versions={},
        started_ns=0,
        info={"dtype": "bfloat16", "num_kv_blocks": 64},
    )
    store.connection.execute(
        "UPDATE runs SET started_at = CAST(? AS TIMESTAMP) WHERE run_id = ?", [started_at, run_id]
    )


def _requests(store: Store, run_id: str, token_ms: dict[str, list[int]]) -> None:
    """Requests arriving at 0 whose tokens come at ``token_ms``; each finishes at its last."""
    ids = list(token_ms)
    store.append(
        run_id,
        "requests",
        {
            "req_id": ids,
            "arrival_ns": [0] * len(ids),
            "first_token_ns": [token_ms[r][0] * MS for r in ids],
            "finish_ns": [token_ms[r][-1] * MS for r in ids],
            "prompt_tokens": [8] * len(ids),
            "output_tokens": [len(token_ms[r]) for r in ids],
            "num_preemptions": [0] * len(ids),
            "finish_reason": ["length"] * len(ids),
            "cached_tokens": [0] * len(ids),
        },
    )
    store.append(
        run_id,
        "tokens",
        {
            "req_id": [r for r in ids for _ in token_ms[r]],
            "idx": [i for r in ids for i in range(len(token_ms[r]))],
            "t_ns": [t * MS for r in ids for t in token_ms[r]],
            "token_id": [7 for r in ids for _ in token_ms[r]],
        },
    )


def _steps(store: Store, run_id: str, modes: list[str], syncs_at: list[int]) -> None:
    n = len(modes)
    store.append(
        run_id,
        "steps",
        {
            "step": list(range(n)),
            "cpu_start_ns": [10 * MS * i for i in range(n)],
            "cpu_end_ns": [10 * MS * i + 2 * MS for i in range(n)],
            "num_reqs": [2] * n,
            "num_tokens": [2 + i for i in range(n)],
            "graph_mode": modes,
            "overlap_frac": [0.5 + 0.1 * (i % 3) for i in range(n)],
            "bubble_ns": [250_000 * i for i in range(n)],
            "bubble_kind": ["host_bound" if i % 2 else "other" for i in range(n)],
        },
    )
    store.append(
        run_id,
        "syncs",
        {
            "step": syncs_at,
            "t_ns": [0] * len(syncs_at),
            "kind": ["output_wait"] * len(syncs_at),
            "site": ["mrv2_prof/runner/worker/model_runner.py:1"] * len(syncs_at),
            "blocked_ns": [MS] * len(syncs_at),
        },
    )


@pytest.fixture
def runs_db(tmp_path: Path) -> Path:
    """Three runs, newest first: bbb222 (candidate), aaa111 (baseline), ccc333 (failed).

    baseline: tokens at 100/200/300 ms and 200/250/400 ms → 6 tokens in 0.4 s = 15.0 tok/s,
    ITL gaps 100, 100, 50, 150 ms → p99 = 100 + 0.97 × 50 = 148.5 ms; 5 steps, syncs in steps
    0, 0 and 3. candidate: tokens at 100/150/200 ms twice → 30.0 tok/s, every gap 50 ms;
    3 steps, one sync. crashed: no requests, no steps.
    """
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _run(store, "aaa111", "baseline", "cuda:0", "2025-01-02 10:00:00")
        _requests(store, "aaa111", {"r0": [100, 200, 300], "r1": [200, 250, 400]})
        _steps(store, "aaa111", ["full", "full", "piecewise", "none", "full"], [0, 0, 3])
        store.finish_run("aaa111", "completed", ended_ns=1)
        _run(store, "bbb222", "candidate", "cuda:0", "2025-01-02 11:00:00")
        _requests(store, "bbb222", {"r0": [100, 150, 200], "r1": [100, 150, 200]})
        _steps(store, "bbb222", ["full", "full", "full"], [1])
        store.finish_run("bbb222", "completed", ended_ns=1)
        _run(store, "ccc333", "crashed", "cpu", "2025-01-01 09:00:00")
        store.finish_run("ccc333", "failed", ended_ns=1, error="boom")
    return path
