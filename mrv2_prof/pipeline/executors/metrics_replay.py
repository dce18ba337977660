"""A Ray cell's live metrics, recorded on its worker and replayed into the driver's exporter.

With ``--metrics-port`` the driver serves ``/metrics`` (``pipeline/metrics_exporter.py``), fed by
each run's ``RunnerProcess``; a Ray worker has no exporter. There the cell's ``RunnerProcess``
gets a ``MetricsRecorder`` in its place (the same ``begin_run`` and ``update``): it keeps the
run's start (run id, model) and what its snapshots add up to, the task returns that
(``recorded``), and as the cell lands the driver applies it to its exporter (``replay``). So a Ray
cell's series appear when the cell lands, not while it runs, with the same values its
snapshots would have given a local run's: counters and gauges from the last snapshot (counters
are cumulative totals), every latency of every snapshot observed in the histograms.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mrv2_prof.views.snapshot import Snapshot

LATENCY_FIELDS = ("new_ttft_s", "new_itl_s", "new_e2e_s")  # the histograms' new values


class MetricsRecorder:
    """Stands in for ``MetricsExporter`` in a worker's ``RunnerProcess``: keeps the run's start,
    its latest snapshot and every latency the snapshots carried (a run's snapshots are
    cumulative but for those, so the latest one and the latencies are all the exporter needs)."""

    def __init__(self) -> None:
        self.started: tuple[str, str] | None = None  # (run_id, model name)
        self.last: Snapshot | None = None
        self.latencies: dict[str, list[float]] = {name: [] for name in LATENCY_FIELDS}
        self.num_snapshots = 0

    def begin_run(self, run_id: str, model_name: str) -> None:
        self.started = (run_id, model_name)

    def update(self, snapshot: Snapshot) -> None:
        self.last = snapshot
        self.num_snapshots += 1
        for name in LATENCY_FIELDS:
            self.latencies[name].extend(getattr(snapshot, name))

    def stop_lingering(self) -> None:
        """A stop by signal on the worker: nothing lingers here (the driver's exporter decides)."""

    def recorded(self) -> dict[str, Any] | None:
        """What the task returns (plain data), None when no snapshot came."""
        if self.last is None:
            return None
        merged = {name: tuple(values) for name, values in self.latencies.items()}
        return {"started": self.started, "snapshot": dataclasses.replace(self.last, **merged)}


def replay(exporter: Any, recorded: dict[str, Any] | None, run_id: str | None) -> None:
    """Apply a cell's ``recorded`` metrics to ``exporter`` under ``run_id``, the id its run is
    stored under (the worker's, unless the merge had to give the run a new one)."""
    if recorded is None or run_id is None:
        return
    snapshot = recorded["snapshot"]
    if recorded["started"] is not None:
        exporter.begin_run(run_id, recorded["started"][1])
    exporter.update(dataclasses.replace(snapshot, run_id=run_id))
