"""A note added to a stored run (``runs.info.notes``) after the run itself was written, such as
why the parent's NVML samples are missing. The info is read, the note appended to its list and
the info written back through ``Store.update_run``."""

from __future__ import annotations

import json

from mrv2_prof.store.db import Store


def add_run_note(store: Store, run_id: str, note: str) -> None:
    """Append ``note`` to run ``run_id``'s ``info.notes`` (a run with no info gets one)."""
    row = store.connection.execute("SELECT info FROM runs WHERE run_id = ?", [run_id]).fetchone()
    info = json.loads(row[0]) if row and row[0] else {}
    info["notes"] = [*info.get("notes", []), note]
    store.update_run(run_id, info=info)
