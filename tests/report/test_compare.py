"""`mrv2-prof compare`: gate metrics of two hand-made runs side by side (values: gate_runs.py)."""

from __future__ import annotations

import json

import pytest
from gate_runs import add_base, add_slight, add_worse, make_db
from typer.testing import CliRunner

from mrv2_prof.analysis.gate_metrics import METRICS
from mrv2_prof.cli import app

runner = CliRunner()

BASE = {
    "p50_ttft": 15, "p95_ttft": 19.5, "p99_ttft": 19.9,
    "p50_tpot": 10, "p95_tpot": 10, "p99_tpot": 10,
    "p50_itl": 10, "p95_itl": 10, "p99_itl": 10,
    "req_throughput": 40, "tok_throughput": 160, "peak_gpu_mem": 3072,
    "overlap": 0.5, "host_bound_bubble_ms": 5, "sync_count": 3, "graph_hit_rate": 0.75,
    "capture_s": 2, "startup_s": 10, "errors": 0, "aborts": 0, "preemptions": 0,
    "compiles_after_warmup": 0,
    "mean_acceptance_length": 2.25, "draft_time_share": 0.25,
    "spec_sat_out_steps": 0, "spec_reclaimed_share": 0.375,
    "peak_kv_usage": 0.5, "host_cpu_util": 1.0, "decode_roofline": 0.5,
    "joules_per_output_token": 0.1,
}  # fmt: skip
WORSE = {
    "p50_ttft": 15, "p95_ttft": 19.5, "p99_ttft": 19.9,
    "p50_tpot": 12, "p95_tpot": 13.8, "p99_tpot": 13.96,
    "p50_itl": 10, "p95_itl": 19, "p99_itl": 21.4,
    "req_throughput": 2 / 0.062, "tok_throughput": 8 / 0.062, "peak_gpu_mem": 4096,
    "overlap": 0.375, "host_bound_bubble_ms": 7, "sync_count": 5, "graph_hit_rate": 0.25,
    "capture_s": 3, "startup_s": 11, "errors": 1, "aborts": 1, "preemptions": 1,
    "compiles_after_warmup": 1,
    "mean_acceptance_length": 1.5, "draft_time_share": 0.5,
    "spec_sat_out_steps": 2, "spec_reclaimed_share": 0.75,
    "peak_kv_usage": 0.8, "host_cpu_util": 1.5, "decode_roofline": 0.25,
    "joules_per_output_token": 0.2,
}  # fmt: skip
UNCHANGED = {"p50_ttft", "p95_ttft", "p99_ttft", "p50_itl"}


@pytest.fixture
def db(tmp_path):
    return make_db(tmp_path / "runs.duckdb", add_base, add_worse, add_slight)


def _compare_json(*args: str) -> dict:
    result = runner.invoke(app, ["compare", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_metric_of_both_runs_with_its_change(db):
    data = _compare_json("aaa111", "bbb222", "--db", str(db))
    assert (data["a"]["run_id"], data["b"]["run_id"]) == ("aaa111", "bbb222")
    rows = {row["metric"]: row for row in data["metrics"]}
    assert list(rows) == list(METRICS)
    for name, row in rows.items():
        assert row["a"] == pytest.approx(BASE[name]), name
        assert row["b"] == pytest.approx(WORSE[name]), name
        assert row["delta"] == pytest.approx(WORSE[name] - BASE[name]), name
        assert row["verdict"] == ("same" if name in UNCHANGED else "worse"), name
    assert rows["p99_itl"]["delta_pct"] == pytest.approx(114.0)  # 11.4 / 10
    assert rows["sync_count"]["delta_pct"] == pytest.approx(200 / 3)
    assert rows["req_throughput"]["delta_pct"] == pytest.approx(100 * (50 / 62 - 1))
    assert rows["overlap"]["direction"] == "higher" and rows["p99_itl"]["unit"] == "ms"
    assert rows["errors"]["delta_pct"] is None  # from a baseline of 0


def test_the_other_way_round_every_change_is_better(db):
    rows = _compare_json("bbb222", "aaa111", "--db", str(db))["metrics"]
    verdicts = {row["metric"]: row["verdict"] for row in rows}
    assert verdicts == {n: "same" if n in UNCHANGED else "better" for n in METRICS}


def test_a_metric_one_run_did_not_measure_has_no_change(db):
    rows = {r["metric"]: r for r in _compare_json("aaa111", "ccc333", "--db", str(db))["metrics"]}
    for name in ("peak_gpu_mem", "overlap", "host_bound_bubble_ms"):
        assert rows[name]["b"] is None
        assert rows[name]["delta"] is rows[name]["verdict"] is None
    assert rows["p99_itl"]["b"] == pytest.approx(10.475)


def _table_line(db, run_b: str, metric: str) -> str:
    result = runner.invoke(app, ["compare", "aaa111", run_b, "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "gate[aaa111]" in result.stdout and "[completed]" in result.stdout
    return next(line for line in result.stdout.splitlines() if f" {metric} " in line)


def test_table_shows_values_deltas_and_marks(db):
    line = _table_line(db, "bbb222", "p99_itl")
    for cell in ("10.00 ms", "21.40 ms", "+11.40 ms", "+114.0%", "worse"):
        assert cell in line
    line = _table_line(db, "bbb222", "overlap (higher)")
    for cell in ("0.500", "0.375", "-0.125", "-25.0%", "worse"):
        assert cell in line
    assert "not measured" in _table_line(db, "ccc333", "overlap (higher)")


def test_runs_in_two_databases(tmp_path):
    db_a = make_db(tmp_path / "a.duckdb", add_base)
    db_b = make_db(tmp_path / "b.duckdb", add_worse)
    data = _compare_json("latest", "bbb", "--db", str(db_a), "--db-b", str(db_b))
    assert (data["a"]["run_id"], data["a"]["db"]) == ("aaa111", str(db_a))
    assert (data["b"]["run_id"], data["b"]["db"]) == ("bbb222", str(db_b))
    p99 = next(row for row in data["metrics"] if row["metric"] == "p99_itl")
    assert (p99["a"], p99["b"]) == (pytest.approx(10), pytest.approx(21.4))


def test_unknown_run_is_one_line_exit_2(db):
    result = runner.invoke(app, ["compare", "aaa111", "zzz", "--db", str(db)])
    assert result.exit_code == 2
    assert "no run 'zzz'" in result.stderr and len(result.stderr.strip().splitlines()) == 1
