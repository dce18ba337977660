"""What every executor shares: a finished cell (``CellRun``), the interface an executor offers
(``Executor``), the error that refuses one before anything is written (``ExecutorError``) and
the placement a cell ran on, written into its run's environment (``record_placement``).

A cell is one run of a sweep: a matrix combination and repeat. The command builds each cell's
``RunJob`` when the executor asks for it (``make_job(index)``) and hears of each finished cell,
merged into the database, through ``landed(cell)``, which returns False to stop the sweep.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mrv2_prof.pipeline.job import Outcome, RunJob

MakeJob = Callable[[int], RunJob]
Landed = Callable[["CellRun"], bool]


class ExecutorError(Exception):
    """An executor that cannot run here (a missing extra, an unreachable cluster): one line,
    raised before anything is written."""


@dataclass
class CellRun:
    """One finished cell as the command reads it (what ``RunnerProcess`` says of its run)."""

    index: int
    outcome: Outcome
    facts: dict[str, Any] | None = None
    interrupted: bool = False
    stopped_by: int | None = None  # the signal that stopped the run
    store_error: str | None = None  # what could not be written after the run
    placement: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    """Runs the cells ``0 .. count-1``; returns the signal that stopped the sweep, if any."""

    def run(self, count: int, make_job: MakeJob, landed: Landed) -> int | None: ...


def cell_from_runner(index: int, runner: Any, placement: dict[str, Any] | None = None) -> CellRun:
    """A ``CellRun`` from a joined ``launcher.RunnerProcess``."""
    return CellRun(
        index,
        runner.outcome,
        runner.facts,
        runner.interrupted,
        runner.stopped_by,
        runner.store_error,
        dict(placement or {}),
    )


def host_name() -> str:
    return socket.gethostname()


def record_placement(db: str | Path, run_id: str, placement: dict[str, Any]) -> str | None:
    """Add ``placement`` (executor, host, device slot) to run ``run_id``'s stored environment
    (``runs.environment['placement']``); returns what could not be written, else None."""
    from mrv2_prof.analysis.metrics import run_summary
    from mrv2_prof.store import Store, StoreError

    try:
        with Store.open(Path(db)) as store:
            env = run_summary(store, run_id).environment or {}
            store.update_run(run_id, environment={**env, "placement": placement})
    except StoreError as exc:
        return f"placement not stored: {exc}"
    return None
