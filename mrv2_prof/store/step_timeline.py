"""Per-step host and device times out of a run's spans, and the overlap columns written back.

The GPU timeline is stored as spans (track ``gpu``) while the run goes; a step's row is written
before its device times are known. At the end of a run the harness reads, per step, the host
prep window (start of ``schedule`` to end of ``execute``) and the device window (first to last
GPU span), computes overlap and bubbles (``probes.overlap``) and writes them into ``steps``
(``gpu_start_ns``, ``gpu_end_ns``, ``overlap_frac``, ``bubble_ns``, ``bubble_kind``,
``host_prep_ns``, ``hidden_prep_ns``, ``starved_ns``, ``perturbed``).

Starved time (``probes.starvation``): each device span carries the events rule's value; for the
steps of a kernel-trace window ``kernel_starved`` replaces it with the exact one from the
device operations and their launch times (``store.device_busy``), before ``starved_windows``
reads every step's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mrv2_prof.store.db import Store
from mrv2_prof.store.device_busy import starved_from_kernels
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


def kernel_starved(
    store: Store,
    run_id: str,
    steps: Sequence[int],
    launches: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> int:
    """Set ``spans.starved_ns`` of the device spans of ``steps`` (a kernel-trace window) from the
    device operations: ``launches`` (start, end, host launch time of each, from the kernel
    trace), else the run's stored kernels without launch times (every gap counts as waiting for
    the host). Returns the spans updated (``store.device_busy``)."""
    con = store.connection
    spans = con.execute(
        "SELECT step, name, start_ns, end_ns FROM spans WHERE run_id = ? AND track = 'gpu' "
        "AND step IN (SELECT unnest(?::BIGINT[])) ORDER BY start_ns",
        [run_id, list(map(int, steps))],
    ).fetchall()
    if not spans:
        return 0
    sp = np.array([(r[2], r[3]) for r in spans], dtype=np.int64)
    if launches is None:
        lo, hi = spans[0][2], max(r[3] for r in spans)
        ops = con.execute(
            "SELECT start_ns, end_ns FROM kernels WHERE run_id = ? AND end_ns > ? AND start_ns < ?",
            [run_id, lo, hi],
        ).fetchall()
        op = np.array(ops, dtype=np.int64).reshape(-1, 2)
        starved = starved_from_kernels(sp[:, 0], sp[:, 1], op[:, 0], op[:, 1])
    else:
        starved = starved_from_kernels(sp[:, 0], sp[:, 1], *launches)
    batch = pa.table(
        {
            "step": pa.array([r[0] for r in spans], pa.int64()),
            "name": pa.array([r[1] for r in spans]),
            "starved_ns": pa.array(starved, pa.int64()),
        }
    )
    con.register(_VIEW, batch)
    try:
        con.execute(
            f"UPDATE spans SET starved_ns = v.starved_ns FROM {_VIEW} v WHERE spans.run_id = ? "
            "AND spans.track = 'gpu' AND spans.step = v.step AND spans.name = v.name",
            [run_id],
        )
    finally:
        con.unregister(_VIEW)
    return len(spans)


def starved_windows(store: Store, run_id: str, steps: np.ndarray) -> list[list[tuple[int, int]]]:
    """Each step's starved windows, ``(start, start + starved_ns)`` of its device spans (the
    starved part lies at the head of a span, ``probes.starvation``), in the order of ``steps``."""
    rows = store.connection.execute(
        "SELECT step, start_ns, starved_ns FROM spans WHERE run_id = ? AND track = 'gpu' "
        "AND starved_ns > 0 ORDER BY step, start_ns",
        [run_id],
    ).fetchall()
    by_step: dict[int, list[tuple[int, int]]] = {}
    for step, start, starved in rows:
        by_step.setdefault(int(step), []).append((int(start), int(start) + int(starved)))
    return [by_step.get(int(s), []) for s in steps]


def first_use_capture_steps(store: Store, run_id: str) -> set[int]:
    """The steps that captured a CUDA graph (``runner.piecewise_capture``: a PIECEWISE size
    captured by the first step that needs it, ``graph_captures.step`` >= 0): the capture's time
    is in the step's, so it is perturbed as a trace window's steps are."""
    rows = store.connection.execute(
        "SELECT DISTINCT step FROM graph_captures WHERE run_id = ? AND step >= 0", [run_id]
    ).fetchall()
    return {int(r[0]) for r in rows}
