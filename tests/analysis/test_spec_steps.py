"""Speculative decoding's per-step slot and dynamic-k columns (schema version 7): from the probe
to the store (a step without a decision stored NULL), an older file upgraded or read with them
NULL, and the run's totals in the spec-decode summary, its printed rows and the gate metrics."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mrv2_prof.analysis.gate_metrics import gate_metrics
from mrv2_prof.analysis.spec_metrics import spec_decode_summary
from mrv2_prof.analysis.summary import _dynamic_k, _spec_slots
from mrv2_prof.pipeline.probe_results import arrow_tables
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.store import SCHEMA_VERSION, TABLES, Store

V7_STEPS_COLUMNS = (
    "spec_reserved", "spec_reclaimed", "spec_sat_out", "spec_expected_tokens", "spec_cost_ratio",
)  # fmt: skip
MS = 1_000_000
T0 = 3_000_000_000


def _begin(store: Store, run_id: str) -> None:
    store.begin_run(run_id, scenario_name="spec", label="spec", matrix_combo=None,
                    scenario_yaml="name: spec\n", device="cpu", versions={},
                    started_ns=T0)  # fmt: skip


# ---- the probe's step rows in the store ---------------------------------------------------------


def test_the_probes_spec_columns_reach_the_store_and_a_missing_decision_is_null(tmp_path: Path):
    p = RecordingProbe(capacity=4)
    steps = [  # k, drafted, verifies, keyword arguments
        (0, 0, [], {}),  # spec_step not called in step 0: the defaults
        (2, 4, [("a", 2, 1)], {"reserved": 4, "reclaimed": 1, "sat_out": 1}),  # no decision
        (3, 6, [("a", 2, 2), ("b", 2, 0)],
         {"reserved": 6, "reclaimed": 2, "expected_tokens": 2.25, "cost_ratio": 1.5}),
        (0, 0, [], {"expected_tokens": 1.1, "cost_ratio": 1.3}),  # dynamic k chose k = 0
    ]  # fmt: skip
    for i, (k, drafted, verifies, kw) in enumerate(steps):
        p.step_begin(i)
        if i > 0:
            p.spec_step(k, drafted, verifies, **kw)
        p.step_end(2, 2 + drafted, 0, 0, 2, 4, 0, 0, "none")
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _begin(store, "p00001")
        store.append_batches("p00001", arrow_tables(p.drain()))
        rows = store.connection.execute(
            "SELECT spec_k, num_draft_tokens, num_accepted_tokens, spec_reserved, spec_reclaimed, "
            "spec_sat_out, spec_expected_tokens, spec_cost_ratio FROM steps ORDER BY step"
        ).fetchall()
    assert rows == [
        (0, 0, 0, 0, 0, 0, None, None),
        (2, 4, 1, 4, 1, 1, None, None),
        (3, 6, 2, 6, 2, 0, 2.25, 1.5),
        (0, 0, 0, 0, 0, 0, 1.1, 1.3),
    ]


# ---- an older file ------------------------------------------------------------------------------


def _version_6_file(path: Path) -> None:
    """A speculating run written before the v7 columns existed."""
    with Store.open(path) as store:
        _begin(store, "old001")
        store.append("old001", "steps", {
            "step": [0, 1], "cpu_start_ns": [T0, T0 + MS], "cpu_end_ns": [T0 + MS, T0 + 2 * MS],
            "spec_k": [2, 2], "num_draft_tokens": [4, 4], "num_accepted_tokens": [0, 3],
        })  # fmt: skip
        store.append("old001", "spec_verifies", {
            "step": [1, 1], "req_id": ["a", "b"], "num_draft_tokens": [2, 2],
            "num_accepted_tokens": [2, 1],
        })  # fmt: skip
        store.finish_run("old001", "completed", ended_ns=T0 + 3 * MS)
    con = duckdb.connect(str(path))
    for column in V7_STEPS_COLUMNS:
        con.execute(f"ALTER TABLE steps DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    con.close()


def _old_run_has_no_slot_figures(store: Store) -> None:
    d = spec_decode_summary(store, "old001")
    assert d is not None and d.mean_acceptance_length == pytest.approx(1 + 3 / 2)
    assert (d.reserved_slots, d.reclaimed_slots, d.reclaimed_share) == (None, None, None)
    assert (d.sat_out_steps, d.sat_out_requests, d.decided_steps) == (None, None, 0)
    assert d.last_expected_tokens is d.mean_cost_ratio is None
    assert _spec_slots(_summary(d)) is None and _dynamic_k(_summary(d)) is None
    values = gate_metrics(store, "old001").values
    assert values["spec_sat_out_steps"] is values["spec_reclaimed_share"] is None


def test_a_version_6_file_is_upgraded_with_the_new_columns_null(tmp_path: Path):
    path = tmp_path / "runs.duckdb"
    _version_6_file(path)
    with Store.open(path) as store:
        assert store.upgraded_from == 6
        con = store.connection
        assert con.execute("SELECT value FROM meta").fetchall() == [(str(SCHEMA_VERSION),)]
        cols = [r[0] for r in con.execute("DESCRIBE steps").fetchall()]
        assert cols[-5:] == list(V7_STEPS_COLUMNS)  # added at the end
        assert sorted(cols) == sorted(name for name, _ in TABLES["steps"])
        nulls = con.execute(
            f"SELECT {', '.join(f'count({c})' for c in V7_STEPS_COLUMNS)} FROM steps"
        ).fetchone()
        assert nulls == (0,) * 5
        _old_run_has_no_slot_figures(store)


def test_a_version_6_file_is_read_as_it_is_with_the_new_columns_null(tmp_path: Path):
    path = tmp_path / "runs.duckdb"
    _version_6_file(path)
    before = path.read_bytes()
    with Store.open(path, read_only=True) as store:
        assert store.connection.execute("SELECT value FROM meta").fetchall() == [("6",)]
        _old_run_has_no_slot_figures(store)
    assert path.read_bytes() == before


# ---- the run's totals ---------------------------------------------------------------------------
# Six steps; k, slots reserved and reclaimed, requests sat out, dynamic k's decision:
#   step  k  reserved  reclaimed  sat out  expected  cost
#    0    2     4         0          1        -        -      (dynamic k warming up: none)
#    1    2     4         3          0       2.5      1.25
#    2    2     2         2          2       2.0      1.5
#    3    0     0         1          0       1.2      1.6    (k = 0 chosen)
#    4    0     0         0          0       1.3       -     (cost not measured yet)
#    5    1     2         0          0       1.9      1.2
# reserved 12, reclaimed 6 -> share 0.5; sat out in 2 steps, 3 requests; 5 steps decided, k = 0
# in 2 of them (3 and 4); expected tokens last 1.9, mean (2.5 + 2.0 + 1.2 + 1.3 + 1.9) / 5 =
# 1.78; cost ratio last 1.2 (step 5), mean (1.25 + 1.5 + 1.6 + 1.2) / 4 = 1.3875
SPEC = {
    "spec_k": [2, 2, 2, 0, 0, 1], "spec_reserved": [4, 4, 2, 0, 0, 2],
    "spec_reclaimed": [0, 3, 2, 1, 0, 0], "spec_sat_out": [1, 0, 2, 0, 0, 0],
    "spec_expected_tokens": [None, 2.5, 2.0, 1.2, 1.3, 1.9],
    "spec_cost_ratio": [None, 1.25, 1.5, 1.6, None, 1.2],
}  # fmt: skip


@pytest.fixture
def spec_db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _begin(store, "s00001")
        n = len(SPEC["spec_k"])
        store.append("s00001", "steps", {
            "step": list(range(n)), "cpu_start_ns": [T0 + i * MS for i in range(n)],
            "cpu_end_ns": [T0 + (i + 1) * MS for i in range(n)], **SPEC,
        })  # fmt: skip
        store.append("s00001", "spec_verifies", {
            "step": [1, 1, 2], "req_id": ["a", "b", "a"], "num_draft_tokens": [2, 2, 2],
            "num_accepted_tokens": [1, 0, 0],
        })  # fmt: skip
        store.finish_run("s00001", "completed", ended_ns=T0 + 10 * MS)
    return path


def _summary(d):
    return type("S", (), {"spec_decode": d})()


def test_the_totals_of_the_slots_and_the_decisions(spec_db: Path):
    with Store.open(spec_db, read_only=True) as store:
        d = spec_decode_summary(store, "s00001")
        values = gate_metrics(store, "s00001").values
    assert (d.reserved_slots, d.reclaimed_slots) == (12, 6)
    assert d.reclaimed_share == pytest.approx(0.5)
    assert (d.sat_out_steps, d.sat_out_requests) == (2, 3)
    assert (d.decided_steps, d.k_off_steps) == (5, 2)
    assert d.last_expected_tokens == pytest.approx(1.9)
    assert d.mean_expected_tokens == pytest.approx(1.78)
    assert d.last_cost_ratio == pytest.approx(1.2)
    assert d.mean_cost_ratio == pytest.approx(1.3875)
    assert values["spec_sat_out_steps"] == 2
    assert values["spec_reclaimed_share"] == pytest.approx(0.5)
    assert _spec_slots(_summary(d)) == (
        "12 draft slots reserved, 6 reclaimed (50.0%); 3 requests sat out in 2 steps "
        "(drafts on the host)"
    )
    assert _dynamic_k(_summary(d)) == (
        "k = 0 in 2 of 5 steps decided; expected tokens 1.90 last, 1.78 mean; cost ratio "
        "1.20 last, 1.39 mean (pays where expected / cost > 1)"
    )


def test_show_prints_the_slot_and_dynamic_k_rows(spec_db: Path):
    from typer.testing import CliRunner

    from mrv2_prof.cli import app

    result = CliRunner().invoke(app, ["show", "s00001", "--db", str(spec_db)],
                                env={"COLUMNS": "250"})  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {line.split(maxsplit=2)[1]: line for line in result.output.splitlines()
            if line.startswith(("spec slots", "dynamic k"))}  # fmt: skip
    assert "12 draft slots reserved, 6 reclaimed (50.0%)" in rows["slots"]
    assert "k = 0 in 2 of 5 steps decided" in rows["k"]
