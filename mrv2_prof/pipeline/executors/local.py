"""Cells on this host: one after another under the dashboard or progress bar (``Sequential``,
the default and the output of a plain ``run``), or up to ``--max-parallel`` at once, each
runner process given one device id of its own (``Parallel``; ``CUDA_VISIBLE_DEVICES``), so
two cells never share a GPU.

The device ids are ``MRV2_PROF_DEVICE_IDS`` (a comma-separated list; a testing aid that also
gives a CPU run ids to place cells on), else for a CUDA scenario the visible GPUs
(``CUDA_VISIBLE_DEVICES``, else every GPU NVML lists). A CPU scenario without the variable
runs its cells side by side on the host's cores, with no device id.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from mrv2_prof.pipeline.executors.cells import (
    ExecutorError,
    Landed,
    MakeJob,
    cell_from_runner,
    host_name,
    record_placement,
)
from mrv2_prof.pipeline.executors.sweep_progress import SweepProgress
from mrv2_prof.pipeline.job import RunJob
from mrv2_prof.pipeline.lifetime import STOP_SIGNALS
from mrv2_prof.views.safe_text import markup_safe

DEVICE_IDS_ENV = "MRV2_PROF_DEVICE_IDS"
_POLL_S = 0.1


class Sequential:
    """One cell at a time, each through ``launch`` (the dashboard or the progress bar)."""

    def __init__(self, launch: Callable[[RunJob], Any]) -> None:
        self.launch = launch

    def run(self, count: int, make_job: MakeJob, landed: Landed) -> int | None:
        stopped_by = None
        for index in range(count):
            runner = self.launch(make_job(index))
            stopped_by = runner.stopped_by
            if not landed(cell_from_runner(index, runner)):
                break
        return stopped_by


def device_slots(gpu: bool, wanted: int) -> tuple[list[str | None], str]:
    """The device ids cells are placed on (at most ``wanted``) and where they came from."""
    given = os.environ.get(DEVICE_IDS_ENV)
    if given is not None:
        ids = [part.strip() for part in given.split(",")]
        if not all(ids) or len(set(ids)) != len(ids):
            raise ExecutorError(
                f"{DEVICE_IDS_ENV}={given!r}: expected distinct device ids separated by commas"
            )
        return list(ids[:wanted]), DEVICE_IDS_ENV
    if not gpu:
        return [None] * wanted, "the host's cores"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        source = "CUDA_VISIBLE_DEVICES"
    else:
        ids, source = [str(i) for i in range(_nvml_gpu_count())], "NVML"
    if not ids:
        raise ExecutorError(f"--max-parallel {wanted}: no GPU is visible ({source})")
    return list(ids[:wanted]), source


def _nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no package, no driver: the scenario's own checks say what is wrong
        return 1
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


class Parallel:
    """Up to ``len(slots)`` cells at once, each runner on a slot no other running cell holds;
    progress is one line per cell started and landed, and a bar on a terminal. Ctrl-C, SIGTERM
    and SIGHUP stop every running cell (each kept ``aborted``) and start no more."""

    def __init__(self, slots: list[str | None], console: Console) -> None:
        self.slots = slots
        self.console = console
        self.stopped_by: int | None = None
        self.running: dict[int, tuple[Any, str | None]] = {}
        self.counts = {"done": 0, "failed": 0}
        self.progress = SweepProgress(console, len(slots))  # lines only until run() shows a bar

    def run(self, count: int, make_job: MakeJob, landed: Landed) -> int | None:
        with SweepProgress(self.console, count) as self.progress:
            return self._run(count, make_job, landed)

    def _run(self, count: int, make_job: MakeJob, landed: Landed) -> int | None:
        old = {s: signal.signal(s, self._stop) for s in STOP_SIGNALS}
        free, next_index, going = list(self.slots), 0, True
        try:
            while self.running or (going and next_index < count and self.stopped_by is None):
                while free and going and next_index < count and self.stopped_by is None:
                    self._start(next_index, count, make_job(next_index), free.pop(0))
                    next_index += 1
                for index, (runner, slot) in list(self.running.items()):
                    runner.pump()
                    if runner.done:
                        del self.running[index]
                        free.append(slot)
                        going = self._land(index, count, runner, slot, landed) and going
                time.sleep(_POLL_S)
        finally:
            for runner, _ in self.running.values():  # an error in the command: stop the rest
                runner.request_stop()
                runner.join()
            for s, handler in old.items():
                signal.signal(s, handler if self.stopped_by is None else signal.SIG_IGN)
        return self.stopped_by

    def _stop(self, signum, frame) -> None:
        if self.stopped_by is None:
            self.stopped_by = signum
        for runner, _ in self.running.values():
            runner.request_stop(signum)

    def _start(self, index: int, count: int, job: RunJob, slot: str | None) -> None:
        from mrv2_prof.pipeline.launcher import RunnerProcess

        runner = RunnerProcess(job)
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if slot is not None:  # the spawned interpreter takes the environment as it is now
            os.environ["CUDA_VISIBLE_DEVICES"] = slot
        try:
            runner.start()
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
        self.running[index] = (runner, slot)
        self._count()
        where = "" if slot is None else f" on device {slot}"
        self._say(f"cell {index + 1}/{count} started{where}: [bold]{markup_safe(job.label)}[/]")

    def _land(self, index: int, count: int, runner: Any, slot: str | None, landed: Landed) -> bool:
        runner.join()
        placement = {"executor": "local", "host": host_name(), "device_slot": slot}
        outcome = runner.outcome
        if outcome.run_id is not None and outcome.exit_code != 2:
            note = record_placement(runner.job.db_path, outcome.run_id, placement)
            runner.store_error = runner.store_error or note
        self.counts["failed" if outcome.status == "failed" else "done"] += 1
        self._count()
        where = "" if slot is None else f" on device {slot}"
        self._say(
            f"cell {index + 1}/{count} {outcome.status}{where}: "
            f"[bold]{markup_safe(runner.job.label)}[/] run [cyan]{outcome.run_id}[/] "
            f"(done {self.counts['done']}, running {len(self.running)}, "
            f"failed {self.counts['failed']})"
        )
        return landed(cell_from_runner(index, runner, placement))

    def _count(self) -> None:
        self.progress.update(running=len(self.running), **self.counts)

    def _say(self, text: str) -> None:
        self.progress.say(text)
