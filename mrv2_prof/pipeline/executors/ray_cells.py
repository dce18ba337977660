"""Cells as tasks on a Ray cluster (``--executor ray``): each task runs the cell's runner process
on a worker exactly as a local run does (``launcher.RunnerProcess``) into a database of its own
in a temporary directory, and returns that file's bytes (through ``--stage-dir`` when it is
larger than ``INLINE_MAX_BYTES``); the driver writes it as a side file of ``--db`` and merges it
(``store.live_runs``) as it lands. The worker chose the run's id in its own database: one
``--db`` already has (another cell's, an earlier run's, a live run's) is replaced by a new one
as the run is merged (``Store.merge_run_file``), so no run is overwritten or lost, and the cell's
outcome names the id it is stored under.

With ``--metrics-port`` the worker's runner records its snapshots (``metrics_replay``) and the
driver replays them into its exporter as the cell lands: a Ray cell's series appear then, not
while it runs.

A task asks for one GPU for a CUDA scenario, else one CPU; ``MRV2_PROF_RAY_CELL_RESOURCE``
names a custom resource to ask for instead (a testing aid: a CPU cluster started with
``resources={"gpu_slot": 2}`` stands in for two GPUs). A worker lost mid-cell is retried once
by Ray (``max_retries=1``); a run that failed on its own is a result, never retried. A cell
whose task still fails is stored as a ``failed`` run with the reason, and the sweep goes on.
Ctrl-C (SIGTERM, SIGHUP) cancels the tasks still out; every run merged so far is kept.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from mrv2_prof.pipeline.executors.cells import (
    CellRun,
    ExecutorError,
    Landed,
    MakeJob,
    host_name,
    record_placement,
)
from mrv2_prof.pipeline.executors.metrics_replay import MetricsRecorder, replay
from mrv2_prof.pipeline.executors.sweep_progress import SweepProgress
from mrv2_prof.pipeline.job import Outcome, RunJob
from mrv2_prof.pipeline.lifetime import STOP_SIGNALS
from mrv2_prof.pipeline.metrics_exporter import serving
from mrv2_prof.views.safe_text import markup_safe

EXTRA = "pip install 'mrv2-prof[ray]'"
CELL_RESOURCE_ENV = "MRV2_PROF_RAY_CELL_RESOURCE"
INLINE_MAX_BYTES = 256 * 1024 * 1024  # a larger run file goes through --stage-dir
_CONNECT_TIMEOUT_S = 5.0
_CANCEL_GRACE_S = 30.0  # cancelled tasks that stop within it still return their aborted run


def _torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def worker_versions() -> tuple[str, str, str | None, dict[str, Any]]:
    """On a worker: its host, mrv2-prof version and installed torch version (torch not loaded),
    and its class for ``--resume`` (code version and a GPU cell's environment class there)."""
    from mrv2_prof import __version__
    from mrv2_prof.pipeline.resume import node_class

    return socket.gethostname(), __version__, _torch_version(), node_class()


def run_cell(job: RunJob, stage_dir: str | None) -> dict[str, Any]:
    """On a worker: run ``job`` into a temporary database and return the run file and facts."""
    import ray

    from mrv2_prof.pipeline.launcher import RunnerProcess
    from mrv2_prof.store import Store

    context = ray.get_runtime_context()
    placement = {
        "executor": "ray",
        "host": host_name(),
        "node_id": context.get_node_id(),
        "device_slot": os.environ.get("CUDA_VISIBLE_DEVICES") or None,
        "resources": context.get_assigned_resources(),
    }
    with tempfile.TemporaryDirectory(prefix="mrv2-prof-cell-") as tmp:
        db = Path(tmp) / "run.duckdb"
        with Store.open(db):
            pass
        runner = RunnerProcess(dataclasses.replace(job, db_path=str(db)))
        recorder = runner.metrics = MetricsRecorder()  # no exporter here: replayed by the driver
        runner.start()
        try:
            outcome = runner.join()
        except KeyboardInterrupt:  # ray.cancel: stop between two steps, keep what was drained
            runner.request_stop(signal.SIGINT)
            outcome = runner.join()
        if outcome.run_id is not None:
            record_placement(db, outcome.run_id, placement)
        result = {"outcome": outcome, "facts": runner.facts, "placement": placement}
        result["store_error"] = runner.store_error
        result["metrics"] = recorder.recorded()
        size = db.stat().st_size
        if stage_dir is not None and size > INLINE_MAX_BYTES:
            staged = Path(stage_dir) / f"{outcome.run_id or os.getpid()}-{time.time_ns()}.duckdb"
            shutil.copyfile(db, staged)
            result["path"] = str(staged)
        else:
            result["bytes"] = db.read_bytes()
        return result


def _reachable(address: str) -> None:
    """A ``host:port`` address is refused at once when nothing listens there."""
    bare = address.split("://", 1)[-1]
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", "local" or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ExecutorError(f"--ray-address {address!r}: cannot reach it ({exc})") from None


class RayCells:
    """The driver: connect and check the cluster (``connect``), then submit and merge."""

    def __init__(self, address: str | None, stage_dir: Path | None, console: Console) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        self.stage_dir = stage_dir
        self.console = console
        self.stopped_by: int | None = None
        self.resource = os.environ.get(CELL_RESOURCE_ENV)
        self.counts = {"done": 0, "failed": 0}
        self.progress = SweepProgress(console, 0)  # lines only until run() shows a bar

    def connect(self, gpu: bool, max_parallel: int | None) -> None:
        """Join the cluster and refuse, in one line, one that cannot run these cells."""
        try:
            import ray
        except ImportError:
            raise ExecutorError(f"--executor ray needs Ray: {EXTRA}") from None
        self.ray = ray
        self.max_parallel = max_parallel
        _reachable(self.address)
        try:
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:  # ConnectionError, or what Ray says of a bad address
            raise ExecutorError(f"--ray-address {self.address!r}: {_last_line(exc)}") from None
        self.gpu = gpu
        needed = self.resource or ("GPU" if self.gpu else "CPU")
        if ray.cluster_resources().get(needed, 0) < 1:
            raise ExecutorError(
                f"--executor ray: the cluster at {self.address!r} has no {needed} for "
                f"{'a GPU' if self.gpu else 'a CPU'} scenario's cells"
            )
        self._check_versions()

    def _check_versions(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from mrv2_prof import __version__

        remote = self.ray.remote(num_cpus=0)(worker_versions)
        refs = [
            remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], False)
            ).remote()
            for n in self.ray.nodes()
            if n.get("Alive")
        ]
        mine = (__version__, _torch_version())
        self.node_classes: list[dict[str, Any]] = []  # --resume matches under each of them
        for host, version, torch, *node in self.ray.get(refs):  # (an older worker: no class)
            if (version, torch) != mine:
                raise ExecutorError(
                    f"--executor ray: worker {host} has mrv2-prof {version} and torch {torch}, "
                    f"this host mrv2-prof {mine[0]} and torch {mine[1]}: install the same on both"
                )
            self.node_classes += [c for c in node[:1] if c not in self.node_classes]

    def run(self, count: int, make_job: MakeJob, landed: Landed) -> int | None:
        with SweepProgress(self.console, count) as self.progress:
            return self._run(count, make_job, landed)

    def _run(self, count: int, make_job: MakeJob, landed: Landed) -> int | None:
        ray = self.ray
        wants = {"resources": {self.resource: 1}, "num_cpus": 0} if self.resource else {}
        if not wants:
            wants = {"num_gpus": 1, "num_cpus": 0} if self.gpu else {"num_cpus": 1}
        task = ray.remote(max_retries=1, retry_exceptions=False)(run_cell)
        stage = None if self.stage_dir is None else str(self.stage_dir)
        jobs: dict[int, RunJob] = {}
        refs: dict[Any, int] = {}

        def submit() -> None:  # up to --max-parallel tasks out (every cell without it)
            while len(jobs) < count and len(refs) < (self.max_parallel or count):
                index = len(jobs)
                jobs[index] = job = make_job(index)
                name = f"mrv2-prof cell {index} {job.label}"
                refs[task.options(name=name, **wants).remote(job, stage)] = index
                self.progress.update(running=len(refs), **self.counts)

        old = {s: signal.signal(s, self._stop) for s in STOP_SIGNALS}
        cancelled_at = None
        try:
            submit()
            while refs:
                if self.stopped_by is not None and cancelled_at is None:
                    cancelled_at = time.monotonic()
                    for ref in refs:
                        ray.cancel(ref)
                force = (
                    cancelled_at is not None and time.monotonic() > cancelled_at + _CANCEL_GRACE_S
                )
                if force:
                    for ref in refs:
                        ray.cancel(ref, force=True)
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.2)
                for ref in ready:
                    index = refs.pop(ref)
                    cell = self._land(index, jobs[index], ref, len(refs), count)
                    if cell is not None and not landed(cell) and self.stopped_by is None:
                        self.stopped_by = 0  # the command asked to stop: cancel the rest
                if self.stopped_by is None:
                    submit()
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)
            for s, handler in old.items():
                signal.signal(s, handler if not self.stopped_by else signal.SIG_IGN)
        return self.stopped_by or None

    def _stop(self, signum, frame) -> None:
        if not self.stopped_by:
            self.stopped_by = signum
        exporter = serving()
        if exporter is not None:  # the user wants out: no --metrics-linger (as a local run)
            exporter.stop_lingering()

    def _land(self, index: int, job: RunJob, ref, running: int, count: int) -> CellRun | None:
        """Merge the cell's run into the database; a task that failed is stored ``failed``."""
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.TaskCancelledError:
            return None
        except Exception as exc:  # the worker died (after Ray's one retry), or the task raised
            reason = f"ray task failed: {_last_line(exc)}"
            result = {"outcome": None, "placement": {"executor": "ray"}, "error": reason}
        placement = result["placement"]
        if result["outcome"] is None:
            outcome = Outcome(
                _store_failed(job, result["error"], placement), "failed", result["error"], 1
            )
            cell = CellRun(index, outcome, placement=placement)
        else:
            cell = CellRun(index, result["outcome"], result["facts"], placement=placement)
            cell.store_error = self._merge(job, result)
            exporter = serving()
            if exporter is not None:  # --metrics-port: the cell's series, now that it landed
                replay(exporter, result.get("metrics"), cell.outcome.run_id)
        outcome = cell.outcome
        self.counts["failed" if outcome.status == "failed" else "done"] += 1
        self.progress.update(running=running, **self.counts)
        host = markup_safe(str(placement.get("host")))
        self.progress.say(
            f"cell {index + 1}/{count} {outcome.status} on {host}: "
            f"[bold]{markup_safe(job.label)}[/] run [cyan]{outcome.run_id}[/] "
            f"(done {self.counts['done']}, running {running}, failed {self.counts['failed']})"
        )
        return cell

    def _merge(self, job: RunJob, result: dict[str, Any]) -> str | None:
        """Merge the cell's run file into ``--db``; its outcome (and facts) then name the id
        the run is stored under. Returns what could not be stored, else None."""
        from mrv2_prof.store import Store, StoreError

        outcome = result["outcome"]
        if outcome.run_id is None:
            return None
        db = Path(job.db_path)
        source = Path(result["path"]) if "path" in result else None
        try:
            if source is None:
                source = _landing_file(db, outcome.run_id, result["bytes"])
            stored_id = Store.merge_run_file(db, source, outcome.run_id)
        except (StoreError, OSError) as exc:
            why = exc if isinstance(exc, StoreError) else (exc.strerror or exc)
            kept = _keep_for_later(db, source, outcome.run_id)
            return f"run {outcome.run_id} is not merged into {db} ({why}){kept}"
        if stored_id != outcome.run_id:
            outcome.run_id = stored_id
            if isinstance(result.get("facts"), dict):
                result["facts"]["run_id"] = stored_id
        return None


def _landing_file(db: Path, run_id: str, data: bytes) -> Path:
    """A returned run file written beside ``db`` (so it is moved in by a rename); a partly
    written one is removed."""
    fd, name = tempfile.mkstemp(dir=db.parent, prefix=f".{db.name}.{run_id}.")
    try:
        with os.fdopen(fd, "wb") as landing:
            landing.write(data)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _keep_for_later(db: Path, source: Path | None, run_id: str) -> str:
    """A run file that could not be merged now (the database held too long, the disk): made
    the run's side file, which the next writable open of ``db`` merges, when no other run has
    that name; says where it is."""
    from mrv2_prof.store.live_runs import live_file

    if source is None or not source.exists():
        return ""
    side = live_file(db, run_id)
    try:
        if not side.exists():
            side.parent.mkdir(exist_ok=True)
            shutil.move(source, side)
            return f"; kept in {side}, merged by the next writable open"
    except OSError:
        pass
    return f"; its file is kept as {source}"


def _last_line(exc: BaseException) -> str:
    """An exception's last non-empty line (Ray's errors end with the cause), else its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _store_failed(job: RunJob, error: str, placement: dict[str, Any]) -> str | None:
    """A ``failed`` row for a cell whose task never returned its run; its id, or None."""
    from mrv2_prof.store import Store, StoreError

    try:
        with Store.open(Path(job.db_path)) as store:
            run_id = store.new_run_id()
            now = time.perf_counter_ns()
            with store.transaction():
                store.begin_run(
                    run_id,
                    scenario_name=str(job.scenario.get("name", "")),
                    label=job.label,
                    matrix_combo=job.matrix_combo,
                    scenario_yaml=job.scenario_yaml,
                    device=str(job.scenario.get("runner", {}).get("device", "")),
                    versions={},
                    started_ns=now,
                )
                store.update_run(
                    run_id,
                    scenario_given_yaml=job.scenario_yaml,
                    run_group=job.run_group,
                    repeat_index=job.repeat_index,
                    environment={"placement": placement},
                )
                store.finish_run(run_id, "failed", ended_ns=now, error=error)
            return run_id
    except StoreError:
        return None
