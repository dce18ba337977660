"""``report -o`` / ``export -o`` never write over another database: a second run database, a
plain DuckDB file, a run's unmerged side file under ``<db>.live/`` (of ``--db`` or of another
database) or its marker, another database's log, each also through a symlink or a hard link.
Each is one line, exit 2, and every file in the directory byte for byte as it was. And
``tui`` without a terminal says so and exits 2 instead of drawing on a pipe forever."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from mrv2_prof.cli import app
from mrv2_prof.store import Store

runner = CliRunner()
COMMANDS = {
    "report": ["report", "latest", "-o"],
    "export": ["export", "latest", "-o"],
}
SCENARIO = (
    "name: tiny\nmodel: {preset: llama-tiny}\n"
    "runner: {device: cpu, kernels: torch, num_kv_blocks: 64, max_model_len: 256}\n"
    "workload: {num_requests: 1, prompt_len: {dist: fixed, value: 8}, "
    "output_len: {dist: fixed, value: 4}}\n"
)


@pytest.fixture(scope="module")
def run_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding one real (small, CPU) run, for report and export to render."""
    d = tmp_path_factory.mktemp("run")
    (d / "s.yaml").write_text(SCENARIO)
    db = d / "runs.duckdb"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrv2_prof",
            "run",
            str(d / "s.yaml"),
            "--headless",
            "--db",
            str(db),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return db


def _plain_duckdb(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE kept AS SELECT range AS i FROM range(1000)")
    con.close()


def _side_file(path: Path) -> None:
    """A run's side file left by a run killed before its merge: a run database of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Store.open(path).close()


def _build(d: Path, run_db: Path) -> dict[str, Path]:
    """The run database (``--db``) and, by name, every other database file to aim ``-o`` at."""
    shutil.copyfile(run_db, d / "runs.duckdb")
    (d / "other").mkdir()
    Store.open(d / "other" / "b.duckdb").close()  # a second run database
    _plain_duckdb(d / "other" / "plain.duckdb")  # a DuckDB file of someone else's
    _side_file(d / "runs.duckdb.live" / "bbb222.duckdb")  # --db's own unmerged run
    (d / "runs.duckdb.live" / "bbb222.json").write_text('{"run_id": "bbb222"}')
    _side_file(d / "other" / "b.duckdb.live" / "ccc333.duckdb")  # another database's
    return {
        "second-run-db": d / "other" / "b.duckdb",
        "plain-duckdb": d / "other" / "plain.duckdb",
        "own-side-file": d / "runs.duckdb.live" / "bbb222.duckdb",
        "other-side-file": d / "other" / "b.duckdb.live" / "ccc333.duckdb",
    }


def _snapshot(d: Path) -> dict[str, bytes | str]:
    """Every entry under ``d``: a file's bytes, a link's target, ``dir`` for a directory."""
    seen: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(d))
            if p.is_symlink():
                seen[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                seen[rel] = "dir"
            else:
                seen[rel] = p.read_bytes()
    return seen


def _cases() -> list[tuple[str, str, str]]:
    names = ["second-run-db", "plain-duckdb", "own-side-file", "other-side-file"]
    cases = [(c, n, s) for c in COMMANDS for n in names for s in ("direct", "symlink", "hard")]
    for c in COMMANDS:
        cases += [(c, "own-marker", "direct"), (c, "own-marker", "symlink")]
        cases += [(c, "other-wal", "direct")]  # another database's log, not there yet
    return cases


def _aim(d: Path, targets: dict[str, Path], name: str, spelling: str) -> Path:
    if name == "own-marker":
        target = d / "runs.duckdb.live" / "bbb222.json"
    elif name == "other-wal":
        target = d / "other" / "b.duckdb.wal"
    else:
        target = targets[name]
    if spelling == "direct":
        return target
    link = d / f"{spelling}-{name}.out"
    (os.symlink if spelling == "symlink" else os.link)(target, link)
    return link


@pytest.mark.parametrize(("command", "name", "spelling"), _cases())
def test_another_database_is_refused_in_one_line(
    command: str, name: str, spelling: str, tmp_path: Path, run_db: Path
) -> None:
    targets = _build(tmp_path, run_db)
    path = _aim(tmp_path, targets, name, spelling)
    before = _snapshot(tmp_path)
    args = [*COMMANDS[command], str(path), "--db", str(tmp_path / "runs.duckdb")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {path}: "), lines[0]
    assert "Traceback" not in result.output
    assert _snapshot(tmp_path) == before  # nothing written, nothing replaced, no .partial


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_message_says_what_the_file_is_and_how_to_replace_it(
    command: str, tmp_path: Path, run_db: Path
) -> None:
    targets = _build(tmp_path, run_db)
    db = str(tmp_path / "runs.duckdb")
    result = runner.invoke(app, [*COMMANDS[command], str(targets["plain-duckdb"]), "--db", db])
    assert "is a DuckDB database" in result.output
    assert "delete it yourself" in result.output
    side = targets["own-side-file"]
    result = runner.invoke(app, [*COMMANDS[command], str(side), "--db", db])
    assert f"is in {side.parent}, a live-run directory" in result.output
    wal = tmp_path / "other" / "b.duckdb.wal"
    result = runner.invoke(app, [*COMMANDS[command], str(wal), "--db", db])
    assert f"write-ahead log of the DuckDB database {targets['second-run-db']}" in result.output


def test_duckdb_files_carry_the_magic_bytes_the_check_reads(tmp_path: Path) -> None:
    """The installed DuckDB writes ``DUCK`` at offset 8 of a new file (the check relies on it)."""
    _plain_duckdb(tmp_path / "x.duckdb")
    Store.open(tmp_path / "y.duckdb").close()
    for name in ("x.duckdb", "y.duckdb"):
        assert (tmp_path / name).read_bytes()[8:12] == b"DUCK"


@pytest.mark.parametrize(("command", "suffix"), [("report", ".html"), ("export", ".json")])
def test_an_ordinary_file_is_still_replaced(
    command: str, suffix: str, tmp_path: Path, run_db: Path
) -> None:
    """The refusals above are about databases: a file that is not one is written over (and
    a file whose first bytes are ``DUCK`` but not at offset 8 is not a database)."""
    _build(tmp_path, run_db)
    old = tmp_path / f"old{suffix}"
    old.write_bytes(b"DUCK and more, not a database header")
    args = [*COMMANDS[command], str(old), "--db", str(tmp_path / "runs.duckdb")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert not old.read_bytes().startswith(b"DUCK")
    assert old.stat().st_size > 100


def _tui(db: Path, stdin, stdout) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mrv2_prof", "tui", "--db", str(db)],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=60,
        env={**os.environ, "TERM": "xterm"},
    )


@pytest.mark.parametrize("missing", ["stdin", "stdout", "both"])
def test_tui_without_a_terminal_says_so_and_exits_2(
    missing: str, tmp_path: Path, run_db: Path
) -> None:
    db = tmp_path / "runs.duckdb"
    shutil.copyfile(run_db, db)
    before = db.read_bytes()
    leader, follower = pty.openpty()  # a terminal for the side that has one
    try:
        stdin = subprocess.DEVNULL if missing in ("stdin", "both") else follower
        stdout = subprocess.PIPE if missing in ("stdout", "both") else follower
        result = _tui(db, stdin, stdout)
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: tui needs a terminal"), lines[0]
    assert not result.stdout  # nothing drawn on a pipe (None when stdout was the terminal)
    assert db.read_bytes() == before
