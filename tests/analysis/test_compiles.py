"""Compiles after warm-up on a hand-made run: what ``late_compiles`` reads, the finding's text,
the gate metric, and the gate failing a candidate that compiles where the baseline did not."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mrv2_prof.analysis.compiles import late_compiles
from mrv2_prof.analysis.findings import run_findings
from mrv2_prof.analysis.gate_metrics import METRICS, gate_metrics
from mrv2_prof.cli import app
from mrv2_prof.store import Store

MS = 1_000_000
T0 = 7_000_000_000_000

# Start-up compiled two kernels (step -1, not counted); step 50 compiled the staged-write apply
# (400 ms) and step 61 the state advance (240 ms): 2 compiles after warm-up, 640 ms.
COMPILES = [
    (-1, "_prepare_inputs_kernel", "BLOCK=128; int32@16, =1", 900.0, False),
    (-1, "_advance_kernel", "int64@16, int32@16", 300.0, False),
    (50, "_apply_packed_writes_kernel", "BLOCK=256; float64@16, i32, int32@16, i32", 400.0, True),
    (61, "_advance_kernel", "int64, int32@16", 240.0, True),
]


def _add(store: Store, run_id: str, compiles: list[tuple]) -> None:
    store.begin_run(
        run_id, scenario_name="c", label=run_id, matrix_combo=None, scenario_yaml="name: c\n",
        device="cuda:0", versions={}, started_ns=T0,
    )  # fmt: skip
    store.append(
        run_id,
        "requests",
        {"req_id": ["r0"], "arrival_ns": [T0], "first_token_ns": [T0 + 10 * MS],
         "finish_ns": [T0 + 2000 * MS], "output_tokens": [4], "finish_reason": ["stop"]},
    )  # fmt: skip
    times = [T0 + (10 + 600 * i) * MS for i in range(4)]
    store.append(run_id, "tokens", {"req_id": ["r0"] * 4, "idx": list(range(4)), "t_ns": times})
    if compiles:
        names = ("step", "kernel", "key", "compile_ms", "after_warmup")
        cols = {n: list(c) for n, c in zip(names, zip(*compiles, strict=True), strict=True)}
        cols["source"] = ["triton"] * len(compiles)
        cols["t_ns"] = [T0 + i * MS for i in range(len(compiles))]
        store.append(run_id, "compiles", cols)
    store.finish_run(run_id, "completed", ended_ns=T0 + 2100 * MS)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _add(store, "late111", COMPILES)
        _add(store, "warm222", COMPILES[:2])
        _add(store, "none333", [])
    return path


def test_the_compiles_after_warm_up(db):
    with Store.open(db) as store:
        late = late_compiles(store, "late111")
        assert late.count == 2 and late.total_ms == 640.0
        assert [(c.step, c.kernel) for c in late.compiles] == [
            (50, "_apply_packed_writes_kernel"), (61, "_advance_kernel"),
        ]  # fmt: skip
        assert late_compiles(store, "warm222").count == 0


def test_the_finding_names_kernel_step_and_key(db):
    with Store.open(db) as store:
        found = {f.rule: f for f in run_findings(store, "late111")}
        assert "compiles_after_warmup" not in {f.rule for f in run_findings(store, "warm222")}
    f = found["compiles_after_warmup"]
    assert f.severity == 2
    assert f.text == (
        "2 Triton compiles after warm-up cost 640 ms: kernel _apply_packed_writes_kernel at step "
        "50 (key BLOCK=256; float64@16, i32, int32@16, i32); kernel _advance_kernel at step 61 "
        "(key int64, int32@16)"
    )
    assert f.weight == pytest.approx(640 / 2000)  # of the run's 2 s (arrival to finish)


def test_the_gate_metric_counts_them(db):
    assert METRICS["compiles_after_warmup"].direction == "lower"
    assert not METRICS["compiles_after_warmup"].timed
    with Store.open(db) as store:
        assert gate_metrics(store, "late111").values["compiles_after_warmup"] == 2
        assert gate_metrics(store, "warm222").values["compiles_after_warmup"] == 0
        assert gate_metrics(store, "none333").values["compiles_after_warmup"] == 0


def _gate(db, baseline: str, candidate: str):
    args = ["gate", "--baseline", baseline, "--candidate", candidate, "--db", str(db)]
    return CliRunner().invoke(app, [*args, "--only", "compiles_after_warmup"])


def test_the_gate_fails_a_candidate_that_compiles_where_the_baseline_did_not(db):
    result = _gate(db, "warm222", "late111")
    assert result.exit_code == 1, result.output
    assert "FAIL compiles_after_warmup: 0 -> 2 (+2 > +0)" in result.stdout.splitlines()
    result = _gate(db, "warm222", "none333")  # 0 against 0
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("gate: PASS (1 metric)")
