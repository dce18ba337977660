"""``run --resume`` beyond one host's class and one group: the key stored with a run is the one of
the environment it ran in; on a cluster a cell is done when a completed run has its key under any
node's class; a resumed ``--repeats N`` sweep puts its re-runs in the group of the combination's
completed repeats (pipeline/resume.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from mrv2_prof.cli.preflight import preflight
from mrv2_prof.pipeline import resume
from mrv2_prof.pipeline.resume import cell_keys, memo_key, resume_plan, run_key
from mrv2_prof.scenario import load_quickstart
from mrv2_prof.store import Store

TINY = ("runner.device=cpu", "workload.num_requests=2", "workload.output_len.value=4")
H200 = {"gpu": {"gpu_name": "NVIDIA H200", "gpu_driver": "570.1"}, "torch": "2.9"}
A100 = {"gpu": {"gpu_name": "NVIDIA A100", "gpu_driver": "570.1"}, "torch": "2.9"}
NODES = [{"code": "0.1.0", "environment": H200}, {"code": "0.1.0", "environment": A100}]


def _scenario(*sets: str):
    return load_quickstart([*TINY, *sets])


def _runs(scenario, repeats: int, group: str | None = "minted") -> list:
    """``cli/repeats.repeated``'s shape: (label, (given, as run), group, repeat_index)."""
    return [("q", (scenario, scenario), group, r) for r in range(repeats)]


def _add_completed(store: Store, run_id: str, key: str, group: str | None, started: int) -> None:
    store.begin_run(run_id, scenario_name="q", label="q", matrix_combo=None, scenario_yaml="",
                    device="cpu", versions={}, started_ns=started,
                    info={"memo_key": key, "notes": []})  # fmt: skip
    store.update_run(run_id, run_group=group)
    store.finish_run(run_id, "completed", ended_ns=started + 1)


def test_a_cell_on_a_cluster_has_a_key_per_node_class():
    data = _scenario("runner.device=auto").model_dump(mode="json")
    by_hand = [memo_key(data, 0, code="0.1.0", environment=env) for env in (H200, A100)]
    assert cell_keys(data, 0, NODES) == by_hand
    assert by_hand[0] != by_hand[1]
    assert cell_keys(data, 0, None) == [memo_key(data, 0)]  # this host runs it
    # a CPU cell has no GPU in its class: one key on any node
    cpu = _scenario().model_dump(mode="json")
    both = cell_keys(cpu, 0, NODES)
    assert both == [memo_key(cpu, 0, code="0.1.0", environment={"gpu": None, "torch": "2.9"})]
    # another code version on a node is another key
    older = [*NODES, {"code": "0.0.9", "environment": H200}]
    assert len(cell_keys(data, 0, older)) == 3


def test_a_run_completed_under_one_class_of_the_cluster_is_done(tmp_path):
    scenario = _scenario("runner.device=auto")
    data = scenario.model_dump(mode="json")
    db = tmp_path / "m.duckdb"
    with Store.open(db) as store:  # repeat 1 ran on the A100 node
        _add_completed(store, "ona100", memo_key(data, 1, code="0.1.0", environment=A100), "g", 0)
    plan = resume_plan(db, _runs(scenario, 2), NODES)
    assert plan.kept == [0]
    assert [outcome.run_id for _, outcome in plan.skipped] == ["ona100"]
    assert plan.line == (
        "skipped 1 cell (already in the database: ona100); matched across 2 GPU classes"
    )
    # a cluster of H200 nodes only: the A100's run is no match
    alone = resume_plan(db, _runs(scenario, 2), NODES[:1])
    assert alone.kept == [0, 1] and alone.line is None


def test_the_runner_stores_the_key_of_its_own_environment(monkeypatch):
    data = _scenario("runner.device=auto").model_dump(mode="json")
    given = memo_key(data, 2, environment={"gpu": None, "torch": "2.9"})  # the command's class
    assert run_key(data, 2, None) == {}  # no key asked for
    monkeypatch.setattr(resume, "environment_class", lambda device: H200)  # the runner's GPU
    stored = run_key(data, 2, given)["memo_key"]
    assert stored == memo_key(data, 2, code=resume.code_version(), environment=H200)
    assert stored != given


def test_re_runs_join_the_group_of_most_completed_repeats(tmp_path):
    scenario = _scenario()
    data = scenario.model_dump(mode="json")
    db = tmp_path / "m.duckdb"
    with Store.open(db) as store:  # repeats 0 and 2 in group old1, repeat 1 in old2; 3 failed
        for r, group in ((0, "old1"), (1, "old2"), (2, "old1")):
            _add_completed(store, f"run{r}", memo_key(data, r), group, r)
    plan = resume_plan(db, _runs(scenario, 4), None)
    assert plan.kept == [3]
    assert [(run[2], run[3]) for run in plan.runs] == [("old1", 3)]
    assert [(run[2], o.run_id) for run, o in plan.skipped] == [
        ("old1", "run0"),
        ("old2", "run1"),
        ("old1", "run2"),
    ]
    assert plan.line == (
        "skipped 3 cells (already in the database: run0, run1, run2); the completed repeats of "
        "q are in 2 groups: its re-runs join group:old1 (2 of 3 there)"
    )


def test_a_combination_with_no_completed_repeat_keeps_its_new_group(tmp_path):
    scenario = _scenario()
    db = tmp_path / "m.duckdb"
    with Store.open(db):
        pass
    plan = resume_plan(db, _runs(scenario, 2), None)
    assert plan.kept == [0, 1] and plan.skipped == [] and plan.line is None
    assert [run[2] for run in plan.runs] == ["minted", "minted"]


def _run(db: Path, *args: str) -> subprocess.CompletedProcess:
    sets = [arg for s in TINY for arg in ("--set", s)]
    cmd = [sys.executable, "-m", "mrv2_prof", "run", "--db", str(db), "--headless", *sets]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)


def _groups(db: Path) -> list[tuple[str, str, str, int]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT run_id, status, run_group, repeat_index FROM runs ORDER BY started_ns"
        ).fetchall()


def test_a_resumed_repeat_joins_its_combinations_group(tmp_path):
    db = tmp_path / "runs.duckdb"
    first = _run(db, "--repeats", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    rows = _groups(db)
    assert [r[1] for r in rows] == ["completed"] * 3 and len({r[2] for r in rows}) == 1
    group = rows[0][2]
    with Store.open(db) as store:  # the second repeat failed
        store.finish_run(rows[1][0], "failed", ended_ns=1)

    again = _run(db, "--repeats", "3", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"skipped 2 cells (already in the database: {rows[0][0]}, {rows[2][0]})" in again.stdout
    after = _groups(db)
    assert len(after) == 4
    new = after[3]
    assert (new[1], new[2], new[3]) == ("completed", group, 1)  # repeat 1, in the old group
    completed = [r for r in after if r[1] == "completed"]
    assert {r[2] for r in completed} == {group} and sorted(r[3] for r in completed) == [0, 1, 2]
    assert f"group:{group}  3 runs" in again.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        info = json.loads(
            con.execute("SELECT info FROM runs WHERE run_id = ?", [new[0]]).fetchone()[0]
        )
    data = preflight(load_quickstart(list(TINY))).model_dump(mode="json")  # as it ran
    assert info["memo_key"] == memo_key(data, 1)
