"""Live runs write a side file beside the run database and are merged into it when they end:
readers of the finished runs are never locked out, and a killed run is merged (then marked
failed) by the next writable open, never lost or half there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from mrv2_prof.store import Store, StoreError
from mrv2_prof.store.live_runs import live_dir, live_file

REPO_ROOT = Path(__file__).resolve().parents[2]

# A child that starts a live run, writes a step and a request, then waits on stdin; with
# argv[2] == "finish" it finishes the run and exits normally (the harness then merges).
LIVE_RUN = """
import sys
from mrv2_prof.store import Store
store, run_id = Store.open_live_run(sys.argv[1], label="live-label", scenario_name="live")
store.begin_run(run_id, scenario_name="live", label="live-label", matrix_combo=None,
                scenario_yaml="name: live\\n", device="cpu", versions={}, started_ns=5)
store.append_batches(run_id, {"steps": {"step": [0, 1]}, "requests": {"req_id": ["r0"]}})
print(run_id, flush=True)
sys.stdin.readline()
if sys.argv[2] == "finish":
    store.finish_run(run_id, "completed", ended_ns=9)
    store.close()
    Store.merge_ended_runs(sys.argv[1])
"""


def _live_child(db: Path, then: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", LIVE_RUN, str(db), then],
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    return child, child.stdout.readline().strip()


def _finished_run(db: Path, run_id: str = "aaa111") -> None:
    with Store.open(db) as store:
        store.begin_run(run_id, scenario_name="done", label="done", matrix_combo=None,
                        scenario_yaml="", device="cpu", versions={}, started_ns=1)  # fmt: skip
        store.append(run_id, "steps", {"step": [0, 1, 2]})
        store.finish_run(run_id, "completed", ended_ns=2)


def test_readers_see_finished_runs_and_the_live_one_while_it_writes(tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    _finished_run(db)
    child, live_id = _live_child(db, "finish")
    try:
        assert live_file(db, live_id).exists()
        with Store.open(db, read_only=True, lock_wait_s=0) as store:  # nobody holds the database
            rows = {r["run_id"]: r for r in store.list_runs()}
            assert rows["aaa111"]["status"] == "completed"
            live = rows[live_id]
            assert (live["status"], live["label"], live["writer_gone"]) == (
                "running",
                "live-label",
                False,
            )
            assert store.resolve_run("latest") == "aaa111"  # the newest of the readable runs
            with pytest.raises(StoreError, match=f"run {live_id} in .* is still running"):
                store.resolve_run(live_id)
        with Store.open(db, lock_wait_s=0) as store:  # a writer does not take a live side file
            assert store.live_merged == []
        assert live_file(db, live_id).exists()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
    assert not live_dir(db).exists()  # merged, side files and directory removed
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute(
            "SELECT status, label FROM runs WHERE run_id = ?", [live_id]
        ).fetchall() == [("completed", "live-label")]
        counts = [
            con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [live_id]).fetchone()[0]
            for t in ("steps", "requests")
        ]
        assert counts == [2, 1]
        assert con.execute("SELECT count(*) FROM steps").fetchone() == (5,)


def test_a_killed_live_run_is_merged_and_marked_failed_by_the_next_writer(tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    _finished_run(db)
    child, live_id = _live_child(db, "kill")
    child.kill()
    child.wait(timeout=60)
    with Store.open(db, read_only=True) as store:  # a reader changes nothing, says it is gone
        (live,) = [r for r in store.list_runs() if r["run_id"] == live_id]
        assert live["status"] == "running" and live["writer_gone"]
    assert live_file(db, live_id).exists()
    with Store.open(db) as store:
        assert store.live_merged == [live_id] and store.orphans_failed == [live_id]
        status, error = store.connection.execute(
            "SELECT status, error FROM runs WHERE run_id = ?", [live_id]
        ).fetchone()
        assert status == "failed" and f"PID {child.pid}" in error
        assert store.connection.execute(
            "SELECT count(*) FROM steps WHERE run_id = ?", [live_id]
        ).fetchone() == (2,)
    assert not live_dir(db).exists()
    with Store.open(db) as store:  # merging again changes nothing
        assert store.live_merged == [] and len(store.list_runs()) == 2


def test_a_side_file_already_merged_is_removed_not_copied_twice(tmp_path: Path) -> None:
    """A merge that committed but was killed before deleting the side file."""
    db = tmp_path / "runs.duckdb"
    store, run_id = Store.open_live_run(db, label="x", scenario_name="x")
    store.begin_run(run_id, scenario_name="x", label="x", matrix_combo=None,
                    scenario_yaml="name: x\n", device="cpu", versions={}, started_ns=1)  # fmt: skip
    store.append(run_id, "steps", {"step": [0]})
    store.close()
    side = live_file(db, run_id)
    kept = side.read_bytes()
    assert Store.merge_ended_runs(db) == [run_id]
    live_dir(db).mkdir()
    side.write_bytes(kept)
    assert Store.merge_ended_runs(db) == []
    assert not side.exists()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM steps").fetchone() == (1,)


def test_a_side_file_of_another_schema_is_left_in_place(tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    Store.open(db).close()
    live_dir(db).mkdir()
    with duckdb.connect(str(live_file(db, "bbb222"))) as con:
        con.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
        con.execute("INSERT INTO meta VALUES ('schema_version', '999')")
    assert Store.merge_ended_runs(db) == []
    assert live_file(db, "bbb222").exists()
