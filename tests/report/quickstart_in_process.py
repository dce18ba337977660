"""A run of the shipped quickstart through ``runner_main`` in this process (no CLI, no spawn):
the fixture runs of the compare/gate tests."""

from __future__ import annotations

import queue
import signal
import threading
from pathlib import Path

from mrv2_prof.store import Store

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def run_quickstart(db: Path, *sets: str) -> str:
    """The quickstart with ``--set`` overrides into ``db``; returns the new run's id."""
    from mrv2_prof.pipeline.harness import runner_main
    from mrv2_prof.pipeline.job import RunJob
    from mrv2_prof.scenario import load_scenario, scenario_yaml

    s = load_scenario(QUICKSTART, list(sets))
    data = s.model_dump(mode="json")
    job = RunJob(data, scenario_yaml(data), s.name, None, str(db))
    sigint = signal.getsignal(signal.SIGINT)
    try:
        runner_main(job, queue.Queue(), threading.Event())
    finally:
        signal.signal(signal.SIGINT, sigint)  # runner_main takes SIGINT over, as in its process
    with Store.open(db, read_only=True) as store:
        return store.resolve_run("latest")
