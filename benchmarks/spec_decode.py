"""Speculative decoding: TPOT and output tokens/s at batch 1, 8 and 64 for spec decode off,
n-gram k = 2 and 4, self-draft k = 2 and 4 (the target's first ``--self-draft-layers`` layers as
the draft model, its k steps one fused draft graph), and dynamic k; mean acceptance length, the
graph modes replayed, and for a draft model its device time against the step's (``draft_ms``,
``step_ms`` per step: CUDA events around the draft model's work and around the whole queued
step, so ``draft_share`` is what the draft costs of each step; host time on the CPU); and the
dynamic-k comparison of vLLM's DSD full-CUDA-graph change: FULL (every (batch, 1 + k) captured,
``cudagraph_mode: full_and_piecewise``; the verifies of a uniform decode batch padded to one k)
against ``cudagraph_mode: piecewise`` (nothing padded), same workload. The JSON rows count the
placeholder draft slots verified (``num_padded_slots``).

Each configuration is one engine (Triton kernels, staged writes, UVA, sync scheduling: with
async scheduling a speculating request sits out every other step, see the README) running, for
each batch size B, B greedy requests of repetitive prompts (a random 8-token segment repeated to
128 tokens, so the n-gram drafter finds drafts with random weights) and 64 output tokens, EOS
ignored. TPOT is the mean over requests of (last token time - first token time) / (tokens - 1),
from the host times at which each step's tokens were known; tok/s is all output tokens over the
wall time from the first decode step to the end. ``--markdown`` writes the table for
benchmarks/RESULTS.md.

    python benchmarks/spec_decode.py --preset llama-1b --out spec.json --markdown spec.md
    python benchmarks/spec_decode.py --cpu-smoke --out smoke.json   # the CI smoke run
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import replace

import numpy as np
import torch
from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.spec_decode.config import SpecDecodeConfig

PROMPT, OUTPUT, SEGMENT = 128, 64, 8
SELF_DRAFT_LAYERS = 4  # --self-draft-layers: of llama-1b's 16 (the CPU smoke run uses 1)
DYNAMIC_K = ((1, 4), (8, 2), (64, 1))
CONFIGS = {  # name -> (spec decode, cudagraph_mode)
    "off": (SpecDecodeConfig(), "full_and_piecewise"),
    "ngram k=2": (SpecDecodeConfig(method="ngram", num_speculative_tokens=2), "full_and_piecewise"),
    "ngram k=4": (SpecDecodeConfig(method="ngram", num_speculative_tokens=4), "full_and_piecewise"),
    "self-draft k=2": (
        SpecDecodeConfig(
            method="draft_model", num_speculative_tokens=2, draft_target_layers=SELF_DRAFT_LAYERS
        ),
        "full_and_piecewise",
    ),
    "self-draft k=4": (
        SpecDecodeConfig(
            method="draft_model", num_speculative_tokens=4, draft_target_layers=SELF_DRAFT_LAYERS
        ),
        "full_and_piecewise",
    ),
    "dynamic k": (
        SpecDecodeConfig(method="ngram", num_speculative_tokens=4, dynamic_k=DYNAMIC_K),
        "full_and_piecewise",
    ),
    "dynamic k, piecewise": (
        SpecDecodeConfig(method="ngram", num_speculative_tokens=4, dynamic_k=DYNAMIC_K),
        "piecewise",
    ),
}


class DeviceTimer:
    """Device time (CUDA events; host time on the CPU) of every call to ``obj.name``."""

    def __init__(self, obj, name: str) -> None:
        self.spans: list = []
        fn = getattr(obj, name)
        cuda = torch.cuda.is_available() and getattr(obj, "device", None) != torch.device("cpu")
        self.cuda = cuda

        def timed(*args, **kwargs):
            if cuda:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                out = fn(*args, **kwargs)
                end.record()
            else:
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                end = time.perf_counter()
            self.spans.append((start, end))
            return out

        setattr(obj, name, timed)

    def take_ms(self) -> tuple[float, int]:
        """Milliseconds summed over the calls since the last take, and how many calls."""
        spans, self.spans = self.spans, []
        if self.cuda:
            torch.cuda.synchronize()
            return sum(s.elapsed_time(e) for s, e in spans), len(spans)
        return 1e3 * sum(e - s for s, e in spans), len(spans)


def run_batch(engine: Engine, batch: int, tag: str, prompt: int, output: int) -> dict:
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_tokens=output, ignore_eos=True)
    for i in range(batch):
        segment = rng.integers(0, engine.vocab_size, size=SEGMENT)
        engine.add_request(f"{tag}-{i}", np.resize(segment, prompt).tolist(), params)
    times: dict[str, list[float]] = {}
    spec = engine.scheduler.spec
    stats = spec.stats if spec else None
    before = (stats.num_drafts, stats.num_accepted_tokens, stats.num_padded_slots) if stats else ()
    replays_before = dict(engine.runner.graphs.replays)
    t_first = None
    while engine.has_unfinished_requests():
        res = engine.step()
        now = time.perf_counter()
        for r in res.updated:
            got = times.setdefault(r.request_id, [])
            got.extend([now] * (len(r.output_token_ids) - len(got)))
        if t_first is None and any(len(t) > 1 for t in times.values()):
            t_first = now
    t_end = time.perf_counter()
    timing = {}
    timers = getattr(engine, "bench_timers", None)
    if timers is not None:  # a draft model: its device time against the step's
        draft_ms, n_draft = timers[0].take_ms()
        step_ms, n_steps = timers[1].take_ms()
        timing = {
            "draft_ms": draft_ms / max(n_steps, 1),
            "step_ms": step_ms / max(n_steps, 1),
            "draft_share": draft_ms / step_ms if step_ms > 0 else None,
            "draft_rounds": n_draft,
        }
        graphs = engine.runner.drafter.graphs
        if graphs is not None:
            timing["draft_graph_replays"] = sum(graphs.replays.values())
    tpots = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    drafts = accepted = padded = 0
    if spec is not None:
        drafts = spec.stats.num_drafts - before[0]
        accepted = spec.stats.num_accepted_tokens - before[1]
        padded = spec.stats.num_padded_slots - before[2]  # placeholder draft slots verified
    replayed: dict[str, int] = {}
    for (mode, key), n in engine.runner.graphs.replays.items():
        extra = n - replays_before.get((mode, key), 0)
        name = f"{mode} verify" if isinstance(key, tuple) else mode
        replayed[name] = replayed.get(name, 0) + extra
    return {
        "batch": batch,
        "tpot_ms": 1e3 * float(np.mean(tpots)),
        "tok_s": sum(map(len, times.values())) / (t_end - (t_first or t_end) or 1e-9),
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "num_drafts": drafts,
        "num_padded_slots": padded,
        "replays": {k: v for k, v in replayed.items() if v},
        **timing,
    }


def markdown(results: list[dict], preset: str, device: str) -> str:
    lines = [
        f"### Speculative decoding ({preset}, {device}, prompt {PROMPT} repetitive, "
        f"output {OUTPUT}, greedy)",
        "",
        "| config | batch | TPOT (ms) | tok/s | mean acceptance length | draft / step (ms) "
        "| replays |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        mal = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
        replays = ", ".join(f"{k} {v}" for k, v in sorted(r["replays"].items())) or "-"
        if r.get("draft_graph_replays"):
            replays += f", draft graph {r['draft_graph_replays']}"
        split = "-"
        if "draft_ms" in r:
            split = f"{r['draft_ms']:.2f} / {r['step_ms']:.2f}"
        lines.append(
            f"| {r['config']} | {r['batch']} | {r['tpot_ms']:.2f} | {r['tok_s']:,.0f} | "
            f"{mal} | {split} | {replays} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    ap.add_argument("--markdown", default=None, help="write the results table here")
    ap.add_argument("--cpu-smoke", action="store_true", help="llama-tiny on the CPU, tiny sizes")
    ap.add_argument("--self-draft-layers", type=int, default=SELF_DRAFT_LAYERS)
    args = ap.parse_args()
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("spec_decode: needs a CUDA device (or --cpu-smoke)")
    preset = "llama-tiny" if smoke else args.preset
    batches = [1, 2] if smoke else args.batches
    prompt, output = (32, 24) if smoke else (PROMPT, OUTPUT)
    results = []
    for name in args.configs:
        spec, mode = CONFIGS[name]
        if spec.draft_target_layers is not None:
            spec = replace(spec, draft_target_layers=1 if smoke else args.self_draft_layers)
        config = RunnerConfig(
            device="cpu" if smoke else "cuda",
            kernels="torch" if smoke else "triton",
            async_scheduling=False,
            uva=not smoke,
            cudagraph_mode="none" if smoke else mode,
            max_num_seqs=max(batches),
            max_num_reqs=2 * max(batches),
            max_num_batched_tokens=8192,
            max_model_len=prompt + output + 1,
            num_kv_blocks=256 if smoke else None,
            spec_decode=spec,
        )
        engine = Engine(config, ModelSpec(preset=preset))
        if engine.runner.drafter is not None:
            engine.bench_timers = (
                DeviceTimer(engine.runner.drafter, "run"),
                DeviceTimer(engine.runner, "queue_step"),
            )
        for b in batches:
            r = {"config": name, "cudagraph_mode": config.cudagraph_mode}
            r |= run_batch(engine, b, f"{name}{b}", prompt, output)
            results.append(r)
            print(
                f"{name:22} batch {b:3d}: TPOT {r['tpot_ms']:7.2f} ms {r['tok_s']:9,.0f} tok/s "
                f"acceptance {r['mean_acceptance_length']} replays {r['replays']} "
                f"draft/step ms {r.get('draft_ms')} / {r.get('step_ms')}",
                flush=True,
            )
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and not smoke else "cpu"
    write_results(args.out, {"preset": preset, "prompt_len": prompt, "output_len": output}, results)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results, preset, device))


if __name__ == "__main__":
    main()
