"""A cell's memo key, for ``run --resume``: what makes two runs of one cell the same run.

A cell is one combination of a scenario's matrix and one repeat of it. Its key is a hash of
what the parent knows before the runner starts:

* the scenario as the runner takes it (the file, ``--set`` and the matrix combination applied,
  ``max_model_len: auto`` resolved: ``RunJob.scenario``), less what is no part of the run (the
  database it is written to, the matrix and the repeat count), and the repeat's index;
* the code version: ``mrv2_prof.__version__``, and the commit when the package is a git
  checkout (uncommitted edits are not in it);
* the environment class: the GPU's model and driver a CUDA run would take (NVML, read without
  torch), or none for a CPU run, and torch's version (from its package metadata).

The key is stored with each run (``runs.info['memo_key']``); ``analysis/memo.py`` finds the
completed run a key names (``completed_cells``: each cell's, in one read of the database). A run
that failed or was stopped is no match: its cell runs again.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from mrv2_prof import __version__
from mrv2_prof.pipeline.run_environment import gpu_identity
from mrv2_prof.store import Store

# the scenario's keys that are no part of what a run does (comparability's too)
NOT_THE_RUN = (("store", "db"), ("matrix",), ("repeats",))


@functools.cache
def code_version() -> str:
    """``mrv2_prof.__version__``, with ``+<commit>`` when the package is in a git checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return __version__
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return __version__
    commit = done.stdout.strip()
    return f"{__version__}+{commit}" if done.returncode == 0 and commit else __version__


@functools.cache
def torch_version() -> str | None:
    """The installed torch's version, from its metadata (torch is not imported)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def environment_class(device: str) -> dict[str, Any]:
    """What a run on ``device`` (the scenario's ``runner.device``) is measured on: the GPU's
    model and driver (None for a CPU run, or where NVML finds no GPU) and torch's version."""
    gpu = gpu_identity(device) if device != "cpu" else {}
    return {"gpu": gpu or None, "torch": torch_version()}


def _the_run(scenario: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(scenario)
    for path in NOT_THE_RUN:
        node = data
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return data


def memo_key(
    scenario: dict[str, Any],
    repeat_index: int | None = None,
    *,
    code: str | None = None,
    environment: dict[str, Any] | None = None,
) -> str:
    """The key of the cell that runs ``scenario`` (``RunJob.scenario``) as repeat
    ``repeat_index`` (None: no repeats); ``code`` and ``environment`` default to this
    checkout's ``code_version()`` and ``environment_class`` of the scenario's device."""
    if environment is None:
        device = str((scenario.get("runner") or {}).get("device", "auto"))
        environment = environment_class(device)
    cell = {
        "scenario": _the_run(scenario),
        "repeat": repeat_index,
        "code": code_version() if code is None else code,
        "environment": environment,
    }
    text = json.dumps(cell, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def completed_cells(db_path: str | Path, keys: list[str]) -> list[str | None]:
    """Per key, the completed run stored under it in ``db_path`` (None: the cell is to run);
    raises ``StoreError`` when the database cannot be read."""
    from mrv2_prof.analysis.memo import completed_run_for

    with Store.open(db_path, read_only=True) as store:
        return [completed_run_for(store, key) for key in keys]


def skipped_line(done: list[str | None], shown: int = 10) -> str:
    """The line ``run --resume`` says: how many cells it skipped and their runs (the first
    ``shown`` of them)."""
    skipped = [run_id for run_id in done if run_id is not None]
    n = len(skipped)
    ids = ", ".join(skipped[:shown]) + (f" and {n - shown} more" if n > shown else "")
    return f"skipped {n} cell{'s' if n != 1 else ''} (already in the database: {ids})"
