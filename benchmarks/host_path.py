"""Host time per decode step, by phase, from the harness's own spans; the probes' host cost; and
the async-on/off throughput ratio on a host-bound small model.

(a) phases: ``--batches`` requests arrive at once (short prompts, ``--decode-tokens`` new tokens,
    EOS ignored), run through the harness (``runner_main`` in this process, a fresh DuckDB file
    per run) with the default probes and with every switchable probe off, alternating sides
    ``--repeats`` times. Over the uniform-decode steps at the full batch (no prefill token,
    ``num_reqs`` = batch) it reports the median of each CPU phase span (schedule, execute,
    prepare, forward, sample, update, step) and of host prep (``schedule`` start to ``execute``
    end, the end of enqueueing); and the ``flush`` spans that fell inside the step loop (median
    and max). CUDA graphs are captured at the batch size only (the decode steps replay them).
(b) engine: the same batch through ``Engine`` directly with the no-op ``Probe`` and with
    ``RecordingProbe`` (drained as the harness drains it), alternating; per uniform-decode step
    the median host time (``StepResult.host_ns`` less the output wait), its schedule, queue and
    update calls, the time inside the calls that do device work (input prep, model, sampler:
    compute on the CPU, launches on a GPU) and the rest, the bookkeeping; the probe's cost is
    the difference of the bookkeeping. On the CPU this is the host-path micro-benchmark.
(c) hooks: the recording probe's own cost per decode step, the hooks one step calls replayed
    without the engine (the flush timed apart); on CUDA also with the GPU timeline, its event
    records and resolution, the device idle and busy.
(e) flush: the step loop's part of one hand-off to the store writer, isolated: the probe's
    buffer swap after ``--flush-steps`` decode steps of each batch (the hooks of part (c), the
    requests in flight), median over repeated hand-offs with the arrays given back between them
    as the writer gives them back.
(f) syncfinder: the sync finder's and the host-wait catcher's host cost per decode step, the
    wrapped torch calls of one step replayed alone with them on and off (``host_path_syncs``).
(d) throughput: the host-bound small preset (``--small-preset``, ``--small-requests`` requests,
    16-32 token prompts, ``--small-tokens`` new tokens) through the harness with
    ``runner.async_scheduling`` on and off, alternating the order each repeat; output tokens/s
    (first arrival to last finish) per side and the on/off ratio per repeat.

The machine's host is shared and noisy: compare sides only inside one invocation.

    python benchmarks/host_path.py --out host_path.json                  # H200, all parts
    python benchmarks/host_path.py --part phases --out phases.json       # one part
    python benchmarks/host_path.py --quick --out /tmp/host_path.json     # CPU, llama-tiny
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import signal
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import duckdb
from bench_io import write_results
from host_path_syncs import markdown_syncfinder, part_syncfinder

from mrv2_prof.pipeline.harness import runner_main
from mrv2_prof.pipeline.job import RunJob
from mrv2_prof.scenario import Scenario, scenario_yaml

PHASES = ("schedule", "execute", "prepare", "forward", "sample", "update", "step")
# step_breakdown's figures, in the order its query selects them
BREAKDOWN = ("interval", "gpu_step", "gpu_busy", "bubble", "host_prep", "output_wait")
# part_engine's figures per side
ENGINE_KEYS = ("host", "bookkeeping", "schedule", "queue", "device", "update")
PROBE_SETS = {
    "default": {},
    "off": {"nvtx": False, "cuda_events": False, "sync_finder": False, "copy_audit": False,
            "nvml_hz": 0, "kernel_trace": False},
}  # fmt: skip


def scenario(args, *, preset: str, num_requests: int, prompt: tuple[int, int], tokens: int,
             probes: dict, runner: dict) -> dict[str, Any]:  # fmt: skip
    base_runner = (
        dict(device="cpu", kernels="torch", uva=False, cudagraph_mode="none", num_kv_blocks=4096)
        if args.quick
        else dict(device="cuda", gpu_memory_utilization=0.8)
    )
    return {
        "name": "host-path",
        "seed": 0,
        "model": {"preset": preset},
        "runner": {
            **base_runner,
            "max_num_seqs": max(num_requests, 1),
            "max_num_batched_tokens": 8192,
            "max_model_len": prompt[1] + tokens + 16,
            **runner,
        },
        "workload": {
            "num_requests": num_requests,
            "arrival": {"pattern": "burst"},
            "prompt_len": {"dist": "uniform", "min": prompt[0], "max": prompt[1]},
            "output_len": {"dist": "fixed", "value": tokens},
            "sampling": {"temperature": 0.0},
            "ignore_eos": True,
        },
        "probes": probes,
    }


def run_harness(data: dict[str, Any], tmp: Path) -> tuple[str, Path]:
    """One run through the runner process's own code, in this process; its run id and file."""
    s = Scenario.from_data(data, "<host_path>")
    dumped = s.model_dump(mode="json")
    db = tmp / f"run-{len(list(tmp.iterdir()))}.duckdb"
    job = RunJob(dumped, scenario_yaml(dumped), s.name, None, str(db))
    messages: queue.Queue = queue.Queue()
    sigint = signal.getsignal(signal.SIGINT)
    try:
        runner_main(job, messages, threading.Event())
    finally:
        signal.signal(signal.SIGINT, sigint)
    outcome = None
    while not messages.empty():
        kind, payload = messages.get()
        if kind == "done":
            outcome = payload
    if outcome is None or outcome.status != "completed":
        raise SystemExit(f"host_path: run failed: {outcome and outcome.error}")
    gc.collect()
    return outcome.run_id, db


def decode_phases(db: Path, run_id: str, batch: int) -> dict[str, Any]:
    """Median CPU phase spans (µs) over the run's uniform-decode steps at the full batch."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT p.name, median(p.end_ns - p.start_ns) / 1e3, count(*) FROM spans p "
            "JOIN steps s ON s.run_id = p.run_id AND s.step = p.step "
            "WHERE p.run_id = ? AND p.track = 'cpu' AND s.num_prefill_tokens = 0 "
            "AND s.num_reqs = ? GROUP BY p.name",
            [run_id, batch],
        ).fetchall()
        prep = con.execute(  # schedule start to the end of enqueueing (execute end)
            "SELECT median(e.end_ns - s.start_ns) / 1e3 FROM spans s "
            "JOIN spans e ON e.run_id = s.run_id AND e.step = s.step "
            "JOIN steps t ON t.run_id = s.run_id AND t.step = s.step "
            "WHERE s.run_id = ? AND s.track = 'cpu' AND e.track = 'cpu' "
            "AND s.name = 'schedule' AND e.name = 'execute' "
            "AND t.num_prefill_tokens = 0 AND t.num_reqs = ?",
            [run_id, batch],
        ).fetchone()[0]
        flush = con.execute(  # flushes inside the step loop (the last one follows it)
            "SELECT median(end_ns - start_ns) / 1e3, max(end_ns - start_ns) / 1e3, count(*) "
            "FROM spans WHERE run_id = ? AND track = 'cpu' AND name = 'flush' AND start_ns < "
            "(SELECT max(cpu_end_ns) FROM steps WHERE run_id = ?)",
            [run_id, run_id],
        ).fetchone()
    finally:
        con.close()
    out: dict[str, Any] = {name: us for name, us, _ in rows if name in PHASES}
    out["decode_steps"] = max((n for name, _, n in rows if name == "step"), default=0)
    out["host_prep"] = prep
    out["flush_median"], out["flush_max"], out["flushes"] = flush
    return out


def tokens_per_s(db: Path, run_id: str) -> float:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT sum(output_tokens) / ((max(finish_ns) - min(arrival_ns)) / 1e9) "
            "FROM requests WHERE run_id = ?",
            [run_id],
        ).fetchone()[0]
    finally:
        con.close()


def step_breakdown(db: Path, run_id: str) -> dict[str, Any]:
    """Median ms over the run's decode steps (no prefill token) at its largest batch: the step
    interval (one step's start to the next one's), the device step (its first device mark to
    its last), the device's busy part of it (less ``starved_ns``), the idle gap before it
    (``bubble_ns``), host prep and the output wait; and how many such steps there were."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute(
            "WITH s AS (SELECT *, lead(cpu_start_ns) OVER (ORDER BY step) - cpu_start_ns AS dt "
            "FROM steps WHERE run_id = ?) "
            "SELECT median(dt) / 1e6, median(gpu_end_ns - gpu_start_ns) / 1e6, "
            "median(gpu_end_ns - gpu_start_ns - coalesce(starved_ns, 0)) / 1e6, "
            "median(bubble_ns) / 1e6, median(host_prep_ns) / 1e6, "
            "median(output_wait_ns) / 1e6, count(*) FROM s "
            "WHERE num_prefill_tokens = 0 AND num_reqs = (SELECT max(num_reqs) FROM s)",
            [run_id],
        ).fetchone()
    finally:
        con.close()
    return {**dict(zip(BREAKDOWN, row[:6], strict=True)), "steps": row[6]}


def probe_set(name: str) -> dict:
    """``default``, ``off``, or ``+NAME``: every probe off but ``NAME`` (its cost alone)."""
    if name in PROBE_SETS:
        return PROBE_SETS[name]
    probe = name.removeprefix("+")
    if not name.startswith("+") or probe not in PROBE_SETS["off"]:
        raise SystemExit(f"--probe-sets: {name!r} is not default, off or +PROBE")
    on = {"nvml_hz": 10} if probe == "nvml_hz" else {probe: True}
    return {**PROBE_SETS["off"], **on}


def part_phases(args, tmp: Path) -> list[dict]:
    results = []
    steps = args.full_step.split(",")
    if not set(steps) <= {"on", "off"}:
        raise SystemExit(f"--full-step: {args.full_step!r} is not a list of on / off")
    sets = [(name, fs) for name in args.probe_sets.split(",") for fs in steps]
    for name, _ in sets:
        probe_set(name)  # refuse a bad name before any run
    for batch in args.batches:
        for rep in range(args.repeats):
            order = sets if rep % 2 == 0 else sets[::-1]
            for probes, fs in order:
                runner = {} if args.quick else {"cudagraph_capture_sizes": [batch]}
                runner["full_step_graph"] = fs == "on"
                data = scenario(
                    args,
                    preset=args.preset,
                    num_requests=batch,
                    prompt=(16, 32),
                    tokens=args.decode_tokens,
                    probes=probe_set(probes),
                    runner=runner,
                )
                run_id, db = run_harness(data, tmp)
                side = probes if len(steps) == 1 else f"{probes}, full step {fs}"
                row = {"part": "phases", "batch": batch, "probes": side, "repeat": rep}
                results.append({**row, **decode_phases(db, run_id, batch)})
                print(f"  phases batch {batch} probes {side} repeat {rep}: done", flush=True)
    return results


class Timed:
    """Accumulates the host time spent inside wrapped callables (per key), for one step."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}

    def wrap(self, key: str, fn):
        import time

        def timed(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                self.ns[key] = self.ns.get(key, 0) + time.perf_counter_ns() - t0

        return timed


def instrument(engine) -> Timed:
    """Time the engine's schedule, queue and update calls, and inside the queue the calls that
    do device work (input prep, model, logits, sampler; the staged-write apply, bound at
    start-up, stays in the bookkeeping): on the CPU these
    compute, on a GPU they launch. Bookkeeping = host time less that device-side work."""
    import dataclasses

    t = Timed()
    runner, sched = engine.runner, engine.scheduler
    sched.schedule = t.wrap("schedule", sched.schedule)
    sched.update_from_output = t.wrap("update", sched.update_from_output)
    runner.queue_step = t.wrap("queue", runner.queue_step)
    k = runner.kernels
    runner.kernels = dataclasses.replace(
        k,
        prepare_inputs=t.wrap("device", k.prepare_inputs),
        sample=t.wrap("device", k.sample),
    )
    model = runner.model
    model.forward = t.wrap("device", model.forward)
    model.compute_logits = t.wrap("device", model.compute_logits)
    return t


def part_engine(args) -> list[dict]:
    """The no-op probe against the recording one, on ``Engine`` directly: host time per
    uniform-decode step by call, and the probe's cost."""
    import time

    from mrv2_prof.pipeline.open_loop import FLUSH_INTERVAL_NS
    from mrv2_prof.probes.api import Probe
    from mrv2_prof.probes.recording import RecordingProbe
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    sides = ("none", "recording")
    keys = ENGINE_KEYS
    results = []
    for batch in args.batches:
        data = scenario(
            args,
            preset=args.preset,
            num_requests=batch,
            prompt=(16, 32),
            tokens=args.decode_tokens,
            probes={},
            # both engines live at once: a fixed KV pool each (room for every request), not
            # a share of the free GPU memory that the first would take
            runner={}
            if args.quick
            else {
                "cudagraph_capture_sizes": [batch],
                "num_kv_blocks": batch * ((args.decode_tokens + 63) // 16) + 64,
            },
        )
        s = Scenario.from_data(data, "<host_path>")
        engines = {}
        for side in sides:
            probe = RecordingProbe() if side == "recording" else Probe()
            engine = Engine(s.runner_config(), s.model_spec(), probe)
            engines[side] = (engine, probe, instrument(engine))
        per_side: dict[str, dict[str, list[float]]] = {x: {k: [] for k in keys} for x in sides}
        for rep in range(args.repeats):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                engine, probe, timed = engines[side]
                for i in range(batch):
                    prompt = [(7 * i + j) % 500 + 3 for j in range(16 + i % 16)]
                    params = SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True)
                    engine.add_request(f"b{rep}-{i}", prompt, params)
                steps: dict[str, list[int]] = {k: [] for k in keys}
                next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS
                while engine.has_unfinished_requests():
                    timed.ns.clear()
                    res = engine.step()
                    so = res.scheduler_output
                    if so.num_reqs == batch and so.total_num_scheduled_tokens == batch:
                        host = res.host_ns - res.runner_output.output_wait_ns
                        steps["host"].append(host)
                        steps["bookkeeping"].append(host - timed.ns.get("device", 0))
                        for k in ("schedule", "queue", "device", "update"):
                            steps[k].append(timed.ns.get(k, 0))
                    if probe.enabled and (time.perf_counter_ns() >= next_flush or probe.fill > 0.5):
                        probe.drain()
                        next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS
                if probe.enabled:
                    probe.drain()
                for k in keys:
                    per_side[side][k].append(statistics.median(steps[k]) / 1e3)
        row: dict[str, Any] = {"part": "engine", "batch": batch}
        for side in sides:
            for k in keys:
                row[f"{side}_{k}"] = statistics.median(per_side[side][k])
        row["probe_cost"] = row["recording_bookkeeping"] - row["none_bookkeeping"]
        row["repeats"] = per_side
        results.append(row)
        print(f"  engine batch {batch}: done", flush=True)
        del engines
        gc.collect()
    return results


def part_hooks(args) -> list[dict]:
    """The probes' own cost per decode step: the hooks one step of ``batch`` decodes calls (as
    the engine, the runner and the output wait call them, with what they pass: the output
    indices a numpy column from the columnar decode step, no first token), replayed, median of
    many steps. The probe is a default run's: NVTX ranges on, no tool attached. On CUDA also
    with the GPU timeline of a default run attached (``cuda_events``): the step's four marks
    (an event record each; the last one is the output's ready event, which a run without the
    timeline records anyway: ``output_event_us`` times that bare record, to be taken off) and
    the resolution of the finished steps, where the output wait (``before_wait``) and the
    harness (``backstop``) call it; the device idle (every wait finds
    the output ready: a host-bound run) and busy (a 1 ms device step; the time spent while it
    still ran is not the loop's)."""
    import time

    import numpy as np
    import torch

    from mrv2_prof.probes import api as probes
    from mrv2_prof.probes.recording import RecordingProbe
    from mrv2_prof.runner.core.steady_decode import COLUMNS_FROM

    try:
        from mrv2_prof.probes.nvtx_ranges import NvtxRecordingProbe as DefaultProbe
    except ImportError:  # no nvtx package: a default run records without it
        DefaultProbe = RecordingProbe
    cuda = torch.cuda.is_available() and not args.quick
    sides = ["hooks"] + (["timeline_idle", "timeline_busy"] if cuda else [])
    results = []
    # The first batch once more, first and not reported: the first side timed in a process
    # was slower whichever batch it was (the device-busy timeline: 61.0 µs at batch 256 first,
    # 36.5 µs at batch 256 last, on the H200).
    for warm_up, batch in ((True, args.batches[0]), *((False, b) for b in args.batches)):
        row: dict[str, Any] = {"part": "hooks", "batch": batch}
        for side in sides:
            probe = DefaultProbe()
            timeline = ready = None
            if side != "hooks":
                from mrv2_prof.probes.gpu_timeline import GpuTimeline

                timeline = GpuTimeline(probe.gpu_span, with_starved=True)
                timeline.anchor()
                probe.timeline = timeline
                ready = torch.cuda.Event()
            ids = [f"req-{i}" for i in range(batch)]
            tokens = list(range(batch))
            per_step = []
            for step in range(2000):
                idx = np.full(batch, step + 1) if batch >= COLUMNS_FROM else [step + 1] * batch
                t0 = time.perf_counter_ns()
                skip = 0  # ns of this step that are not the probes' (device work, the wait)
                p = probe
                p.step_begin(step)  # engine
                p.begin(probes.SCHEDULE)
                p.switch(probes.SCHEDULE, probes.EXECUTE)
                p.begin(probes.PREPARE)  # runner
                p.gpu_mark(probes.G_PREPARE)
                p.staged_write("block_table", 3, 3, 12, 4096)
                p.switch(probes.PREPARE, probes.FORWARD)
                p.graph_dispatch(batch, batch, "full", "full", True, "captured")
                p.gpu_mark(probes.G_FORWARD)
                if side == "timeline_busy":  # a device step of about 1 ms (not timed)
                    t1 = time.perf_counter_ns()
                    torch.cuda._sleep(2_000_000)
                    skip += time.perf_counter_ns() - t1
                p.switch(probes.FORWARD, probes.SAMPLE)
                p.gpu_mark(probes.G_SAMPLE)
                p.end(probes.SAMPLE)
                end = p.gpu_mark(probes.G_END)  # the output's queue marks it after its copies
                if end is not None:  # the output waits on the timeline's end event
                    ready = end
                elif ready is not None:  # the output's own event (not timed)
                    t1 = time.perf_counter_ns()
                    ready.record()
                    skip += time.perf_counter_ns() - t1
                p.end(probes.EXECUTE)
                if ready is not None:  # the output wait: the probe's turn first, then the wait
                    t1 = time.perf_counter_ns()
                    p.before_wait(ready)
                    t2 = time.perf_counter_ns()
                    # its work while the device still ran cost the loop nothing (the query is
                    # the benchmark's own); a device done meanwhile: all of it counted
                    skip += time.perf_counter_ns() - (t2 if ready.query() else t1)
                    t1 = time.perf_counter_ns()
                    ready.synchronize()
                    skip += time.perf_counter_ns() - t1
                p.begin(probes.OUTPUT_WAIT)
                p.end(probes.OUTPUT_WAIT)
                p.sync("output_wait", "async_output", 1000)
                p.begin(probes.UPDATE)  # engine
                p.end(probes.UPDATE)
                p.step_tokens(ids, idx, t0, tokens, False)
                p.step_end(batch, batch, 0, 0, batch, 100, 0, 1000, "full")
                if timeline is not None:  # the harness, after the step
                    timeline.backstop()
                per_step.append(time.perf_counter_ns() - t0 - skip)
                if probe.fill > 0.5:
                    t1 = time.perf_counter_ns()
                    probe.swap()
                    per_step[-1] -= time.perf_counter_ns() - t1  # the flush is timed apart
            row[f"{side}_us" if side != "hooks" else "step_us"] = (
                statistics.median(per_step[100:]) / 1e3
            )
            if timeline is not None:
                timeline.finish()
        if cuda:  # what a run without the probes records a step anyway: its output event
            own, times = torch.cuda.Event(), []
            for _ in range(2000):
                t1 = time.perf_counter_ns()
                own.record()
                times.append(time.perf_counter_ns() - t1)
            torch.cuda.synchronize()
            row["output_event_us"] = statistics.median(times[100:]) / 1e3
        if not warm_up:
            results.append(row)
    return results


def part_flush(args) -> list[dict]:
    """The hand-off on the step loop (``probe.swap()``, what the harness's ``flush`` does
    before the writer thread takes over), after ``--flush-steps`` decode steps per batch."""
    import time

    from mrv2_prof.probes import api as probes
    from mrv2_prof.probes.recording import RecordingProbe

    results = []
    for batch in args.batches:
        probe = RecordingProbe()
        ids = [f"req-{i}" for i in range(batch)]
        for rid in ids:
            probe.request_arrival(rid, 1, 16)
        tokens, per_flush, handed, step = list(range(batch)), [], None, 0
        for _ in range(12):
            for _ in range(args.flush_steps):
                probe.step_begin(step)
                for phase in (probes.SCHEDULE, probes.EXECUTE, probes.UPDATE):
                    probe.begin(phase)
                    probe.end(phase)
                probe.sync("output_wait", "async_output", 1000)
                probe.step_tokens(ids, [step] * batch, step, tokens)
                probe.step_end(batch, batch, 0, 0, batch, 100, 0, 1000, "full")
                step += 1
            t0 = time.perf_counter_ns()
            handoff = probe.swap()
            per_flush.append(time.perf_counter_ns() - t0)
            if handed is not None:  # the writer thread's part, done by now in a run
                probe.give_back(handed)
            handed = handoff
        results.append(
            {"part": "flush", "batch": batch, "steps": args.flush_steps,
             "flush_us": statistics.median(per_flush[2:]) / 1e3}
        )  # fmt: skip
    return results


def part_throughput(args, tmp: Path) -> list[dict]:
    results = []
    for rep in range(args.repeats):
        row: dict[str, Any] = {"part": "throughput", "repeat": rep}
        for side in ("on", "off") if rep % 2 == 0 else ("off", "on"):
            data = scenario(
                args,
                preset=args.small_preset,
                num_requests=args.small_requests,
                prompt=(16, 32),
                tokens=args.small_tokens,
                probes=PROBE_SETS["default"],
                runner={"async_scheduling": side == "on"},
            )
            run_id, db = run_harness(data, tmp)
            row[f"async_{side}"] = tokens_per_s(db, run_id)
            row[f"steps_{side}"] = step_breakdown(db, run_id)
        row["ratio"] = row["async_on"] / row["async_off"]
        results.append(row)
        print(f"  throughput repeat {rep}: ratio {row['ratio']:.2f}", flush=True)
    return results


def _f(v) -> str:
    return "" if v is None else f"{v:,.1f}"


def markdown(results: list[dict]) -> str:
    lines = []
    phases = [r for r in results if r["part"] == "phases"]
    if phases:
        cols = ("host_prep", *PHASES, "flush_median", "flush_max")
        lines += [
            "Host time per uniform-decode step (median µs, CPU spans):",
            "",
            "| batch | probes | repeat | steps | " + " | ".join(cols) + " | flushes |",
            "| ---: | --- | ---: | ---: |" + " ---: |" * len(cols) + " ---: |",
        ]
        for r in phases:
            cells = " | ".join(_f(r.get(c)) for c in cols)
            lines.append(
                f"| {r['batch']} | {r['probes']} | {r['repeat']} | {r['decode_steps']} | "
                f"{cells} | {r['flushes']} |"
            )
        lines.append("")
    eng = [r for r in results if r["part"] == "engine"]
    if eng:
        keys = ENGINE_KEYS
        lines += [
            "Engine alone, per uniform-decode step (median µs; host less the output wait;"
            " device = time inside the input prep, model and sampler calls;"
            " bookkeeping = host - device):",
            "",
            "| batch | probe | " + " | ".join(keys) + " |",
            "| ---: | --- |" + " ---: |" * len(keys),
        ]
        for r in eng:
            for side in ("none", "recording"):
                cells = " | ".join(_f(r[f"{side}_{k}"]) for k in keys)
                lines.append(f"| {r['batch']} | {side} | {cells} |")
        lines += [
            "",
            "Probe cost (recording - none, bookkeeping): "
            + ", ".join(f"batch {r['batch']}: {_f(r['probe_cost'])} µs" for r in eng),
            "",
        ]
    hooks = [r for r in results if r["part"] == "hooks"]
    if hooks:
        lines += [
            "Recording probe, hooks of one decode step (median µs): "
            + ", ".join(f"batch {r['batch']}: {r['step_us']:.1f}" for r in hooks),
            "",
        ]
        if any("timeline_idle_us" in r for r in hooks):
            lines += [
                "The same with the GPU timeline (four event records, the steps resolved), on the "
                "step loop, the device idle (each wait finds the output ready: the backstop "
                "resolves) / busy (a 1 ms device step: the output wait resolves): "
                + ", ".join(
                    f"batch {r['batch']}: {_f(r.get('timeline_idle_us'))} / "
                    f"{_f(r.get('timeline_busy_us'))}"
                    for r in hooks
                ),
                "",
                "The last of the four records is the output's ready event, which a run without "
                "probes records too (a bare `record()`, median µs): "
                + ", ".join(f"batch {r['batch']}: {_f(r.get('output_event_us'))}" for r in hooks)
                + ". The probes' cost is the figures above less that.",
                "",
            ]
    flush = [r for r in results if r["part"] == "flush"]
    if flush:
        lines += [
            "Flush on the step loop, the hand-off alone (median µs): "
            + ", ".join(
                f"batch {r['batch']} x {r['steps']} steps: {r['flush_us']:.1f}" for r in flush
            ),
            "",
        ]
    lines += markdown_syncfinder(results)
    tput = [r for r in results if r["part"] == "throughput"]
    if tput:
        lines += [
            "Async on/off throughput (output tokens/s), alternating order:",
            "",
            "| repeat | async on | async off | ratio |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for r in tput:
            lines.append(
                f"| {r['repeat']} | {_f(r['async_on'])} | {_f(r['async_off'])} | {r['ratio']:.2f} |"
            )
        keys = BREAKDOWN
        lines += [
            "",
            "Its decode steps at the full batch (median ms; interval: step start to the next):",
            "",
            "| repeat | async | steps | " + " | ".join(keys) + " |",
            "| ---: | --- | ---: |" + " ---: |" * len(keys),
        ]
        for r in tput:
            for side in ("on", "off"):
                b = r[f"steps_{side}"]
                cells = " | ".join("" if b[k] is None else f"{b[k]:.3f}" for k in keys)
                lines.append(f"| {r['repeat']} | {side} | {b['steps']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU, llama-tiny, small sizes")
    ap.add_argument(
        "--part",
        choices=("all", "phases", "engine", "hooks", "flush", "syncfinder", "throughput"),
        default="all",
    )
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument(
        "--probe-sets",
        default="default,off",
        help="phases: probe sets to alternate (default, off, +cuda_events: only that probe on)",
    )
    ap.add_argument(
        "--full-step",
        default="on",
        help="phases: runner.full_step_graph values to alternate (on, off or on,off)",
    )
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--flush-steps", type=int, default=300, help="flush: steps per hand-off")
    ap.add_argument("--small-preset", default="qwen3-0.6b")
    ap.add_argument("--small-requests", type=int, default=256)
    ap.add_argument("--small-tokens", type=int, default=256)
    ap.add_argument("--out", help="JSON results")
    args = ap.parse_args(argv)
    if args.quick:
        import torch

        torch.set_num_threads(1)  # no intra-op pool spinning against the host path being timed
        args.preset = args.small_preset = "llama-tiny"
        args.decode_tokens, args.small_tokens = min(args.decode_tokens, 16), 16
        args.small_requests = min(args.small_requests, 32)
    args.batches = [int(b) for b in args.batches.split(",")]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="host_path-") as d:
        tmp = Path(d)
        if args.part in ("all", "phases"):
            results += part_phases(args, tmp)
        if args.part in ("all", "hooks"):
            results += part_hooks(args)
        if args.part in ("all", "flush"):
            results += part_flush(args)
        if args.part in ("all", "syncfinder"):
            results += part_syncfinder(args)
        if args.part in ("all", "engine"):
            results += part_engine(args)
        if args.part in ("all", "throughput"):
            results += part_throughput(args, tmp)
    print(markdown(results))
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    write_results(args.out, meta, results)
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown of torch and triton (leak reports)


if __name__ == "__main__":
    main()
