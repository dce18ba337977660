"""The runner process (DESIGN §1): Scenario → Workload → Engine step loop → store.

``runner_main`` is the target of the spawned process. It owns the run row from start to end: the
row is written as ``running`` before the model loads; the probe buffers are drained about once a
second and written by a background thread (the drain and hand-over is the ``flush`` span, the
DuckDB insert stays off the step loop); and the row is finished as
``completed``, ``aborted`` (SIGINT or a stop request from the parent) or ``failed`` (with the
error). Arrivals are honoured in wall time (open loop): a request arrives at ``t0 + arrival_s``
even when the runner is busy, so queueing counts towards its latency. About four times a second
a ``Snapshot`` goes to the parent; the parent never touches the engine.

Messages to the parent are ``(kind, payload)`` tuples: ``("begun", run_id)``,
``("started", facts)``, ``("snapshot", Snapshot)``, ``("done", outcome)``.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mrv2_prof import __version__
from mrv2_prof.probes import api as probes
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.probes.session import ProbeSession
from mrv2_prof.probes.support import unavailable_probe_notes
from mrv2_prof.snapshot import Snapshot
from mrv2_prof.store import BackgroundWriter, Store, StoreError

SNAPSHOT_INTERVAL_NS = 250_000_000
FLUSH_INTERVAL_NS = 1_000_000_000
_ITL_WINDOW = 8192  # live ITL percentiles cover the most recent gaps
_TOP_SYNC_SITES = 5  # sites with the most syncs, in the snapshot
_TOP_FALLBACK_REASONS = 3


@dataclass(frozen=True)
class RunJob:
    """Everything the runner process needs; plain data so it pickles under ``spawn``."""

    scenario: dict[str, Any]  # Scenario.model_dump(mode="json"), overrides and matrix applied
    scenario_yaml: str
    label: str
    matrix_combo: dict[str, Any] | None
    db_path: str


@dataclass
class Outcome:
    run_id: str | None
    status: str  # completed | aborted | failed
    error: str | None = None
    exit_code: int = 0  # 2: bad input (scenario, checkpoint, config, database)
    facts: dict[str, Any] = field(default_factory=dict)


class _Interrupted:
    """SIGINT in the runner sets a flag; the loop stops between steps, never inside a write."""

    def __init__(self) -> None:
        self.flag = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self.flag = True


def _versions() -> dict[str, str]:
    import duckdb
    import torch

    v = {
        "mrv2_prof": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "duckdb": duckdb.__version__,
    }
    if torch.cuda.is_available():
        v["cuda"] = str(torch.version.cuda)
        v["gpu"] = torch.cuda.get_device_name()
    return v


def _arrow(cols: dict[str, np.ndarray]) -> dict[str, Any]:
    """-1 in a ``*_ns`` column means "not measured": stored as NULL."""
    return {
        k: pa.array(v, mask=v < 0) if k.endswith("_ns") and v.dtype.kind == "i" else v
        for k, v in cols.items()
    }


def _to_arrow(batches: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    return {table: _arrow(cols) for table, cols in batches.items()}


class LiveStats:
    """Running aggregates for the snapshot, updated from each step's result.

    Sync points and graph dispatches come from the probe's buffers: after each step only the
    rows added since the last look are counted, into a few counters keyed by the probe's interned
    name ids (names are looked up at snapshot time). The harness's flush drains those buffers;
    that shows as a different first row in the probe's step buffer, and counting starts again
    at row 0. The probe is the engine's, found at the first snapshot unless passed here: rows
    recorded before then are still in the buffers (the first flush comes later).
    """

    def __init__(
        self,
        run_id: str,
        label: str,
        num_requests: int,
        num_kv_blocks: int,
        probe: RecordingProbe | None = None,
    ) -> None:
        self.run_id, self.label = run_id, label
        self.num_requests, self.num_kv_blocks = num_requests, num_kv_blocks
        self.t0_ns = time.perf_counter_ns()
        self.steps = self.output_tokens = self.num_finished = self.num_aborted = 0
        self.staged_bytes = self.dense_bytes = 0
        self.ttft_ms: list[float] = []
        self.tpot_ms: list[float] = []
        self.itl_ms = np.zeros(_ITL_WINDOW)
        self.num_itl = 0
        self.first_token_ns: dict[str, int] = {}
        self.last_token_ns: dict[str, int] = {}
        self._last = (self.t0_ns, 0, 0)  # (t_ns, steps, output_tokens) at the last snapshot
        self.probe = probe
        self.num_syncs = self.sync_blocked_ns = 0
        self.num_dispatches = self.num_graph_hits = 0
        self._sync_sites: dict[int, int] = {}  # interned site -> syncs
        self._graph_modes: dict[int, int] = {}  # interned chosen mode -> dispatches
        self._fallbacks: dict[int, int] = {}  # interned reason -> dispatches without a graph
        self._buffer_first_step = -1  # step of the probe's first buffered step row, last look
        self._seen_syncs = self._seen_dispatches = 0  # buffered rows already counted

    def on_step(self, res, t_ns: int) -> None:
        self.steps += 1
        self.output_tokens += len(res.updated)
        for ws in res.write_stats.values():
            self.staged_bytes += ws.staged_bytes
            self.dense_bytes += ws.dense_bytes
        for r in res.updated:
            rid = r.request_id
            prev = self.last_token_ns.get(rid)
            if prev is None:
                self.ttft_ms.append((t_ns - r.arrival_time * 1e9) / 1e6)
                self.first_token_ns[rid] = t_ns
            else:
                self.itl_ms[self.num_itl % _ITL_WINDOW] = (t_ns - prev) / 1e6
                self.num_itl += 1
            if r.is_finished:
                self.last_token_ns.pop(rid, None)
                first_ns = self.first_token_ns.pop(rid, t_ns)
                completed = r.finish_reason != "abort"
                self.num_finished += completed
                if completed and r.num_output_tokens > 1:
                    self.tpot_ms.append((t_ns - first_ns) / 1e6 / (r.num_output_tokens - 1))
            else:
                self.last_token_ns[rid] = t_ns
        self._count_probe_rows()

    def on_abort(self, req_id: str) -> None:
        self.num_aborted += 1
        self.last_token_ns.pop(req_id, None)
        self.first_token_ns.pop(req_id, None)

    def _count_probe_rows(self) -> None:
        """Count the sync and graph-dispatch rows the probe recorded since the last look."""
        p = self.probe
        if p is None:
            return
        first_step = int(p.steps.step[0]) if p.steps.n else -1
        if first_step != self._buffer_first_step:  # drained by a flush since the last look
            self._buffer_first_step = first_step
            self._seen_syncs = self._seen_dispatches = 0
        sy = p.syncs
        for i in range(self._seen_syncs, sy.n):
            self.num_syncs += 1
            self.sync_blocked_ns += max(int(sy.blocked_ns[i]), 0)  # -1: not measured
            site = int(sy.site[i])
            self._sync_sites[site] = self._sync_sites.get(site, 0) + 1
        self._seen_syncs = sy.n
        gd = p.dispatch
        for i in range(self._seen_dispatches, gd.n):
            self.num_dispatches += 1
            mode = int(gd.mode[i])
            self._graph_modes[mode] = self._graph_modes.get(mode, 0) + 1
            if gd.hit[i]:
                self.num_graph_hits += 1
            else:
                reason = int(gd.reason[i])
                self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1
        self._seen_dispatches = gd.n

    def _named(self, counts: dict[int, int], top: int | None) -> tuple[tuple[str, int], ...]:
        """``(name, count)`` most first (ties by name), names from the probe's interned ids."""
        assert self.probe is not None or not counts
        name_of = self.probe.name_of if self.probe is not None else str
        pairs = sorted(
            ((str(name_of(i)), n) for i, n in counts.items()), key=lambda p: (-p[1], p[0])
        )
        return tuple(pairs[:top])

    def snapshot(self, engine) -> Snapshot:
        if self.probe is None and isinstance(getattr(engine, "probe", None), RecordingProbe):
            self.probe = engine.probe
            self._count_probe_rows()
        now = time.perf_counter_ns()
        t_last, steps_last, tokens_last = self._last
        dt_s = max((now - t_last) / 1e9, 1e-9)
        self._last = (now, self.steps, self.output_tokens)
        itl = self.itl_ms[: min(self.num_itl, _ITL_WINDOW)]

        def pct(values, q: float) -> float | None:
            return float(np.percentile(values, q)) if len(values) else None

        return Snapshot(
            run_id=self.run_id,
            label=self.label,
            elapsed_s=(now - self.t0_ns) / 1e9,
            steps=self.steps,
            steps_per_s=(self.steps - steps_last) / dt_s,
            output_tokens=self.output_tokens,
            tokens_per_s=(self.output_tokens - tokens_last) / dt_s,
            num_requests=self.num_requests,
            num_waiting=engine.num_waiting,
            num_running=engine.num_running,
            num_finished=self.num_finished,
            num_aborted=self.num_aborted,
            ttft_ms_p50=pct(self.ttft_ms, 50),
            ttft_ms_p99=pct(self.ttft_ms, 99),
            itl_ms_p50=pct(itl, 50),
            itl_ms_p99=pct(itl, 99),
            kv_usage=engine.num_kv_blocks_used / max(self.num_kv_blocks, 1),
            num_preemptions=engine.scheduler.num_preemptions,
            staged_bytes=self.staged_bytes,
            dense_bytes=self.dense_bytes,
            device=str(getattr(getattr(engine, "info", None), "device", "")),
            tpot_ms_p50=pct(self.tpot_ms, 50),
            tpot_ms_p99=pct(self.tpot_ms, 99),
            num_syncs=self.num_syncs,
            sync_blocked_ns=self.sync_blocked_ns,
            top_sync_sites=self._named(self._sync_sites, _TOP_SYNC_SITES),
            graph_mode_counts=self._named(self._graph_modes, None),
            graph_hit_rate=(
                self.num_graph_hits / self.num_dispatches if self.num_dispatches else None
            ),
            top_fallback_reasons=self._named(self._fallbacks, _TOP_FALLBACK_REASONS),
            **self._gpu_timeline(),
        )

    def _gpu_timeline(self) -> dict[str, Any]:
        """Overlap and bubbles so far, from the GPU timeline's running totals (CUDA runs)."""
        timeline = getattr(self.probe, "timeline", None)
        if timeline is None:
            return {}
        live = timeline.live
        return {
            "overlap_frac": live.overlap,
            "bubble_host_bound_ns": live.host_bound_bubble_ns,
            "bubble_other_ns": live.other_bubble_ns,
        }


def _drive(
    engine, requests, probe, flush, emit, live: LiveStats, should_stop, session=None
) -> bool:
    """The open-loop step loop. Returns True when every request finished, False when stopped."""
    from mrv2_prof.runner.core.request import SamplingParams

    pending = deque(requests)
    abort_at: dict[str, int] = {}
    t0 = live.t0_ns
    next_snapshot, next_flush = t0 + SNAPSHOT_INTERVAL_NS, t0 + FLUSH_INTERVAL_NS
    while True:
        if should_stop():
            return False
        now = time.perf_counter_ns()
        while pending and t0 + round(pending[0].arrival_s * 1e9) <= now:
            w = pending.popleft()
            params = SamplingParams(
                temperature=w.temperature,
                top_k=w.top_k,
                top_p=w.top_p,
                seed=w.seed,
                max_tokens=w.max_tokens,
                logprobs=w.logprobs,
                prompt_logprobs=w.prompt_logprobs,
                ignore_eos=w.ignore_eos,
            )
            arrival_s = (t0 + round(w.arrival_s * 1e9)) / 1e9
            engine.add_request(w.req_id, list(w.prompt_token_ids), params, arrival_time=arrival_s)
            if w.abort_after_tokens == 0:
                engine.abort_request(w.req_id)
                live.on_abort(w.req_id)
            elif w.abort_after_tokens is not None:
                abort_at[w.req_id] = w.abort_after_tokens
        if engine.has_unfinished_requests():
            res = engine.step()
            if session is not None:
                session.after_step(engine.step_index - 1)
            now = time.perf_counter_ns()
            live.on_step(res, now)
            for r in res.updated:
                k = abort_at.get(r.request_id)
                if k is not None and not r.is_finished and r.num_output_tokens >= k:
                    engine.abort_request(r.request_id)
                    live.on_abort(r.request_id)
        elif pending:
            if session is not None:
                session.at_idle()
            wait_ns = t0 + round(pending[0].arrival_s * 1e9) - now
            time.sleep(min(max(wait_ns, 0), next_snapshot - now, 50_000_000) / 1e9)
            now = time.perf_counter_ns()
        else:
            return True
        if now >= next_snapshot:
            emit(("snapshot", live.snapshot(engine)))
            next_snapshot = now + SNAPSHOT_INTERVAL_NS
        if now >= next_flush or probe.fill > 0.5:
            flush()
            next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


def runner_process_main(job: RunJob, queue, stop_event) -> None:
    """The target of the spawned runner process: ``runner_main``, then an exit that skips the
    interpreter's teardown. By then everything is written and the outcome sent; tearing torch
    and triton down only made some builds print native-extension leak reports (nanobind)."""
    runner_main(job, queue, stop_event)
    queue.close()
    queue.join_thread()  # the outcome is through the pipe
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def runner_main(job: RunJob, queue, stop_event) -> None:
    """The runner process's work (tests call it in-process)."""
    interrupted = _Interrupted()
    emit = queue.put
    try:
        store = Store.open(job.db_path)
    except StoreError as exc:
        emit(("done", Outcome(None, "failed", str(exc), exit_code=2)))
        return
    try:
        outcome = _run(job, store, emit, lambda: interrupted.flag or stop_event.is_set())
    except Exception as exc:  # before the run row existed, or while finishing it
        outcome = Outcome(None, "failed", _one_line(exc), exit_code=1)
    if outcome.status == "aborted":
        outcome.error = "interrupted (SIGINT)" if interrupted.flag else "stopped by the user"
    try:
        if outcome.run_id is not None:
            store.finish_run(
                outcome.run_id,
                outcome.status,
                ended_ns=time.perf_counter_ns(),
                error=outcome.error,
            )
    finally:
        store.close()
        emit(("done", outcome))


def _run(job: RunJob, store: Store, emit, should_stop) -> Outcome:
    from mrv2_prof.runner.config import ConfigError
    from mrv2_prof.runner.model import CheckpointError
    from mrv2_prof.scenario import Scenario, ScenarioError

    scenario = Scenario.model_validate(job.scenario)
    run_id = store.new_run_id()
    store.begin_run(
        run_id,
        scenario_name=scenario.name,
        label=job.label,
        matrix_combo=job.matrix_combo,
        scenario_yaml=job.scenario_yaml,
        device=scenario.runner.device,
        versions=_versions(),
        started_ns=time.perf_counter_ns(),
    )
    emit(("begun", run_id))
    probe, nvtx_anchor_ns = _make_probe(scenario.probes.nvtx, run_id)
    outcome = Outcome(run_id, "failed")
    engine = session = None
    writer: BackgroundWriter | None = None

    def flush() -> None:
        probe.begin(probes.FLUSH)
        batches = probe.drain()
        if writer is None:
            store.append_batches(run_id, _to_arrow(batches))
        else:
            writer.submit(batches)  # converted and written on the writer thread
        probe.end(probes.FLUSH)

    try:
        from mrv2_prof.runner.engine import Engine
        from mrv2_prof.workload import build_workload

        t0 = time.perf_counter()
        engine = Engine(scenario.runner_config(), scenario.model_spec(), probe)
        info = engine.info
        requests = build_workload(
            scenario.workload,
            seed=scenario.seed,
            vocab_size=engine.vocab_size,
            max_model_len=scenario.runner.max_model_len,
            source=scenario._source,
        )
        outcome.facts = {
            "device": info.device,
            "dtype": info.dtype,
            "model_params": info.model_params,
            "num_kv_blocks": info.num_kv_blocks,
            "kv_cache_bytes": info.kv_cache_bytes,
            "weight_load_s": info.weight_load_s,
            "profile_run_s": info.profile_run_s,
            "kv_alloc_s": info.kv_alloc_s,
            "kernel_warmup_s": info.warmup_s,
            "capture_s": info.capture_s,
            "graph_memory_bytes": info.graph_memory_bytes,
            "num_graphs": info.num_graphs,
            "startup_s": time.perf_counter() - t0,
            "num_requests": len(requests),
            "notes": list(info.notes) + unavailable_probe_notes(scenario.probes.model_dump()),
        }
        if nvtx_anchor_ns is not None:
            outcome.facts["nvtx_anchor_ns"] = nvtx_anchor_ns
        session = ProbeSession(
            scenario.probes.model_dump(),
            probe,
            info.device,
            outcome.facts["notes"],
            trace_dir=str(Path(job.db_path).resolve().parent / "kernel_traces"),
        )
        store.update_run(run_id, device=info.device, info=outcome.facts)
        emit(("started", {"run_id": run_id, "label": job.label, **outcome.facts}))
        # Start-up objects (torch, triton, the model, compiled kernels) leave the collector's
        # reach: a full collection over them stalled a step for hundreds of ms mid-run.
        gc.collect()
        gc.freeze()
        outcome.facts["gc_frozen_objects"] = gc.get_freeze_count()
        store.update_run(run_id, info=outcome.facts)
        live = LiveStats(run_id, job.label, len(requests), info.num_kv_blocks, probe=probe)
        _to_arrow({"prime": {"t_ns": np.array([-1])}})  # its first call imports numpy.ma
        writer = BackgroundWriter(store, run_id, _to_arrow).start()
        with session.running():
            done = _drive(engine, requests, probe, flush, emit, live, should_stop, session)
        outcome.status = "completed" if done else "aborted"
        emit(("snapshot", live.snapshot(engine)))
    except (ConfigError, CheckpointError, ScenarioError) as exc:
        outcome.error, outcome.exit_code = _one_line(exc), 2
    except Exception as exc:  # a runner bug: keep the data and the traceback
        outcome.error, outcome.exit_code = _one_line(exc), 1
        outcome.facts["traceback"] = traceback.format_exc()
        store.update_run(run_id, info=outcome.facts)
    finally:
        if engine is not None:
            _close_unfinished(engine, probe)
        try:
            if session is not None:
                _finish_probes(session, outcome.facts)
            flush()
            if writer is not None:
                writer.close()  # everything drained is written before the run row is finished
            if session is not None:
                _store_probe_results(store, run_id, session, outcome.facts)
            usage = engine.graph_usage() if engine is not None else {}
            if usage:
                outcome.facts.update(usage)  # never-replayed graphs
                store.update_run(run_id, info=outcome.facts)
        except Exception as exc:  # the store itself failed (disk full, ...)
            outcome.status, outcome.error, outcome.exit_code = "failed", _one_line(exc), 1
    return outcome


def _finish_probes(session: ProbeSession, facts: dict[str, Any]) -> None:
    """Resolve the GPU timeline and the kernel trace; a failure there is a note, not a loss."""
    try:
        session.finish(facts)
    except Exception as exc:
        facts.setdefault("notes", []).append(f"probes: finishing failed ({_one_line(exc)})")


def _store_probe_results(store: Store, run_id: str, session: ProbeSession, facts) -> None:
    """After the last flush: the kernel trace's rows, and overlap and bubbles per step."""
    kt = session.kernel_trace
    if kt is not None and kt.columns is not None:
        cols = dict(kt.columns)
        cols["step"] = pa.array(cols["step"], mask=cols["step"] < 0)  # -1: not attributed
        store.append(run_id, "kernels", _arrow(cols))
    if session.timeline is not None:
        from mrv2_prof.probes.overlap import step_columns
        from mrv2_prof.store.step_timeline import step_times, update_steps

        t = step_times(store, run_id)
        cols = step_columns(
            t["prep_start_ns"], t["enqueue_end_ns"], t["gpu_start_ns"], t["gpu_end_ns"]
        )
        update_steps(store, run_id, t["step"], cols)
    store.update_run(run_id, info=facts)


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


def scenario_yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False)
