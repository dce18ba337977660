"""The start-up line of a headless run: the seconds from the command's start (the runner
process's spawn, for a run without ``command_s``) to its first step, and the phases they went
to, from the run's start-up facts (``runs.info``).

* ``command``: the ``mrv2-prof`` command itself until it spawned the runner (its own imports,
  the scenario's checks, the database's), for the first runner a command spawns:
  ``command_s``, wall-clock time from ``__main__.main`` to the spawn (``RunJob.command_at``).
  Later runners of a sweep and runs started in-process have none. Where the runner was started
  before the command's imports and waited for its job (``pipeline/standby.py``: the
  ``standby_s`` fact), the line says so ("the runner starting beside it"): its interpreter and
  imports went beside the command, and its own phases count from the hand-over.
* ``process``: the parent spawning the runner until the runner begins building the engine (a
  fresh interpreter, torch and the runner's imports, the database opened): ``process_start_s``,
  wall-clock time between the two processes (``RunJob.launched_at``). Where the run recorded
  when the runner's target began (``process_entry_s``, ``RunJob.entered_at``), it is two phases:
  ``interpreter`` (the spawn: a fresh interpreter, multiprocessing's bootstrap and the harness
  module's imports, until the target runs) and ``imports`` (the rest: the database opened, torch
  and the engine's modules imported); where the run also recorded torch's own import
  (``torch_import_s``, the harness's ``_import_torch``), it is ``torch`` and ``imports`` the
  rest of that time, "from source" where most of torch's modules were compiled in the runner
  process (no bytecode cache read: the ``bytecode`` fact, ``pipeline/bytecode_cache.py``).
* ``weights``, ``profile run``, ``KV cache``, ``warm-up``, ``graphs`` (with the keys captured),
  ``draft graphs``: the engine's own timings (``RuntimeInfo``: ``weight_load_s``,
  ``profile_run_s``, ``kv_alloc_s``, ``kernel_warmup_s``, ``capture_s``, ``draft_capture_s``).
* ``other``: the rest of ``startup_s`` (the engine built, then the workload and tokenizer and
  the collection of start-up's objects, until the first step): ``startup_s`` less the engine's
  phases.

The total is ``command_s + process_start_s + startup_s``; the line leaves out a phase under
0.05 s (it would read 0.0 s), and ``process`` (``command``) for a run whose facts do not have it
(stored before it was recorded, or started in-process).
A run with the host sampler on (``probes.host_sampling_hz``) sampled its start-up too, and the
samples' own time is in the phases: ``startup_sampler_s`` (the sampler's time until start-up
ended) closes the line, "host sampler 0.1 s of it", from 0.05 s.
"""

from __future__ import annotations

from typing import Any

PHASES = (
    ("weight_load_s", "weights"),
    ("profile_run_s", "profile run"),
    ("kv_alloc_s", "KV cache"),
    ("kernel_warmup_s", "warm-up"),
    ("capture_s", "graphs"),
    ("draft_capture_s", "draft graphs"),
)


def startup_phases(facts: dict[str, Any]) -> list[tuple[str, float]]:
    """(phase, seconds) in order, ``other`` last; phases of zero seconds left out."""
    process = facts.get("process_start_s")
    entry = facts.get("process_entry_s")
    phases = [("command", float(facts.get("command_s") or 0.0))]
    if process is None:
        pass
    elif entry is None:
        phases.append(("process", float(process)))
    else:
        entry = min(float(entry), float(process))
        rest = float(process) - entry
        torch_s = min(float(facts.get("torch_import_s") or 0.0), rest)
        phases += [("interpreter", entry), ("torch", torch_s), ("imports", rest - torch_s)]
    engine = [(name, float(facts.get(key) or 0.0)) for key, name in PHASES]
    phases += engine
    other = float(facts.get("startup_s") or 0.0) - sum(s for _, s in engine)
    phases.append(("other", max(other, 0.0)))
    return [(name, s) for name, s in phases if s > 0]


def torch_from_source(facts: dict[str, Any]) -> bool:
    """Whether most of torch's modules were compiled from source in the runner process (the
    run's ``bytecode`` fact, ``pipeline/bytecode_cache.py``): no bytecode cache was read."""
    bytecode = facts.get("bytecode")
    if not isinstance(bytecode, dict) or not bytecode.get("torch_modules"):
        return False
    return 2 * int(bytecode.get("torch_compiled") or 0) > int(bytecode["torch_modules"])


def startup_line(facts: dict[str, Any]) -> str:
    """``start-up 8.3 s (process 2.1 s, weights 1.2 s, ..., graphs 2.0 s / 86 keys, other
    0.4 s)``."""
    phases = startup_phases(facts)
    total = sum(float(facts.get(k) or 0.0) for k in ("command_s", "process_start_s", "startup_s"))
    parts = []
    for name, seconds in phases:
        if seconds < 0.05:
            continue
        text = f"{name} {seconds:.1f} s"
        if name == "graphs" and facts.get("num_graphs"):
            text += f" / {facts['num_graphs']} keys"
        if name == "command" and facts.get("standby_s"):  # standby.py
            text += ", the runner starting beside it"
        if name == "torch" and torch_from_source(facts):
            text += " from source"
        parts.append(text)
    sampler = float(facts.get("startup_sampler_s") or 0.0)
    if sampler >= 0.05:
        parts.append(f"host sampler {sampler:.1f} s of it")
    return f"start-up {total:.1f} s" + (f" ({', '.join(parts)})" if parts else "")
