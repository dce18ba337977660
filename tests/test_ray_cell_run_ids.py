"""A Ray cell's run id was chosen by its worker in a database of its own: when ``--db`` already
has that id (an earlier run, another cell's, a live run's), the run is merged under a new id
(``Store.merge_run_file``, ``live_runs.adopt_run_file``) and nothing is overwritten or dropped;
the cell's outcome, facts and replayed metrics name the id it is stored under."""

from __future__ import annotations

import types
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from mrv2_prof.pipeline.executors.metrics_replay import MetricsRecorder
from mrv2_prof.pipeline.executors.ray_cells import RayCells
from mrv2_prof.pipeline.job import Outcome, RunJob
from mrv2_prof.store import Store, StoreError
from mrv2_prof.store.live_runs import live_dir, live_file
from tests.test_metrics_exporter import free_port, scrape, snap

SAME = "abc123"


def _run_file(path: Path, run_id: str, label: str, steps: int) -> Path:
    """A finished run's own database, as a Ray worker returns it: ``steps`` step rows."""
    with Store.open(path) as store:
        store.begin_run(run_id, scenario_name="q", label=label, matrix_combo=None,
                        scenario_yaml="", device="cpu", versions={}, started_ns=1)  # fmt: skip
        store.append(run_id, "steps", {"step": list(range(steps))})
        store.finish_run(run_id, "completed", ended_ns=2)
    return path


def _runs(db: Path) -> dict[str, tuple[str, int]]:
    """run_id -> (label, its step rows)."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT run_id, label, (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) "
            "FROM runs r"
        ).fetchall()
    return {run_id: (label, steps) for run_id, label, steps in rows}


def test_a_run_file_whose_id_the_database_has_is_stored_under_a_new_one(tmp_path):
    db = tmp_path / "runs.duckdb"
    _run_file(tmp_path / "earlier.duckdb", SAME, "earlier", 3)
    assert Store.merge_run_file(db, tmp_path / "earlier.duckdb", SAME) == SAME  # id free: kept
    stored = Store.merge_run_file(db, _run_file(tmp_path / "cell.duckdb", SAME, "cell", 5), SAME)
    assert stored != SAME and len(stored) == len(SAME)
    assert _runs(db) == {SAME: ("earlier", 3), stored: ("cell", 5)}
    assert not live_dir(db).exists() and not (tmp_path / "cell.duckdb").exists()


def test_a_live_runs_id_is_not_taken_either(tmp_path):
    db = tmp_path / "runs.duckdb"
    Store.open(db).close()
    live_dir(db).mkdir()
    held = live_file(db, SAME)
    held.write_bytes(b"a live run's side file")  # its writer holds it: no merge touches it
    stored = Store.merge_run_file(db, _run_file(tmp_path / "cell.duckdb", SAME, "cell", 2), SAME)
    assert stored != SAME and _runs(db) == {stored: ("cell", 2)}
    assert held.read_bytes() == b"a live run's side file"


class _Ray:
    """Stands in for ``ray`` in the driver: ``get`` returns the task results handed to it."""

    exceptions = types.SimpleNamespace(TaskCancelledError=type("Cancelled", (Exception,), {}))

    def __init__(self, results: dict[str, dict]) -> None:
        self.results = results

    def get(self, ref: str) -> dict:
        return self.results[ref]


def _result(path: Path, steps: int, tokens: int) -> dict:
    """What ``run_cell`` returns for a completed run ``SAME`` of ``steps`` steps, with the
    metrics its worker recorded."""
    recorder = MetricsRecorder()
    recorder.begin_run(SAME, "llama-tiny")
    recorder.update(snap(run_id=SAME, steps=steps - 1, output_tokens=tokens - 1))
    recorder.update(snap(run_id=SAME, steps=steps, output_tokens=tokens, new_ttft_s=(0.5,)))
    return {
        "outcome": Outcome(SAME, "completed"),
        "facts": {"run_id": SAME, "notes": []},
        "placement": {"executor": "ray", "host": "worker"},
        "store_error": None,
        "bytes": _run_file(path, SAME, path.stem, steps).read_bytes(),
        "metrics": recorder.recorded(),
    }


def test_cells_with_one_id_land_as_runs_of_their_own_and_metrics_follow(tmp_path, monkeypatch):
    pytest.importorskip("prometheus_client")
    from mrv2_prof.pipeline import metrics_exporter

    db = tmp_path / "runs.duckdb"
    Store.merge_run_file(db, _run_file(tmp_path / "earlier.duckdb", SAME, "earlier", 1), SAME)
    driver = RayCells("auto", None, Console(file=open(tmp_path / "out", "w")))  # noqa: SIM115
    driver.ray = _Ray(
        {
            "a": _result(tmp_path / "cell-a.duckdb", 4, 40),
            "b": _result(tmp_path / "cell-b.duckdb", 6, 60),
        }
    )
    driver.counts = {"done": 0, "failed": 0}
    exporter = metrics_exporter.serve(free_port())
    try:
        job = RunJob({}, "", "cell", None, str(db))
        cells = [driver._land(i, job, ref, 0, 2) for i, ref in enumerate("ab")]
        scraped = scrape(exporter.port)
    finally:
        exporter.close()
    ids = [cell.outcome.run_id for cell in cells]
    assert len({SAME, *ids}) == 3  # three runs, three ids
    assert [cell.facts["run_id"] for cell in cells] == ids
    assert [cell.store_error for cell in cells] == [None, None]
    assert _runs(db) == {SAME: ("earlier", 1), ids[0]: ("cell-a", 4), ids[1]: ("cell-b", 6)}
    assert list(tmp_path.glob(".runs.duckdb.*")) == [] and not live_dir(db).exists()
    by_run = {dict(k)["run_id"]: v for k, v in scraped["mrv2_prof:steps_total"].items()}
    assert by_run == {ids[0]: 4, ids[1]: 6}  # the last snapshot's totals, under the stored ids
    tokens = {dict(k)["run_id"]: v for k, v in scraped["vllm:generation_tokens_total"].items()}
    assert tokens == {ids[0]: 40, ids[1]: 60}
    ttft = {
        dict(k)["run_id"]: v for k, v in scraped["vllm:time_to_first_token_seconds_count"].items()
    }
    assert ttft == {ids[0]: 1, ids[1]: 1}
    model = {dict(k)["model_name"] for k in scraped["mrv2_prof:steps_total"]}
    assert model == {"llama-tiny"}


def test_a_run_that_cannot_be_merged_now_is_left_for_the_next_writable_open(tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    Store.open(db).close()

    def held(*args):
        raise StoreError(f"{db}: another process holds it")

    monkeypatch.setattr(Store, "merge_run_file", held)
    driver = RayCells("auto", None, Console(file=open(tmp_path / "out", "w")))  # noqa: SIM115
    result = _result(tmp_path / "cell.duckdb", 3, 30)
    error = driver._merge(RunJob({}, "", "cell", None, str(db)), result)
    side = live_file(db, SAME)
    assert error == (
        f"run {SAME} is not merged into {db} ({db}: another process holds it); "
        f"kept in {side}, merged by the next writable open"
    )
    assert list(tmp_path.glob(".runs.duckdb.*")) == []  # the landing file became the side file
    monkeypatch.undo()
    with Store.open(db) as store:
        assert store.live_merged == [SAME]
    assert _runs(db) == {SAME: ("cell", 3)}
