"""The gate's static and output-contract stages on real runs: the tiny CPU model runs the
quickstart twice with one seed; the candidate is then edited in a copy of the store (a token, a
note, a leak counter) and the gate must name what changed."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.store import Store
from tests.report.quickstart_in_process import run_quickstart

runner = CliRunner()
SETS = ("runner.device=cpu", "workload.num_requests=6", "workload.output_len.value=8")
ONLY_ERRORS = ("--only", "errors")  # a load stage that timing noise cannot move (errors: +0)


def _run(db: Path, *sets: str) -> str:
    return run_quickstart(db, *SETS, *sets)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, str, str]:
    db = tmp_path_factory.mktemp("contract") / "runs.duckdb"
    return db, _run(db), _run(db)


@pytest.fixture
def edited(two_runs, tmp_path):
    """A copy of the two runs' store, and a function running SQL on it."""
    db, a, b = two_runs
    copy = tmp_path / "edited.duckdb"
    shutil.copy(db, copy)

    def sql(statement: str, params: list) -> None:
        with Store.open(copy) as store:
            store.connection.execute(statement, params)

    return copy, a, b, sql


def set_info(db: Path, run_id: str, sql, **facts) -> None:
    """Replace some of the run's ``info`` facts, keeping the others."""
    with Store.open(db, read_only=True) as store:
        query = "SELECT info FROM runs WHERE run_id = ?"
        (info,) = store.connection.execute(query, [run_id]).fetchone()
    sql(
        "UPDATE runs SET info = ? WHERE run_id = ?",
        [json.dumps({**json.loads(info), **facts}), run_id],
    )


def gate_json(db: Path, a: str, b: str, *args: str):
    argv = ["gate", "--db", str(db), "--baseline", a, "--candidate", b, "--json", *args]
    result = runner.invoke(app, [*argv, *ONLY_ERRORS])
    return result.exit_code, json.loads(result.stdout)


def stages(data: dict) -> dict[str, dict]:
    return {s["name"]: s for s in data["stages"]}


def test_two_runs_of_one_seeded_scenario_pass_the_contract(two_runs):
    db, a, b = two_runs
    code, data = gate_json(db, a, b)
    assert code == 0, data
    by = stages(data)
    assert [by[n]["status"] for n in ("static", "output contract", "load")] == ["pass"] * 3
    lines = by["output contract"]["lines"]
    assert "greedy tokens: 48 tokens of 6 requests identical" in lines  # 6 requests x 8 tokens
    assert f"leaks: run {b} holds no request slot or KV block at its end" in lines
    assert "top-k logprobs: not stored with the tokens (not checked)" in lines


def test_one_changed_token_fails_naming_the_request_and_position(edited):
    db, a, b, sql = edited
    with Store.open(db, read_only=True) as store:
        (first,) = store.connection.execute(
            "SELECT req_id FROM requests WHERE run_id = ? ORDER BY arrival_ns, req_id LIMIT 1", [b]
        ).fetchone()
        (token,) = store.connection.execute(
            "SELECT token_id FROM tokens WHERE run_id = ? AND req_id = ? AND idx = 3", [b, first]
        ).fetchone()
    sql("UPDATE tokens SET token_id = ? WHERE run_id = ? AND req_id = ? AND idx = 3",
        [token + 1, b, first])  # fmt: skip
    code, data = gate_json(db, a, b)
    assert code == 1
    contract = stages(data)["output contract"]
    assert contract["status"] == "fail"
    assert contract["lines"][0] == (
        f"FAIL output contract: request {first!r} position 3: baseline token {token}, "
        f"candidate token {token + 1} (run {b})"
    )
    assert stages(data)["load"]["status"] == "not run"  # the gate stops at the failing stage
    code, data = gate_json(db, a, b, "--all-stages")
    assert code == 1 and stages(data)["load"]["status"] == "pass"


def test_a_changed_finish_reason_fails(edited):
    db, a, b, sql = edited
    sql("UPDATE requests SET finish_reason = 'abort' WHERE run_id = ? AND req_id = "
        "(SELECT max(req_id) FROM requests WHERE run_id = ?)", [b, b])  # fmt: skip
    code, data = gate_json(db, a, b)
    assert code == 1
    assert (
        "finish reason length in the baseline, abort in the candidate"
        in (stages(data)["output contract"]["lines"][0])
    )


def test_a_leak_counter_fails_the_contract(edited):
    db, a, b, sql = edited
    leaks = {"request_slots": 1, "kv_blocks": 2, "unfinished": 0}
    set_info(db, b, sql, leaks=leaks)
    code, data = gate_json(db, a, b)
    assert code == 1
    assert stages(data)["output contract"]["lines"][0] == (
        f"FAIL leaks: run {b} still holds 1 request slot(s) and 2 KV block(s) after every "
        "request finished"
    )


def test_a_downgrade_note_fails_the_static_stage(edited):
    db, a, b, sql = edited
    note = "runner.cudagraph_mode: full needs CUDA; running eager"
    set_info(db, b, sql, notes=[note])
    code, data = gate_json(db, a, b)
    assert code == 1
    by = stages(data)
    assert by["static"]["status"] == "fail"
    # the failure names the flag that accepts the note, with the note quoted for a shell
    flag = f"--allow-note '{note}'"
    assert by["static"]["lines"] == [
        f"FAIL note on run {b}: {note}",
        f"accepted by: {flag} (or --allow-notes for every note)",
    ]
    assert by["output contract"]["status"] == by["load"]["status"] == "not run"
    assert data["verdict"] == f"gate: FAIL (static stage: a new note; {flag} accepts it)"
    code, data = gate_json(db, a, b, *shlex.split(flag))  # the value as printed is accepted
    assert code == 0 and stages(data)["static"]["lines"][0].startswith("allowed note")
    code, data = gate_json(db, a, b, "--allow-note", "cudagraph_mode")
    assert code == 0 and stages(data)["static"]["lines"][0].startswith("allowed note")


def test_a_note_on_both_sides_is_reported_not_failed(edited):
    """Two runs with the same note (the same machine's limit): the static stage passes and
    reports it; a second note only the candidate has still fails it."""
    db, a, b, sql = edited
    same = "runner.device: auto found no CUDA device; running on the CPU"
    set_info(db, a, sql, notes=[same])
    set_info(db, b, sql, notes=[same])
    code, data = gate_json(db, a, b)
    by = stages(data)
    assert by["static"]["status"] == "pass"
    assert by["static"]["lines"] == [f"on both sides note on run {b}: {same}"]
    assert by["output contract"]["status"] == "pass" and code == 0
    new = "runner.uva: needs the Triton kernels on a CUDA device"
    set_info(db, b, sql, notes=[same, new])
    code, data = gate_json(db, a, b)
    assert code == 1 and stages(data)["static"]["lines"][1] == f"FAIL note on run {b}: {new}"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU's own note")
def test_two_identical_runs_on_a_cpu_pass_the_gate(tmp_path):
    """The quickstart as shipped (``runner.device: auto``) twice on a machine without CUDA:
    both runs carry the note that auto found no CUDA device, which is no change between them;
    the gate passes its static and output-contract stages and exits 0."""
    db = tmp_path / "runs.duckdb"
    a, b = _run(db, "runner.device=auto"), _run(db, "runner.device=auto")
    code, data = gate_json(db, a, b)
    by = stages(data)
    assert by["static"]["status"] == "pass", by["static"]
    assert any(
        "on both sides" in line and "no CUDA device" in line for line in by["static"]["lines"]
    )
    assert by["output contract"]["status"] == "pass" and code == 0


def test_aborted_and_preempted_requests_leave_no_slot_or_block(tmp_path):
    # 10 KV blocks of 16 tokens for 6 requests of up to 104 tokens: some are preempted; half
    # of them are aborted
    db = tmp_path / "pressure.duckdb"
    pressure = (
        "runner.max_model_len=128",
        "runner.num_kv_blocks=10",
        "workload.abort_fraction=0.5",
    )
    run_id = _run(db, *pressure)
    with Store.open(db, read_only=True) as store:
        (info,) = store.connection.execute(
            "SELECT info FROM runs WHERE run_id = ?", [run_id]
        ).fetchone()
        aborts, preemptions = store.connection.execute(
            "SELECT count(*) FILTER (WHERE finish_reason = 'abort'), sum(num_preemptions) "
            "FROM requests WHERE run_id = ?",
            [run_id],
        ).fetchone()
    assert aborts > 0 and preemptions > 0
    leaks = json.loads(info)["leaks"]
    assert (leaks["request_slots"], leaks["kv_blocks"], leaks["unfinished"]) == (0, 0, 0)
    code, data = gate_json(db, run_id, run_id)
    assert code == 0, data
    lines = stages(data)["output contract"]["lines"]
    assert f"leaks: run {run_id} holds no request slot or KV block at its end" in lines
