"""The completed run a cell's memo key names (``run --resume``; the key: ``pipeline/resume.py``,
stored in ``runs.info['memo_key']``). Only a ``completed`` run counts: a failed or stopped one
leaves its cell to run again. ``run_groups``: the groups the completed runs are in, which the
re-run repeats of their combination join."""

from __future__ import annotations

import json

from mrv2_prof.store import Store


def completed_run_for(store: Store, key: str) -> str | None:
    """The newest completed run stored under memo key ``key``; None when there is none."""
    rows = store.connection.execute(
        "SELECT run_id, info FROM runs WHERE status = 'completed' AND contains(info, ?) "
        "ORDER BY started_at DESC NULLS LAST, started_ns DESC NULLS LAST, run_id",
        [key],
    ).fetchall()
    for run_id, text in rows:  # the text held the key: it must be the info's memo key
        try:
            info = json.loads(text)
        except ValueError:
            continue
        if isinstance(info, dict) and info.get("memo_key") == key:
            return run_id
    return None


def run_groups(store: Store, run_ids: list[str]) -> dict[str, str | None]:
    """Each of ``run_ids``'s ``runs.run_group`` (None: a run of no group)."""
    if not run_ids:
        return {}
    rows = store.connection.execute(
        "SELECT run_id, run_group FROM runs WHERE list_contains(?, run_id)", [list(run_ids)]
    ).fetchall()
    return dict(rows)
