"""How long ``mrv2-prof report`` takes for a long run: a synthetic 10,000-step GPU run.

The run database is built with ``Store.append`` (not timed): every step has its CPU phase spans,
GPU spans, overlap and bubble, a graph dispatch, staged writes and an output wait; 512 requests
of 256 tokens; NVML at 20 Hz; 40 captured graph keys. Timed: rendering the report (store reads,
figures, HTML with plotly.js inlined) and writing it, as the CLI does.

    python benchmarks/report_10k.py [--steps 10000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.store import Store

T0 = 5_000_000_000_000
CPU_PHASES = ("schedule", "prepare", "forward", "sample", "output_wait", "update")


def build_run(store: Store, run_id: str, num_steps: int, seed: int = 0) -> None:
    """A synthetic GPU run of ``num_steps`` steps in ``store`` (vectorised appends)."""
    rng = np.random.default_rng(seed)
    store.begin_run(
        run_id, scenario_name="report-bench", label="report-bench", matrix_combo=None,
        scenario_yaml="name: report-bench\nprobes: {cuda_events: true, nvml_hz: 20}\n",
        device="cuda:0", versions={}, started_ns=T0 - 2_000_000_000,
        info={"dtype": "bfloat16", "num_graphs": 40, "capture_s": 4.0, "notes": []},
    )  # fmt: skip
    step = np.arange(num_steps)
    phase_ns = rng.integers(50_000, 2_000_000, size=(num_steps, len(CPU_PHASES)))
    step_ns = phase_ns.sum(1) + 20_000
    cpu_start = T0 + np.concatenate([[0], np.cumsum(step_ns)[:-1]])
    cpu_end = cpu_start + step_ns
    gpu_start = cpu_start + phase_ns[:, 0] + phase_ns[:, 1] // 2
    gpu_end = gpu_start + phase_ns[:, 2] + phase_ns[:, 3]
    bubble = np.maximum(0, gpu_start - np.concatenate([[gpu_start[0]], gpu_end[:-1]]))
    host_prep = phase_ns[:, :3].sum(1)
    hidden = (host_prep * rng.uniform(0, 1, num_steps)).astype(np.int64)
    num_tokens = np.where(step % 50 == 0, 2048, rng.integers(1, 256, num_steps))
    mode = np.where(num_tokens > 512, "none", np.where(step % 7 == 0, "piecewise", "full"))
    store.append(run_id, "steps", {
        "step": step, "cpu_start_ns": cpu_start, "cpu_end_ns": cpu_end,
        "gpu_start_ns": gpu_start, "gpu_end_ns": gpu_end, "num_tokens": num_tokens,
        "graph_mode": mode.astype(object), "overlap_frac": hidden / host_prep,
        "host_prep_ns": host_prep, "hidden_prep_ns": hidden, "bubble_ns": bubble,
        "bubble_kind": np.where(bubble > 500_000, "host_bound", "other").astype(object),
    })  # fmt: skip
    offsets = np.concatenate([np.zeros((num_steps, 1), np.int64), np.cumsum(phase_ns, 1)], 1)
    starts = cpu_start[:, None] + offsets[:, :-1]
    ends = cpu_start[:, None] + offsets[:, 1:]
    names = np.tile(np.array(CPU_PHASES, dtype=object), num_steps)
    gpu_names = np.tile(np.array(["prepare", "forward", "sample"], dtype=object), num_steps)
    gpu_bounds = np.linspace(gpu_start, gpu_end, 4).T.astype(np.int64)
    store.append(run_id, "spans", {
        "step": np.concatenate([step, np.repeat(step, len(CPU_PHASES)), np.repeat(step, 3)]),
        "track": np.array(["cpu"] * (num_steps * (1 + len(CPU_PHASES))) + ["gpu"] * num_steps * 3,
                          dtype=object),
        "name": np.concatenate([np.full(num_steps, "step", dtype=object), names, gpu_names]),
        "start_ns": np.concatenate([cpu_start, starts.ravel(), gpu_bounds[:, :3].ravel()]),
        "end_ns": np.concatenate([cpu_end, ends.ravel(), gpu_bounds[:, 1:].ravel()]),
    })  # fmt: skip
    sites = np.array(
        [f"mrv2_prof/runner/worker/model_runner.py:{n}" for n in range(300, 320)], object
    )
    implicit = rng.choice(num_steps, num_steps // 10)
    store.append(run_id, "syncs", {
        "step": np.concatenate([step, implicit]),
        "t_ns": np.concatenate([starts[:, 4], cpu_start[implicit]]),
        "kind": np.array(["output_wait"] * num_steps + ["implicit"] * len(implicit), object),
        "site": np.concatenate([np.full(num_steps, None, object),
                                rng.choice(sites, len(implicit))]),
        "blocked_ns": np.concatenate([phase_ns[:, 4], rng.integers(0, 100_000, len(implicit))]),
    })  # fmt: skip
    store.append(run_id, "graph_dispatch", {
        "step": step, "num_tokens": num_tokens, "padded_tokens": num_tokens,
        "requested_mode": np.full(num_steps, "full_and_piecewise", object),
        "mode": mode.astype(object), "hit": mode != "none",
        "reason": np.where(mode == "none", "num_tokens > largest capture size",
                           "uniform decode").astype(object),
    })  # fmt: skip
    sizes = np.arange(8, 8 * 21, 8)
    store.append(run_id, "graph_captures", {
        "key": np.array([f"{m}:{s}" for m in ("full", "piecewise") for s in sizes], object),
        "mode": np.repeat(np.array(["full", "piecewise"], object), len(sizes)),
        "num_tokens": np.tile(sizes, 2), "capture_s": rng.uniform(0.02, 0.2, 2 * len(sizes)),
        "mem_bytes": rng.integers(1 << 20, 1 << 24, 2 * len(sizes)),
    })  # fmt: skip
    tensors = np.array(["block_table", "num_computed_tokens", "prefill_token_ids"], object)
    store.append(run_id, "staged_writes", {
        "step": np.repeat(step, 3), "tensor": np.tile(tensors, num_steps),
        "rows": rng.integers(1, 64, 3 * num_steps), "elements": rng.integers(1, 512, 3 * num_steps),
        "staged_bytes": rng.integers(16, 4096, 3 * num_steps),
        "dense_bytes": np.tile([262_144, 4096, 4_194_304], num_steps),
    })  # fmt: skip
    num_requests, out_tokens = 512, 256
    arrival = T0 + np.sort(rng.integers(0, cpu_end[-1] - T0, num_requests)) // 2
    token_t = arrival[:, None] + np.cumsum(rng.integers(1_000_000, 20_000_000,
                                                        (num_requests, out_tokens)), 1)  # fmt: skip
    req_ids = np.array([f"r{i}" for i in range(num_requests)], object)
    store.append(run_id, "requests", {
        "req_id": req_ids, "arrival_ns": arrival, "first_token_ns": token_t[:, 0],
        "finish_ns": token_t[:, -1], "prompt_tokens": rng.integers(64, 512, num_requests),
        "output_tokens": np.full(num_requests, out_tokens),
        "finish_reason": np.full(num_requests, "length", object),
    })  # fmt: skip
    store.append(run_id, "tokens", {
        "req_id": np.repeat(req_ids, out_tokens),
        "idx": np.tile(np.arange(out_tokens), num_requests),
        "t_ns": token_t.ravel(), "token_id": rng.integers(0, 32_000, num_requests * out_tokens),
    })  # fmt: skip
    t = np.arange(T0, cpu_end[-1], 50_000_000)
    store.append(run_id, "gpu_samples", {
        "t_ns": t, "gpu_util": rng.uniform(0, 100, len(t)),
        "mem_used_bytes": rng.integers(40 << 30, 60 << 30, len(t)),
        "power_w": rng.uniform(100, 700, len(t)), "sm_clock_mhz": rng.uniform(1500, 1980, len(t)),
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write results as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.duckdb"
        t = time.perf_counter()
        with Store.open(db) as store:
            build_run(store, "bench0", args.steps)
        build_s = time.perf_counter() - t
        times = []
        for _ in range(args.repeats):
            out = Path(tmp) / "report.html"
            t = time.perf_counter()
            with Store.open(db, read_only=True) as store:
                out.write_text(render_run_report(store, "bench0"), encoding="utf-8")
            times.append(time.perf_counter() - t)
        size = out.stat().st_size
    print(f"{args.steps:,} steps: database built in {build_s:.1f} s (not timed)")
    print(
        f"report: median {statistics.median(times):.2f} s, min {min(times):.2f} s over "
        f"{args.repeats} runs; {size / 2**20:.1f} MiB HTML"
    )
    if args.json:
        from bench_io import write_results

        write_results(
            args.json, {"benchmark": "report_10k", "steps": args.steps},
            [{"median_s": statistics.median(times), "min_s": min(times), "html_bytes": size}],
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
