"""What a user types for a run or a group of runs, resolved to run ids.

* a run: ``latest``, an id, or a unique id prefix (``Store.resolve_run``);
* ``group:ID``: the runs of one group of repeats (``runs.run_group``; ``mrv2-prof run
  --repeats N``), a unique prefix of the group id will do, in repeat order; ``group:latest``
  is the newest run's group;
* ``baseline:NAME``: the run or group a named baseline points at (``store.baselines``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mrv2_prof.store.baselines import GROUP, get_baseline
from mrv2_prof.store.db import Store
from mrv2_prof.store.opening import StoreError

GROUP_PREFIX, BASELINE_PREFIX = "group:", "baseline:"


@dataclass(frozen=True)
class ResolvedRuns:
    ref: str  # as typed
    run_ids: list[str]  # one, or the group's runs in repeat order
    group: str | None  # the run_group, when the reference named one


def runs_with_groups(store: Store) -> list[dict]:
    """``Store.list_runs()`` with each run's ``run_group`` and ``repeat_index`` (None for a run
    that is no repeat), for the views that group the repeats."""
    rows = store.connection.execute(
        "SELECT run_id, run_group, repeat_index FROM runs WHERE run_group IS NOT NULL"
    ).fetchall()
    groups = {run_id: (group, index) for run_id, group, index in rows}
    runs = store.list_runs()
    for run in runs:
        run["run_group"], run["repeat_index"] = groups.get(run["run_id"], (None, None))
    return runs


def group_runs(store: Store, group: str) -> list[str]:
    rows = store.connection.execute(
        "SELECT run_id FROM runs WHERE run_group = ? "
        "ORDER BY repeat_index NULLS LAST, started_ns, run_id",
        [group],
    ).fetchall()
    return [row[0] for row in rows]


def resolve_group(store: Store, ref: str) -> str:
    """The group id ``ref`` names: exact, a unique prefix, or ``latest`` (the group of the
    newest run that has one)."""
    if ref == "latest":
        row = store.connection.execute(
            "SELECT run_group FROM runs WHERE run_group IS NOT NULL "
            "ORDER BY started_at DESC NULLS LAST, started_ns DESC NULLS LAST LIMIT 1"
        ).fetchone()
        if row is None:
            raise StoreError(
                f"no group in {store.path} yet; make one with mrv2-prof run SCENARIO --repeats N"
            )
        return row[0]
    groups = [
        row[0]
        for row in store.connection.execute(
            "SELECT DISTINCT run_group FROM runs WHERE starts_with(run_group, ?) "
            "ORDER BY run_group",
            [ref],
        ).fetchall()
    ]
    if ref in groups:
        return ref
    if len(groups) == 1 and ref:
        return groups[0]
    if not groups or not ref:
        raise StoreError(f"no group {ref!r} in {store.path}; see mrv2-prof runs --db {store.path}")
    raise StoreError(f"group prefix {ref!r} is ambiguous in {store.path}; type more characters")


def resolve_runs(store: Store, ref: str) -> ResolvedRuns:
    """The runs ``ref`` names (see the module docstring); raises ``StoreError``."""
    if ref.startswith(BASELINE_PREFIX):
        baseline = get_baseline(store, ref[len(BASELINE_PREFIX) :])
        if baseline.kind == GROUP:
            runs = group_runs(store, baseline.target)
            if not runs:
                raise StoreError(f"{ref}: its group {baseline.target!r} has no runs left")
            return ResolvedRuns(ref, runs, baseline.target)
        return ResolvedRuns(ref, [store.resolve_run(baseline.target)], None)
    if ref.startswith(GROUP_PREFIX):
        group = resolve_group(store, ref[len(GROUP_PREFIX) :])
        return ResolvedRuns(ref, group_runs(store, group), group)
    return ResolvedRuns(ref, [store.resolve_run(ref)], None)
