"""The runner process's CPU threads: a default that leaves a loaded host's busy cores alone.

torch's default is one intra-op thread per core, whatever else the host runs. On a small, busy
host that oversubscribes it: the OpenMP threads wait for one another at every parallel region,
and one thread without a core stalls them all (the quickstart on 2 cores at load 3: 102 output
tok/s with torch's 2 threads, 1,623 with ``OMP_NUM_THREADS=1``).

The rule (``choose_threads``), taken once in the runner process before the model loads:

* ``OMP_NUM_THREADS`` set (the user's, inherited): honoured as it is; torch reads it itself.
* else *free cores* = the cores this process may run on (``sched_getaffinity``) − the host's
  1-minute load average at that moment, and each of the run's ``processes`` (tensor-parallel
  ranks) gets ``max(1, round(free / processes))`` threads, never more than the cores over the
  processes. A quiet host keeps torch's default (every core); each whole unit of load beyond a
  half takes a core away.

The choice is applied with ``torch.set_num_threads`` in this process and exported as
``OMP_NUM_THREADS`` for the ranks it spawns, and recorded in the run's environment
(``torch_threads_set_by``; the user's own ``OMP_NUM_THREADS`` stays what is recorded under that
key).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # the intra-op threads per process to set; None: leave them as they are
    reason: str  # how they were chosen, recorded as the environment's torch_threads_set_by

    def facts(self) -> dict[str, str]:
        return {"torch_threads_set_by": self.reason}


def available_cores() -> int:
    """The cores this process may run on (its affinity), else the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_threads(
    environ: Mapping[str, str], cores: int, load_1min: float | None, processes: int = 1
) -> ThreadChoice:
    """The threads per runner process on a host with ``cores`` and ``load_1min`` (module doc)."""
    explicit = environ.get("OMP_NUM_THREADS")
    if explicit:
        return ThreadChoice(None, f"OMP_NUM_THREADS={explicit} (given)")
    processes = max(1, processes)
    per_process = max(1, cores // processes)
    if load_1min is None:
        return ThreadChoice(per_process, f"{cores} cores / {processes} process(es); load unknown")
    free = max(0.0, cores - load_1min)
    threads = max(1, min(per_process, math.floor(free / processes + 0.5)))
    return ThreadChoice(
        threads,
        f"round(({cores} cores - load {load_1min:.2f}) / {processes} process(es)) = {threads}",
    )


def apply_threads(choice: ThreadChoice) -> None:
    """Set the chosen threads in this process (torch) and for the processes it spawns."""
    if choice.threads is None:
        return
    import torch

    torch.set_num_threads(choice.threads)
    os.environ["OMP_NUM_THREADS"] = str(choice.threads)
