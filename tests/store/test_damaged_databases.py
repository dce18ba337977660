"""Every command on a damaged, truncated or foreign database file: one line naming the file and
what is wrong, exit 2, and the file unchanged (byte for byte) — reading never writes and ``run``
refuses to append."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.store import SCHEMA_VERSION, Store
from mrv2_prof.store import opening as store_opening

runner = CliRunner()


def _project_db(path: Path) -> None:
    """A real run database with a finished run, large enough to span several blocks."""
    with Store.open(path) as store:
        store.begin_run(
            "abc123",
            scenario_name="s",
            label="s",
            matrix_combo=None,
            scenario_yaml="name: s\n",
            device="cpu",
            versions={},
            started_ns=1,
        )
        n = 60_000
        store.append("abc123", "steps", {"step": np.arange(n), "cpu_start_ns": np.arange(n)})
        store.append("abc123", "tokens", {"req_id": ["0"] * n, "idx": np.arange(n)})
        store.finish_run("abc123", "completed", ended_ns=2)


def truncated(path: Path) -> None:
    _project_db(path)
    os.truncate(path, path.stat().st_size // 10)


def corrupt_block(path: Path) -> None:
    _project_db(path)
    with path.open("r+b") as fp:  # the first block after the two headers: a checksum mismatch
        fp.seek(12288)
        fp.write(bytes(range(256)) * 2)


def not_duckdb(path: Path) -> None:
    path.write_bytes(b"run_id,label\n1,a\n" * 50)


def empty_file(path: Path) -> None:
    path.write_bytes(b"")


def _foreign(*statements: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        con = duckdb.connect(str(path))
        for statement in statements:
            con.execute(statement)
        con.close()

    return make


CASES = {
    "truncated": (truncated, "damaged or not an mrv2-prof run database (IO Error: Could not read"),
    "corrupt block": (corrupt_block, "damaged or not an mrv2-prof run database (Corrupt database"),
    "not duckdb": (not_duckdb, "not a DuckDB database (850 bytes without a DuckDB header)"),
    "empty file": (empty_file, None),  # read: an empty file; run: DuckDB's own complaint
    "other columns in meta": (
        _foreign("CREATE TABLE meta (name VARCHAR, n INTEGER)", "INSERT INTO meta VALUES ('a', 1)"),
        "not an mrv2-prof run database (its meta table has columns ['n', 'name'])",
    ),
    "meta without runs": (
        _foreign(
            "CREATE TABLE meta (key VARCHAR, value VARCHAR)",
            f"INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}')",
        ),
        f"not an mrv2-prof run database (schema_version {SCHEMA_VERSION} but no runs table)",
    ),
    "schema_version 0": (
        _foreign(
            "CREATE TABLE meta (key VARCHAR, value VARCHAR)",
            "INSERT INTO meta VALUES ('schema_version', '0')",
            "CREATE TABLE things (x INTEGER)",
        ),
        "not an mrv2-prof run database (schema_version '0')",
    ),
    "tables of another tool": (
        _foreign("CREATE TABLE t (x INTEGER)"),
        "not an mrv2-prof run database (no schema_version)",
    ),
    "a directory": (
        lambda path: path.mkdir(),
        "is a directory; the run database must be a regular",
    ),
    "a fifo": (lambda path: os.mkfifo(path), "is not a regular file (a FIFO or a device)"),
}

COMMANDS = {
    "runs": ["runs"],
    "show": ["show", "latest"],
    "export": ["export", "latest", "-o", "{tmp}/t.json"],
    "report": ["report", "latest", "-o", "{tmp}/r.html"],
    "tui": ["tui"],
    "compare": ["compare", "latest", "latest"],
    "gate": ["gate", "--baseline", "latest", "--candidate", "latest"],
    "run": ["run", "--headless", "--set", "workload.num_requests=1", "{scenario}"],
}

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def _snapshot(path: Path) -> bytes | str:
    return path.read_bytes() if path.is_file() else ("dir" if path.is_dir() else "other")


def _invoke(command: str, db: Path, tmp: Path):
    args = [a.format(tmp=tmp, scenario=QUICKSTART) for a in COMMANDS[command]]
    sigint = signal.getsignal(signal.SIGINT)
    try:
        return runner.invoke(app, [*args, "--db", str(db)])
    finally:
        signal.signal(signal.SIGINT, sigint)  # run takes Ctrl-C over, as in its process


@pytest.mark.parametrize("case", list(CASES))
def test_every_command_refuses_a_bad_database_in_one_line(tmp_path: Path, case: str) -> None:
    make, expected = CASES[case]
    db = tmp_path / "runs.duckdb"
    make(db)
    before = _snapshot(db)
    for command in COMMANDS:
        result = _invoke(command, db, tmp_path)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        where = f"{case} / {command}: {result.output!r} {result.exception!r}"
        assert result.exit_code == 2, where
        assert len(lines) == 1 and "Traceback" not in result.output, where
        assert lines[0].startswith(f"error: {db}: "), where
        if expected is not None:
            assert expected in lines[0], where
        assert _snapshot(db) == before, where  # nothing written, nothing upgraded
        assert not (tmp_path / "runs.duckdb.wal").exists(), where
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "r.html").exists()


def test_permission_denied_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of mode 000. Root reads it anyway, so there the refusal of ``os.access`` is
    simulated; elsewhere the mode itself does it."""
    db = tmp_path / "runs.duckdb"
    _project_db(db)
    db.chmod(0)
    if os.geteuid() == 0:
        access = os.access
        monkeypatch.setattr(
            store_opening.os, "access", lambda p, mode, **k: Path(p) != db and access(p, mode)
        )
    try:
        for command in COMMANDS:
            result = _invoke(command, db, tmp_path)
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert result.exit_code == 2 and len(lines) == 1, (command, result.output)
            assert lines[0].startswith(f"error: {db}: permission denied (mode ----------;")
    finally:
        db.chmod(0o644)


def test_a_null_label_is_listed_not_a_traceback(tmp_path: Path) -> None:
    """A run row another tool wrote without a label: listed under its scenario name."""
    db = tmp_path / "runs.duckdb"
    _project_db(db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET label = NULL")
    con.close()
    before = db.read_bytes()
    result = runner.invoke(app, ["runs", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "abc123" in result.stdout and "completed" in result.stdout
    result = runner.invoke(app, ["show", "latest", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert db.read_bytes() == before
