"""Opening a run database file: one-line errors, the schema created in a new file, an older
file upgraded in place by a writer and read as it is by a reader, a newer or foreign one refused.

``connect`` is what ``Store.open`` does before it wraps the connection. Every problem a user can
act on (a missing directory, a file another process holds, a file that is not DuckDB, not ours,
damaged or truncated, a schema newer than this version) is a ``StoreError`` whose ``str()`` is
one line naming the file.

A write the file system refuses (no space left on the device, the process's file size limit,
a disk quota) is not damage: ``disk_full`` tells it from DuckDB's error text or the ``OSError``
and gives a ``DiskFullError`` naming the cause and the file written; the file itself is as its
last commit left it. A new file whose creation failed that way is removed, not left half made.

Reading never writes: a read-only open checks the file and, for an older schema, shows the
columns and tables newer versions added as NULL through temporary views (they live in the
connection, not in the file). Only a writable open, which appends, creates or upgrades tables.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from pathlib import Path

import duckdb

from mrv2_prof.store.schema import (
    META_TABLE,
    SCHEMA_VERSION,
    TABLES,
    quote,
    schema_ddl,
    upgrade_ddl,
)

# How long an open waits for another process's lock: a live run's merge (a run of 1.7 M rows
# takes about 2 s on a busy 2-core host) or a run closing the file.
LOCK_WAIT_S = 10.0
_LOCK_POLL_S = 0.05
# The columns a file must have to be read as a run database at all (every version has them).
_CORE_RUN_COLUMNS = ("run_id", "label", "status", "started_ns", "ended_ns", "error", "info")


class StoreError(Exception):
    """A run database problem the user can act on; ``str()`` is one line naming the file."""


class DiskFullError(StoreError):
    """A write the file system refused (``cause``: no space left on device, file too large,
    disk quota exceeded) to ``path``; what was committed before it is intact."""

    def __init__(self, path: Path, cause: str) -> None:
        self.path, self.cause = path, cause
        super().__init__(f"{path}: cannot write: {cause}{_DISK_HINTS.get(cause, '')}")


# errno → the cause as a message names it; DuckDB's IOException carries strerror's text
_DISK_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EFBIG: "file too large",
    errno.EDQUOT: "disk quota exceeded",
}
_DISK_TEXTS = {os.strerror(code).lower(): cause for code, cause in _DISK_ERRNOS.items()}
_DISK_HINTS = {
    "file too large": " (over the file size limit of this process, ulimit -f)",
    "no space left on device": " (free space on its file system)",
    "disk quota exceeded": " (free space within the quota)",
}
_WRITTEN_FILE = re.compile(r'file "([^"]+)"', re.IGNORECASE)  # 'Could not write file "…"'


def disk_full(path: Path, exc: BaseException | None) -> DiskFullError | None:
    """The ``DiskFullError`` for ``exc`` (or the exception it was raised from, ``raise … from``)
    when the file system refused a write; None for anything else. ``path``: the file meant when
    the error does not name one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return exc
        if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
            return DiskFullError(Path(exc.filename or path), _DISK_ERRNOS[exc.errno])
        if isinstance(exc, duckdb.Error):
            text = str(exc)
            cause = next((c for t, c in _DISK_TEXTS.items() if t in text.lower()), None)
            if cause is not None:
                named = _WRITTEN_FILE.search(text)
                return DiskFullError(Path(named.group(1)) if named else path, cause)
        exc = exc.__cause__
    return None


def connect(
    path: Path, read_only: bool, *, lock_wait_s: float | None = None
) -> tuple[duckdb.DuckDBPyConnection, int | None]:
    """A connection to ``path`` with the schema checked, and the version the file was upgraded
    from (None when it was not). A writable open creates the file and schema when the file is
    missing and upgrades an older schema; a read-only open changes nothing."""
    _check_file(path, read_only)
    new = not read_only and not path.exists()
    try:
        con = _connect_waiting(path, read_only, LOCK_WAIT_S if lock_wait_s is None else lock_wait_s)
    except DiskFullError:
        if new:
            _remove_new_file(path)
        raise
    try:
        upgraded_from = _check_schema(con, path, read_only)
    except duckdb.Error as exc:
        con.close()
        error = damaged_error(path, exc)
        if new and isinstance(error, DiskFullError):
            _remove_new_file(path)
        raise error from exc
    except BaseException:
        con.close()
        raise
    return con, upgraded_from


def _remove_new_file(path: Path) -> None:
    """A file this open created but could not finish (the disk refused a write): removed, so
    no half-made database is left behind."""
    for leftover in (path, path.with_name(path.name + ".wal")):
        with contextlib.suppress(OSError):
            leftover.unlink(missing_ok=True)


def damaged_error(path: Path, exc: BaseException) -> StoreError:
    """The one-line StoreError for a DuckDB error met while reading an open file (a refused
    write is a ``DiskFullError``: the file is not damaged)."""
    full = disk_full(path, exc)
    if full is not None:
        return full
    return StoreError(
        f"{path}: damaged or not an mrv2-prof run database ({_first_line(exc)}); "
        "pass a different --db"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(exc).__name__


def _check_file(path: Path, read_only: bool) -> None:
    """What can be told from the file system before DuckDB touches the file."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system allows but DuckDB cannot take
        shown = str(path).encode("utf-8", "backslashreplace").decode()
        raise StoreError(
            f"{shown}: the name is not valid UTF-8, which DuckDB cannot open; "
            "rename the file or pass a different --db"
        ) from None
    try:
        st = path.stat()
    except FileNotFoundError:
        if read_only:
            raise StoreError(
                f"{path}: no such run database (pass --db with a file runs wrote)"
            ) from None
        if not path.parent.is_dir():
            raise StoreError(
                f"{path}: directory {path.parent} does not exist; "
                "create it or pass a different --db"
            ) from None
        return
    except OSError as exc:
        msg = f"{path}: cannot open ({exc.strerror or exc}); pass a different --db"
        raise StoreError(msg) from exc
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise StoreError(f"{path}: {kind}, not a run database; pass a different --db")
    wanted = os.R_OK if read_only else os.R_OK | os.W_OK
    if not os.access(path, wanted):
        mode = stat.filemode(st.st_mode)
        need = "read" if read_only else "read and write"
        raise StoreError(
            f"{path}: permission denied (mode {mode}; {need} access needed); "
            "change its permissions or pass a different --db"
        )
    if st.st_size == 0 and read_only:
        raise StoreError(f"{path}: an empty file, not a run database; pass a different --db")


def _connect_waiting(path: Path, read_only: bool, wait_s: float) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``, waiting up to ``wait_s`` while another process holds the file."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as exc:
            error = _open_error(path, exc)
            if not _is_lock_error(exc) or time.monotonic() >= deadline:
                raise error from exc
        time.sleep(_LOCK_POLL_S)


def _is_lock_error(exc: duckdb.Error) -> bool:
    msg = str(exc)
    return "Could not set lock" in msg or "Conflicting lock" in msg


def _open_error(path: Path, exc: duckdb.Error) -> StoreError:
    """The one-line StoreError for a DuckDB error raised by ``duckdb.connect``."""
    msg = str(exc)
    full = disk_full(path, exc)
    if full is not None:
        return full
    if _is_lock_error(exc):
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
    if "Permission denied" in msg:
        return StoreError(f"{path}: permission denied; change its permissions or pass another --db")
    if "Could not read enough bytes" in msg or "Corrupt database" in msg:
        return damaged_error(path, exc)
    return StoreError(f"{path}: cannot open ({_first_line(exc)}); pass a different --db")


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, str]]:
    """The file's tables (main schema) and their columns with types."""
    found: dict[str, dict[str, str]] = {}
    for table, column, sql_type in con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = current_database() AND schema_name = 'main' "
        "AND NOT internal"
    ).fetchall():
        found.setdefault(table, {})[column] = sql_type
    for (table,) in con.execute(
        "SELECT table_name FROM duckdb_tables() "
        "WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall():
        found.setdefault(table, {})
    return found


def _check_schema(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> int | None:
    """Create the schema in an empty file; otherwise require an mrv2-prof file of a version
    this code reads. Returns the version an older file was upgraded from (writable opens)."""
    tables = _columns(con)
    if not tables:
        if read_only:
            raise _not_ours(path, "no tables")
        con.execute("BEGIN TRANSACTION")
        for statement in schema_ddl():
            con.execute(statement)
        con.execute("COMMIT")
        return None
    meta = tables.get(META_TABLE)
    if meta is None:
        raise _not_ours(path, "no schema_version")
    if set(meta) != {"key", "value"}:
        raise _not_ours(path, f"its {META_TABLE} table has columns {sorted(meta)}")
    # fetchall: a partly fetched result would block the connection's next register()
    rows = con.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'schema_version'").fetchall()
    text = str(rows[0][0]) if rows else ""
    if not text.isdigit() or int(text) < 1:
        shown = repr(text[:20]) if rows else "none"
        raise _not_ours(path, f"schema_version {shown}")
    version = int(text)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: run database schema version {version} is newer than this mrv2-prof "
            f"expects ({SCHEMA_VERSION}); upgrade mrv2-prof to read it"
        )
    runs = tables.get("runs")
    if runs is None:
        raise _not_ours(path, f"schema_version {version} but no runs table")
    lacking = [c for c in _CORE_RUN_COLUMNS if c not in runs]
    if lacking:
        raise _not_ours(path, f"its runs table lacks {', '.join(lacking)}")
    missing = _missing(tables)
    if version == SCHEMA_VERSION and missing:
        table, cols = next(iter(missing.items()))
        what = f"table {table}" if cols is None else f"column {table}.{cols[0][0]}"
        raise StoreError(
            f"{path}: damaged run database (schema version {version} but {what} is missing); "
            "pass a different --db"
        )
    con.execute("SELECT count(*), count(run_id), count(status) FROM runs").fetchall()
    if version == SCHEMA_VERSION:
        return None
    if read_only:
        _shadow_missing(con, missing)
        return None
    _upgrade(con, tables)
    return version


def _not_ours(path: Path, why: str) -> StoreError:
    return StoreError(
        f"{path}: a DuckDB database but not an mrv2-prof run database ({why}); "
        "pass a different --db"
    )


def _missing(tables: dict[str, dict[str, str]]) -> dict[str, list[tuple[str, str]] | None]:
    """What of ``TABLES`` the file lacks: a table (None) or its missing columns."""
    missing: dict[str, list[tuple[str, str]] | None] = {}
    for table, cols in TABLES.items():
        have = tables.get(table)
        if have is None:
            missing[table] = None
        elif lacks := [(name, t) for name, t in cols if name not in have]:
            missing[table] = lacks
    return missing


def _shadow_missing(
    con: duckdb.DuckDBPyConnection, missing: dict[str, list[tuple[str, str]] | None]
) -> None:
    """Temporary views (this connection only) that give an older file's tables the columns and
    tables newer versions added, as NULL: the readers' queries work, the file is not touched."""
    (database,) = con.execute("SELECT current_database()").fetchone()
    for table, lacks in missing.items():
        if lacks is None:
            cols = ", ".join(f"CAST(NULL AS {t}) AS {quote(n)}" for n, t in TABLES[table])
            body = f"SELECT {cols} WHERE false"
        else:
            extra = ", ".join(f"CAST(NULL AS {t}) AS {quote(n)}" for n, t in lacks)
            body = f"SELECT *, {extra} FROM {quote(database)}.main.{quote(table)}"
        con.execute(f"CREATE TEMP VIEW {quote(table)} AS {body}")


def _upgrade(con: duckdb.DuckDBPyConnection, tables: dict[str, dict[str, str]]) -> None:
    """Add what newer versions added (columns only; nothing is dropped or rewritten)."""
    existing = {table: set(cols) for table, cols in tables.items()}
    con.execute("BEGIN TRANSACTION")
    try:
        for statement in upgrade_ddl(existing):
            con.execute(statement)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
