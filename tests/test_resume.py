"""``mrv2-prof run --resume``: a cell's memo key (pipeline/resume.py) and the completed run it
names (analysis/memo.py); after a complete sweep, ``--resume`` runs nothing again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import yaml

from mrv2_prof.analysis.memo import completed_run_for
from mrv2_prof.pipeline import resume
from mrv2_prof.pipeline.resume import memo_key
from mrv2_prof.scenario import expand_matrix, load_quickstart, load_scenario
from mrv2_prof.store import Store

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
TINY = ("runner.device=cpu", "workload.num_requests=2", "workload.output_len.value=4")
CPU = {"gpu": None, "torch": "2.9"}


def _key(*sets: str, index: int | None = None, **kwargs) -> str:
    data = load_quickstart([*TINY, *sets]).model_dump(mode="json")
    return memo_key(data, index, **{"code": "0.1.0", "environment": CPU, **kwargs})


def test_the_same_cell_has_the_same_key_and_a_changed_set_another():
    assert _key() == _key()
    assert _key("workload.num_requests=3") != _key()
    assert _key("runner.async_scheduling=true") != _key()
    assert _key(index=0) != _key(index=1) != _key()  # each repeat is a cell of its own


def test_the_database_path_is_no_part_of_the_key_and_code_and_environment_are():
    assert _key("store.db=elsewhere.duckdb") == _key()
    assert _key(code="0.1.0+abc") != _key()
    assert _key(environment={"gpu": None, "torch": "2.10"}) != _key()
    h200 = {"gpu": {"gpu_name": "NVIDIA H200", "gpu_driver": "570.1"}, "torch": "2.9"}
    assert _key(environment=h200) != _key()
    assert _key(environment={**h200, "gpu": {**h200["gpu"], "gpu_driver": "575.2"}}) != _key(
        environment=h200
    )


def test_the_key_of_a_matrix_cell_is_its_combination(tmp_path):
    data = yaml.safe_load(QUICKSTART.read_text())
    data["matrix"] = {"runner.staged_writes": [True, False]}
    path = tmp_path / "ab.yaml"
    path.write_text(yaml.safe_dump(data))
    (_, a), (_, b) = expand_matrix(load_scenario(path, TINY))
    keys = [memo_key(s.model_dump(mode="json"), code="x", environment=CPU) for s in (a, b)]
    assert keys[0] != keys[1]
    again = [s.model_dump(mode="json") for _, s in expand_matrix(load_scenario(path, TINY))]
    assert [memo_key(d, code="x", environment=CPU) for d in again] == keys


def test_the_parent_reads_the_code_and_environment_without_torch():
    import importlib.metadata

    assert resume.code_version().startswith(__import__("mrv2_prof").__version__)
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    assert resume.environment_class("cpu") == {"gpu": None, "torch": torch}
    script = (
        "import sys; from mrv2_prof.pipeline.resume import memo_key; "
        "memo_key({'runner': {'device': 'auto'}}); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def _add_run(store: Store, run_id: str, key: str | None, status: str | None, started: int) -> None:
    info = {"notes": []} if key is None else {"memo_key": key, "notes": []}
    store.begin_run(run_id, scenario_name="q", label="q", matrix_combo=None, scenario_yaml="",
                    device="cpu", versions={}, started_ns=started, info=info)  # fmt: skip
    if status is not None:
        store.finish_run(run_id, status, ended_ns=started + 1)


def test_only_a_completed_run_is_a_hit(tmp_path):
    with Store.open(tmp_path / "m.duckdb") as store:
        _add_run(store, "failed1", "k1", "failed", 0)
        _add_run(store, "abort1", "k1", "aborted", 1)
        _add_run(store, "live01", "k1", None, 2)  # still running
        assert completed_run_for(store, "k1") is None  # each of them: the cell runs again
        _add_run(store, "done01", "k1", "completed", 3)
        _add_run(store, "other1", "k2", "completed", 4)
        _add_run(store, "nokey1", None, "completed", 5)  # a run from before keys were stored
        _add_run(store, "near01", "k1x", "completed", 6)  # holds the text, not the key
        assert completed_run_for(store, "k1") == "done01"
        assert completed_run_for(store, "k2") == "other1"
        assert completed_run_for(store, "k3") is None


def _sweep(tmp_path: Path, db: Path, *args: str) -> subprocess.CompletedProcess:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["matrix"] = {"runner.staged_writes": [True, False]}
    path = tmp_path / "ab.yaml"
    path.write_text(yaml.safe_dump(data))
    sets = [arg for s in TINY for arg in ("--set", s)]
    cmd = [sys.executable, "-m", "mrv2_prof", "run", str(path), "--db", str(db), "--headless"]
    return subprocess.run([*cmd, *sets, *args], capture_output=True, text=True, timeout=300)


def test_resume_reruns_nothing_after_a_complete_sweep(tmp_path):
    db = tmp_path / "runs.duckdb"
    first = _sweep(tmp_path, db)
    assert first.returncode == 0, first.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT run_id, status, info FROM runs ORDER BY started_ns").fetchall()
    assert [r[1] for r in rows] == ["completed", "completed"]
    keys = [json.loads(r[2])["memo_key"] for r in rows]
    assert len(set(keys)) == 2  # one key per cell, stored with its run

    again = _sweep(tmp_path, db, "--resume")
    assert again.returncode == 0, again.stderr
    ids = ", ".join(r[0] for r in rows)
    assert f"skipped 2 cells (already in the database: {ids})" in again.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


def test_resume_runs_a_cell_whose_run_failed_again(tmp_path):
    db = tmp_path / "runs.duckdb"
    assert _sweep(tmp_path, db).returncode == 0
    with duckdb.connect(str(db)) as con:
        first = con.execute("SELECT run_id FROM runs ORDER BY started_ns LIMIT 1").fetchone()[0]
        con.execute("UPDATE runs SET status = 'failed' WHERE run_id = ?", [first])
    again = _sweep(tmp_path, db, "--resume")
    assert again.returncode == 0, again.stderr
    assert "skipped 1 cell (already in the database: " in again.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT status FROM runs ORDER BY started_ns").fetchall()
    assert [r[0] for r in rows] == ["failed", "completed", "completed"]
