"""Which runs form a sweep, and the scenario texts a sweep's page shows of each run.

A sweep is what one ``mrv2-prof run`` of a scenario with a ``matrix`` stores: consecutive runs
(in start order) of the same ``scenario_name``, each with a ``matrix_combo`` over the same keys
and no combination twice. ``sweep_members`` finds that group around one of its runs.
"""

from __future__ import annotations

import json

from mrv2_prof.store.db import Store, StoreError, no_run_error


def sweep_members(store: Store, run_id: str) -> list[str]:
    """The runs of the sweep ``run_id`` belongs to, in start order (see the module docstring)."""
    rows = store.connection.execute(
        "SELECT run_id, scenario_name, matrix_combo FROM runs "
        "ORDER BY started_at NULLS FIRST, started_ns NULLS FIRST, run_id"
    ).fetchall()
    ids = [r[0] for r in rows]
    if run_id not in ids:
        raise no_run_error(store.path, run_id)
    i = ids.index(run_id)
    name, combo_json = rows[i][1], rows[i][2]
    if not combo_json:
        raise StoreError(f"run {run_id} is not part of a sweep (its scenario has no matrix)")
    keys = sorted(json.loads(combo_json))
    seen = {combo_json}
    lo = hi = i

    def same_sweep(j: int) -> bool:
        _, other_name, other_combo = rows[j]
        if other_name != name or not other_combo or other_combo in seen:
            return False
        if sorted(json.loads(other_combo)) != keys:
            return False
        seen.add(other_combo)
        return True

    while lo > 0 and same_sweep(lo - 1):
        lo -= 1
    while hi + 1 < len(rows) and same_sweep(hi + 1):
        hi += 1
    return ids[lo : hi + 1]


def scenario_texts(store: Store, run_id: str) -> tuple[str | None, str | None, str | None]:
    """The run's ``matrix_combo`` (JSON), its scenario as given and its scenario as run (YAML)."""
    return store.connection.execute(
        "SELECT matrix_combo, scenario_given_yaml, scenario_yaml FROM runs WHERE run_id = ?",
        [run_id],
    ).fetchone()
