"""The run list's figures (output tok/s, ITL p99), run by run, each read from where the run is.

A run in the database has them from ``run_queries.headline`` (``store.metrics.run_summary``, the
numbers ``show`` prints). A live run is not in the database yet: it writes its own side file
(``store.live_runs``), which its runner holds for writing the whole run, and DuckDB lets no other
process read a file held so. Its figures are then ``LIVE``: not read, the reason said. A side
file no process holds (its runner ended and is merging it, or died before the merge) is read as
it is: the figures ``SO_FAR``. Whatever keeps one run's figures from being read is that run's
reason (``UNREAD``); it never stops the other runs' figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from mrv2_prof.analysis.run_queries import Headline, RunRow, headline
from mrv2_prof.store import Store, StoreError
from mrv2_prof.store.live_runs import live_file
from mrv2_prof.views.format import one_line

FROM_DATABASE = "database"  # read from the run database
SO_FAR = "so far"  # read from a live run's side file that no process holds
LIVE = "live"  # a live run's side file, held by its runner: not readable until it ends
UNREAD = "unread"  # could not be read; ``why`` says what went wrong


@dataclass(frozen=True)
class RunFigures:
    kind: str  # FROM_DATABASE | SO_FAR | LIVE | UNREAD
    numbers: Headline | None  # None for LIVE and UNREAD
    why: str  # one line: where the figures come from, or why there are none ("" from the db)


def run_figures(store: Store, row: RunRow) -> RunFigures:
    """The figures of run ``row`` of ``store`` (open read-only); never raises for a problem of
    that one run: it is the returned ``why``."""
    if not row.live:
        try:
            return RunFigures(FROM_DATABASE, headline(store, row.run_id), "")
        except (StoreError, duckdb.Error) as exc:
            return RunFigures(UNREAD, None, f"cannot read its figures: {one_line(exc)}")
    side = live_file(store.path, row.run_id)
    try:
        with Store.open(side, read_only=True, lock_wait_s=0) as live:
            numbers = headline(live, row.run_id)
    except (StoreError, duckdb.Error) as exc:
        if row.writer_gone:
            return RunFigures(
                UNREAD,
                None,
                f"its runner is gone and its side file cannot be read: {one_line(exc)}",
            )
        return RunFigures(
            LIVE,
            None,
            f"live: its runner is writing {side}, which no other process can read meanwhile; "
            f"its figures are there once it ends (r reloads). The open said: {one_line(exc)}",
        )
    return RunFigures(
        SO_FAR,
        numbers,
        f"figures so far (*), read from its side file {side}: not merged into the database yet",
    )
