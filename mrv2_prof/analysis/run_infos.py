"""Every stored run's ``runs.info`` (its start-up facts and notes), parsed: the run list reads
its model column from it."""

from __future__ import annotations

import json

from mrv2_prof.store import Store


def run_infos(store: Store) -> dict[str, dict | None]:
    """Run id -> its info as a dict; None where a run has none or it is not a JSON object."""
    rows = store.connection.execute("SELECT run_id, info FROM runs").fetchall()
    return {run_id: _json_or_none(text) for run_id, text in rows}


def _json_or_none(text: str | None) -> dict | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
