"""Output files of the command line: the run database refused under any spelling, devices and
directories refused, a write that fails leaves the old file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mrv2_prof.cli.output_file import OutputError, check_output, write_output


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    path.write_bytes(b"DUCK" * 100)
    return path


def spellings(db: Path) -> list[Path]:
    (db.parent / "sub").mkdir()
    os.symlink(db, db.parent / "link.json")
    os.link(db, db.parent / "hard.json")
    return [
        db,
        Path(os.path.relpath(db)),
        db.parent / "sub" / ".." / db.name,
        db.parent / "link.json",
        db.parent / "hard.json",
        db.with_name(db.name + ".wal"),  # DuckDB's log, even before it exists
    ]


def test_every_spelling_of_the_database_is_refused(db: Path):
    before = db.read_bytes()
    for path in spellings(db):
        with pytest.raises(OutputError, match="is the run database"):
            write_output(path, [db], "trace", lambda fp: fp.write("{}"))
    assert db.read_bytes() == before
    assert not db.with_name(db.name + ".wal").exists()
    assert (db.parent / "link.json").is_symlink()


@pytest.mark.parametrize(
    ("target", "problem"), [("/dev/full", "not a regular file"), ("/dev/null", "not a regular")]
)
def test_devices_are_refused(db: Path, target: str, problem: str):
    with pytest.raises(OutputError, match=problem):
        check_output(Path(target), [db], "trace")


def test_a_directory_is_refused(db: Path):
    with pytest.raises(OutputError, match="is a directory"):
        check_output(db.parent, [db], "report")


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, db: Path):
    target = tmp_path / "old.json"
    target.write_text("old")

    def half_then_fail(fp):
        fp.write("new, half written")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="cannot write the trace .No space left on device."):
        write_output(target, [db], "trace", half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json", "runs.duckdb"]


def test_writes_through_a_symlink_and_keeps_the_mode(tmp_path: Path, db: Path):
    real = tmp_path / "real.html"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.html"
    link.symlink_to(real)
    assert write_output(link, [db], "report", lambda fp: fp.write("new")) == 3
    assert link.is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o640
