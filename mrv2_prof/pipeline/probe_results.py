"""What the recording probe gathered, into the store: drained buffers as Arrow columns, and the
results known only once the step loop is over (the kernel trace's rows, overlap and bubbles
per step from the resolved GPU timeline).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from mrv2_prof.probes.session import ProbeSession
from mrv2_prof.store import Store


def arrow_columns(cols: dict[str, np.ndarray]) -> dict[str, Any]:
    """-1 in a ``*_ns`` column means "not measured", NaN in a float column "none given" (a step
    without a dynamic-k decision): both stored as NULL."""
    return {k: _with_nulls(k, v) for k, v in cols.items()}


def _with_nulls(name: str, values: Any) -> Any:
    if not isinstance(values, np.ndarray):  # already Arrow (its NULLs set by the caller)
        return values
    kind = values.dtype.kind
    if kind == "i" and name.endswith("_ns"):
        return pa.array(values, mask=values < 0)
    if kind == "f":
        return pa.array(values, mask=np.isnan(values))
    return values


def arrow_tables(batches: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """``RecordingProbe.drain()``'s tables, ready for ``Store.append_batches``."""
    return {table: arrow_columns(cols) for table, cols in batches.items()}


def store_probe_results(
    store: Store, run_id: str, session: ProbeSession, facts: dict[str, Any]
) -> None:
    """After the last flush: the kernel trace's rows, the exact starved time of its steps, and
    overlap, bubbles, starved time and the perturbed flag per step."""
    from mrv2_prof.store.step_timeline import (
        first_use_capture_steps,
        kernel_starved,
        starved_windows,
        step_times,
        update_steps,
    )

    kt = session.kernel_trace
    perturbed = set(session.perturbed_steps()) | first_use_capture_steps(store, run_id)
    if kt is not None and kt.columns is not None:
        cols = dict(kt.columns)
        cols["step"] = pa.array(cols["step"], mask=cols["step"] < 0)  # -1: not attributed
        store.append(run_id, "kernels", arrow_columns(cols))
        if session.timeline is not None:
            launches = getattr(kt, "launch_ns", None)
            if launches is not None:  # unknown launches (-1): their gaps count as waiting
                launches = (
                    kt.columns["start_ns"],
                    kt.columns["end_ns"],
                    np.where(launches < 0, np.iinfo(np.int64).max, launches),
                )
            kernel_starved(store, run_id, kt.traced_steps, launches)
    t = step_times(store, run_id)
    cols: dict[str, list] = {"perturbed": [int(s) in perturbed for s in t["step"]]}
    if session.timeline is not None:
        from mrv2_prof.probes.overlap import step_columns

        windows = starved_windows(store, run_id, t["step"])
        cols |= step_columns(
            t["prep_start_ns"], t["enqueue_end_ns"], t["gpu_start_ns"], t["gpu_end_ns"], windows
        )
    update_steps(store, run_id, t["step"], cols)
    store.update_run(run_id, info=facts)
