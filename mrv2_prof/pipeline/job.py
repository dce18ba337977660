"""What the parent hands the runner process, and what comes back: ``RunJob`` and ``Outcome``.

Plain data (stdlib only) so both pickle under ``spawn`` and the parent (cli, launcher) never
imports the runner to build or read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunJob:
    """Everything the runner process needs for one run."""

    scenario: dict[str, Any]  # Scenario.model_dump(mode="json"), overrides and matrix applied
    scenario_yaml: str
    label: str
    matrix_combo: dict[str, Any] | None
    db_path: str
    run_group: str | None = None  # the repeats of one combination share it (run --repeats N)
    repeat_index: int | None = None
    notes: tuple[str, ...] = ()  # what the scenario as given replaced (Scenario.notes)
    # GPU UUID -> [HBM read bytes/s, the run that measured it]: the database's measured peaks
    known_peaks: dict[str, list[Any]] = field(default_factory=dict)
    memo_key: str | None = None  # the cell's key (pipeline/resume.py), kept in runs.info
    launched_at: float | None = None  # time.time() as the parent spawned the runner process
    # (or handed the job to one spawned before it: ``standby.py``; then time.time() at that
    # spawn here, its interpreter and imports done beside the command)
    prespawned_at: float | None = None
    # time.time() as the ``mrv2-prof`` command began, on the first job it spawns (None on the
    # rest and in-process): the command's imports and checks before the spawn
    command_at: float | None = None
    # time.time() as the runner process's target began (``runner_entry``): its interpreter up
    # (the rest of its start, to the engine's build: the harness, the database, torch)
    entered_at: float | None = None
    # what ``bytecode_cache.cache_bytecode`` did in the runner process (None: nothing)
    bytecode_cache: dict[str, str] | None = None


@dataclass
class Outcome:
    """How a run ended, as the runner process reports it (or the parent, if the runner died)."""

    run_id: str | None
    status: str  # completed | aborted | failed
    error: str | None = None
    exit_code: int = 0  # 1: the run started and failed; 2: the database, before a row existed
    facts: dict[str, Any] = field(default_factory=dict)
