"""CUDA graph modes: decode TPOT and output tokens/s at batch 1, 8, 64 and 256 for NONE,
PIECEWISE and FULL; capture time and graph memory per mode; the decode roofline.

For each mode one engine (Triton kernels, async scheduling, staged writes, UVA, capture sizes
``auto``) runs, for each batch size B, B requests of 128 prompt tokens and 64 output tokens
(all at once, EOS ignored). TPOT is the median wall time of the steady decode steps (all B
requests decoding), tokens/s is B / TPOT. The dispatch of those steps is checked to be the mode
under test.

Roofline: the bytes a decode step must read from HBM (all weights once + the KV cache of every
request at its median length) over the measured HBM bandwidth (a 2 GiB device copy, read + write
bytes, best of 5), as a fraction of the measured FULL-graph step time.

    python benchmarks/cudagraphs.py --preset llama-1b --out graphs.json
"""

from __future__ import annotations

import argparse
import gc

import numpy as np
import torch
from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine

PROMPT, OUTPUT = 128, 64


def hbm_bandwidth(nbytes: int = 2 << 30) -> float:
    """Bytes per second of a device-to-device copy (bytes read + bytes written)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / best


def decode_run(engine: Engine, batch: int, tag: str) -> dict:
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
    for i in range(batch):
        ids = rng.integers(0, engine.vocab_size, size=PROMPT).tolist()
        engine.add_request(f"{tag}-{i}", ids, params)
    walls, modes = [], set()
    while engine.has_unfinished_requests():
        res = engine.step()
        so = res.scheduler_output
        steady = so.num_reqs == batch and so.total_num_scheduled_tokens == batch
        if steady and not so.scheduled_new_reqs:
            walls.append(res.host_ns / 1e6)
            modes.add(engine.runner.graph_mode_of_last_step)
    tpot = float(np.median(walls[2:]))  # the first decode steps still drain the prefill
    return {"batch": batch, "tpot_ms": tpot, "tok_s": batch / tpot * 1e3, "modes": sorted(modes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--modes", nargs="+", default=["none", "piecewise", "full"])
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("cudagraphs: needs a CUDA device")
    bw = hbm_bandwidth()
    print(f"HBM bandwidth (device copy, read + write): {bw / 1e9:,.0f} GB/s", flush=True)
    results = []
    for mode in args.modes:
        config = RunnerConfig(
            device="cuda",
            kernels="triton",
            async_scheduling=True,
            uva=True,
            cudagraph_mode=mode,
            max_num_seqs=max(args.batches),
            max_num_reqs=2 * max(args.batches),
            max_num_batched_tokens=8192,
            max_model_len=PROMPT + OUTPUT + 1,
        )
        engine = Engine(config, ModelSpec(preset=args.preset))
        info = engine.info
        a = engine.runner.model_args
        startup = {
            "weight_load_s": info.weight_load_s,
            "profile_run_s": info.profile_run_s,
            "kv_alloc_s": info.kv_alloc_s,
            "warmup_s": info.warmup_s,
            "capture_s": info.capture_s,
            "graph_memory_bytes": info.graph_memory_bytes,
            "num_graph_keys": info.num_graphs,
        }
        print(
            f"{mode:9} start-up: weights {info.weight_load_s:.1f} s, profile "
            f"{info.profile_run_s:.1f} s, KV alloc {info.kv_alloc_s:.2f} s, warm-up "
            f"{info.warmup_s:.1f} s, capture {info.capture_s:.1f} s "
            f"({info.num_graphs} keys, {info.graph_memory_bytes / 2**20:,.0f} MiB)",
            flush=True,
        )
        weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
        kv_per_token = 2 * a.num_hidden_layers * a.num_key_value_heads * a.head_dim * 2
        for b in args.batches:
            r = decode_run(engine, b, f"{mode}{b}")
            step_bytes = weight_bytes + b * (PROMPT + OUTPUT // 2) * kv_per_token
            r["roofline_ms"] = step_bytes / bw * 1e3
            r["roofline_fraction"] = r["roofline_ms"] / r["tpot_ms"]
            results.append({"mode": mode, **startup, **r})
            print(
                f"{mode:9} batch {b:4d}: TPOT {r['tpot_ms']:7.2f} ms  {r['tok_s']:9,.0f} tok/s  "
                f"dispatch {','.join(r['modes'])}  roofline {r['roofline_ms']:.2f} ms "
                f"({100 * r['roofline_fraction']:.0f}% of the step)",
                flush=True,
            )
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    meta = {
        "preset": args.preset,
        "hbm_bytes_per_s": bw,
        "prompt_len": PROMPT,
        "output_len": OUTPUT,
    }
    write_results(args.out, meta, results)


if __name__ == "__main__":
    main()
