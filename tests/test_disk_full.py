"""A full disk or the file size limit (``ulimit -f``) while ``mrv2-prof run`` writes: the error
names the cause and the file, a run that did not reach the database exits 1 and stays in its side
file (which the next writable open merges), and a healthy database is never called damaged.

The CLI runs in a subprocess under ``RLIMIT_FSIZE`` (CPython ignores SIGXFSZ, so a write past the
limit fails with EFBIG). The limits were measured on a tiny CPU run: a new DuckDB file needs a
12288-byte header, a side file's WAL holds about 18 kB once the run has started and grows by tens
of kB a flush, and the database's WAL takes about 100 kB per merged run of ``END_OF_RUN`` (its
checkpoint into the 3 MB main file fails under these limits, which DuckDB tolerates: the WAL
keeps what was committed). A full disk (ENOSPC) cannot be made without root, so its cases patch
the write to fail as DuckDB reports it.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from mrv2_prof.store import Store, StoreError
from mrv2_prof.store.live_runs import live_dir, live_file
from mrv2_prof.store.opening import DiskFullError, damaged_error, disk_full

ROOT = Path(__file__).resolve().parents[1]
TINY = (
    "name: diskfull\n"
    "model: {preset: llama-tiny}\n"
    "runner: {device: cpu, kernels: torch, async_scheduling: false, uva: false,\n"
    "         cudagraph_mode: none, num_kv_blocks: 64, max_model_len: 256}\n"
    "probes: {nvtx: false, cuda_events: false, sync_finder: false, copy_audit: false,\n"
    "         nvml_hz: 0}\n"
)
# 4 requests at once, 96 tokens each: one flush or two, ~100 kB in the database per run
END_OF_RUN = TINY + (
    "workload: {num_requests: 4, arrival: {pattern: burst}, prompt_len: {dist: fixed, value: 8},\n"
    "           output_len: {dist: fixed, value: 96}, sampling: {temperature: 0.0}}\n"
)
# arrivals spread over seconds: the step loop flushes (about once a second) while it runs
MID_RUN = TINY + (
    "workload: {num_requests: 8, arrival: {pattern: poisson, rate: 3},\n"
    "           prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 64},\n"
    "           sampling: {temperature: 0.0}}\n"
)
START_LIMIT = 8192  # under a new file's header (and over multiprocessing's 4096-byte arena)
MID_RUN_LIMIT = 40_000  # over a started run's side WAL (~18 kB), under its first flushes
MERGE_LIMIT = 400_000  # over a side WAL of END_OF_RUN (~170-210 kB)
MERGE_HEADROOM = 10_000  # what the database's WAL is left below MERGE_LIMIT (a merge: ~100 kB)


def _cli(*args: str, cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    """``python -m mrv2_prof ARGS`` in its own process, under a file size limit if given."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        preexec_fn=limited if limit is not None else None,
        timeout=600,
    )


def _run(scenario: Path, db: Path, limit: int | None) -> subprocess.CompletedProcess:
    return _cli("run", str(scenario), "--db", str(db), "--headless", cwd=db.parent, limit=limit)


def _refused(
    db: Path, scenario_text: str, limit: int, returncode: int, prefix: str
) -> tuple[str, list[str]]:
    """``run`` of ``scenario_text`` (written to ``s.yaml`` beside ``db``) into ``db`` under the
    file size ``limit``: it exits ``returncode`` with a plain stderr. That stderr, and its lines
    starting with ``prefix``."""
    scenario = db.parent / "s.yaml"
    scenario.write_text(scenario_text)
    done = _run(scenario, db, limit)
    assert done.returncode == returncode, done.stderr + done.stdout
    _assert_plain(done.stderr)
    return done.stderr, [line for line in done.stderr.splitlines() if line.startswith(prefix)]


def _stored(db: Path) -> dict[str, tuple[str, str | None]]:
    """run id → (status, error) of the runs in the database itself (read-only, no limit)."""
    with Store.open(db, read_only=True) as store:
        rows = store.connection.execute("SELECT run_id, status, error FROM runs").fetchall()
    return {run_id: (status, error) for run_id, status, error in rows}


def _assert_plain(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "damaged" not in stderr, stderr
    assert "leaked" not in stderr, stderr  # the runner exited normally, not through an error


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A database holding one completed run (made without a limit), and its id."""
    folder = tmp_path_factory.mktemp("earlier")
    scenario = folder / "end_of_run.yaml"
    scenario.write_text(END_OF_RUN)
    db = folder / "runs.duckdb"
    done = _run(scenario, db, None)
    assert done.returncode == 0, done.stderr
    ((run_id, (status, _)),) = _stored(db).items()
    assert status == "completed"
    return db, run_id


def _copy(earlier: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "runs.duckdb"
    shutil.copy(earlier[0], db)
    return db, earlier[1]


# --- file size limit, through the real command line ---------------------------------------


def test_a_new_database_that_cannot_be_created_is_not_left_half_made(tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    _, errors = _refused(db, END_OF_RUN, START_LIMIT, 2, "error:")
    assert len(errors) == 1 and "file too large" in errors[0] and str(db) in errors[0], errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # no file, WAL or side file


def test_the_side_file_refused_at_the_start_is_one_line_and_leaves_nothing(
    earlier: tuple[Path, str], tmp_path: Path
) -> None:
    db, earlier_id = _copy(earlier, tmp_path)
    stderr, errors = _refused(db, END_OF_RUN, START_LIMIT, 2, "error:")
    assert len(errors) == 1, stderr
    assert "file too large" in errors[0] and f"{live_dir(db)}/" in errors[0], errors
    assert not live_dir(db).exists()  # no side file, marker or directory half made
    assert not db.with_name(db.name + ".wal").exists()
    assert _stored(db) == {earlier_id: ("completed", None)}


def test_a_side_file_refused_mid_run_stops_the_run_with_the_cause_named(
    earlier: tuple[Path, str], tmp_path: Path
) -> None:
    db, earlier_id = _copy(earlier, tmp_path)
    (failed,) = _refused(db, MID_RUN, MID_RUN_LIMIT, 1, "run failed:")[1]
    assert "file too large" in failed and f"{live_dir(db)}/" in failed, failed
    runs = _stored(db)  # what it wrote before the failure reached the database, marked failed
    assert runs.pop(earlier_id) == ("completed", None)
    ((run_id, (status, error)),) = runs.items()
    assert status == "failed" and "file too large" in error and str(live_file(db, run_id)) in error
    with duckdb.connect(str(db), read_only=True) as con:
        (finished,) = con.execute(
            "SELECT count(*) FROM requests WHERE run_id = ? AND finish_reason IS NOT NULL",
            [run_id],
        ).fetchone()
    assert finished < 8  # it stopped in the step loop, not after it
    assert not live_dir(db).exists()


def test_a_merge_refused_keeps_the_run_in_its_side_file_until_the_next_writable_open(
    earlier: tuple[Path, str], tmp_path: Path
) -> None:
    db, earlier_id = _copy(earlier, tmp_path)
    wal = db.with_name(db.name + ".wal")
    _fill_wal(db, MERGE_LIMIT - MERGE_HEADROOM)
    padded = set(_stored(db))
    (error,) = _refused(db, END_OF_RUN, MERGE_LIMIT, 1, "error:")[1]
    (side,) = live_dir(db).glob("*.duckdb")
    run_id = side.stem
    assert f"run {run_id} did not reach {db}" in error, error
    assert f"{wal}: cannot write: file too large" in error, error
    assert f"kept in {side}" in error and "next writable open" in error, error
    # the database is whole: its runs are there, the new one only in the side file
    assert set(_stored(db)) == padded
    listed = _cli("runs", "--db", str(db), cwd=tmp_path)
    assert listed.returncode == 0 and run_id in listed.stdout and "writer gone" in listed.stdout
    # the next writable open, without the limit, merges it (here: naming a baseline)
    named = _cli("baseline", "set", "before", earlier_id, "--db", str(db), cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    assert not live_dir(db).exists()
    runs = _stored(db)
    assert runs[run_id] == ("completed", None) and set(runs) == padded | {run_id}
    with Store.open(db, read_only=True) as store:
        assert store.num_steps(run_id) == store.num_steps(earlier_id) > 0


def _fill_wal(db: Path, size: int) -> None:
    """Earlier finished runs (their rows only) written under a file size limit, so that their
    checkpoint fails and they stay in the database's WAL, which ends just under ``size``."""
    script = (
        "import sys\n"
        "from mrv2_prof.store import Store\n"
        "with Store.open(sys.argv[1]) as store:\n"
        "    for i in range(1000):\n"
        "        try:\n"
        "            with store.transaction():\n"
        "                store.begin_run(f'pad{i:03d}', scenario_name='pad', label='pad',\n"
        "                    matrix_combo=None, scenario_yaml='#' * 2000, device='cpu',\n"
        "                    versions={}, started_ns=i)\n"
        "                store.finish_run(f'pad{i:03d}', 'completed', ended_ns=i + 1)\n"
        "        except Exception:  # the limit: the WAL is full\n"
        "            break\n"
    )

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    subprocess.run(
        [sys.executable, "-c", script, str(db)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=limited,
        check=True,
        timeout=120,
    )
    wal = db.with_name(db.name + ".wal")
    assert size - 6000 <= wal.stat().st_size <= size


# --- a full disk (ENOSPC), the write patched to fail as DuckDB reports it -------------------

NO_SPACE = 'IO Error: Could not write file "{}": No space left on device'


def test_disk_errors_are_told_from_damage(tmp_path: Path) -> None:
    db = tmp_path / "runs.duckdb"
    wal = f"{db}.wal"
    full = disk_full(db, duckdb.IOException(NO_SPACE.format(wal)))
    assert isinstance(full, DiskFullError) and full.path == Path(wal)
    assert str(full).startswith(f"{wal}: cannot write: no space left on device")
    commit = duckdb.TransactionException(
        f'TransactionContext Error: Failed to commit: Could not write file "{wal}": File too large'
    )
    assert "file too large" in str(damaged_error(db, commit))
    assert "damaged" not in str(damaged_error(db, commit))
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(tmp_path / "x.json"))
    assert str(disk_full(db, quota)).startswith(f"{tmp_path / 'x.json'}: cannot write: disk quota")
    wrapped = RuntimeError("flush")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert str(disk_full(db, wrapped)).startswith(f"{db}: cannot write: no space left")
    assert disk_full(db, duckdb.IOException("IO Error: Corrupt database file")) is None
    assert "damaged" in str(damaged_error(db, duckdb.Error("Corrupt block checksum")))


def _no_space(path: Path):
    def fail(*args, **kwargs):
        raise duckdb.IOException(NO_SPACE.format(path))

    return fail


def test_a_merge_out_of_space_keeps_the_side_file_and_names_the_cause(
    run_in_process, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mrv2_prof.cli.run import _kept_in_side_file
    from mrv2_prof.store import db as db_module

    real_merge = db_module.merge_finished
    state = {"full": True}

    def merge(con, db):  # the disk is full once the run has ended (its side file is there)
        if state["full"] and any(live_dir(Path(db)).glob("*.duckdb")):
            _no_space(Path(f"{db}.wal"))()
        return real_merge(con, db)

    monkeypatch.setattr(db_module, "merge_finished", merge)
    job, sent = run_in_process(
        "workload.num_requests=2", "workload.output_len={dist: fixed, value: 4}"
    )
    db = Path(job.db_path)
    (outcome,) = [payload for kind, payload in sent if kind == "done"]
    assert outcome.status == "completed"
    side = live_file(db, outcome.run_id)
    assert side.exists()
    kept = _kept_in_side_file(db, outcome.run_id)
    assert kept is not None and "no space left on device" in kept and "damaged" not in kept
    assert str(side) in kept and "next writable open" in kept
    with pytest.raises(StoreError) as refused:  # a writable open while the disk is full
        Store.open(db)
    assert isinstance(refused.value, DiskFullError) and "damaged" not in str(refused.value)
    state["full"] = False  # space again: the next writable open merges it
    with Store.open(db) as store:
        assert store.live_merged == [outcome.run_id]
    assert _stored(db)[outcome.run_id] == ("completed", None) and not side.exists()
    assert _kept_in_side_file(db, outcome.run_id) is None


def test_a_flush_out_of_space_fails_the_run_without_a_traceback(
    run_in_process, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_append = Store.append_batches
    calls = {"n": 0}

    def append_batches(self, run_id, batches):
        calls["n"] += 1
        if calls["n"] > 1 and self.path.parent.name.endswith(".live"):
            _no_space(Path(f"{self.path}.wal"))()
        return real_append(self, run_id, batches)

    real_finish = Store.finish_run

    def finish_run(self, run_id, status, **kwargs):  # the side file cannot take the end either
        if self.path.parent.name.endswith(".live"):
            _no_space(Path(f"{self.path}.wal"))()
        return real_finish(self, run_id, status, **kwargs)

    monkeypatch.setattr(Store, "append_batches", append_batches)
    monkeypatch.setattr(Store, "finish_run", finish_run)
    monkeypatch.setattr("mrv2_prof.pipeline.open_loop.FLUSH_INTERVAL_NS", 1)  # a flush every step
    job, sent = run_in_process(
        "workload.num_requests=4", "workload.output_len={dist: fixed, value: 16}"
    )
    (outcome,) = [payload for kind, payload in sent if kind == "done"]
    db = Path(job.db_path)
    side_wal = f"{live_file(db, outcome.run_id)}.wal"
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error.startswith(f"{side_wal}: cannot write: no space left on device")
    assert "traceback" not in outcome.facts
    # merged as it was before the failure, and its end written in the database's row
    assert _stored(db)[outcome.run_id] == ("failed", outcome.error)
    assert not live_dir(db).exists()


def test_a_run_row_refused_at_the_start_is_exit_2_and_leaves_nothing(
    run_in_process, monkeypatch: pytest.MonkeyPatch
) -> None:
    def begin_run(self, run_id, **kwargs):
        _no_space(Path(f"{self.path}.wal"))()

    monkeypatch.setattr(Store, "begin_run", begin_run)
    job, sent = run_in_process()
    (outcome,) = [payload for kind, payload in sent if kind == "done"]
    assert outcome.run_id is None and outcome.exit_code == 2
    assert "no space left on device" in outcome.error and ".live/" in outcome.error
    assert [kind for kind, _ in sent] == ["done"]
    db = Path(job.db_path)
    assert _stored(db) == {} and not live_dir(db).exists()


def test_a_marker_refused_removes_the_side_file(tmp_path: Path, monkeypatch) -> None:
    from mrv2_prof.store import live_runs

    def write_text(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    db = tmp_path / "runs.duckdb"
    Store.open(db).close()
    monkeypatch.setattr(live_runs.Path, "write_text", write_text)
    with pytest.raises(DiskFullError, match="no space left on device"):
        Store.open_live_run(db, label="x", scenario_name="x")
    assert not live_dir(db).exists()
