"""The run database: run lifecycle, columnar appends, run lookup (opening: ``store.opening``).

All DuckDB access of the project goes through ``Store``. A run is written by one process; each
``append`` is its own autocommitted transaction and ``append_batches`` (one flush of a run) is
one transaction, so everything appended before a crash survives and a flush is never half
there. A ``Store`` (like its DuckDB connection) is used from one thread at a time. A DuckDB
error met inside ``with Store.open(...) as store:`` leaves it as a one-line ``StoreError``
naming the file (a file damaged where the open did not look).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from mrv2_prof.store.live_runs import (
    adopt_run_file,
    live_dir,
    live_file,
    live_runs,
    merge_finished,
    remove_live_run,
    write_marker,
)
from mrv2_prof.store.opening import StoreError, connect, damaged_error, disk_full
from mrv2_prof.store.orphans import fail_orphaned_runs, this_writer, writer_alive
from mrv2_prof.store.schema import FINISH_STATUSES, TABLES, quote

_COLUMN_TYPES = {table: dict(columns) for table, columns in TABLES.items()}
_UPDATABLE = (
    "scenario_name",
    "label",
    "matrix_combo",
    "scenario_yaml",
    "device",
    "versions",
    "info",
    "scenario_given_yaml",
    "environment",
    "run_group",
    "repeat_index",
)
_JSON_FIELDS = ("matrix_combo", "versions", "info", "environment")
_BATCH_VIEW = "_mrv2_append_batch"
_KEYED = {"requests": "req_id"}  # tables with one row per key and run: an append replaces it
_RUN_ID_HEX_CHARS = 6
MERGE_WAIT_S = 30.0  # how long an ended run's merge waits for readers of the database


def no_run_error(path: Path, ref: str) -> StoreError:
    return StoreError(f"no run {ref!r} in {path}; see mrv2-prof runs --db {path}")


def _to_json(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else json.dumps(value)


class Store:
    """One open run database (``runs.duckdb``): the writer's and the readers' only door."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self._con = con
        self.path = path
        self.read_only = read_only
        self._closed = False
        self._in_transaction = False  # inside append_batches
        self.upgraded_from: int | None = None  # the schema version a writable open upgraded
        self.orphans_failed: list[str] = []  # runs a writable open marked failed (writer gone)
        self.live_merged: list[str] = []  # runs a writable open merged from their side files

    @classmethod
    def open(
        cls, path: str | Path, *, read_only: bool = False, lock_wait_s: float | None = None
    ) -> Store:
        """Open ``path``. A writable open creates the file and schema when it is missing,
        upgrades an older schema, merges the side files of live runs that have ended
        (``store.live_runs``) and marks runs whose writer is gone ``failed``; a read-only one
        writes nothing. ``lock_wait_s``: how long to wait for another process's lock."""
        path = Path(path)
        con, upgraded_from = connect(path, read_only, lock_wait_s=lock_wait_s)
        store = cls(con, path, read_only)
        store.upgraded_from = upgraded_from
        if not read_only:
            try:
                store.live_merged = merge_finished(con, path)  # live runs that have ended
                store.orphans_failed = fail_orphaned_runs(con)
            except duckdb.Error as exc:
                store.close()
                raise damaged_error(path, exc) from exc
        return store

    @classmethod
    def open_live_run(cls, db: str | Path, *, label: str, scenario_name: str) -> tuple[Store, str]:
        """A new run's own side file (``store.live_runs``) and its id, unique in ``db``: the
        run writes there while it is live, and ``db`` stays readable. ``db`` is opened for
        writing once first (created, upgraded, ended live runs merged)."""
        db = Path(db)
        with cls.open(db) as main:  # held while the id is chosen and its side file created
            run_id = main.new_run_id()
            try:
                live_dir(db).mkdir(exist_ok=True)
            except OSError as exc:
                full = disk_full(live_dir(db), exc)
                if full is not None:
                    raise full from exc
                raise StoreError(
                    f"{live_dir(db)}: cannot create ({exc.strerror or exc}); pass a different --db"
                ) from exc
            try:
                store = cls.open(live_file(db, run_id))
            except StoreError:
                remove_live_run(db, run_id)  # nothing of a run that could not start is left
                raise
        try:
            write_marker(db, run_id, label=label, scenario_name=scenario_name)
        except OSError as exc:
            store.close()
            remove_live_run(db, run_id)
            full = disk_full(live_dir(db), exc)
            if full is not None:
                raise full from exc
            raise StoreError(f"{live_dir(db)}: cannot write ({exc.strerror or exc})") from exc
        return store, run_id

    @classmethod
    def merge_ended_runs(cls, db: str | Path) -> list[str]:
        """Merge the side files of the live runs of ``db`` that have ended (waiting up to
        ``MERGE_WAIT_S`` for readers); returns the ids merged."""
        with cls.open(db, lock_wait_s=MERGE_WAIT_S) as main:
            return main.live_merged

    @classmethod
    def merge_run_file(cls, db: str | Path, source: Path, run_id: str) -> str:
        """Merge ``source``, a finished run's own database made elsewhere (a Ray cell's) that
        holds run ``run_id``, into ``db``. Returns the id it is stored under: ``run_id``, or a
        new one when ``db`` has that run id already (or a live run holds it), so that no run
        is overwritten or dropped (``live_runs.adopt_run_file``)."""
        db = Path(db)
        with cls.open(db, lock_wait_s=MERGE_WAIT_S) as main:  # held: no id is chosen meanwhile
            taken = main._run_exists(run_id) or live_file(db, run_id).exists()
            stored_id = main.new_run_id() if taken else run_id
            adopt_run_file(main._con, db, source, run_id, stored_id)
        return stored_id

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._con

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        self.close()
        if isinstance(exc, duckdb.Error):
            raise damaged_error(self.path, exc) from exc

    # --- run lifecycle ---------------------------------------------------------------------

    def new_run_id(self) -> str:
        """A short random hex id that no run in this file has yet."""
        while True:
            run_id = secrets.token_hex(_RUN_ID_HEX_CHARS // 2)
            if not self._run_exists(run_id) and not live_file(self.path, run_id).exists():
                return run_id

    def begin_run(
        self,
        run_id: str,
        *,
        scenario_name: str,
        label: str,
        matrix_combo: dict[str, Any] | None,
        scenario_yaml: str,
        device: str,
        versions: dict[str, Any],
        started_ns: int,
        info: dict[str, Any] | None = None,
    ) -> None:
        """Insert the run's row with status ``running`` (committed at once), naming this process
        as its writer."""
        if self._run_exists(run_id):
            raise ValueError(f"run {run_id!r} already exists in {self.path}")
        self._con.execute(
            "INSERT INTO runs (run_id, scenario_name, label, matrix_combo, scenario_yaml, status, "
            "started_ns, started_at, device, versions, info, writer_pid, writer_host) "
            "VALUES (?, ?, ?, ?, ?, 'running', ?, localtimestamp, ?, ?, ?, ?, ?)",
            [
                run_id,
                scenario_name,
                label,
                _to_json(matrix_combo),
                scenario_yaml,
                int(started_ns),
                device,
                _to_json(versions),
                _to_json(info),
                *this_writer(),
            ],
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The lifecycle calls inside it (``begin_run``, ``update_run``, …) commit together,
        or (an error, a write the disk refused) not at all."""
        self._con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Replace descriptive fields of a run (``info``, ``device``, …); dicts go in as JSON."""
        bad = sorted(set(fields) - set(_UPDATABLE))
        if bad:
            raise ValueError(f"update_run cannot set {bad}; settable: {list(_UPDATABLE)}")
        if not fields:
            return
        values = [_to_json(v) if k in _JSON_FIELDS else v for k, v in fields.items()]
        assignments = ", ".join(f"{quote(name)} = ?" for name in fields)
        self._update(run_id, assignments, values)

    def finish_run(
        self, run_id: str, status: str, *, ended_ns: int, error: str | None = None
    ) -> None:
        """Mark the run ``completed``, ``failed`` or ``aborted`` with its end time and error."""
        if status not in FINISH_STATUSES:
            raise ValueError(f"finish status must be one of {FINISH_STATUSES}, got {status!r}")
        self._update(run_id, "status = ?, ended_ns = ?, error = ?", [status, int(ended_ns), error])

    def _update(self, run_id: str, assignments: str, values: list[Any]) -> None:
        done = self._con.execute(
            f"UPDATE runs SET {assignments} WHERE run_id = ? RETURNING run_id", [*values, run_id]
        ).fetchall()
        if not done:
            raise ValueError(f"no run {run_id!r} in {self.path}")

    def num_steps(self, run_id: str) -> int:
        """How many steps the run has stored."""
        row = self._con.execute("SELECT count(*) FROM steps WHERE run_id = ?", [run_id]).fetchone()
        return int(row[0]) if row else 0

    def step_ids(self, run_id: str) -> np.ndarray:
        """The run's step numbers, in order."""
        return self._con.execute(
            "SELECT step FROM steps WHERE run_id = ? AND step IS NOT NULL ORDER BY step", [run_id]
        ).fetchnumpy()["step"]

    def _run_exists(self, run_id: str) -> bool:
        return bool(self._con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchall())

    # --- columnar appends ------------------------------------------------------------------

    def append(
        self, run_id: str, table: str, columns: Mapping[str, np.ndarray | Sequence[Any]]
    ) -> int:
        """Append one columnar batch to ``table`` for ``run_id``; returns the rows appended.

        The batch goes in as one Arrow table and one INSERT … SELECT (never row by row) and is
        committed when this returns (or with the transaction of ``append_batches``). Columns not
        given are NULL. A ``requests`` row replaces the run's earlier row of its ``req_id``: a
        request's row is written when it arrives and again when it finishes.
        """
        types = _COLUMN_TYPES.get(table)
        if types is None or table == "runs":
            appendable = [name for name in TABLES if name != "runs"]
            raise ValueError(f"cannot append to table {table!r}; tables: {appendable}")
        if not columns:
            raise ValueError(f"append to {table}: no columns given")
        if "run_id" in columns:
            raise ValueError(f"append to {table}: run_id is filled in by the store")
        unknown = [name for name in columns if name not in types]
        if unknown:
            raise ValueError(f"append to {table}: unknown columns {unknown}; known: {list(types)}")
        lengths_rows = {name: len(values) for name, values in columns.items()}
        if len(set(lengths_rows.values())) != 1:
            raise ValueError(f"append to {table}: columns differ in length {lengths_rows}")
        num_rows = next(iter(lengths_rows.values()))
        if num_rows == 0:
            return 0
        batch = pa.table({name: pa.array(values) for name, values in columns.items()})
        names = ", ".join(quote(name) for name in columns)
        casts = ", ".join(f"CAST({quote(name)} AS {types[name]})" for name in columns)
        insert = f"INSERT INTO {quote(table)} (run_id, {names}) "
        insert += f"SELECT ?, {casts} FROM {_BATCH_VIEW}"
        keyed = table in _KEYED and _KEYED[table] in columns
        own_transaction = keyed and not self._in_transaction
        self._con.register(_BATCH_VIEW, batch)
        try:
            if own_transaction:
                self._con.execute("BEGIN TRANSACTION")
            if keyed:
                key = quote(_KEYED[table])
                self._con.execute(
                    f"DELETE FROM {quote(table)} WHERE run_id = ? AND {key} IN "
                    f"(SELECT CAST({key} AS {types[_KEYED[table]]}) FROM {_BATCH_VIEW})",
                    [run_id],
                )
            self._con.execute(insert, [run_id])
            if own_transaction:
                self._con.execute("COMMIT")
        except BaseException:
            if own_transaction:
                self._con.execute("ROLLBACK")
            raise
        finally:
            self._con.unregister(_BATCH_VIEW)
        return num_rows

    def append_batches(
        self, run_id: str, batches: Mapping[str, Mapping[str, np.ndarray | Sequence[Any]]]
    ) -> int:
        """Append several tables' batches in one transaction (one commit); all or nothing."""
        self._con.execute("BEGIN TRANSACTION")
        self._in_transaction = True
        try:
            num_rows = sum(self.append(run_id, table, cols) for table, cols in batches.items())
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        finally:
            self._in_transaction = False
        self._con.execute("COMMIT")
        return num_rows

    # --- lookup ----------------------------------------------------------------------------

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, with its request count and output tokens; ``writer_gone``
        is True for a ``running`` run whose writing process no longer exists. Runs still
        writing their side files come first (``live``: True, no counts yet)."""
        cursor = self._con.execute(
            """
            SELECT r.run_id, coalesce(r.label, r.scenario_name, '') AS label, r.scenario_name,
                   coalesce(r.status, 'unknown') AS status, r.started_ns, r.ended_ns,
                   r.started_at, r.device, r.error, r.writer_pid, r.writer_host,
                   coalesce(q.num_requests, 0)::BIGINT AS num_requests,
                   coalesce(q.output_tokens, 0)::BIGINT AS output_tokens
            FROM runs r
            LEFT JOIN (
                SELECT run_id, count(*) AS num_requests, sum(output_tokens) AS output_tokens
                FROM requests GROUP BY run_id
            ) q USING (run_id)
            ORDER BY r.started_at DESC NULLS LAST, r.started_ns DESC NULLS LAST, r.run_id
            """
        )
        names = [col[0] for col in cursor.description]
        runs = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for run in runs:
            pid, host = run.pop("writer_pid"), run.pop("writer_host")
            alive = (
                writer_alive(pid, host, run["started_at"]) if run["status"] == "running" else None
            )
            run["writer_gone"] = alive is False
        return live_runs(self.path, {run["run_id"] for run in runs}) + runs

    def resolve_run(self, ref: str) -> str:
        """The run id ``ref`` names: ``latest``, an exact id, a unique id prefix, or
        ``baseline:NAME`` (a named baseline that points at one run)."""
        if ref.startswith("baseline:"):
            return self._baseline_run(ref)
        if ref == "latest":
            row = self._con.execute(
                "SELECT run_id FROM runs ORDER BY started_at DESC NULLS LAST, "
                "started_ns DESC NULLS LAST, run_id DESC LIMIT 1"
            ).fetchall()
            row = row[0] if row else None
            if row is None:
                raise StoreError(
                    f"no runs in {self.path} yet; start one with mrv2-prof run SCENARIO "
                    f"--db {self.path}"
                )
            return row[0]
        if not ref:
            raise StoreError(f"empty run id; see mrv2-prof runs --db {self.path}")
        if self._run_exists(ref):
            return ref
        matches = [
            row[0]
            for row in self._con.execute(
                "SELECT run_id FROM runs WHERE starts_with(run_id, ?) ORDER BY run_id", [ref]
            ).fetchall()
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            live = [r["run_id"] for r in live_runs(self.path, set()) if r["run_id"].startswith(ref)]
            if len(live) == 1:
                raise StoreError(
                    f"run {live[0]} in {self.path} is still running; its data is readable "
                    "once it ends (mrv2-prof runs lists it)"
                )
            raise no_run_error(self.path, ref)
        shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
        raise StoreError(
            f"run prefix {ref!r} is ambiguous in {self.path} ({shown}); type more characters"
        )

    def _baseline_run(self, ref: str) -> str:
        name = ref.removeprefix("baseline:")
        row = self._con.execute(
            "SELECT kind, target FROM baselines WHERE name = ?", [name]
        ).fetchone()
        if row is None:
            raise StoreError(
                f"no baseline {name!r} in {self.path}; see mrv2-prof baseline list --db {self.path}"
            )
        if row[0] != "run":
            raise StoreError(
                f"{ref} names the group {row[1]!r}; this command takes one run (compare and gate "
                "take a group)"
            )
        return self.resolve_run(row[1])
