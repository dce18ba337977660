"""The run a trace export reads and its window of steps: ``TrackQuery`` and the run-wide queries.

``TrackQuery`` carries the run, the window of steps (first and last step, both included; None:
the whole run) and the trace origin, and gives every track's query its filters and parameters.
Rows stream from a DuckDB cursor in batches, in the order the query gives them. What each track
holds is in ``trace_rows``; the trace itself is ``report/trace_export``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:
    import numpy as np

_FETCH_ROWS = 10_000


@dataclass
class TrackQuery:
    """The run, its step window and the trace origin, shared by every track's query."""

    con: duckdb.DuckDBPyConnection
    run_id: str
    origin_ns: int
    window: tuple[int, int] | None

    def step_filter(self, column: str = "step") -> str:
        return f"{column} BETWEEN $lo AND $hi" if self.window else "TRUE"

    def params(self, sql: str, **extra: Any) -> dict[str, Any]:
        params = {"run": self.run_id, **extra}
        if self.window:
            params.update(lo=self.window[0], hi=self.window[1])
        return {k: v for k, v in params.items() if f"${k}" in sql}

    def rows(self, sql: str, **extra: Any) -> Iterator[tuple[Any, ...]]:
        cursor = self.con.cursor()
        cursor.execute(sql, self.params(sql, **extra))
        while batch := cursor.fetchmany(_FETCH_ROWS):
            yield from batch
        cursor.close()

    def value(self, sql: str, **extra: Any) -> Any:
        return self.con.execute(sql, self.params(sql, **extra)).fetchall()[0][0]

    def time_filter(self) -> str:
        """``t_ns`` inside the window: from the first to the last stored time of its steps."""
        if not self.window:
            return "TRUE"
        first, last = self.time_bounds()
        return f"t_ns BETWEEN {first} AND {last}"

    def time_bounds(self) -> tuple[str, str]:
        """SQL of the window's first and last stored time (its steps' and their spans')."""
        w = "run_id = $run AND step BETWEEN $lo AND $hi"
        bounds = (
            f"SELECT start_ns AS lo, end_ns AS hi FROM spans WHERE {w} UNION ALL SELECT "
            f"least(cpu_start_ns, gpu_start_ns), greatest(cpu_end_ns, gpu_end_ns) "
            f"FROM steps WHERE {w}"
        )
        return f"(SELECT min(lo) FROM ({bounds}))", f"(SELECT max(hi) FROM ({bounds}))"


def run_header(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[Any, ...] | None:
    """``(label, scenario_name, status, device, started_ns, ended_ns, info)`` of the run (``info``
    the stored JSON text), None when no run has that id."""
    row = con.execute(
        "SELECT label, scenario_name, status, device, started_ns, ended_ns, info FROM runs "
        "WHERE run_id = ?",
        [run_id],
    ).fetchall()
    return row[0] if row else None


def step_ids(con: duckdb.DuckDBPyConnection, run_id: str) -> np.ndarray:
    """The run's step ids, ascending (steps without an id left out)."""
    return con.execute(
        "SELECT step FROM steps WHERE run_id = ? AND step IS NOT NULL ORDER BY step", [run_id]
    ).fetchnumpy()["step"]


def first_stored_ns(q: TrackQuery) -> int | None:
    """The earliest time stored for the run: spans, steps, NVML samples, kernels (None: none)."""
    return q.value(
        "SELECT least("
        "(SELECT min(start_ns) FROM spans WHERE run_id = $run), "
        "(SELECT min(least(cpu_start_ns, gpu_start_ns)) FROM steps WHERE run_id = $run), "
        "(SELECT min(t_ns) FROM gpu_samples WHERE run_id = $run), "
        "(SELECT min(start_ns) FROM kernels WHERE run_id = $run))"
    )
