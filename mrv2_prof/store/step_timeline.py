"""Per-step host and device times out of a run's spans, and the overlap columns written back.

The GPU timeline is stored as spans (track ``gpu``) while the run goes; a step's row is written
before its device times are known. At the end of a run the harness reads, per step, the host
prep window (start of ``schedule`` to end of ``execute``) and the device window (first to last
GPU span), computes overlap and bubbles (``probes.overlap``) and writes them into ``steps``
(``gpu_start_ns``, ``gpu_end_ns``, ``overlap_frac``, ``bubble_ns``, ``bubble_kind``,
``host_prep_ns``, ``hidden_prep_ns``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mrv2_prof.store.db import Store
from mrv2_prof.store.schema import TABLES, quote

_VIEW = "_mrv2_step_timeline"
_UPDATABLE = {name for name, _ in TABLES["steps"]} - {"run_id", "step"}


def step_times(store: Store, run_id: str) -> dict[str, np.ndarray]:
    """``step``, ``prep_start_ns``, ``enqueue_end_ns``, ``gpu_start_ns``, ``gpu_end_ns`` of every
    step row, in step order; -1 where a time was not recorded."""
    rows = store.connection.execute(
        """
        SELECT s.step,
               coalesce(c.prep_start, -1), coalesce(c.enqueue_end, -1),
               coalesce(g.gpu_start, -1), coalesce(g.gpu_end, -1)
        FROM steps s
        LEFT JOIN (
            SELECT step,
                   min(start_ns) FILTER (WHERE name = 'schedule') AS prep_start,
                   max(end_ns) FILTER (WHERE name = 'execute') AS enqueue_end
            FROM spans WHERE run_id = $1 AND track = 'cpu' GROUP BY step
        ) c USING (step)
        LEFT JOIN (
            SELECT step, min(start_ns) AS gpu_start, max(end_ns) AS gpu_end
            FROM spans WHERE run_id = $1 AND track = 'gpu' GROUP BY step
        ) g USING (step)
        WHERE s.run_id = $1
        ORDER BY s.step
        """,
        [run_id],
    ).fetchall()
    names = ("step", "prep_start_ns", "enqueue_end_ns", "gpu_start_ns", "gpu_end_ns")
    if not rows:
        return {n: np.zeros(0, dtype=np.int64) for n in names}
    cols = np.array(rows, dtype=np.int64).T
    return dict(zip(names, cols, strict=True))


def update_steps(
    store: Store, run_id: str, steps: np.ndarray, columns: Mapping[str, Sequence[Any]]
) -> None:
    """Set ``columns`` of the run's existing ``steps`` rows, matched by ``step``; None is NULL."""
    unknown = set(columns) - _UPDATABLE
    if unknown:
        raise ValueError(f"update steps: unknown columns {sorted(unknown)}")
    if len(steps) == 0:
        return
    types = dict(TABLES["steps"])
    batch = pa.table(
        {"step": pa.array(steps, pa.int64()), **{k: pa.array(v) for k, v in columns.items()}}
    )
    sets = ", ".join(f"{quote(k)} = CAST(v.{quote(k)} AS {types[k]})" for k in columns)
    con = store.connection
    con.register(_VIEW, batch)
    try:
        con.execute(
            f"UPDATE steps SET {sets} FROM {_VIEW} v "
            "WHERE steps.run_id = ? AND steps.step = v.step",
            [run_id],
        )
    finally:
        con.unregister(_VIEW)
