"""What the run browser reads from the store: the run list, a run's headline numbers, its steps.

Plain functions over an open ``Store`` (no Textual), called from the browser's worker threads.
Run-level numbers come from ``store.metrics.run_summary`` so the browser, ``show`` and the
report agree; the step table is one query over ``steps`` with each step's sync count.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from mrv2_prof.store import Store
from mrv2_prof.store.metrics import run_summary

STEP_PAGE = 2_000  # rows of the step table at a time; a longer run is paged


@dataclass(frozen=True)
class RunRow:
    run_id: str
    label: str
    status: str
    started: str  # local wall clock, "MM-DD HH:MM"; "" when unknown
    device: str
    num_requests: int
    error: str | None


@dataclass(frozen=True)
class Headline:
    """The numbers the run list shows next to each run; None where not measured."""

    output_tokens_per_s: float | None
    itl_ms_p99: float | None


@dataclass(frozen=True)
class StepRow:
    step: int
    graph_mode: str | None
    num_tokens: int | None
    host_ms: float | None  # the step's CPU span
    overlap_frac: float | None
    bubble_ms: float | None
    bubble_kind: str | None
    num_syncs: int


def list_run_rows(store: Store) -> list[RunRow]:
    """Every run, newest first."""
    rows = []
    for r in store.list_runs():
        started = r.get("started_at")
        rows.append(
            RunRow(
                run_id=r["run_id"],
                label=r.get("label") or r.get("scenario_name") or "",
                status=r["status"],
                started=started.strftime("%m-%d %H:%M") if isinstance(started, dt.datetime) else "",
                device=r.get("device") or "",
                num_requests=int(r.get("num_requests") or 0),
                error=r.get("error"),
            )
        )
    return rows


def headline(store: Store, run_id: str) -> Headline:
    s = run_summary(store, run_id)
    return Headline(
        output_tokens_per_s=s.output_tokens_per_s if s.duration_s > 0 else None,
        itl_ms_p99=s.itl_ms.p99,
    )


def load_steps(
    store: Store, run_id: str, offset: int = 0, limit: int = STEP_PAGE
) -> tuple[list[StepRow], int]:
    """Steps ``offset`` .. ``offset + limit - 1`` of a run (by position, in step order) and how
    many steps it has in all."""
    con = store.connection
    (total,) = con.execute("SELECT count(*) FROM steps WHERE run_id = ?", [run_id]).fetchone()
    rows = con.execute(
        """
        SELECT s.step, s.graph_mode, s.num_tokens,
               (s.cpu_end_ns - s.cpu_start_ns) / 1e6, s.overlap_frac, s.bubble_ns / 1e6,
               s.bubble_kind, coalesce(y.n, 0)
        FROM steps s
        LEFT JOIN (SELECT step, count(*) AS n FROM syncs WHERE run_id = ? GROUP BY step) y
            USING (step)
        WHERE s.run_id = ?
        ORDER BY s.step
        LIMIT ? OFFSET ?
        """,
        [run_id, run_id, limit, offset],
    ).fetchall()
    return [StepRow(*row) for row in rows], int(total)
