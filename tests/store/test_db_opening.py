"""Opening a run database: one-line refusals (locked, not DuckDB, another tool's, missing, newer),
a version 1 file upgraded or read as it is, runs left running by a gone process, a brief wait for
a closing writer."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from mrv2_prof.store import SCHEMA_VERSION, TABLES, Store, StoreError
from mrv2_prof.store.opening import LOCK_WAIT_S
from tests.store.db_helpers import begin as _begin
from tests.store.db_helpers import child as _child
from tests.store.db_helpers import one_line as _one_line


def test_locked_file_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    code = (
        "import sys\n"
        "from mrv2_prof.store import Store\n"
        "store = Store.open(sys.argv[1])\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = _child(code, str(path), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        for read_only, wait_s in ((False, None), (True, 0.5)):  # the default wait, then a short one
            start = time.monotonic()
            with pytest.raises(StoreError) as err:
                Store.open(path, read_only=read_only, lock_wait_s=wait_s)
            waited = time.monotonic() - start
            assert (wait_s or LOCK_WAIT_S) <= waited < (wait_s or LOCK_WAIT_S) + 5
            assert _one_line(err) == (
                f"{path}: in use by another process (PID {holder.pid}); "
                "wait for it to finish or pass a different --db"
            )
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    Store.open(path).close()  # free again once the holder exits


def test_not_a_duckdb_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    path.write_bytes(b"id,name\n1,a\n" * 100)
    with pytest.raises(StoreError) as err:
        Store.open(path)
    msg = _one_line(err)
    assert msg.startswith(f"{path}: not a DuckDB database (1200 bytes")
    assert msg.endswith("; pass a different --db")


def test_duckdb_file_of_another_tool(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError) as err:
        Store.open(path)
    assert _one_line(err) == (
        f"{path}: a DuckDB database but not an mrv2-prof run database (no schema_version); "
        "pass a different --db"
    )


def test_missing_file_and_directory(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    with pytest.raises(StoreError) as err:
        Store.open(path, read_only=True)
    assert _one_line(err).startswith(f"{path}: no such run database (pass --db")
    assert not path.exists()
    with pytest.raises(StoreError) as err:
        Store.open(tmp_path / "nodir" / "runs.duckdb")
    assert "does not exist; create it or pass a different --db" in _one_line(err)


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    Store.open(path).close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    for read_only in (False, True):
        with pytest.raises(StoreError) as err:
            Store.open(path, read_only=read_only)
        assert _one_line(err) == (
            f"{path}: run database schema version {SCHEMA_VERSION + 1} is newer than this "
            f"mrv2-prof expects ({SCHEMA_VERSION}); upgrade mrv2-prof to read it"
        )


V1_NEW_STEPS_COLUMNS = ("bubble_kind", "host_prep_ns", "hidden_prep_ns")


def _version_1_file(path: Path) -> None:
    with Store.open(path) as store:
        _begin(store, "abc123")
        store.append("abc123", "steps", {"step": [0, 1], "bubble_ns": [5, 7]})
        store.finish_run("abc123", "completed", ended_ns=2_000)
    con = duckdb.connect(str(path))  # make it look like a version 1 file
    for column in V1_NEW_STEPS_COLUMNS:
        con.execute(f"ALTER TABLE steps DROP COLUMN {column}")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.close()


def test_a_version_1_file_is_upgraded_in_place_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    _version_1_file(path)
    with Store.open(path) as store:
        assert store.upgraded_from == 1
        con = store.connection
        assert con.execute("SELECT value FROM meta").fetchall() == [(str(SCHEMA_VERSION),)]
        cols = [r[0] for r in con.execute("DESCRIBE steps").fetchall()]
        assert sorted(cols) == sorted(name for name, _ in TABLES["steps"])  # added at the end
        assert con.execute(
            "SELECT step, bubble_ns, bubble_kind FROM steps ORDER BY step"
        ).fetchall() == [(0, 5, None), (1, 7, None)]
        assert store.resolve_run("latest") == "abc123"
    with Store.open(path) as store:
        assert store.upgraded_from is None  # once


def test_a_version_1_file_is_read_as_it_is_without_writing(tmp_path: Path) -> None:
    """Reading never writes: the columns newer versions added read as NULL, the file keeps its
    bytes and its version."""
    path = tmp_path / "runs.duckdb"
    _version_1_file(path)
    before = path.read_bytes()
    with Store.open(path, read_only=True) as store:
        assert store.upgraded_from is None
        con = store.connection
        assert con.execute("SELECT value FROM meta").fetchall() == [("1",)]
        cols = [r[0] for r in con.execute("DESCRIBE steps").fetchall()]
        assert sorted(cols) == sorted(name for name, _ in TABLES["steps"])
        assert con.execute(
            "SELECT step, bubble_ns, bubble_kind FROM steps ORDER BY step"
        ).fetchall() == [(0, 5, None), (1, 7, None)]
        assert store.resolve_run("latest") == "abc123"
        assert [r["status"] for r in store.list_runs()] == ["completed"]
    assert path.read_bytes() == before


def test_a_run_left_running_by_a_gone_process_is_shown_then_marked_failed(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    code = (
        "import os, sys\n"
        "from mrv2_prof.store import Store\n"
        "store = Store.open(sys.argv[1])\n"
        "store.begin_run('abc123', scenario_name='s', label='s', matrix_combo=None,\n"
        "    scenario_yaml='', device='cpu', versions={}, started_ns=1)\n"
        "os._exit(1)\n"
    )
    proc = _child(code, str(path), stderr=subprocess.PIPE)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    before = path.read_bytes()
    with Store.open(path, read_only=True) as store:  # a reader shows it, and writes nothing
        (run,) = store.list_runs()
        assert (run["status"], run["writer_gone"]) == ("running", True)
        pid, host = store.connection.execute("SELECT writer_pid, writer_host FROM runs").fetchone()
    assert pid == proc.pid and host == os.uname().nodename
    assert path.read_bytes() == before
    with Store.open(path) as store:  # the next writer marks it failed, with the reason
        assert store.orphans_failed == ["abc123"]
        (run,) = store.list_runs()
        assert (run["status"], run["writer_gone"]) == ("failed", False)
        assert run["error"] == (
            f"its writer (PID {pid} on {host}) ended without finishing the run; "
            "marked failed when the database was next opened for writing"
        )
    with Store.open(path) as store:
        assert store.orphans_failed == []


def test_a_running_run_of_a_live_writer_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _begin(store, "abc123")
    with Store.open(path) as store:  # this process wrote it and still exists
        assert store.orphans_failed == []
        assert [(r["status"], r["writer_gone"]) for r in store.list_runs()] == [("running", False)]


def test_an_open_waits_briefly_for_a_writer_that_is_closing(tmp_path: Path) -> None:
    """A reader opening the file just as the run's process closes it gets in, not an error."""
    path = tmp_path / "runs.duckdb"
    Store.open(path).close()
    code = (
        "import sys, time\n"
        "from mrv2_prof.store import Store\n"
        "store = Store.open(sys.argv[1])\n"
        "print('ready', flush=True)\n"
        "time.sleep(0.5)\n"
        "store.close()\n"
        "time.sleep(30)\n"
    )
    holder = _child(code, str(path), stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with Store.open(path, read_only=True, lock_wait_s=10) as store:
            assert store.list_runs() == []
    finally:
        holder.kill()
        holder.wait()
