"""The runner process's first frame: Python's bytecode cache, then the harness.

The spawned runner unpickles this function as its target, so this module is what the process
imports first of the runner's (beside ``job``, stdlib only). It turns Python's bytecode cache on
where the host left it off (``bytecode_cache.cache_bytecode``: torch compiled from source in
every run otherwise, 2.3 s of a 4.9 s start-up on an H100 host) before the harness, numpy and
torch are imported, then runs ``harness.runner_process_main``. What it did travels in the job
(``RunJob.bytecode_cache``) to the run's ``bytecode`` fact and notes.
"""

from __future__ import annotations

import dataclasses
import time

from mrv2_prof.pipeline.bytecode_cache import cache_bytecode
from mrv2_prof.pipeline.job import RunJob


def process_start() -> tuple[float, dict[str, str] | None]:
    """The runner process's first step: (``time.time()`` at its entry, what
    ``cache_bytecode`` did); also the standby runner's (``standby.py``)."""
    entered = time.time()  # the process's start, split in two (the start-up line's interpreter)
    return entered, cache_bytecode(export=True)  # its tensor-parallel ranks read what it writes


def run_job(job: RunJob, start: tuple[float, dict[str, str] | None], *args) -> None:
    """``runner_process_main(job, *args)``, the job carrying ``process_start``'s results."""
    from mrv2_prof.pipeline.harness import runner_process_main

    entered, cache = start
    runner_process_main(dataclasses.replace(job, entered_at=entered, bytecode_cache=cache), *args)


def runner_entry(job: RunJob, *args) -> None:
    """``runner_process_main(job, *args)`` with the bytecode cache set up first."""
    run_job(job, process_start(), *args)
