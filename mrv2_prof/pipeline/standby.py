"""A runner process started before the command line is imported, waiting for its job.

Before ``run`` spawns a runner, its own process spends some 0.5 s (an H100 host) importing the
command line (typer, rich, pydantic, DuckDB) and checking the scenario, the model and the
database. The runner then spends 1.5-2 s starting an interpreter and importing torch and the
engine's modules. Neither needs the other until the job exists. So for a ``run`` command
``__main__`` starts the runner's process first (``prespawn``): it sets up the bytecode cache,
imports the harness, torch and the engine (``prepare_imports``), and waits on a pipe.
The first ``RunnerProcess`` started in this process takes it (``claim``) and sends the job through
the pipe; what it did is the same as a runner spawned then, less those imports.

It is started only where it pays: a host with a CUDA driver (``MRV2_PROF_STANDBY=on`` or ``off``
forces it either way). It is left unclaimed where the command launches no runner (bad input, exit
2; ``--help``), or where the first runner's ``CUDA_VISIBLE_DEVICES`` differs (a sweep's device
slots), and is then killed at exit (``dismiss``): it holds no file and no CUDA context, and it
waits with the stop signals blocked, so a Ctrl-C reaches the command alone.

What the start-up line says: the runner's phases are timed from the hand-over
(``RunJob.launched_at``), so its interpreter and imports, done beside the command, are no phase of
their own. ``RunJob.prespawned_at`` (the ``standby_s`` fact: the seconds it ran before its job
came) says how much of its start went beside the command. The host sampler
(``probes.host_sampling_hz``), which starts with the job, does not sample those imports.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import time
from typing import Any

from mrv2_prof.inputs.cuda_devices import cuda_driver_present
from mrv2_prof.pipeline.job import RunJob
from mrv2_prof.pipeline.runner_entry import process_start, run_job

SWITCH_ENV = "MRV2_PROF_STANDBY"  # on | off; unset or auto: on where a CUDA driver is present


@dataclasses.dataclass
class Standby:
    """The waiting process and what a ``RunnerProcess`` adopts of it."""

    process: Any  # multiprocessing's SpawnProcess
    conn: Any  # the pipe's sending end
    queue: Any
    stop_event: Any
    stop_signal: Any
    spawned_at: float  # time.time() as it was started
    visible: str | None  # CUDA_VISIBLE_DEVICES then
    claimed: bool = False


_standby: Standby | None = None


def wanted(argv: list[str], env: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether ``argv`` (``sys.argv``) is a ``run`` command that gets a standby runner."""
    switch = env.get(SWITCH_ENV, "auto").strip().lower()
    if switch == "off" or argv[1:2] != ["run"] or {"-h", "--help"} & set(argv[2:]):
        return False
    if "ray" in argv[2:] or "--executor=ray" in argv[2:]:  # its runners start on Ray's workers
        return False
    return switch == "on" or (switch == "auto" and cuda_driver_present())


def prespawn() -> Standby:
    """Start the waiting runner process (once per process)."""
    global _standby
    if _standby is not None:
        return _standby
    import multiprocessing as mp

    from mrv2_prof.pipeline.lifetime import stop_signals_blocked

    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    queue, stop_event, stop_signal = ctx.Queue(), ctx.Event(), ctx.Value("i", 0)
    process = ctx.Process(
        target=standby_entry,
        args=(receive, queue, stop_event, stop_signal, os.getpid()),
        daemon=False,
    )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    # The child keeps the stop signals blocked while it waits (a Ctrl-C is the command's); the
    # parent takes a pending one only once ``dismiss`` can find the child.
    with stop_signals_blocked():
        spawned_at = time.time()
        process.start()
        _standby = Standby(process, send, queue, stop_event, stop_signal, spawned_at, visible)
        atexit.register(dismiss)
    receive.close()  # the child's end
    return _standby


def claim() -> Standby | None:
    """The waiting runner, for the first runner this process starts, where it starts with the
    environment the standby was spawned with; None otherwise (a runner is then spawned as
    ever, and the standby, of no further use, dismissed)."""
    standby = _standby
    if standby is None or standby.claimed:
        return None
    if os.environ.get("CUDA_VISIBLE_DEVICES") != standby.visible or not standby.process.is_alive():
        dismiss()
        return None
    standby.claimed = True
    return standby


def hand_over(standby: Standby, job: RunJob) -> bool:
    """Send ``job`` to the waiting runner, which then runs it as a freshly spawned one would;
    False where it is gone (it died importing: the runner spawned instead says why)."""
    try:
        standby.conn.send(job)
    except (BrokenPipeError, ConnectionError, OSError):
        standby.process.join(5.0)
        return False
    finally:
        standby.conn.close()
    return True


def dismiss() -> None:
    """Kill an unclaimed standby runner (it holds nothing) and wait for it."""
    standby = _standby
    if standby is None or standby.claimed:
        return
    standby.claimed = True  # nothing takes it from here on
    try:
        standby.conn.close()
        standby.process.kill()
        standby.process.join(5.0)
    except Exception:  # at exit: nothing more to do about it
        pass


def prepare_imports() -> None:
    """What a runner imports before its job exists: torch, then the engine's modules, as the
    harness imports them (no garbage collection over them, their objects frozen after)."""
    from mrv2_prof.pipeline.collector import imports_uncollected

    with imports_uncollected("torch"):
        import torch  # noqa: F401
    with imports_uncollected("mrv2_prof.runner.engine"):
        import mrv2_prof.runner.engine  # noqa: F401
        import mrv2_prof.runner.model.model_name  # noqa: F401
        import mrv2_prof.workload  # noqa: F401


def standby_entry(conn, queue, stop_event, stop_signal, parent_pid: int) -> None:
    """The waiting runner's target: the bytecode cache and the imports, then the job."""
    start = process_start()  # as ``runner_entry`` does, before the imports
    prepare_imports()
    try:
        job = conn.recv()
    except (EOFError, OSError):  # the command launched no runner, or ended
        os._exit(0)
    conn.close()
    run_job(job, start, queue, stop_event, stop_signal, parent_pid)  # (it exits the process)
