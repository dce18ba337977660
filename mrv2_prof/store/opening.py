"""Opening a run database file: one-line errors, the schema created in a new file, an older
file upgraded in place, a newer one refused.

``connect`` is what ``Store.open`` does before it wraps the connection. Every problem a user can
act on (a missing directory, a file another process holds, a file that is not DuckDB or not
ours, a schema newer than this version) is a ``StoreError`` whose ``str()`` is one line naming
the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from mrv2_prof.store.schema import META_TABLE, SCHEMA_VERSION, schema_ddl, upgrade_ddl


class StoreError(Exception):
    """A run database problem the user can act on; ``str()`` is one line naming the file."""


def connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A connection to ``path`` with the schema checked, creating the file and schema when it is
    missing (unless ``read_only``) and upgrading an older schema (a read-only open upgrades
    through a writable one first)."""
    if not path.exists():
        if read_only:
            raise StoreError(f"{path}: no such run database (pass --db with a file runs wrote)")
        if not path.parent.is_dir():
            raise StoreError(
                f"{path}: directory {path.parent} does not exist; "
                "create it or pass a different --db"
            )
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        raise _open_error(path, exc) from exc
    try:
        _check_schema(con, path, read_only)
    except _NeedsUpgrade:
        con.close()
        connect(path, read_only=False).close()  # upgrade in place, then open read-only again
        return connect(path, read_only=True)
    except BaseException:
        con.close()
        raise
    return con


def _open_error(path: Path, exc: duckdb.Error) -> StoreError:
    """The one-line StoreError for a DuckDB error raised by ``duckdb.connect``."""
    msg = str(exc)
    if "Could not set lock" in msg or "Conflicting lock" in msg:
        pid = re.search(r"PID (\d+)", msg)
        holder = f" (PID {pid.group(1)})" if pid else ""
        return StoreError(
            f"{path}: in use by another process{holder}; "
            "wait for it to finish or pass a different --db"
        )
    if "not a valid DuckDB database" in msg:
        size_bytes = path.stat().st_size if path.exists() else 0
        return StoreError(
            f"{path}: not a DuckDB database ({size_bytes} bytes without a DuckDB header); "
            "pass a different --db"
        )
    first_line = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    return StoreError(f"{path}: cannot open ({first_line}); pass a different --db")


def _check_schema(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
    """Create the schema in an empty file; otherwise require an mrv2-prof file of our version."""
    tables = {
        row[0]
        for row in con.execute(
            "SELECT table_name FROM duckdb_tables() "
            "WHERE database_name = current_database() AND schema_name = 'main'"
        ).fetchall()
    }
    not_ours = StoreError(
        f"{path}: a DuckDB database but not an mrv2-prof run database (no schema_version); "
        "pass a different --db"
    )
    if not tables:
        if read_only:
            raise not_ours
        con.execute("BEGIN TRANSACTION")
        for statement in schema_ddl():
            con.execute(statement)
        con.execute("COMMIT")
        return
    if META_TABLE not in tables:
        raise not_ours
    # fetchall: a partly fetched result would block the connection's next register()
    rows = con.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'schema_version'").fetchall()
    row = rows[0] if rows else None
    if row is None or not str(row[0]).isdigit():
        raise not_ours
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: run database schema version {version} is newer than this mrv2-prof "
            f"expects ({SCHEMA_VERSION}); upgrade mrv2-prof to read it"
        )
    if version < SCHEMA_VERSION:
        if read_only:
            raise _NeedsUpgrade(version)
        _upgrade(con)


class _NeedsUpgrade(Exception):
    """A read-only open found an older schema: the file is upgraded by a writable open first."""


def _upgrade(con: duckdb.DuckDBPyConnection) -> None:
    """Add what newer versions added (columns only; nothing is dropped or rewritten)."""
    existing: dict[str, set[str]] = {}
    for table, column in con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        "WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall():
        existing.setdefault(table, set()).add(column)
    con.execute("BEGIN TRANSACTION")
    try:
        for statement in upgrade_ddl(existing):
            con.execute(statement)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
