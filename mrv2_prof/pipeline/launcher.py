"""The parent side of a run: spawn the runner process, relay its snapshots to a view.

The runner runs in its own spawned process so the dashboard never shares its interpreter. The
parent only reads small messages from a queue: the live dashboard (``tui``) or a rich progress
bar renders them (or, when the output is not a terminal, plain progress lines:
``headless_progress``). Ctrl-C (SIGINT), SIGTERM, SIGHUP or ``q`` ask the runner to stop between two
steps; it then flushes everything and marks the run ``aborted`` (more signals change nothing;
one that does not stop within ``STOP_GRACE_S`` is killed). A runner that dies without saying so
has its run row marked ``failed`` by the parent; one whose parent dies stops by itself
(``lifetime``).

The runner writes its own side file while it is live (``store.live_runs``); once it has
exited, the parent makes sure that file is merged into the database. With ``--metrics-port``
every snapshot received also goes to the metrics exporter (``metrics_exporter``).

NVML telemetry (``probes.nvml_hz``) is sampled here, in the parent, from the moment the runner
reports it started until it is done; the samples (or the note saying why there are none) are
written to the run once the runner has closed the database.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from collections import deque
from collections.abc import Callable

from rich.console import Console

from mrv2_prof.pipeline.headless_progress import with_progress_bar, with_progress_lines
from mrv2_prof.pipeline.job import Outcome, RunJob
from mrv2_prof.pipeline.lifetime import STOP_SIGNALS, stop_signals_blocked
from mrv2_prof.pipeline.metrics_exporter import serving
from mrv2_prof.pipeline.runner_entry import runner_entry
from mrv2_prof.pipeline.standby import claim, hand_over
from mrv2_prof.probes.nvml_sampler import NvmlSampler
from mrv2_prof.store import Store, StoreError
from mrv2_prof.store.run_notes import add_run_note
from mrv2_prof.views.safe_text import markup_safe
from mrv2_prof.views.snapshot import Snapshot
from mrv2_prof.views.startup_line import startup_line

_JOIN_TIMEOUT_S = 60.0
STOP_GRACE_S = 60.0  # a runner asked to stop that has not stopped by then is killed
GPU_SAMPLE_WINDOW = 240  # NVML samples the dashboard keeps for its sparklines


class RunnerProcess:
    """One spawned runner and its message queue; also a ``SnapshotSource`` for the dashboard."""

    def __init__(self, job: RunJob) -> None:
        job = dataclasses.replace(job, launched_at=time.time())  # the process start, timed
        self.job = job
        ctx = mp.get_context("spawn")
        self.queue = ctx.Queue()
        self.stop_event = ctx.Event()
        self.stop_signal = ctx.Value("i", 0)  # the signal a stop was asked for with (0: none)
        self.process = ctx.Process(
            target=runner_entry,
            args=(job, self.queue, self.stop_event, self.stop_signal, os.getpid()),
        )
        self.run_id: str | None = None
        self.facts: dict | None = None
        self.outcome: Outcome | None = None
        self.interrupted = False
        self.stopped_by: int | None = None  # the signal that stopped the run
        self.store_error: str | None = None  # what the parent could not write after the run
        self._stop_asked_at: float | None = None
        self.on_started: Callable[[dict], None] | None = None
        self._latest: Snapshot | None = None
        self.metrics = serving()  # --metrics-port: every snapshot received goes to it too
        self.nvml_hz = float(job.scenario.get("probes", {}).get("nvml_hz", 0) or 0)
        self.nvml: NvmlSampler | None = None
        self._nvml_note: str | None = None
        self._notes_to_store: list[str] = []
        self._gpu_recent: deque[tuple[int, float, int, float, float]] = deque(
            maxlen=GPU_SAMPLE_WINDOW
        )

    def start(self) -> None:
        standby = claim()  # a runner spawned before the command's imports (``standby.py``)
        if standby is not None:
            own = (self.job, self.queue, self.stop_event, self.stop_signal, self.process)
            # adopted before the job is sent: a stop asked while it is sent reaches the standby
            self.queue, self.stop_event = standby.queue, standby.stop_event
            self.stop_signal, self.process = standby.stop_signal, standby.process
            self.job = dataclasses.replace(
                self.job, launched_at=time.time(), prespawned_at=standby.spawned_at
            )
            if hand_over(standby, self.job):
                return
            # it died waiting: a runner is spawned as ever
            self.job, self.queue, self.stop_event, self.stop_signal, self.process = own
        with stop_signals_blocked():  # the runner unblocks them once it handles them
            self.process.start()

    # ---- messages -------------------------------------------------------------------------------
    def _handle(self, kind: str, payload) -> None:
        if kind == "begun":
            self.run_id = payload
        elif kind == "started":
            self.facts = payload
            self._start_nvml(payload)
            if self.metrics is not None:
                self.metrics.begin_run(payload["run_id"], str(payload["model"].get("name", "")))
            if self.on_started is not None:
                self.on_started(payload)
        elif kind == "snapshot":
            self._latest = payload
            if self.metrics is not None:
                self.metrics.update(payload)
        elif kind == "done":
            self.outcome = payload

    def pump(self, timeout_s: float = 0.0) -> None:
        """Handle every waiting message (waiting up to ``timeout_s`` for the first)."""
        try:
            msg = self.queue.get(timeout=timeout_s) if timeout_s else self.queue.get_nowait()
            while True:
                self._handle(*msg)
                msg = self.queue.get_nowait()
        except queue_mod.Empty:
            pass
        if self.outcome is None and not self.process.is_alive():
            self._drain_after_exit()
        stuck = self._stop_asked_at is not None and self.outcome is None
        if stuck and time.monotonic() - self._stop_asked_at > STOP_GRACE_S:
            self.process.kill()
            self._stop_asked_at = None

    def _drain_after_exit(self) -> None:
        """The process is gone: read what it sent last, else record that it died."""
        deadline = time.monotonic() + 2.0
        while self.outcome is None and time.monotonic() < deadline:
            try:
                self._handle(*self.queue.get(timeout=0.1))
            except queue_mod.Empty:
                continue
        if self.outcome is None:
            code = self.process.exitcode
            self.outcome = Outcome(
                self.run_id, "failed", f"runner process died (exit code {code})", exit_code=1
            )
            self._mark_failed()

    def _mark_failed(self) -> None:
        """The runner cannot finish its row any more: the parent does (its steps are kept)."""
        if self.run_id is None or self.outcome is None:
            return
        self.process.join(_JOIN_TIMEOUT_S)  # its lock on the file goes with it
        try:
            with Store.open(self.job.db_path) as store:
                store.finish_run(
                    self.run_id, "failed", ended_ns=time.perf_counter_ns(), error=self.outcome.error
                )
        except StoreError as exc:  # the row stays running; the next writer marks it failed
            self.outcome.error = f"{self.outcome.error}; the run row was not updated ({exc})"

    def _merge_side_file(self) -> None:
        """The runner merges its side file into the database as it ends; when it could not
        (killed, or readers held the file too long) the parent does, before the summary."""
        if self.run_id is None:
            return
        try:
            Store.merge_ended_runs(self.job.db_path)
        except StoreError as exc:
            self.store_error = f"run {self.run_id} is still in its side file ({exc})"

    @property
    def done(self) -> bool:
        return self.outcome is not None

    # ---- NVML -----------------------------------------------------------------------------------
    def _start_nvml(self, facts: dict) -> None:
        if self.nvml_hz <= 0:
            return
        sampler = NvmlSampler(self.nvml_hz, str(facts.get("device", "cpu")))
        if sampler.start():
            self.nvml = sampler
        else:
            self._nvml_note = sampler.note
            facts["notes"] = [*facts.get("notes", []), sampler.note]

    def _finish_nvml(self) -> None:
        """After the runner exited: store the samples, or the note of why there are none."""
        samples = self.nvml.stop() if self.nvml is not None else None
        energy_note = self.nvml.energy_note if self.nvml is not None else None
        self.nvml = None
        self._notes_to_store = [n for n in (self._nvml_note, energy_note) if n is not None]
        if self.run_id is None or (not self._notes_to_store and samples is None):
            return
        try:
            self._store_nvml(samples)
        except StoreError as exc:  # the run itself is stored; say what was not
            self.store_error = f"NVML samples not stored: {exc}"

    def _store_nvml(self, samples: dict | None) -> None:
        with Store.open(self.job.db_path) as store:
            if samples is not None and len(samples["t_ns"]):
                store.append(self.run_id, "gpu_samples", samples)
            for note in self._notes_to_store:  # NVML missing, or a GPU without its energy counter
                add_run_note(store, self.run_id, note)

    # ---- SnapshotSource -------------------------------------------------------------------------
    def poll(self) -> tuple[Snapshot | None, bool]:
        self.pump()
        snap, self._latest = self._latest, None
        return snap, self.done

    def request_stop(self, signum: int = 0) -> None:
        """Ask the runner to stop between two steps; ``signum``: the signal that asked."""
        if signum and self.stopped_by is None:
            self.stopped_by = signum
            self.interrupted = True
            self.stop_signal.value = signum
            if self.metrics is not None:  # the user wants out: no --metrics-linger
                self.metrics.stop_lingering()
        if self._stop_asked_at is None and not self.stop_event.is_set():
            self._stop_asked_at = time.monotonic()
        self.stop_event.set()

    def gpu_samples(self) -> tuple[list[tuple[int, float, int, float, float]], str | None]:
        """Recent NVML samples, oldest first, and the note saying why there are none.

        The sampler's newest row is taken at each call (the dashboard calls once per poll), so
        the series has the dashboard's poll rate at most; the stored ``gpu_samples`` keep all.
        """
        if self.nvml is not None:
            row = self.nvml.latest()
            if row is not None and (not self._gpu_recent or row[0] != self._gpu_recent[-1][0]):
                self._gpu_recent.append(row)
        return list(self._gpu_recent), self._nvml_note

    def join(self) -> Outcome:
        while not self.done:
            self.pump(0.2)
        self.process.join(_JOIN_TIMEOUT_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        self._merge_side_file()
        self._finish_nvml()
        assert self.outcome is not None
        return self.outcome


class _StopOnSignals:
    """While a run is live: SIGINT, SIGTERM and SIGHUP ask the runner to stop (the first one
    names the run's reason and the exit code; more change nothing). After SIGHUP the terminal
    is gone: what is still printed to it goes to /dev/null instead of failing."""

    def __init__(self, runner: RunnerProcess) -> None:
        self.runner = runner

    def __enter__(self) -> _StopOnSignals:
        self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            # After a stop by signal the CLI only prints and exits: more signals are ignored
            # (one landing in the interpreter's teardown would otherwise kill it by its default).
            signal.signal(s, handler if self.runner.stopped_by is None else signal.SIG_IGN)

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGHUP:
            _detach_from_terminal()
        self.runner.request_stop(signum)


def _detach_from_terminal() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        if os.isatty(fd):
            os.dup2(devnull, fd)
    os.close(devnull)


def run_headless(job: RunJob, console: Console, heartbeat_s: float = 10.0) -> RunnerProcess:
    """Run one job with a rich progress bar on a terminal, else plain progress lines every
    ``heartbeat_s`` seconds (0: none; ``progress_lines``); both end with the whole run's rate.
    Returns the finished ``RunnerProcess``."""
    runner = RunnerProcess(job)

    def started(facts: dict) -> None:
        console.print(
            f"[bold]{markup_safe(facts['label'])}[/] run [cyan]{facts['run_id']}[/] "
            f"on {markup_safe(facts['device'])} "
            f"({facts['dtype']}): "
            f"{facts['model_params'] / 1e6:.1f}M params, {facts['num_kv_blocks']} KV blocks, "
            f"{markup_safe(startup_line(facts))}"
        )
        for note in facts["notes"]:
            console.print(f"  [yellow]note[/] {markup_safe(note)}")

    runner.on_started = started
    with _StopOnSignals(runner):
        if console.is_terminal:
            with_progress_bar(runner, console)
        else:
            with_progress_lines(runner, console, heartbeat_s)
    return runner


def run_dashboard(job: RunJob) -> RunnerProcess:
    """Run one job under the live Textual dashboard."""
    from mrv2_prof.tui.dashboard import DashboardApp

    runner = RunnerProcess(job)
    with _StopOnSignals(runner):
        runner.start()
        DashboardApp(runner, title=job.label).run()
        runner.join()
    return runner
