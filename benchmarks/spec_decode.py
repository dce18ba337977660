"""Speculative decoding against none: TPOT, tok/s and engine steps, async scheduling on and off.

At batch 1, 8 and 64, for spec decode off, n-gram k = 2 and 4 (and k = 4 with host drafts),
self-draft k = 2 and 4 (the target's first ``--self-draft-layers`` layers as the draft model, its
k steps one fused draft graph), and dynamic k under FULL and PIECEWISE graphs.

Workloads (``--workload``):

* ``repeat`` (the default for a real model, ``--preset smollm2-135m``): chat prompts asking the
  model to repeat a text of the shipped dataset word for word (benchmarks/repeat_prompts.py: the
  dataset's human turns of 200-1200 characters, each once, in a seeded order), encoded with the
  model's chat template; greedy, at most ``--output`` (128) tokens, EOS honoured. The answer
  repeats the prompt, so an n-gram drafter's drafts are right wherever the model repeats it.
  Batch B takes the set's first B prompts (from the start again past its end). A random-weight
  preset (llama-1b) has no tokenizer and cannot take it.
* ``random`` (the default for a random-weight preset, and the CPU smoke run): B prompts each a
  random 8-token segment repeated to 128 tokens (so the n-gram drafter finds drafts with random
  weights), 64 output tokens, EOS ignored.

Each configuration is one engine per async mode (``--async-modes``; Triton kernels, staged
writes, UVA, CUDA graphs) running the batches in turn. Drafts are made and kept on the device
(``draft_on: auto``): the scheduler gives a speculating request 1 + k slots every step without
waiting for its last tokens, so under async scheduling no request sits out a step. The
``ngram k=4, host drafts`` row is the old path (``draft_on: host``): drafts from the host's token
history, so under async scheduling a speculating request sits out every other step (its sat-out
column). Dynamic k takes k by batch size (``DYNAMIC_K``) and is adaptive (its default): the
measured acceptance and step times turn a step's k to 0 where speculation does not pay.

Per (configuration, async mode, batch):

* TPOT: the mean over requests of (last token time - first token time) / (tokens - 1), from the
  host times at which each step's tokens were known; ``TPOT / off``: over the ``off`` row's of
  the same async mode and batch.
* tok/s: all output tokens over the wall time from the first decode step to the end; out tokens:
  the output tokens generated (EOS may end a request before ``--output``).
* steps: the engine steps of the batch, first to last (prefill included); ``steps / off``: steps
  per output token over the ``off`` row's (same async mode and batch), i.e. the ratio of steps
  for the same tokens (steps over off's steps when both generate the same tokens).
* sat-out: requests that sat out a step, summed over the steps (``scheduler.spec.num_sat_out``).
* mean acceptance length: 1 + accepted drafts / verifies with drafts; the JSON adds the accepted
  drafts per position, where the drafts were made (``drafts_on``) and the placeholder draft slots
  verified (``num_padded_slots``).
* k-off steps: the steps adaptive dynamic k turned off (``engine.adaptive.num_off``).
* the graph modes replayed, and for a draft model its device time against the step's
  (``draft_ms``, ``step_ms`` per step: CUDA events around the draft model's work and around the
  whole queued step, so ``draft_share`` is what the draft costs of each step; host time on the
  CPU).

Dynamic k under FULL (every (batch, 1 + k) captured, ``cudagraph_mode: full_and_piecewise``; the
verifies of a uniform decode batch padded to one k) against ``cudagraph_mode: piecewise``
(nothing padded) is the comparison of vLLM's DSD full-CUDA-graph change. ``--markdown`` writes
one table per async mode for benchmarks/RESULTS.md. Beside this script: the configurations
(``spec_decode_configs.py``), one batch through an engine (``spec_decode_batch.py``) and the
markdown (``spec_decode_table.py``).

    python benchmarks/spec_decode.py --preset smollm2-135m --quick --out spec.json \\
        --markdown spec.md
    python benchmarks/spec_decode.py --preset llama-1b --out spec.json --markdown spec.md
    python benchmarks/spec_decode.py --cpu-smoke --out smoke.json   # the CI smoke run
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import replace

import torch
from bench_io import environment, write_results
from repeat_prompts import repeat_prompts
from spec_decode_batch import SEGMENT, DeviceTimer, random_prompts, run_batch
from spec_decode_configs import CONFIGS, QUICK, k_values
from spec_decode_table import markdown

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.shipped import SHIPPED

PROMPT = 128  # the random workload's prompts (their segment: spec_decode_batch.SEGMENT)
OUTPUT = {"repeat": 128, "random": 64}  # --output's default
# --self-draft-layers' default: of llama-1b's 16 layers, of SmolLM2-135M's 30 (CPU smoke: 1)
SELF_DRAFT_LAYERS = {"llama-1b": 4, "smollm2-135m": 8}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-1b", choices=sorted(PRESETS) + sorted(SHIPPED))
    ap.add_argument(
        "--workload",
        choices=("repeat", "random"),
        default=None,
        help="repeat: chat prompts whose answer repeats the prompt (a real model; its default); "
        "random: repetitive random-token prompts, EOS ignored (a random-weight preset's default)",
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--configs", nargs="+", default=None, choices=list(CONFIGS))
    ap.add_argument(
        "--async-modes",
        choices=("both", "on", "off"),
        default=None,
        help="async scheduling on, off or both, each one engine per configuration "
        "(default: both; off for --cpu-smoke)",
    )
    ap.add_argument("--output", type=int, default=None, help="most output tokens per request")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"only {'; '.join(QUICK)}, at batch 1, 8 and 64",
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    ap.add_argument("--markdown", default=None, help="write the results table here")
    ap.add_argument("--cpu-smoke", action="store_true", help="llama-tiny on the CPU, tiny sizes")
    ap.add_argument(
        "--self-draft-layers",
        type=int,
        default=None,
        help="the self-draft's layers (default: 4 of llama-1b's 16, 8 of smollm2-135m's 30)",
    )
    args = ap.parse_args()
    smoke = args.cpu_smoke
    cuda = not smoke and args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("spec_decode: needs a CUDA device (or --device cpu, or --cpu-smoke)")
    preset = "llama-tiny" if smoke else args.preset
    shipped = preset in SHIPPED
    workload = args.workload or ("repeat" if shipped else "random")
    if workload == "repeat" and not shipped:
        raise SystemExit(
            f"spec_decode: --workload repeat needs a real model with a tokenizer "
            f"({', '.join(SHIPPED)}); {preset} has random weights and none: use --workload random"
        )
    if args.quick:
        names, batches = list(QUICK), [1, 8, 64]
    else:
        names, batches = list(CONFIGS), args.batches
    names = args.configs or names
    batches = [1, 2] if smoke else batches
    modes = {"both": [True, False], "on": [True], "off": [False]}[
        args.async_modes or ("off" if smoke else "both")
    ]
    layers = args.self_draft_layers or SELF_DRAFT_LAYERS.get(preset, 4)
    layers = 1 if smoke else layers
    output = args.output or (24 if smoke else OUTPUT[workload])
    model = ModelSpec(preset=preset)
    if shipped:
        from mrv2_prof.cli.fetch import ensure_shipped

        ensure_shipped(preset)
    if workload == "repeat":
        prompt_set = repeat_prompts(model)
        lens = sorted(map(len, prompt_set))
        prompts_of = {b: [prompt_set[i % len(prompt_set)] for i in range(b)] for b in batches}
        max_prompt = max(len(p) for ps in prompts_of.values() for p in ps)
        described = (
            f"{len(prompt_set)} chat prompts, 'repeat the following text exactly' over the "
            f"dataset's texts of 200-1200 characters ({lens[0]}-{lens[-1]} tokens, median "
            f"{lens[len(lens) // 2]}); batch B takes the first B"
        )
        params = SamplingParams(max_tokens=output, ignore_eos=False)
    else:
        prompt = 32 if smoke else PROMPT
        prompts_of, max_prompt = None, prompt
        described = f"B prompts of a random {SEGMENT}-token segment repeated to {prompt} tokens"
        params = SamplingParams(max_tokens=output, ignore_eos=True)
    # room for the verify slots a request near its end is given: with async scheduling its
    # slots in flight count as accepted until they are back, so a verify near max_model_len is
    # not padded to its k (a shape without a FULL graph: eager attention, a compile)
    max_model_len = max_prompt + output + 1 + 2 * max(spec.max_k for spec, _ in CONFIGS.values())
    results = []
    for name in names:
        spec, mode = CONFIGS[name]
        if spec.draft_target_layers is not None:
            spec = replace(spec, draft_target_layers=layers)
        for async_on in modes:
            config = RunnerConfig(
                device="cuda" if cuda else "cpu",
                kernels="triton" if cuda else "torch",
                async_scheduling=async_on,
                uva=cuda,
                cudagraph_mode=mode if cuda else "none",
                max_num_seqs=max(batches),
                max_num_reqs=2 * max(batches),
                max_num_batched_tokens=8192,
                max_model_len=max_model_len,
                num_kv_blocks=None if cuda else max(256, max(batches) * -(-max_model_len // 16)),
                enable_prefix_caching=False,  # each batch's prefill computed, as the first time
                spec_decode=spec,
            )
            engine = Engine(config, model)
            if engine.runner.drafter is not None:
                engine.bench_timers = (
                    DeviceTimer(engine.runner.drafter, "run"),
                    DeviceTimer(engine.runner, "queue_step"),
                )
            for b in batches:
                if prompts_of is not None:
                    prompts = prompts_of[b]
                else:
                    prompts = random_prompts(b, engine.vocab_size, max_prompt)
                r = {"config": name, "async_scheduling": async_on}
                r["cudagraph_mode"] = config.cudagraph_mode
                r |= run_batch(engine, prompts, f"{name}{int(async_on)}-{b}", params)
                results.append(r)
                tpot = "-" if r["tpot_ms"] is None else f"{r['tpot_ms']:7.2f}"
                mal = r["mean_acceptance_length"]
                print(
                    f"{name:22} async {'on ' if async_on else 'off'} batch {b:3d}: TPOT {tpot} ms "
                    f"{r['tok_s']:9,.0f} tok/s {r['output_tokens']:6d} tokens "
                    f"{r['steps']:5d} steps sat-out {r['sat_out']:5d} acceptance "
                    f"{'-' if mal is None else f'{mal:.2f}'} {r['accepted_per_position']} "
                    f"k-off {r['k_off_steps']} drafts {r['drafts_on']} replays {r['replays']} "
                    f"draft/step ms {r.get('draft_ms')} / {r.get('step_ms')}",
                    flush=True,
                )
            del engine
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    env = environment()
    if not cuda:
        env["device"] = "cpu"
    meta = {
        "preset": preset,
        "workload": workload,
        "prompts": described,
        "prompt_len": max_prompt,
        "output_len": output,
        "eos": "EOS honoured" if workload == "repeat" else "EOS ignored",
        "ks": k_values(names, layers),
        "self_draft_layers": layers,
    }
    write_results(args.out, {**meta, "device": env["device"]}, results)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results, {**meta, "env": env}))


if __name__ == "__main__":
    main()
