"""The run database: run lifecycle, columnar appends, run lookup (opening: ``store.opening``).

All DuckDB access of the project goes through ``Store``. A run is written by one process; each
``append`` is its own autocommitted transaction, so everything appended before a crash survives.
A ``Store`` (like its DuckDB connection) is used from one thread at a time.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from mrv2_prof.store.opening import StoreError, connect
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
)
_JSON_FIELDS = ("matrix_combo", "versions", "info", "environment")
_BATCH_VIEW = "_mrv2_append_batch"
_RUN_ID_HEX_CHARS = 6


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

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> Store:
        """Open ``path``, creating the file and schema when it is missing (unless ``read_only``)."""
        path = Path(path)
        return cls(connect(path, read_only), path, read_only)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self._con

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- run lifecycle ---------------------------------------------------------------------

    def new_run_id(self) -> str:
        """A short random hex id that no run in this file has yet."""
        while True:
            run_id = secrets.token_hex(_RUN_ID_HEX_CHARS // 2)
            if not self._run_exists(run_id):
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
        """Insert the run's row with status ``running`` (committed at once)."""
        if self._run_exists(run_id):
            raise ValueError(f"run {run_id!r} already exists in {self.path}")
        self._con.execute(
            "INSERT INTO runs (run_id, scenario_name, label, matrix_combo, scenario_yaml, status, "
            "started_ns, started_at, device, versions, info) "
            "VALUES (?, ?, ?, ?, ?, 'running', ?, localtimestamp, ?, ?, ?)",
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
            ],
        )

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

    def _run_exists(self, run_id: str) -> bool:
        return bool(self._con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchall())

    # --- columnar appends ------------------------------------------------------------------

    def append(
        self, run_id: str, table: str, columns: Mapping[str, np.ndarray | Sequence[Any]]
    ) -> int:
        """Append one columnar batch to ``table`` for ``run_id``; returns the rows appended.

        The batch goes in as one Arrow table and one INSERT … SELECT (never row by row) and is
        committed when this returns. Columns not given are NULL.
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
        self._con.register(_BATCH_VIEW, batch)
        try:
            self._con.execute(insert, [run_id])
        finally:
            self._con.unregister(_BATCH_VIEW)
        return num_rows

    def append_batches(
        self, run_id: str, batches: Mapping[str, Mapping[str, np.ndarray | Sequence[Any]]]
    ) -> int:
        """Append several tables' batches in one transaction (one commit); all or nothing."""
        self._con.execute("BEGIN TRANSACTION")
        try:
            num_rows = sum(self.append(run_id, table, cols) for table, cols in batches.items())
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")
        return num_rows

    # --- lookup ----------------------------------------------------------------------------

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, with its request count and output tokens."""
        cursor = self._con.execute(
            """
            SELECT r.run_id, r.label, r.scenario_name, r.status, r.started_ns, r.ended_ns,
                   r.started_at, r.device, r.error,
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
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def resolve_run(self, ref: str) -> str:
        """The run id ``ref`` names: ``latest``, an exact id, or a unique id prefix."""
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
            raise no_run_error(self.path, ref)
        shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
        raise StoreError(
            f"run prefix {ref!r} is ambiguous in {self.path} ({shown}); type more characters"
        )
