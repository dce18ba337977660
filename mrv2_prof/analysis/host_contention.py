"""Was the host contended during a run? Read from the run's stored environment, nothing else.

A busy host slows the step loop it measures, and on a small host the run's own threads can be
more than its cores. The figures (all from ``runs.environment``, ``run_environment``):

* *load beyond the run* at the start and at the end = the host's 1-minute load average then −
  the most the run itself can have added to it: ``R × (1 − e^(−t/60))``, where ``R`` = the run's
  threads (torch threads × runner processes, + 1 for the parent process) and ``t`` = the seconds
  the run had been going when the load was read (the 1-minute load average is an exponentially
  damped mean with a 60 s time constant; a run reading it after 1 s of start-up adds ≤ 0.05 per
  thread). Never below 0.
* *threads* = torch threads × runner processes (tensor-parallel ranks, one process each).
* *steal* = the share of the host's CPU time the hypervisor gave to others over the run
  (``/proc/stat``'s ``steal`` against all its ticks, between the start and the end; Linux only).

The host is *contended* (``Contention.contended``) when any of these holds:

1. busy: the load beyond the run, at the start or the end, is ≥ ``BUSY_SHARE`` (0.75) × the
   host's cores;
2. oversubscribed: threads + the load beyond the run ≥ the cores this process may use + 1 (at
   least one of the run's threads had no core; with no other load: more threads than cores);
3. steal ≥ ``STEAL_SHARE`` (10 %) of the CPU time over the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

BUSY_SHARE = 0.75  # load beyond the run, over the host's cores, that makes a host busy
STEAL_SHARE = 0.10  # share of CPU time stolen by the hypervisor that counts as contention
LOAD_TIME_CONSTANT_S = 60.0  # the 1-minute load average's damping time constant
LOAD_DIFFERENCE = 0.25  # load over cores by which two runs' hosts differ materially


@dataclass(frozen=True)
class Contention:
    cores: int  # the host's cores (cpu_count)
    usable_cores: int  # the cores the runner may run on (its affinity), else cores
    threads: int  # torch threads × runner processes
    load_start: float | None  # load beyond the run at the start (None: not recorded)
    load_end: float | None
    steal: float | None  # share of CPU time stolen over the run (None: not reported)
    reasons: tuple[str, ...]  # one per rule that holds, with its numbers

    @property
    def contended(self) -> bool:
        return bool(self.reasons)

    @property
    def peak_load(self) -> float | None:
        loads = [x for x in (self.load_start, self.load_end) if x is not None]
        return max(loads) if loads else None

    @property
    def load_per_core(self) -> float | None:
        """The higher load beyond the run, over the host's cores."""
        peak = self.peak_load
        return None if peak is None or self.cores <= 0 else peak / self.cores


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _first_load(value: Any) -> float | None:
    """The 1-minute figure of a stored ``[1, 5, 15]`` load average."""
    return _number(value[0]) if isinstance(value, list) and value else None


def _beyond_run(load: float | None, after_s: Any, run_threads: int) -> float | None:
    if load is None:
        return None
    t = _number(after_s)
    own = 0.0 if t is None else run_threads * (1 - math.exp(-max(t, 0.0) / LOAD_TIME_CONSTANT_S))
    return max(0.0, load - own)


def steal_share(env: dict[str, Any]) -> float | None:
    """Stolen ticks over all ticks between the start and the end (None: not both recorded)."""
    a, b = env.get("cpu_steal_ticks_start"), env.get("cpu_steal_ticks_end")
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == 2 and len(b) == 2):
        return None
    steal, total = (_number(b[0]), _number(a[0])), (_number(b[1]), _number(a[1]))
    if None in steal or None in total:
        return None
    ticks = total[0] - total[1]
    return None if ticks <= 0 else max(0.0, (steal[0] - steal[1]) / ticks)


def assess(env: dict[str, Any] | None) -> Contention | None:
    """The host's contention during a run (module doc: the rules); None without an
    environment or a CPU count."""
    if not env:
        return None
    cores = _number(env.get("cpu_count"))
    if cores is None or cores < 1:
        return None
    cores_i = int(cores)
    usable = int(_number(env.get("cpu_affinity")) or cores_i)
    per_process = int(_number(env.get("torch_threads")) or 1)
    threads = per_process * int(_number(env.get("runner_processes")) or 1)
    run_threads = threads + 1
    start = _beyond_run(
        _first_load(env.get("load_avg_start")), env.get("load_avg_start_after_s"), run_threads
    )
    end = _beyond_run(
        _first_load(env.get("load_avg_end")), env.get("load_avg_end_after_s"), run_threads
    )
    steal = steal_share(env)
    reasons: list[str] = []
    busy = [(w, x) for w, x in (("start", start), ("end", end)) if x is not None]
    busy = [(w, x) for w, x in busy if x >= BUSY_SHARE * cores_i]
    if busy:
        when, load = max(busy, key=lambda p: p[1])
        reasons.append(
            f"load {load:.2f} beyond the run at the {when} on {cores_i} cores "
            f"(≥ {BUSY_SHARE:g} × cores)"
        )
    other = max([x for x in (start, end) if x is not None], default=0.0)
    if threads + other >= usable + 1:
        beside = f" + load {other:.2f}" if other > 0 else ""
        reasons.append(
            f"{threads} runner thread{'' if threads == 1 else 's'}{beside} on {usable} usable cores"
        )
    if steal is not None and steal >= STEAL_SHARE:
        reasons.append(f"{100 * steal:.0f} % of CPU time stolen by the hypervisor")
    return Contention(cores_i, usable, threads, start, end, steal, tuple(reasons))


def contention_text(c: Contention) -> str:
    """The finding's line: what was found, and the fix."""
    steal = "" if c.steal is None else f"; steal {100 * c.steal:.1f} % of CPU time"
    if c.threads > 1:
        fix = (
            "run on a quiet host, or give the runner fewer threads "
            "(OMP_NUM_THREADS=1 on a small host)"
        )
    else:
        fix = "the runner has 1 thread already: run on a quiet host"
    return (
        f"host contended: {'; '.join(c.reasons)}{steal}; the step times measure the host's "
        f"other work too: {fix}"
    )
