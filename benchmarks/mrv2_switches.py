"""Each MRV2 switch on vs off: output tokens/s, host time per step and GPU idle time between steps.

For each workload (decode-heavy, mixed prefill/decode) the same seeded requests run through the
engine (no harness, no probe) under: the reference path (torch kernels, synchronous, dense
writes, no UVA), the full MRV2 path (Triton kernels, async scheduling, staged writes, UVA), and the
MRV2 path with one switch turned off at a time; ``--cudagraph-mode`` adds CUDA graphs to all.

Host time per step is the step's wall time minus its wait for sampled tokens. GPU idle between
steps is measured with timing events the benchmark records (not the runner): one just before a
step's first GPU operation (its staged-write apply) and one after its last (the token copy). The
idle gap before step N+1 is the time from the GPU passing step N's end event to it passing step
N+1's start event; with async scheduling step N+1 is already queued, so it is ~0. Recording the
events adds a few µs of host time per step to every variant alike.

Before the timed runs of a workload, one untimed MRV2 run compiles every Triton specialisation
it needs (so the first variant does not pay compiles the others do not). The machine is shared
and noisy: each Triton variant runs ``--repeats`` times, in rotating order, and every metric
is the median over its runs; the torch variants (minutes each) run once.

    python benchmarks/mrv2_switches.py --preset llama-1b --out switches.json
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import torch
from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine

MRV2 = dict(kernels="triton", async_scheduling=True, staged_writes=True, uva=True)
VARIANTS = {
    "reference": dict(kernels="torch", async_scheduling=False, staged_writes=False, uva=False),
    "mrv2": MRV2,
    "mrv2 -async": {**MRV2, "async_scheduling": False},
    "mrv2 -staged": {**MRV2, "staged_writes": False},
    "mrv2 -uva": {**MRV2, "uva": False},
    "mrv2 -triton": {**MRV2, "kernels": "torch", "uva": False},
}
WORKLOADS = {
    # (num_requests, prompt len range, output len, max_num_batched_tokens)
    "decode": (32, (128, 256), 128, 8192),
    "mixed": (32, (256, 1024), 64, 2048),
}


class GpuGaps:
    """Timing events around each step's GPU work, recorded from outside the runner."""

    def __init__(self, engine: Engine) -> None:
        self.spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        runner, rs = engine.runner, engine.runner.req_states
        apply, queue = rs.apply_writes, runner.queue_step
        start: list[torch.cuda.Event] = []

        def apply_writes():
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            start.append(ev)
            return apply()

        def queue_step(so, *a, **k):
            pending = queue(so, *a, **k)
            if pending.batch is not None and start:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self.spans.append((start[-1], end))
            start.clear()
            return pending

        rs.apply_writes, runner.queue_step = apply_writes, queue_step

    def idle_ms(self) -> np.ndarray:
        """Idle time before each step after the first, in ms."""
        torch.cuda.synchronize()
        pairs = zip(self.spans, self.spans[1:], strict=False)
        return np.array([max(0.0, prev[1].elapsed_time(nxt[0])) for prev, nxt in pairs])

    def busy_span_ms(self) -> float:
        return self.spans[0][0].elapsed_time(self.spans[-1][1]) if self.spans else 0.0


def run(variant: dict, workload: tuple, preset: str, graphs: str, seed: int = 0) -> dict:
    num_requests, (lo, hi), output_len, max_batched = workload
    config = RunnerConfig(
        device="cuda",
        cudagraph_mode=graphs,
        max_num_seqs=256,
        max_num_batched_tokens=max_batched,
        max_model_len=hi + output_len + 1,
        **variant,
    )
    t0 = time.perf_counter()
    engine = Engine(config, ModelSpec(preset=preset))
    startup_s = time.perf_counter() - t0
    gaps = GpuGaps(engine)
    rng = np.random.default_rng(seed)
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    for i in range(num_requests):
        n = int(rng.integers(lo, hi + 1))
        ids = rng.integers(0, engine.vocab_size, size=n).tolist()
        engine.add_request(f"r{i}", ids, params, arrival_time=float(i))
    host_ns, tokens = [], 0
    t1 = time.perf_counter()
    while engine.has_unfinished_requests():
        res = engine.step()
        host_ns.append(res.host_ns - res.runner_output.output_wait_ns)
        tokens += len(res.updated)
    wall_s = time.perf_counter() - t1
    idle = gaps.idle_ms()
    span = gaps.busy_span_ms()
    host_us = np.asarray(host_ns) / 1e3
    return {
        "steps": len(host_ns),
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall_s,
        "host_us_per_step_p50": float(np.percentile(host_us, 50)),
        "host_us_per_step_mean": float(host_us.mean()),
        "gpu_idle_ms_per_step_p50": float(np.percentile(idle, 50)) if idle.size else 0.0,
        "gpu_idle_ms_per_step_mean": float(idle.mean()) if idle.size else 0.0,
        "gpu_idle_fraction": float(idle.sum() / span) if span else 0.0,
        "wall_s": wall_s,
        "startup_s": startup_s,
        "notes": list(engine.info.notes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--repeats", type=int, default=3, help="runs per Triton variant")
    ap.add_argument(
        "--cudagraph-mode",
        default="none",
        choices=["none", "piecewise", "full", "full_and_piecewise"],
        help="CUDA graphs for every variant (default: none, eager)",
    )
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("mrv2_switches: needs a CUDA device")
    results = []
    for wname in args.workloads:
        run(MRV2, WORKLOADS[wname], args.preset, args.cudagraph_mode)  # untimed: compiles
        gc.collect()
        runs: dict[str, list[dict]] = {v: [] for v in args.variants}
        for rep in range(args.repeats):
            order = (
                args.variants[rep % len(args.variants) :]
                + args.variants[: rep % len(args.variants)]
            )
            for vname in order:
                if rep and VARIANTS[vname]["kernels"] == "torch":
                    continue
                runs[vname].append(
                    run(VARIANTS[vname], WORKLOADS[wname], args.preset, args.cudagraph_mode)
                )
                gc.collect()  # the timing wrappers make a cycle through the engine
                torch.cuda.empty_cache()
        for vname in args.variants:
            each = ", ".join(f"{x['output_tokens_per_s']:.0f}" for x in runs[vname])
            r = {
                k: (float(np.median([x[k] for x in runs[vname]])) if k != "notes" else v)
                for k, v in runs[vname][0].items()
            }
            r["repeats"] = len(runs[vname])
            results.append({"workload": wname, "variant": vname, **r})
            print(
                f"{wname:6} {vname:13} steps={r['steps']:4.0f} "
                f"out_tok/s={r['output_tokens_per_s']:8.1f} "
                f"host/step p50={r['host_us_per_step_p50']:7.0f} us "
                f"gpu idle/step p50={r['gpu_idle_ms_per_step_p50'] * 1e3:6.0f} us "
                f"mean={r['gpu_idle_ms_per_step_mean'] * 1e3:6.0f} us "
                f"idle frac={r['gpu_idle_fraction']:.3f} "
                f"(median of {r['repeats']}: out_tok/s "
                f"{each})",
                flush=True,
            )
    meta = {
        "preset": args.preset,
        "workloads": {k: WORKLOADS[k] for k in args.workloads},
        "cudagraph_mode": args.cudagraph_mode,
    }
    write_results(args.out, meta, results)


if __name__ == "__main__":
    main()
