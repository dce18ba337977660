"""The completed run a cell's memo key names (``run --resume``; the key: ``pipeline/resume.py``,
stored in ``runs.info['memo_key']``). Only a ``completed`` run counts: a failed or stopped one
leaves its cell to run again."""

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
