"""Which executor runs a sweep's cells, from ``run``'s ``--executor``, ``--max-parallel``,
``--ray-address`` and ``--stage-dir``: checked (``ExecutorError``, one line) before anything
is written, and for Ray connected and its workers' versions checked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from mrv2_prof.pipeline.executors.cells import Executor, ExecutorError
from mrv2_prof.pipeline.executors.local import Parallel, Sequential, device_slots
from mrv2_prof.pipeline.job import RunJob

EXECUTORS = ("local", "ray")
MAX_PARALLEL = 1024


def choose_executor(
    name: str,
    *,
    max_parallel: int | None,
    ray_address: str | None,
    stage_dir: Path | None,
    gpu: bool,
    launch: Callable[[RunJob], Any],
    console: Console,
) -> Executor:
    """The executor for ``run``'s options; ``gpu``: whether a cell runs on CUDA;
    ``max_parallel`` None: one cell at a time locally, every cell at once on Ray."""
    if name not in EXECUTORS:
        raise ExecutorError(f"--executor {name!r}: expected one of {', '.join(EXECUTORS)}")
    if max_parallel is not None and not 1 <= max_parallel <= MAX_PARALLEL:
        raise ExecutorError(
            f"--max-parallel {max_parallel}: expected a number of cells from 1 to {MAX_PARALLEL}"
        )
    if name == "local":
        for flag, value in (("--ray-address", ray_address), ("--stage-dir", stage_dir)):
            if value is not None:
                raise ExecutorError(f"{flag} is for --executor ray (the executor is local)")
        if max_parallel is None or max_parallel == 1:
            return Sequential(launch)
        slots, source = device_slots(gpu, max_parallel)
        if len(slots) < max_parallel:
            console.print(
                f"note: --max-parallel {max_parallel}: {len(slots)} device ids ({source}), so "
                f"{len(slots)} cells at once",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return Parallel(slots, console)
    if stage_dir is not None and not stage_dir.is_dir():
        raise ExecutorError(f"--stage-dir {str(stage_dir)!r}: not a directory")
    from mrv2_prof.pipeline.executors.ray_cells import RayCells

    executor = RayCells(ray_address, stage_dir, console)
    executor.connect(gpu, max_parallel)
    return executor
