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
completed run a key names (``resume_plan``: each cell's, in one read of the database). A run
that failed or was stopped is no match: its cell runs again.

The stored key is the one of the environment the run had: the runner process computes it again
(``run_key``) with its own code version and environment class (a Ray worker's GPU, the device
id of a ``--max-parallel`` cell), the command's key where they agree. With ``--executor ray``
the command does not know where a cell will run: each alive node says its class (``node_class``:
its code version and the environment class of a GPU cell there; a CPU cell's is the same on
every node, whose torch the command checked), and a cell is done when a completed run has its
key under any class present in the cluster; with more than one, the skipped line says across
how many GPU classes it matched.

With ``--repeats N`` the cells re-run join the group of their combination's completed repeats
(``runs.run_group``; of most of them when they sit in several, which the skipped line says), so
``compare``/``gate`` see the combination's N runs as one ``group:ID``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from mrv2_prof import __version__
from mrv2_prof.pipeline.job import Outcome
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


def run_key(scenario: dict[str, Any], repeat_index: int | None, given: str | None) -> dict:
    """In the runner process: the key stored with the run (``runs.info['memo_key']``), computed
    here with this process's code version and environment class; none when the command gave
    none (``given``, ``RunJob.memo_key``)."""
    return {"memo_key": memo_key(scenario, repeat_index)} if given else {}


def node_class() -> dict[str, Any]:
    """On a node of a Ray cluster: its code version and the environment class of a GPU cell
    run there (its first GPU; none on a node without one)."""
    return {"code": code_version(), "environment": environment_class("cuda")}


def cell_keys(
    scenario: dict[str, Any], repeat_index: int | None, nodes: list[dict[str, Any]] | None
) -> list[str]:
    """The keys a completed run of the cell may be stored under: its key here when this host
    runs it (``nodes`` None), else its key under each node class (``node_class``) present."""
    if nodes is None:
        return [memo_key(scenario, repeat_index)]
    cpu = str((scenario.get("runner") or {}).get("device", "auto")) == "cpu"
    keys: list[str] = []
    for node in nodes:
        environment = node["environment"]
        if cpu:  # no GPU in a CPU run's class, wherever it runs
            environment = {**environment, "gpu": None}
        key = memo_key(scenario, repeat_index, code=node["code"], environment=environment)
        keys += [key] if key not in keys else []
    return keys


def _read(db_path, keys: list[list[str]]) -> tuple[list[str | None], dict[str, str | None]]:
    """Per cell (its keys, ``cell_keys``), the completed run stored under one of them (None:
    the cell is to run), and those runs' groups; in one read of the database."""
    from mrv2_prof.analysis.memo import completed_run_for, run_groups

    with Store.open(db_path, read_only=True) as store:
        done = [next(filter(None, (completed_run_for(store, k) for k in ks)), None) for ks in keys]
        return done, run_groups(store, [run_id for run_id in done if run_id])


@dataclass
class Resumed:
    """What ``run --resume`` runs: ``runs`` (the cells without a completed run, their groups
    joined to those of their combination's completed repeats) at ``kept`` (their indices in
    the sweep), ``skipped`` (each skipped cell and its completed run, as ``(run, Outcome)``)
    and the line it says (None when nothing was skipped)."""

    runs: list
    kept: list[int]
    skipped: list = field(default_factory=list)
    line: str | None = None


def resume_plan(db_path: str | Path, runs: list, nodes: list[dict[str, Any]] | None) -> Resumed:
    """The cells of ``runs`` (``cli/repeats.repeated``'s ``(label, (given, scenario), group,
    repeat_index)``) left to run; ``nodes``: the Ray cluster's node classes (None: this
    host runs them). Raises ``StoreError`` when the database cannot be read."""
    keys = [cell_keys(s.model_dump(mode="json"), r, nodes) for _, (_, s), _, r in runs]
    done, stored_group = _read(db_path, keys)
    joined, notes = _joined_groups(runs, done, stored_group)
    classes = {json.dumps(n["environment"], sort_keys=True) for n in nodes or ()}
    if len(classes) > 1:
        notes.insert(0, f"matched across {len(classes)} GPU classes")
    kept = [i for i, run_id in enumerate(done) if run_id is None]
    skipped = [
        ((label, pair, stored_group.get(run_id), r), Outcome(run_id, "completed"))
        for (label, pair, _, r), run_id in zip(runs, done, strict=True)
        if run_id is not None
    ]
    out = [
        (label, pair, joined.get(group, group), r)
        for label, pair, group, r in (runs[i] for i in kept)
    ]
    return Resumed(out, kept, skipped, skipped_line(done, notes=notes) if skipped else None)


def _joined_groups(
    runs: list, done: list[str | None], stored_group: dict[str, str | None]
) -> tuple[dict[str, str], list[str]]:
    """Per group a combination's repeats were given now: the group its completed repeats are
    in (that of most of them; the first found of a tie), and a note per combination whose
    completed repeats sit in more than one group."""
    found: dict[str, list[str]] = {}
    labels: dict[str, str] = {}
    for (label, _, group, _), run_id in zip(runs, done, strict=True):
        if group is not None and run_id is not None and stored_group.get(run_id):
            found.setdefault(group, []).append(stored_group[run_id])
            labels[group] = label
    joined, notes = {}, []
    for group, stored in found.items():
        counts = Counter(stored)
        joined[group], most = counts.most_common(1)[0]
        if len(counts) > 1:
            notes.append(
                f"the completed repeats of {labels[group]} are in {len(counts)} groups: its "
                f"re-runs join group:{joined[group]} ({most} of {len(stored)} there)"
            )
    return joined, notes


def skipped_line(done: list[str | None], shown: int = 10, notes: list[str] = ()) -> str:
    """The line ``run --resume`` says: how many cells it skipped and their runs (the first
    ``shown`` of them), and ``notes`` (how they were matched)."""
    skipped = [run_id for run_id in done if run_id is not None]
    n = len(skipped)
    ids = ", ".join(skipped[:shown]) + (f" and {n - shown} more" if n > shown else "")
    line = f"skipped {n} cell{'s' if n != 1 else ''} (already in the database: {ids})"
    return "; ".join([line, *notes])
