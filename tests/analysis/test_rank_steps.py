"""What ``rank_steps`` says about a tensor-parallel run, on hand-built rows."""

from __future__ import annotations

from pathlib import Path

from mrv2_prof.analysis.rank_steps import rank_line, rank_summary
from mrv2_prof.store import Store

MS = 1_000_000


def test_comm_share_skew_and_slowest_rank(tmp_path: Path):
    store = Store.open(tmp_path / "runs.duckdb")
    store.begin_run("tp", scenario_name="s", label="s", matrix_combo=None, scenario_yaml="",
                    device="cpu", versions={}, started_ns=0)  # fmt: skip
    # step: (rank 0 ms, rank 1 ms), comm ms 1 per rank-step; step 3 has rank 0 only
    durations = {0: (10, 12), 1: (8, 5), 2: (6, 6), 3: (4, None)}
    rows = []
    for step, (d0, d1) in durations.items():
        start = 100 * step * MS
        rows.append((0, step, start, start + d0 * MS, 1 * MS))
        if d1 is not None:
            rows.append((1, step, start, start + d1 * MS, 2 * MS))
    for row in rows:
        store.connection.execute("INSERT INTO rank_steps VALUES ('tp', ?, ?, ?, ?, ?)", row)
    r = rank_summary(store, "tp")
    # rank 0: 4 ms of collectives in 28 ms; rank 1: 6 ms in 23 ms
    assert r.ranks == 2 and r.steps == 3
    assert r.comm_share == {0: 4 / 28, 1: 6 / 23}
    # skews of the three complete steps: 2, 3, 0 ms -> median 2 ms
    assert r.skew_p50_ms == 2.0
    # slowest: step 0 rank 1, step 1 rank 0, step 2 a tie (rank 0)
    assert r.slowest == {0: 2, 1: 1}
    assert rank_line(r) == (
        "2 ranks; collectives rank 0 14%, rank 1 26% of step time; skew p50 2.00 ms "
        "(slowest: rank 0 in 67% of 3 steps)"
    )
    store.begin_run("one", scenario_name="s", label="s", matrix_combo=None, scenario_yaml="",
                    device="cpu", versions={}, started_ns=0)  # fmt: skip
    assert rank_summary(store, "one") is None
