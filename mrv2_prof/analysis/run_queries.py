"""What the run browser reads from the store: the run list, a run's headline numbers, its steps.

Plain functions over an open ``Store`` (no Textual), called from the browser's worker threads.
Run-level numbers come from ``store.metrics.run_summary`` so the browser, ``show`` and the
report agree; the step table is one query over ``steps`` with each step's sync count, in a
chosen order (``StepOrder``: slowest first, ...) and through a filter (``parse_step_filter``).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from mrv2_prof.analysis.metrics import run_summary
from mrv2_prof.store import Store

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
    live: bool = False  # still in its side file (``store.live_runs``), not in the database yet
    writer_gone: bool = False  # ``running``, and the process writing it no longer exists


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
    """Every run, newest first; the live ones (in their side files) come first."""
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
                live=bool(r.get("live")),
                writer_gone=bool(r.get("writer_gone")),
            )
        )
    return rows


def headline(store: Store, run_id: str) -> Headline:
    s = run_summary(store, run_id)
    return Headline(
        output_tokens_per_s=s.output_tokens_per_s if s.duration_s > 0 else None,
        itl_ms_p99=s.itl_ms.p99,
    )


# the step table's columns as the queries name them (the sort and filter keys)
STEP_FIELDS = ("step", "mode", "tokens", "host", "overlap", "bubble", "kind", "syncs")
TEXT_FIELDS = ("mode", "kind")
_FILTER = re.compile(r"^\s*(\w+)\s*(>=|<=|!=|>|<|=)\s*(\S+)\s*$")


@dataclass(frozen=True)
class StepOrder:
    """The step table's order: a field of ``STEP_FIELDS``, descending or not (ties by step)."""

    field: str = "step"
    descending: bool = False

    def sql(self) -> str:
        if self.field not in STEP_FIELDS:
            raise ValueError(f"cannot sort by {self.field!r}; fields: {', '.join(STEP_FIELDS)}")
        way = "DESC" if self.descending else "ASC"
        return f"{self.field} {way} NULLS LAST, step"


SLOWEST_FIRST = StepOrder("host", descending=True)


@dataclass(frozen=True)
class StepFilter:
    """Which steps the table shows: ``field op value`` (``host>2``, ``mode=none``, ``syncs>0``;
    host and bubble in ms, overlap in %), or a word found in the mode or bubble kind."""

    text: str
    sql: str
    params: tuple[object, ...]


def parse_step_filter(text: str) -> StepFilter | None:
    """The filter ``text`` asks for (None for an empty one); ValueError naming what is wrong."""
    if not text.strip():
        return None
    m = _FILTER.match(text)
    if m is None:
        word = text.strip().lower()
        sql = " OR ".join(f"lower(coalesce({f}, '')) LIKE ?" for f in TEXT_FIELDS)
        return StepFilter(text.strip(), f"({sql})", (f"%{word}%",) * len(TEXT_FIELDS))
    name, op, value = m.groups()
    if name not in STEP_FIELDS:
        raise ValueError(f"{name!r} is not a step field; fields: {', '.join(STEP_FIELDS)}")
    if name in TEXT_FIELDS:
        if op not in ("=", "!="):
            raise ValueError(f"{name} is text: use = or !=")
        return StepFilter(text.strip(), f"coalesce({name}, '') {op} ?", (value,))
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} is a number: {value!r} is not one") from None
    column = "overlap * 100" if name == "overlap" else name
    return StepFilter(text.strip(), f"{column} {op} ?", (number,))


def _step_table_sql(where: StepFilter | None) -> tuple[str, list[object]]:
    """The step table of one run (params: run id twice, then the filter's), as ``t``."""
    sql = """
        WITH t AS (
          SELECT s.step, s.graph_mode AS mode, s.num_tokens AS tokens,
                 (s.cpu_end_ns - s.cpu_start_ns) / 1e6 AS host, s.overlap_frac AS overlap,
                 s.bubble_ns / 1e6 AS bubble, s.bubble_kind AS kind, coalesce(y.n, 0) AS syncs
          FROM steps s
          LEFT JOIN (SELECT step, count(*) AS n FROM syncs WHERE run_id = ? GROUP BY step) y
              USING (step)
          WHERE s.run_id = ?
        )
    """
    if where is None:
        return sql + " SELECT * FROM t WHERE true", []
    return sql + f" SELECT * FROM t WHERE {where.sql}", list(where.params)


def load_steps(
    store: Store,
    run_id: str,
    offset: int = 0,
    limit: int = STEP_PAGE,
    order: StepOrder = StepOrder(),
    where: StepFilter | None = None,
) -> tuple[list[StepRow], int]:
    """Steps ``offset`` .. ``offset + limit - 1`` of a run in ``order`` (by position), of those
    ``where`` keeps, and how many steps it keeps in all."""
    con = store.connection
    table, params = _step_table_sql(where)
    (total,) = con.execute(f"SELECT count(*) FROM ({table})", [run_id, run_id, *params]).fetchone()
    rows = con.execute(
        f"SELECT step, mode, tokens, host, overlap, bubble, kind, syncs FROM ({table}) "
        f"ORDER BY {order.sql()} LIMIT ? OFFSET ?",
        [run_id, run_id, *params, limit, offset],
    ).fetchall()
    return [StepRow(*row) for row in rows], int(total)


def step_position(
    store: Store,
    run_id: str,
    step: int,
    order: StepOrder = StepOrder(),
    where: StepFilter | None = None,
) -> int | None:
    """Where step ``step`` is in the table (0-based, in ``order``, among the steps ``where``
    keeps); None when the run has no such step or the filter hides it."""
    table, params = _step_table_sql(where)
    row = store.connection.execute(
        f"SELECT pos FROM (SELECT step, row_number() OVER (ORDER BY {order.sql()}) - 1 AS pos "
        f"FROM ({table})) WHERE step = ?",
        [run_id, run_id, *params, step],
    ).fetchone()
    return None if row is None else int(row[0])
