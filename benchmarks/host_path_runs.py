"""Parts (a) phases and (d) throughput of ``host_path.py``: runs through the harness.

Each run goes through the runner process's own code (``runner_main`` in this process, a fresh
DuckDB file per run) with a scenario of a burst of requests; what it stored is read back: the
median CPU phase spans of the uniform-decode steps at the full batch, host prep and the flushes
inside the step loop (phases), output tokens/s and the decode steps' device breakdown
(throughput, async scheduling on against off). Also the scenario the engine part builds its
engines from, and the markdown tables of both parts.
"""

from __future__ import annotations

import gc
import queue
import signal
import threading
from pathlib import Path
from typing import Any

import duckdb

from mrv2_prof.pipeline.harness import runner_main
from mrv2_prof.pipeline.job import RunJob
from mrv2_prof.scenario import Scenario, scenario_yaml

PHASES = ("schedule", "execute", "prepare", "forward", "sample", "update", "step")
# step_breakdown's figures, in the order its query selects them
BREAKDOWN = ("interval", "gpu_step", "gpu_busy", "bubble", "host_prep", "output_wait")
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


def number(v) -> str:
    """A figure with one decimal and thousands separators; blank for none."""
    return "" if v is None else f"{v:,.1f}"


def markdown_phases(results: list[dict]) -> list[str]:
    """Part (a)'s table: one row per (batch, probe set, repeat)."""
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
            cells = " | ".join(number(r.get(c)) for c in cols)
            lines.append(
                f"| {r['batch']} | {r['probes']} | {r['repeat']} | {r['decode_steps']} | "
                f"{cells} | {r['flushes']} |"
            )
        lines.append("")
    return lines


def markdown_throughput(results: list[dict]) -> list[str]:
    """Part (d)'s tables: the async on/off throughput, then its decode steps."""
    lines = []
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
                f"| {r['repeat']} | {number(r['async_on'])} | {number(r['async_off'])} | "
                f"{r['ratio']:.2f} |"
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
    return lines
