"""Probe overhead: the no-op ``Probe`` against ``RecordingProbe``, per hook call and per step.

(a) micro: nanoseconds per hook call as the runner makes it (one span = ``begin`` + ``end``,
    ``staged_write``, ``token``, one step = ``step_begin`` + ``step_end``), median of repeats,
    with the recording buffers preallocated (no growth inside a timing).
(b) macro: the same seeded batch (all requests at once, EOS ignored, greedy) through ``Engine``
    with ``Probe()`` and with ``RecordingProbe()``, alternating sides. The recording side is
    drained as the harness drains it (every ``FLUSH_INTERVAL_NS`` or when a buffer is half full,
    plus once at the end), inside the timing; the store write is not included. Reports steps,
    wall time, the median of ``StepResult.host_ns`` and the relative overhead.

    python benchmarks/probe_overhead.py --preset llama-1b --device cuda --num-requests 16 \
        --prompt-len 128:512 --output-len 256 --out probe_overhead.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
import timeit

import numpy as np
import torch
from baseline_workload import QuickstartWorkload

from mrv2_prof.pipeline.open_loop import FLUSH_INTERVAL_NS
from mrv2_prof.probes import api as probes
from mrv2_prof.probes.api import Probe
from mrv2_prof.probes.recording import RecordingProbe
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine

SIDES = {"Probe": Probe, "RecordingProbe": RecordingProbe}

# hook statements as the runner writes them: ``p`` is a local bound to the probe
HOOK_CALLS = {
    "span (begin+end)": "p.begin(4); p.end(4)",
    "staged_write": "p.staged_write('block_table', 3, 12, 60, 2048)",
    "token": "p.token('req-1', 1, 1234567890, 17)",
    "step (step_begin+step_end)": (
        "p.step_begin(7); p.step_end(8, 8, 0, 0, 8, 40, 0, 1500, 'none')"
    ),
}


# ---- (a) micro --------------------------------------------------------------------------------
def hook_ns(side: str, stmt: str, number: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean ns per execution of ``stmt`` (``number`` each)."""
    per_call = []
    for _ in range(repeats):
        probe = RecordingProbe(capacity=number) if side == "RecordingProbe" else Probe()
        probe.request_arrival("req-1", 0, 8)
        timer = timeit.Timer(stmt, setup="p = probe", globals={"probe": probe})
        timer.timeit(number)  # interns the strings and touches every page of the buffers
        if isinstance(probe, RecordingProbe):
            probe.drain()  # steady state: the buffers are reused, as after a harness flush
        per_call.append(timer.timeit(number) / number * 1e9)
    return statistics.median(per_call)


def micro(number: int, repeats: int) -> list[dict]:
    loop = timeit.repeat("pass", number=number, repeat=repeats)
    empty = statistics.median(t / number * 1e9 for t in loop)
    rows = [{"hook": "(empty loop)", "Probe": empty, "RecordingProbe": empty}]
    for hook, stmt in HOOK_CALLS.items():
        rows.append({"hook": hook, **{s: hook_ns(s, stmt, number, repeats) for s in SIDES}})
    return rows


# ---- (b) macro --------------------------------------------------------------------------------
def add_requests(engine: Engine, workload: QuickstartWorkload, max_model_len: int) -> None:
    """The runner baseline's seeded batch (``baseline_workload.run_workload``)."""
    rng = np.random.default_rng(workload.seed)
    params = SamplingParams(
        temperature=workload.temperature, max_tokens=workload.output_len, ignore_eos=True
    )
    for i in range(workload.num_requests):
        n = int(rng.integers(workload.prompt_len_min, workload.prompt_len_max + 1))
        n = min(n, max_model_len - workload.output_len - 1)
        ids = rng.integers(0, engine.vocab_size, size=n).tolist()
        engine.add_request(f"req-{i}", ids, params, arrival_time=float(i))


def warm_up(engine: Engine, prompt_len: int) -> None:
    """A short untimed batch, so that lazy initialisation is not charged to the first side."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"warmup-{i}", [1 + i] * prompt_len, params, arrival_time=-1.0)
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # hands the finished ids to the runner


def flush(probe: RecordingProbe) -> int:
    """What the harness does each flush, less the store write; returns the rows drained."""
    probe.begin(probes.FLUSH)
    tables = probe.drain()
    probe.end(probes.FLUSH)
    return sum(len(next(iter(cols.values()))) for cols in tables.values())


def run_once(side: str, config: RunnerConfig, spec: ModelSpec, workload) -> dict:
    probe = SIDES[side]()
    engine = Engine(config, spec, probe)
    warm_up(engine, workload.prompt_len_min)
    recording = isinstance(probe, RecordingProbe)
    if recording:
        probe.drain()
    add_requests(engine, workload, config.max_model_len)
    requests = list(engine.scheduler.requests.values())

    host_ns, wait_ns = [], []
    drains = rows = drain_ns = 0
    t0 = time.perf_counter_ns()
    next_flush = t0 + FLUSH_INTERVAL_NS
    while engine.has_unfinished_requests():
        res = engine.step()
        host_ns.append(res.host_ns)
        wait_ns.append(res.runner_output.output_wait_ns)
        if recording:
            now = time.perf_counter_ns()
            if now >= next_flush or probe.fill > 0.5:
                rows += flush(probe)
                drains += 1
                drain_ns += time.perf_counter_ns() - now
                next_flush = time.perf_counter_ns() + FLUSH_INTERVAL_NS
    if recording:
        now = time.perf_counter_ns()
        rows += flush(probe)
        drains += 1
        drain_ns += time.perf_counter_ns() - now
    wall_s = (time.perf_counter_ns() - t0) / 1e9

    host = np.asarray(host_ns)
    info = engine.info
    out = {
        "probe": side,
        "device": info.device,
        "dtype": info.dtype,
        "steps": len(host_ns),
        "wall_s": wall_s,
        "step_ms_p50": float(np.median(host)) / 1e6,
        "work_ms_p50": float(np.median(host - np.asarray(wait_ns))) / 1e6,
        "output_tokens": sum(r.num_output_tokens for r in requests),
        "drains": drains,
        "rows_drained": rows,
        "drain_ms": drain_ns / 1e6,
        "tokens": {r.request_id: list(r.output_token_ids) for r in requests},
    }
    del engine, probe
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def macro(args, use_cuda: bool) -> dict:
    lo, hi = (int(x) for x in args.prompt_len.split(":"))
    max_model_len = hi + args.output_len + 1
    num_kv_blocks = args.num_kv_blocks
    if num_kv_blocks is None and not use_cuda:  # a fixed cache on CPU: the whole batch fits
        num_kv_blocks = max(512, args.num_requests * -(-max_model_len // 16))
    config = RunnerConfig(
        device=args.device,
        max_num_seqs=256,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        num_kv_blocks=num_kv_blocks,
        kernels="torch",
        async_scheduling=False,
        uva=False,
        cudagraph_mode="none",
    )
    spec = ModelSpec(preset=args.preset, dtype=args.dtype)
    workload = QuickstartWorkload(
        num_requests=args.num_requests,
        prompt_len_min=lo,
        prompt_len_max=hi,
        output_len=args.output_len,
        seed=args.seed,
    )
    runs = []
    for rep in range(args.repeats):
        order = list(SIDES) if rep % 2 == 0 else list(reversed(SIDES))  # ABBA against drift
        for side in order:
            runs.append(run_once(side, config, spec, workload))
    tokens = [r.pop("tokens") for r in runs]
    by_side = {s: [r for r in runs if r["probe"] == s] for s in SIDES}

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in by_side[side])

    overhead = {
        key: (med("RecordingProbe", key) - med("Probe", key)) / med("Probe", key)
        for key in ("wall_s", "step_ms_p50", "work_ms_p50")
    }
    return {
        "num_kv_blocks": num_kv_blocks,
        "runs": runs,
        "median": {s: {k: med(s, k) for k in overhead} for s in SIDES},
        "overhead": overhead,
        "same_tokens": all(t == tokens[0] for t in tokens),
    }


# ---- report -----------------------------------------------------------------------------------
def markdown(meta: dict, micro_rows: list[dict] | None, macro_res: dict | None) -> str:
    lines = [f"## Probe overhead — {meta['preset']} on {meta['device_name']}", ""]
    if micro_rows is not None:
        lines += [
            f"Hook cost, ns per call (median of {meta['micro_repeats']} × "
            f"{meta['micro_number']:,} calls; the loop itself is the first row):",
            "",
            "| hook | Probe | RecordingProbe | added |",
            "| --- | ---: | ---: | ---: |",
        ]
        for r in micro_rows:
            added = r["RecordingProbe"] - r["Probe"]
            lines.append(
                f"| {r['hook']} | {r['Probe']:.0f} | {r['RecordingProbe']:.0f} | {added:+.0f} |"
            )
        lines.append("")
    if macro_res is not None:
        lines += [
            f"Engine: {meta['num_requests']} requests, prompt {meta['prompt_len']}, "
            f"output {meta['output_len']}, {meta['repeats']} run(s) per side, "
            f"{macro_res['runs'][0]['dtype']}, {macro_res['num_kv_blocks'] or 'auto'} KV blocks; "
            f"step = StepResult.host_ns, work = step − output wait:",
            "",
            "| probe | steps | wall s | step p50 ms | work p50 ms | out tok/s | drains | rows | "
            "drain ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in macro_res["runs"]:
            lines.append(
                f"| {r['probe']} | {r['steps']} | {r['wall_s']:.3f} | {r['step_ms_p50']:.3f} | "
                f"{r['work_ms_p50']:.3f} | {r['output_tokens'] / r['wall_s']:.1f} | "
                f"{r['drains']} | {r['rows_drained']:,} | {r['drain_ms']:.2f} |"
            )
        o = macro_res["overhead"]
        lines += [
            f"| **overhead (medians)** | | {o['wall_s']:+.2%} | {o['step_ms_p50']:+.2%} | "
            f"{o['work_ms_p50']:+.2%} | | | | |",
            "",
            f"Same tokens on every run: {'yes' if macro_res['same_tokens'] else 'NO'}.",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-tiny")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--prompt-len", default="32:256", help="MIN:MAX, uniform")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument(
        "--num-kv-blocks", type=int, default=None, help="default: auto on CUDA, fits all on CPU"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="engine runs per side")
    ap.add_argument("--micro-number", type=int, default=200_000, help="calls per timing")
    ap.add_argument("--micro-repeats", type=int, default=7)
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--skip-macro", action="store_true")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "device_name": torch.cuda.get_device_name() if use_cuda else f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "preset": args.preset,
        "num_requests": args.num_requests,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "micro_number": args.micro_number,
        "micro_repeats": args.micro_repeats,
    }
    micro_rows = None if args.skip_micro else micro(args.micro_number, args.micro_repeats)
    macro_res = None if args.skip_macro else macro(args, use_cuda)
    print(markdown(meta, micro_rows, macro_res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "micro": micro_rows, "macro": macro_res}, f, indent=2)


if __name__ == "__main__":
    main()
