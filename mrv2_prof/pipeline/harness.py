"""The runner process: scenario → workload → engine step loop → store.

``runner_main`` is the target of the spawned process. It owns the run row from start to end: the
row is written as ``running`` before the model loads; the probe buffers are drained about once a
second and written by a background thread (the drain and hand-over is the ``flush`` span, the
DuckDB insert stays off the step loop); and the row is finished as ``completed``, ``aborted``
(SIGINT or a stop request from the parent) or ``failed`` (with the error). The step loop itself
is the open-loop client (``open_loop.drive``); the parent never touches the engine, it gets
``Snapshot``s (``live_stats``); once the step loop has ended, completed, stopped or failed, a
final one carries the run's totals and every latency left, so ``--metrics-port``'s counters and
histograms end at what is stored.

Messages to the parent are ``(kind, payload)`` tuples: ``("begun", run_id)``,
``("started", facts)``, ``("snapshot", Snapshot)``, ``("done", outcome)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from mrv2_prof.pipeline.arrow_no_pandas import arrow_without_pandas
from mrv2_prof.pipeline.bytecode_cache import bytecode_facts, cache_note
from mrv2_prof.pipeline.collector import freeze_start_up, imports_uncollected, thaw
from mrv2_prof.pipeline.job import Outcome, RunJob
from mrv2_prof.pipeline.lifetime import RunnerLifetime, exit_code, stop_reason
from mrv2_prof.pipeline.live_roofline import LiveRoofline
from mrv2_prof.pipeline.live_stats import LiveStats
from mrv2_prof.pipeline.open_loop import drive
from mrv2_prof.pipeline.probe_results import arrow_tables, store_probe_results
from mrv2_prof.pipeline.request_rows import InFlightRows
from mrv2_prof.pipeline.request_texts import RequestTexts
from mrv2_prof.pipeline.run_environment import finish_environment, load_average, run_environment
from mrv2_prof.pipeline.run_facts import loop_facts, startup_facts, versions
from mrv2_prof.pipeline.runner_threads import (
    ThreadChoice,
    apply_threads,
    available_cores,
    choose_threads,
)
from mrv2_prof.probes import api as probes
from mrv2_prof.probes.host_sampler import HostSampler
from mrv2_prof.probes.machine_peaks import machine_peaks
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.session import ProbeSession
from mrv2_prof.probes.support import unavailable_probe_notes
from mrv2_prof.store import BackgroundWriter, Store, StoreError
from mrv2_prof.store.opening import DiskFullError, disk_full


class _Interrupted:
    """SIGINT in the runner sets a flag; the loop stops between steps, never inside a write.
    (In-process use; the runner process has a ``RunnerLifetime`` instead.)"""

    def __init__(self) -> None:
        self.flag = False
        self.signum = 0
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self.flag, self.signum = True, signum

    def reason(self) -> str | None:
        return stop_reason(self.signum) if self.flag else None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


def runner_process_main(
    job: RunJob, queue, stop_event, stop_signal=None, parent_pid: int | None = None
) -> None:
    """The target of the spawned runner process: ``runner_main``, then an exit that skips the
    interpreter's teardown. By then everything is written and the outcome sent; tearing torch
    and triton down only made some builds print native-extension leak reports (nanobind).
    ``stop_signal`` and ``parent_pid``: see ``lifetime.RunnerLifetime``."""
    if job.entered_at is None:  # (``runner_entry`` takes it before the bytecode cache)
        job = dataclasses.replace(job, entered_at=time.time())  # the process's start, in two
    arrow_without_pandas()  # before the first Arrow array: it would import pandas (0.2 s)
    lifetime = RunnerLifetime(parent_pid, stop_signal)
    try:
        runner_main(job, queue, stop_event, lifetime)
    finally:
        lifetime.finished.set()
    if lifetime.parent_gone:
        queue.cancel_join_thread()  # nobody reads the pipe any more: do not wait on it
    else:
        queue.close()
        queue.join_thread()  # the outcome is through the pipe
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def runner_main(job: RunJob, queue, stop_event, lifetime: RunnerLifetime | None = None) -> None:
    """The runner process's work (tests call it in-process, without a ``lifetime``)."""
    interrupted = _Interrupted() if lifetime is None else lifetime
    emit = queue.put
    began = time.perf_counter()
    try:  # the run writes a side file of its own: the database stays readable meanwhile
        name = str(job.scenario.get("name", ""))
        store, run_id = Store.open_live_run(job.db_path, label=job.label, scenario_name=name)
    except StoreError as exc:
        emit(("done", Outcome(None, "failed", str(exc), exit_code=2)))
        return
    try:
        should_stop = lambda: interrupted.flag or stop_event.is_set()  # noqa: E731
        # the runner process's own threads (runner_threads); in-process (tests) the caller's
        outcome = _run(job, store, run_id, emit, should_stop, began, lifetime is not None)
    except DiskFullError as exc:  # the run row could not be written: nothing of the run is kept
        outcome = Outcome(None, "failed", str(exc), exit_code=2)
    except Exception as exc:  # before the run row existed, or while finishing it
        outcome = Outcome(None, "failed", _one_line(exc), exit_code=1)
    if lifetime is None:  # in-process: the run's engine is not the process's for good
        thaw()
    if outcome.status == "aborted":
        outcome.error = interrupted.reason() or "stopped by the user"
        if interrupted.signum:
            outcome.exit_code = exit_code(interrupted.signum)
    ended_ns = time.perf_counter_ns()
    unfinished = False  # the side file could not take the run's end: the database's row is set
    try:
        if outcome.run_id is not None:
            try:
                store.finish_run(
                    outcome.run_id, outcome.status, ended_ns=ended_ns, error=outcome.error
                )
            except Exception as exc:
                full = disk_full(store.path, exc)
                if full is None:
                    raise
                unfinished = True
                if outcome.status != "failed":
                    outcome.status, outcome.error, outcome.exit_code = "failed", str(full), 1
    finally:
        store.close()
        # One transaction of the database; if it cannot be had, the parent's next open (or any
        # later writer's) merges the side file.
        with contextlib.suppress(StoreError):
            Store.merge_ended_runs(job.db_path)
            if unfinished:
                _finish_in_database(job.db_path, outcome, ended_ns)
        emit(("done", outcome))


def _finish_in_database(db_path: str, outcome: Outcome, ended_ns: int) -> None:
    """The run's end, written to the database's row once its side file (which could not take
    it: disk full) is merged; else the next writable open marks the row failed."""
    with Store.open(db_path) as main, contextlib.suppress(ValueError):  # ValueError: not merged
        main.finish_run(outcome.run_id, outcome.status, ended_ns=ended_ns, error=outcome.error)


def _run(
    job: RunJob, store: Store, run_id: str, emit, should_stop, began: float, set_threads: bool
) -> Outcome:
    """The run, with the host sampler (``probes.host_sampling_hz``) on from the start: what the
    runner's start-up spends its time on is sampled too (``startup``, step -1)."""
    from mrv2_prof.scenario import Scenario

    scenario = Scenario.model_validate(job.scenario)
    sampler: HostSampler | None = None
    if scenario.probes.host_sampling_hz > 0:  # start-up's samples too: torch's import onwards
        sampler = HostSampler(scenario.probes.host_sampling_hz).start()
    try:
        return _run_sampled(job, store, run_id, emit, should_stop, began, set_threads, scenario,
                            sampler)  # fmt: skip
    finally:
        if sampler is not None:
            sampler.stop()  # stopped (and its facts taken) by the run; here on an early exit


def _run_sampled(
    job: RunJob, store: Store, run_id: str, emit, should_stop, began: float, set_threads: bool,
    scenario, sampler: HostSampler | None,
) -> Outcome:  # fmt: skip
    from mrv2_prof.pipeline.effective_scenario import engine_as_run
    from mrv2_prof.runner.config import ConfigError
    from mrv2_prof.runner.model import CheckpointError
    from mrv2_prof.scenario import ScenarioError, scenario_yaml

    t_torch = time.perf_counter()
    _import_torch()
    torch_import_s = time.perf_counter() - t_torch  # the start-up line's "torch"
    from mrv2_prof.runner.worker import triton_key_prefetch

    triton_key_prefetch.start(str(scenario.runner.device))  # hashed while the engine builds
    processes = scenario.runner.tensor_parallel_size
    threads: ThreadChoice | None = None
    if set_threads:  # before the model loads and the ranks are spawned
        load = load_average()
        threads = choose_threads(os.environ, available_cores(), load and load[0], processes)
        apply_threads(threads)
    try:  # one transaction: the row is there whole, or (the disk refused it) not at all
        with store.transaction():
            store.begin_run(
                run_id,
                scenario_name=scenario.name,
                label=job.label,
                matrix_combo=job.matrix_combo,
                scenario_yaml=job.scenario_yaml,
                device=scenario.runner.device,
                versions=versions(),
                started_ns=time.perf_counter_ns(),
            )
            store.update_run(run_id, scenario_given_yaml=job.scenario_yaml)  # as run: once known
            if job.run_group is not None:
                store.update_run(run_id, run_group=job.run_group, repeat_index=job.repeat_index)
    except Exception as exc:
        full = disk_full(store.path, exc)
        if full is not None:
            raise full from exc
        raise
    emit(("begun", run_id))
    probe, nvtx_anchor_ns = _make_probe(scenario.probes.nvtx, run_id)
    environment: dict[str, Any] = {}
    outcome = Outcome(run_id, "failed")
    engine = session = None
    writer: BackgroundWriter | None = None

    in_flight = InFlightRows()
    texts: RequestTexts | None = None  # the requests' text columns (None: no tokenizer)
    live: LiveStats | None = None

    def flush() -> None:
        probe.begin(probes.FLUSH)
        # the buffers' arrays (no copy, no conversion: made into rows on the writer thread)
        handoff = (probe.swap(), sampler and sampler.swap())
        if writer is None:
            store.append_batches(run_id, convert(handoff))
        else:
            writer.submit(handoff)  # decoded, converted and written on the writer thread
        probe.end(probes.FLUSH)

    def convert(handoff) -> dict[str, dict[str, Any]]:
        batches = probe.decode(handoff[0])
        if handoff[1] is not None:
            batches["host_samples"] = sampler.decode(handoff[1])
        # tokens and their request rows: one transaction
        in_flight.add_to(batches, in_flight.follow(handoff[0], probe.name_of))
        if texts is not None:  # decoded here, on the writer thread, never on the step loop
            texts.add_to(batches)
        return arrow_tables(batches)

    try:
        if should_stop():  # asked to stop while the runner started: load no model for nothing
            outcome.status = "aborted"
            return outcome
        with imports_uncollected("mrv2_prof.runner.engine"):  # triton, the model (``collector``)
            from mrv2_prof.runner.engine import Engine
            from mrv2_prof.runner.model.model_name import model_identity
            from mrv2_prof.workload import build_workload, model_tokenizer

        t0 = time.perf_counter()
        launched = None if job.launched_at is None else max(0.0, time.time() - job.launched_at)
        engine = Engine(scenario.runner_config(), scenario.model_spec(), probe)
        t_engine = time.perf_counter()
        info = engine.info
        tokenizer = model_tokenizer(scenario.model_spec(), scenario.workload, scenario.source)
        workload_notes: list[str] = []  # the values the workload could not honour as given
        requests = build_workload(
            scenario.workload,
            seed=scenario.seed,
            vocab_size=engine.vocab_size,
            max_model_len=engine.config.max_model_len,
            source=scenario.source,
            tokenizer=tokenizer,
            model=scenario.model_spec(),
            notes=workload_notes,
        )
        texts = RequestTexts.of(tokenizer, requests)  # None without a tokenizer: no text
        notes = [*job.notes, *unavailable_probe_notes(scenario.probes.model_dump())]
        notes += workload_notes
        if job.bytecode_cache is not None:  # Python's settings changed: said, not silent
            notes.append(cache_note(job.bytecode_cache))
        # Start-up objects (torch, triton, the model, compiled kernels) leave the collector's
        # reach: a full collection over them stalled a step for hundreds of ms mid-run. Both
        # before the first step, so in the start-up it reports (its "other").
        frozen = freeze_start_up()
        arrow_tables({"prime": {"t_ns": np.array([-1])}})  # its first call imports numpy.ma
        outcome.facts = startup_facts(info, time.perf_counter() - t0, len(requests), notes)
        outcome.facts["gc_frozen_objects"] = frozen
        outcome.facts["engine_s"] = t_engine - t0  # the rest of start-up: the workload's
        if sampler is not None:  # what sampling start-up took of it (the start-up line says)
            outcome.facts["startup_sampler_s"] = sampler.cost_ns / 1e9
        outcome.facts["process_start_s"] = launched  # spawn, imports, the database opened
        outcome.facts["torch_import_s"] = torch_import_s  # of it: torch's own import
        since = next((t for t in (job.prespawned_at, job.launched_at, job.entered_at) if t), None)
        if job.prespawned_at is not None and job.launched_at is not None:  # beside the command
            outcome.facts["standby_s"] = max(0.0, job.launched_at - job.prespawned_at)
        if since is not None:  # which modules this process compiled from source
            outcome.facts["bytecode"] = {**bytecode_facts(since), "cache": job.bytecode_cache}
        if job.launched_at is not None and job.command_at is not None:  # the command before
            outcome.facts["command_s"] = max(0.0, job.launched_at - job.command_at)
        if launched is not None and job.entered_at is not None:  # its interpreter's start
            outcome.facts["process_entry_s"] = max(0.0, job.entered_at - job.launched_at)
        outcome.facts["model"] = model_identity(scenario.model_spec())  # show and runs name it
        from mrv2_prof.pipeline.resume import run_key  # --resume: this environment's key

        outcome.facts.update(run_key(job.scenario, job.repeat_index, job.memo_key))
        if nvtx_anchor_ns is not None:
            outcome.facts["nvtx_anchor_ns"] = nvtx_anchor_ns
        session = ProbeSession(
            scenario.probes.model_dump(),
            probe,
            info.device,
            outcome.facts["notes"],
            trace_dir=str(Path(job.db_path).resolve().parent / "kernel_traces"),
        )
        environment = run_environment(
            info.device,
            after_s=time.perf_counter() - began,
            processes=processes,
            threads_set_by=threads and threads.reason,
        )
        outcome.facts["machine_peaks"] = machine_peaks(
            info.device, environment, info.dtype, scenario.probes.hbm_gbps, job.known_peaks
        )
        ran = engine_as_run(job.scenario, job.db_path, engine, nvtx_anchor_ns is not None)
        if ran.get("workload", {}).get("ignore_eos") is None:  # the default as it ran
            from mrv2_prof.workload import TextModel

            random_weights = TextModel.of(tokenizer, scenario.model_spec()).random_weights
            ran["workload"]["ignore_eos"] = random_weights
        store.update_run(
            run_id,
            device=info.device,
            info=outcome.facts,
            scenario_yaml=scenario_yaml(ran),
            environment=environment,
        )
        emit(("started", {"run_id": run_id, "label": job.label, **outcome.facts}))
        live = LiveStats(
            run_id, job.label, len(requests), info.num_kv_blocks, probe=probe,
            max_tokens={w.req_id: w.max_tokens for w in requests},
        )  # fmt: skip
        live.roofline = LiveRoofline.of(info.step_cost, outcome.facts["machine_peaks"])
        writer = BackgroundWriter(store, run_id, convert, lambda h: probe.give_back(h[0])).start()
        if sampler is not None:  # start-up is over: samples carry the steps and phases now
            sampler.follow(probe)
        with session.running():
            # Arrivals count from the moment the loop can take its first step (TTFT holds no
            # start-up: the writer thread and the probes are ready by now).
            live.t0_ns = time.perf_counter_ns()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            done = drive(engine, requests, probe, flush, emit, live, should_stop, session)
            loop_facts(outcome.facts, engine, cpu0, wall0)
        outcome.status = "completed" if done else "aborted"
    except (ConfigError, CheckpointError, ScenarioError) as exc:  # found only once started
        # (the CLI checks what it can before a row exists): the run started and failed, exit 1
        outcome.error, outcome.exit_code = _one_line(exc), 1
    except Exception as exc:
        outcome.error, outcome.exit_code = _one_line(exc), 1
        full = disk_full(store.path, exc)
        if full is not None:  # the side file could not take a flush: the run stops, cause named
            outcome.error = str(full)
        else:  # a runner bug: keep the data and the traceback
            outcome.facts["traceback"] = traceback.format_exc()  # stored below, once written
    finally:
        if live is not None:  # the loop ran: its last snapshot, whatever ended it
            with contextlib.suppress(Exception):
                emit(("snapshot", live.snapshot(engine, final=True)))
        if sampler is not None:
            sampler.stop()
            outcome.facts.update(sampler.facts())
        if engine is not None:
            _close_unfinished(engine, probe)
        try:
            if engine is not None:
                outcome.facts.setdefault("notes", []).extend(engine.close())
            if session is not None:
                _finish_probes(session, outcome.facts)
            try:
                flush()
            finally:
                if writer is not None:
                    writer.close()  # everything drained is written before the row is finished
            if texts is not None and texts.note():
                outcome.facts.setdefault("notes", []).append(texts.note())
            if session is not None:
                store_probe_results(store, run_id, session, outcome.facts)
            outcome.facts.update(engine.graph_usage() if engine is not None else {})
            # The writer thread has stopped: the connection is this thread's again.
            store.update_run(run_id, info=outcome.facts)
            if environment:
                ended = finish_environment(environment, after_s=time.perf_counter() - began)
                store.update_run(run_id, environment=ended)
        except Exception as exc:  # the store itself failed (disk full, ...)
            full = disk_full(store.path, exc)
            if full is None or outcome.status != "failed" or not outcome.error:
                outcome.error = _one_line(exc) if full is None else str(full)
            outcome.status, outcome.exit_code = "failed", 1
    return outcome


def _import_torch() -> None:
    """torch and its libraries, the largest part of a runner's start-up on a GPU host: imported
    here, at a frame of its own, so that the start-up's host samples name it; with no garbage
    collection over its objects while it imports, or after (``collector``)."""
    with imports_uncollected("torch"):
        import torch  # noqa: F401


def _finish_probes(session: ProbeSession, facts: dict[str, Any]) -> None:
    """Resolve the GPU timeline and the kernel trace; a failure there is a note, not a loss."""
    try:
        session.finish(facts)
    except Exception as exc:
        facts.setdefault("notes", []).append(f"probes: finishing failed ({_one_line(exc)})")


def _make_probe(nvtx: bool, run_id: str) -> tuple[RecordingProbe, int | None]:
    """The run's probe: NVTX ranges as well when asked for and the package is there (else the
    run carries a note). Returns the probe and the ``perf_counter_ns`` of the NVTX start mark."""
    if nvtx:
        try:
            from mrv2_prof.probes.nvtx_ranges import NvtxRecordingProbe

            probe = NvtxRecordingProbe()
        except ImportError:
            pass
        else:
            return probe, probe.mark_run_start(run_id)
    return RecordingProbe(), None


def _close_unfinished(engine, probe: RecordingProbe) -> None:
    """Requests still in flight at the end of a stopped run: stored without a finish."""
    for r in engine.unfinished_requests():
        probe.request_finish(
            r.request_id, -1, r.num_output_tokens, r.num_preemptions, None, r.num_cached_tokens
        )
