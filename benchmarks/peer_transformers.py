"""Our runner against Hugging Face transformers on the same shapes and workloads, in one process.

For each preset both sides hold random bf16 weights on the GPU (one side at a time): ours is the
preset drawn by seed; transformers' is the same architecture built from the preset's
``ModelArgs.to_hf_config()`` with its own random init. EOS is ignored on both sides, so both
produce the same number of tokens (checked). Our engine runs the MRV2 fast path: Triton kernels,
async scheduling, staged writes, UVA, CUDA graphs (``--cudagraph-mode``).

(a) decode: batch 1, a 128-token prompt, 512 new tokens. transformers: ``generate`` with
    ``cache_implementation="static"`` and the decode forward compiled (recent versions compile it
    themselves inside ``generate``; older ones get ``torch.compile(mode="reduce-overhead")``).
    Its first call compiles (reported apart, as first-call time minus the timed call), then a
    warm call, then the timed calls. TPOT on both sides = (T(N) - T(1)) / (N - 1), where T(1)
    is a call that makes one token (prefill and first token) and each T the median of ``--reps``.
(b) batch: 64 prompts of 128-512 tokens (uniform), 256 new tokens each. transformers:
    ``generate_batch`` (its continuous batching API), or left-padded ``generate`` where it is
    missing or fails (said in the output). A warm call, then a timed call; output tokens/s.

    python benchmarks/peer_transformers.py --preset llama-1b --preset llama-3-8b --out peer.json
    python benchmarks/peer_transformers.py --cpu-smoke     # llama-tiny on the CPU, seconds
"""

from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from bench_io import write_results

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model.checkpoint_args import model_args_for
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.shipped import SHIPPED, require_shipped


@dataclass(frozen=True)
class Workloads:
    decode_prompt: int = 128
    decode_new: int = 512
    batch_prompts: int = 64
    batch_prompt_min: int = 128
    batch_prompt_max: int = 512
    batch_new: int = 256
    reps: int = 2
    seed: int = 0

    def prompts(self, vocab: int, offset: int = 0) -> tuple[list[int], list[list[int]]]:
        """The decode prompt and the batch prompts, the same token ids for both sides. The warm
        calls take another ``offset``: the same lengths, other tokens, so that no prefix cache
        serves the timed call."""
        lens = np.random.default_rng(self.seed).integers(
            self.batch_prompt_min, self.batch_prompt_max + 1, self.batch_prompts
        )
        rng = np.random.default_rng(self.seed + 1 + offset)
        decode = rng.integers(0, vocab, size=self.decode_prompt).tolist()
        return decode, [rng.integers(0, vocab, size=int(n)).tolist() for n in lens]

    @property
    def max_model_len(self) -> int:
        return max(self.decode_prompt + self.decode_new, self.batch_prompt_max + self.batch_new) + 1


FULL = Workloads()
QUICK = Workloads(decode_new=128, batch_prompts=16, batch_new=64, reps=1)
SMOKE = Workloads(8, 8, 4, 8, 16, 8, reps=1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tpot_ms(t_n: list[float], t_1: list[float], n: int) -> float:
    return (statistics.median(t_n) - statistics.median(t_1)) / (n - 1) * 1e3


# ---- our runner ---------------------------------------------------------------------------------
def build_engine(preset: str, w: Workloads, device: str, dtype: str, graphs: str) -> Engine:
    seqs = w.batch_prompts
    blocks_per_req = -(-w.max_model_len // 16)
    config = RunnerConfig(
        device=device,
        kernels="triton" if device == "cuda" else "torch",
        async_scheduling=device == "cuda",
        staged_writes=True,
        uva=device == "cuda",
        cudagraph_mode=graphs if device == "cuda" else "none",
        max_num_seqs=seqs,
        max_num_reqs=2 * seqs,
        max_num_batched_tokens=8192,
        max_model_len=w.max_model_len,
        block_size=16,
        num_kv_blocks=seqs * blocks_per_req + 16,
        enable_prefix_caching=False,  # generate() has none; the decode calls repeat their prompt
    )
    return Engine(config, ModelSpec(preset=preset, dtype=dtype))


def ours_run(
    engine: Engine, prompts: list[list[int]], new: int, tag: str
) -> tuple[float, int, list[float]]:
    """Wall seconds and output tokens of ``prompts`` run to completion, all submitted at once,
    and the wall ms of each step that only decoded."""
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    t0 = time.perf_counter()
    reqs = [engine.add_request(f"{tag}-{i}", p, params) for i, p in enumerate(prompts)]
    decode_ms = []
    while engine.has_unfinished_requests():
        res = engine.step()
        so = res.scheduler_output
        if so.num_reqs and so.total_num_scheduled_tokens == so.num_reqs:
            decode_ms.append(res.host_ns / 1e6)  # every request decodes one token
    wall = time.perf_counter() - t0
    return wall, sum(len(r.output_token_ids) for r in reqs), decode_ms


def ours_side(preset: str, w: Workloads, device: str, dtype: str, graphs: str) -> dict:
    t0 = time.perf_counter()
    engine = build_engine(preset, w, device, dtype, graphs)
    startup_s = time.perf_counter() - t0
    decode, batch = w.prompts(engine.vocab_size)
    warm_batch = w.prompts(engine.vocab_size, offset=1)[1]
    t_1, t_n, steps_ms = [], [], []
    for rep in range(w.reps + 1):  # the first of each is a warm call
        wall_1, _, _ = ours_run(engine, [decode], 1, f"one{rep}")
        wall_n, tokens_n, decode_ms = ours_run(engine, [decode], w.decode_new, f"dec{rep}")
        if rep:
            t_1.append(wall_1)
            t_n.append(wall_n)
            steps_ms += decode_ms
    ours_run(engine, warm_batch, w.batch_new, "warm")
    batch_s, batch_tokens, _ = ours_run(engine, batch, w.batch_new, "batch")
    out = {
        "startup_s": startup_s,
        "decode_tpot_ms": tpot_ms(t_n, t_1, w.decode_new),
        "decode_step_ms_p50": statistics.median(steps_ms) if steps_ms else None,
        "decode_call_s": statistics.median(t_n),
        "decode_tokens": tokens_n,
        "batch_s": batch_s,
        "batch_tokens": batch_tokens,
        "batch_tok_s": batch_tokens / batch_s,
        "graph_usage": engine.graph_usage(),
        "notes": list(engine.info.notes),
    }
    del engine
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


# ---- Hugging Face transformers ------------------------------------------------------------------
def build_hf(preset: str, device: torch.device, dtype: torch.dtype):
    """The preset's architecture as a transformers model, random weights drawn on ``device``; a
    shipped real model is the same GGUF file, loaded (and dequantized) by transformers."""
    import transformers

    if preset in SHIPPED:
        path = require_shipped(preset)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=dtype
        )
        model = model.to(device=device).eval().requires_grad_(False)
        gen = model.generation_config
        gen.eos_token_id, gen.pad_token_id, gen.do_sample = None, 0, False
        return model

    cfg = {**PRESETS[preset].to_hf_config(), "eos_token_id": None, "pad_token_id": 0}
    hf_config = transformers.AutoConfig.for_model(**cfg)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(hf_config, torch_dtype=dtype)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():  # the same init rule as our presets, so neither side sees odd values
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.do_sample = None, 0, False
    return model


def hf_generate(model, ids: torch.Tensor, new: int, **kwargs) -> tuple[float, int]:
    sync(ids.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
    sync(ids.device)
    return time.perf_counter() - t0, int(out.shape[0] * (out.shape[1] - ids.shape[1]))


def hf_decode(model, prompt: list[int], w: Workloads, compile_: bool) -> dict:
    device = model.device
    ids = torch.tensor([prompt], device=device)
    notes = []
    if not compile_:
        notes.append("transformers: decode forward not compiled (CPU)")
    elif hasattr(model, "_valid_auto_compile_criteria"):
        notes.append("transformers: generate compiles the static-cache decode forward itself")
    else:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        notes.append("transformers: forward torch.compile(mode='reduce-overhead', fullgraph=True)")
    static = {"cache_implementation": "static"}
    t_1 = [hf_generate(model, ids, 1, **static)[0] for _ in range(w.reps + 1)][1:]
    first_s, _ = hf_generate(model, ids, w.decode_new, **static)  # compiles
    hf_generate(model, ids, w.decode_new, **static)  # warm
    runs = [hf_generate(model, ids, w.decode_new, **static) for _ in range(w.reps)]
    model.__dict__.pop("forward", None)  # generate_batch gets the plain forward back
    t_n = [r[0] for r in runs]
    return {
        "decode_tpot_ms": tpot_ms(t_n, t_1, w.decode_new),
        "decode_call_s": statistics.median(t_n),
        "decode_first_call_s": first_s,
        "decode_compile_s": first_s - statistics.median(t_n),
        "decode_tokens": runs[-1][1],
        "notes": notes,
    }


def hf_generate_batch(model, prompts: list[list[int]], new: int) -> tuple[float, int]:
    """One timed ``generate_batch`` call: wall seconds and generated tokens. The manager (its KV
    cache, its CUDA graphs) persists from the warm call to the timed one where that is an
    option. On the CPU its KV cache is kept small and its CUDA-graph warm-up skipped."""
    import transformers
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    accepted = inspect.signature(model.generate_batch).parameters
    wanted = {"progress_bar": False, "persistent_manager": True}
    config_cls = getattr(transformers, "ContinuousBatchingConfig", None)
    if model.device.type != "cuda" and config_cls is not None:  # sized from GPU memory otherwise
        wanted["warmup"] = False
        wanted["continuous_batching_config"] = config_cls(num_blocks=16, max_batch_tokens=256)
    extra = {k: v for k, v in wanted.items() if k in accepted}
    sync(model.device)
    t0 = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=gen, **extra)
    sync(model.device)
    wall = time.perf_counter() - t0
    errors = [o.error for o in results.values() if getattr(o, "error", None)]
    if errors:
        raise RuntimeError(f"generate_batch request failed: {errors[0]}")
    return wall, sum(len(o.generated_tokens) for o in results.values())


def hf_padded_generate(model, prompts: list[list[int]], new: int) -> tuple[float, int]:
    """All prompts as one left-padded batch through ``generate`` (dynamic cache, eager)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    sync(model.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    sync(model.device)
    return time.perf_counter() - t0, int(out.shape[0] * (out.shape[1] - width))


def hf_batch(
    model, prompts: list[list[int]], warm: list[list[int]], w: Workloads, padded: bool
) -> dict:
    import transformers

    notes, api = [], "generate_batch"
    if padded:
        api = "padded generate"
        notes.append("--hf-padded: left-padded generate() instead of generate_batch")
    elif not hasattr(model, "generate_batch"):
        api = "padded generate"
        notes.append(
            f"transformers {transformers.__version__} has no generate_batch: "
            "left-padded generate() instead (not continuous batching)"
        )
    else:
        try:
            hf_generate_batch(model, warm, w.batch_new)
            wall, tokens = hf_generate_batch(model, prompts, w.batch_new)
        except Exception as exc:
            api = "padded generate"
            message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            notes.append(f"generate_batch failed ({message}): left-padded generate() instead")
        finally:
            if hasattr(model, "destroy_cached_continuous_batching_manager"):
                model.destroy_cached_continuous_batching_manager()
    if api != "generate_batch":
        hf_padded_generate(model, warm, w.batch_new)
        wall, tokens = hf_padded_generate(model, prompts, w.batch_new)
    return {
        "batch_api": api,
        "batch_s": wall,
        "batch_tokens": tokens,
        "batch_tok_s": tokens / wall,
        "notes": notes,
    }


def hf_side(
    preset: str, w: Workloads, device: torch.device, dtype: torch.dtype, padded: bool
) -> dict:
    import transformers

    t0 = time.perf_counter()
    model = build_hf(preset, device, dtype)
    sync(device)
    out = {"transformers": transformers.__version__, "startup_s": time.perf_counter() - t0}
    vocab = model_args_for(ModelSpec(preset=preset)).vocab_size
    decode, batch = w.prompts(vocab)
    d = hf_decode(model, decode, w, compile_=device.type == "cuda")
    b = hf_batch(model, batch, w.prompts(vocab, offset=1)[1], w, padded)
    out.update({**d, **b, "notes": d["notes"] + b["notes"]})
    del model
    torch._dynamo.reset()  # the compiled decode and its graphs hold the model otherwise
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


# ---- report -------------------------------------------------------------------------------------
def compare(preset: str, w: Workloads, ours: dict, hf: dict) -> dict:
    for what in ("decode_tokens", "batch_tokens"):
        if ours[what] != hf[what]:
            hf["notes"].append(f"{what} differ: ours {ours[what]}, transformers {hf[what]}")
    row = {
        "preset": preset,
        "workloads": w.__dict__,
        "ours": ours,
        "hf": hf,
        "decode_tpot_ratio": ours["decode_tpot_ms"] / hf["decode_tpot_ms"],
        "batch_tok_s_ratio": ours["batch_tok_s"] / hf["batch_tok_s"],
    }
    print(
        f"{preset}: decode b=1 {w.decode_prompt}+{w.decode_new}: TPOT ours "
        f"{ours['decode_tpot_ms']:.2f} ms, transformers {hf['decode_tpot_ms']:.2f} ms "
        f"(compile {hf['decode_compile_s']:.1f} s) -> ours/HF {row['decode_tpot_ratio']:.2f}x\n"
        f"{preset}: batch {w.batch_prompts} x {w.batch_new}: ours {ours['batch_tok_s']:,.0f} "
        f"tok/s, transformers {hf['batch_api']} {hf['batch_tok_s']:,.0f} tok/s -> "
        f"{row['batch_tok_s_ratio']:.1f}x",
        flush=True,
    )
    for note in hf["notes"]:
        print(f"  note: {note}")
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| preset | TPOT ours ms | TPOT HF ms | ours/HF | HF compile s | ours tok/s | HF tok/s "
        "| HF API | ours/HF |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        o, h = r["ours"], r["hf"]
        lines.append(
            f"| {r['preset']} | {o['decode_tpot_ms']:.2f} | {h['decode_tpot_ms']:.2f} | "
            f"{r['decode_tpot_ratio']:.2f}x | {h['decode_compile_s']:.1f} | "
            f"{o['batch_tok_s']:,.0f} | {h['batch_tok_s']:,.0f} | {h['batch_api']} | "
            f"{r['batch_tok_s_ratio']:.1f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--preset",
        action="append",
        choices=sorted(PRESETS) + sorted(SHIPPED),
        help="repeatable; a shipped real model (smollm2-135m): both sides load its GGUF",
    )
    ap.add_argument("--quick", action="store_true", help="128 decode tokens, 16 x 64 batch, 1 rep")
    ap.add_argument("--cpu-smoke", action="store_true", help="llama-tiny on the CPU, tiny sizes")
    ap.add_argument("--reps", type=int, default=None, help="timed decode calls per side")
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise", help="our engine's graphs")
    ap.add_argument(
        "--hf-padded", action="store_true", help="left-padded generate() for transformers' batch"
    )
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()
    if args.cpu_smoke:
        w, presets, device, dtype = SMOKE, args.preset or ["llama-tiny"], "cpu", "float32"
        torch.set_num_threads(1)  # tiny matrices: more threads only contend
    else:
        if not torch.cuda.is_available():
            raise SystemExit("peer_transformers: needs a CUDA device (or --cpu-smoke)")
        w, presets, device, dtype = QUICK if args.quick else FULL, args.preset, "cuda", "bfloat16"
        presets = presets or ["llama-1b"]
    if args.reps is not None:
        w = Workloads(**{**w.__dict__, "reps": args.reps})
    t_dtype = getattr(torch, dtype)
    rows = []
    for preset in presets:
        t0 = time.perf_counter()
        ours = ours_side(preset, w, device, dtype, args.cudagraph_mode)
        hf = hf_side(preset, w, torch.device(device), t_dtype, args.hf_padded)
        rows.append(compare(preset, w, ours, hf))
        print(f"{preset}: {time.perf_counter() - t0:.0f} s for both sides", flush=True)
    print(markdown(rows))
    meta = {"dtype": dtype, "cudagraph_mode": args.cudagraph_mode, "quick": args.quick,
            "hf_padded": args.hf_padded}  # fmt: skip
    write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
