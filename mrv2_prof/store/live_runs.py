"""Runs in progress: each writes a file of its own beside the run database and is merged into it
when it ends, so the runs already there stay readable while it writes.

DuckDB lets one process hold a file for writing and no other process read it meanwhile. A run
that held ``runs.duckdb`` for its whole length would lock ``runs``, ``show``, ``report`` and
``tui`` out of every finished run. So a live run writes ``<db>.live/<run_id>.duckdb`` (the same
schema) and ``<run_id>.json`` beside it, a marker readers list as ``running`` (label, scenario,
start, writer). When it ends, one transaction of the run database copies its rows in (a reader
that meets that lock waits for it, ``opening.LOCK_WAIT_S``) and its files are deleted.

Crash safety: the run database is only touched by that one transaction (all or nothing). A run
killed before its merge leaves its side file; every writable open of the database merges each
side file no live process holds (its DuckDB lock says so; a read-only attach replays its WAL),
and the orphan pass then marks a row still ``running`` ``failed``. A merge is idempotent (a run
already in the database is not copied again, its side files are just removed), and a side file
that cannot be merged (another schema version, damaged) is left where it is, never deleted.

A finished run's file made elsewhere (a Ray cell's, whose worker chose its run id in a database of
its own) is adopted under the database's write lock (``adopt_run_file``): when the database
already has that run id, or a live run holds it, the file's run is given a new id first, so a
merge never drops the newcomer as a run already there.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

import duckdb

from mrv2_prof.store.opening import StoreError
from mrv2_prof.store.orphans import this_writer, writer_alive
from mrv2_prof.store.schema import META_TABLE, SCHEMA_VERSION, TABLES, quote

# the tables keyed by run (a run's rows); ``baselines`` belongs to the database, not to a run
RUN_TABLES = {t: cols for t, cols in TABLES.items() if any(n == "run_id" for n, _ in cols)}

LIVE_SUFFIX = ".live"
_ALIAS = "mrv2_live_run"
_MAX_MARKER_BYTES = 64 * 1024


def live_dir(db: Path) -> Path:
    """The directory of ``db``'s live runs: ``runs.duckdb.live`` beside ``runs.duckdb``."""
    return db.with_name(db.name + LIVE_SUFFIX)


def live_file(db: Path, run_id: str) -> Path:
    """The DuckDB file run ``run_id`` of ``db`` writes while it is live."""
    return live_dir(db) / f"{run_id}.duckdb"


def _marker(db: Path, run_id: str) -> Path:
    return live_dir(db) / f"{run_id}.json"


def write_marker(db: Path, run_id: str, *, label: str, scenario_name: str) -> None:
    """The small file readers list the live run from (written beside, then renamed in)."""
    pid, host = this_writer()
    fields = {
        "run_id": run_id,
        "label": label,
        "scenario_name": scenario_name,
        "started_at": dt.datetime.now().isoformat(),
        "writer_pid": pid,
        "writer_host": host,
    }
    path = _marker(db, run_id)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, path)


def remove_live_run(db: Path, run_id: str) -> None:
    """Remove the side file and marker of a run that could not start (the disk refused its
    first writes): nothing of it is left half made. The directory goes when it is empty."""
    side = live_file(db, run_id)
    marker = _marker(db, run_id)
    for leftover in (
        side,
        side.with_name(side.name + ".wal"),
        marker,
        marker.with_name(marker.name + ".tmp"),
    ):
        with contextlib.suppress(OSError):
            leftover.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        live_dir(db).rmdir()


def live_runs(db: Path, known: set[str]) -> list[dict[str, Any]]:
    """The runs of ``db`` still in their side files (not in ``known``, the ids of the database),
    as ``Store.list_runs`` rows: ``running``, or ``writer_gone`` when their process is gone."""
    rows = []
    for path in sorted(live_dir(db).glob("*.json")) if live_dir(db).is_dir() else ():
        fields = _read_marker(path)
        if fields is None or fields["run_id"] in known:
            continue
        started_at = dt.datetime.fromisoformat(fields["started_at"])
        alive = writer_alive(fields["writer_pid"], fields["writer_host"], started_at)
        rows.append(
            {
                "run_id": fields["run_id"],
                "label": fields["label"] or fields["scenario_name"] or "",
                "scenario_name": fields["scenario_name"],
                "status": "running",
                "started_ns": None,
                "ended_ns": None,
                "started_at": started_at,
                "device": None,
                "error": None,
                "num_requests": 0,
                "output_tokens": 0,
                "writer_gone": alive is False,
                "live": True,
            }
        )
    return rows


def _read_marker(path: Path) -> dict[str, Any] | None:
    """A marker's fields, or None for one that is not (yet) whole: it is skipped, not fatal."""
    try:
        if path.stat().st_size > _MAX_MARKER_BYTES:
            return None
        fields = json.loads(path.read_text())
        dt.datetime.fromisoformat(fields["started_at"])
        if not isinstance(fields["run_id"], str) or path.stem != fields["run_id"]:
            return None
        return fields
    except (OSError, ValueError, KeyError, TypeError):
        return None


def merge_finished(con: duckdb.DuckDBPyConnection, db: Path) -> list[str]:
    """Merge every side file of ``db`` that no process holds into ``con`` (the database, open
    for writing); returns the ids of the runs copied in."""
    directory = live_dir(db)
    if not directory.is_dir():
        return []
    merged = []
    for path in sorted(directory.glob("*.duckdb")):
        merged += merge_one(con, db, path)
    return merged


def merge_one(con: duckdb.DuckDBPyConnection, db: Path, path: Path) -> list[str]:
    """Copy the runs of side file ``path`` into ``con`` in one transaction, then delete the side
    file and its marker. A file another process holds (a live run) is left alone."""
    try:
        con.execute(f"ATTACH '{_sql_text(path)}' AS {_ALIAS} (READ_ONLY)")
    except duckdb.Error:
        return []  # held by its live writer (or not a database): not ours to merge now
    try:
        if not _same_schema(con):
            return []
        ids = [
            run_id
            for (run_id,) in con.execute(
                f"SELECT run_id FROM {_ALIAS}.main.runs "
                "WHERE run_id NOT IN (SELECT run_id FROM main.runs)"
            ).fetchall()
        ]
        con.execute("BEGIN TRANSACTION")
        try:
            for table, columns in RUN_TABLES.items() if ids else ():
                names = ", ".join(quote(name) for name, _ in columns)
                con.execute(
                    f"INSERT INTO main.{quote(table)} ({names}) SELECT {names} "
                    f"FROM {_ALIAS}.main.{quote(table)} WHERE list_contains(?, run_id)",
                    [ids],
                )
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    finally:
        con.execute(f"DETACH {_ALIAS}")
    for leftover in (path, path.with_name(path.name + ".wal"), path.with_suffix(".json")):
        leftover.unlink(missing_ok=True)
    # Side files are created and merged under the database's write lock: no race. The
    # directory stays while other live runs are in it.
    with contextlib.suppress(OSError):
        path.parent.rmdir()
    return ids


def adopt_run_file(
    con: duckdb.DuckDBPyConnection, db: Path, source: Path, run_id: str, stored_id: str
) -> list[str]:
    """Merge ``source``, a finished run's own database holding run ``run_id``, into ``con`` (the
    database ``db``, open for writing: no other id is chosen meanwhile) as run ``stored_id``.
    The file is moved in as ``<stored_id>.duckdb.incoming`` (a name no merge takes), its run
    given ``stored_id`` when that differs, then renamed to that run's side file and merged. A
    file whose id could not be changed stays where it is: never merged over another run."""
    side = live_file(db, stored_id)
    incoming = side.with_name(side.name + ".incoming")
    live_dir(db).mkdir(exist_ok=True)
    shutil.move(source, incoming)
    if stored_id != run_id:
        _change_run_id(incoming, run_id, stored_id)
    os.replace(incoming, side)
    return merge_one(con, db, side)


def _change_run_id(path: Path, old: str, new: str) -> None:
    """Every row of run ``old`` in run file ``path`` becomes run ``new``, in one transaction."""
    try:
        with duckdb.connect(str(path)) as con:
            con.execute("BEGIN TRANSACTION")
            for table in RUN_TABLES:
                con.execute(f"UPDATE {quote(table)} SET run_id = ? WHERE run_id = ?", [new, old])
            con.execute("COMMIT")
    except duckdb.Error as exc:
        detail = " ".join(str(exc).split())
        raise StoreError(f"{path}: cannot give run {old} the id {new} ({detail})") from exc


def _same_schema(con: duckdb.DuckDBPyConnection) -> bool:
    try:
        rows = con.execute(
            f"SELECT value FROM {_ALIAS}.main.{META_TABLE} WHERE key = 'schema_version'"
        ).fetchall()
    except duckdb.Error:
        return False
    return bool(rows) and rows[0][0] == str(SCHEMA_VERSION)


def _sql_text(path: Path) -> str:
    return str(path).replace("'", "''")
