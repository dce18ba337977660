"""Baseline of the reference (torch) runner: throughput and per-step host time on one GPU.

This is the number the MRV2 fast path is measured against. For each variant it builds the engine,
runs a seeded decode-heavy batch (all requests arrive at once, EOS ignored) and reports tokens/s
and per-step host time (p50), with and without the wait for sampled tokens.

    python benchmarks/runner_baseline.py --preset llama-1b --out results.json
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from baseline_workload import QuickstartWorkload, run_workload
from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec, RunnerConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-requests", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--prompt-len", default="128:512")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.prompt_len.split(":"))

    results = []
    for n in args.num_requests:
        for staged in (True, False):
            config = RunnerConfig(
                device=args.device,
                max_num_seqs=256,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=hi + args.output_len + 1,
                num_kv_blocks=None if torch.cuda.is_available() else 4096,
                staged_writes=staged,
                kernels="torch",
                async_scheduling=False,
                uva=False,
                cudagraph_mode="none",
            )
            workload = QuickstartWorkload(
                num_requests=n, prompt_len_min=lo, prompt_len_max=hi, output_len=args.output_len
            )
            summary = run_workload(config, ModelSpec(preset=args.preset), workload)
            row = {"num_requests": n, "staged_writes": staged, **dataclasses.asdict(summary)}
            results.append(row)
            print(
                f"reqs={n:4d} staged_writes={staged!s:5} steps={summary.steps:4d} "
                f"out_tok/s={summary.output_tokens_per_s:8.1f} "
                f"step wall p50={summary.step_wall_ms_p50:7.2f} ms "
                f"host p50={summary.step_host_ms_p50:7.2f} ms "
                f"decode wall/host p50={summary.decode_step_wall_ms_p50:.2f}/"
                f"{summary.decode_step_host_ms_p50:.2f} ms startup={summary.startup_s:.1f} s",
                flush=True,
            )
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
    meta = {"preset": args.preset, "prompt_len": args.prompt_len, "output_len": args.output_len}
    write_results(args.out, meta, results)


if __name__ == "__main__":
    main()
