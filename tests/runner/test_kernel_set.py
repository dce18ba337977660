"""Kernel selection (``runner.kernels``) and the Triton path against the torch references."""

from __future__ import annotations

import random

import pytest
import torch

from mrv2_prof.runner.config import ConfigError, ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker.kernel_set import TORCH, resolve_kernels


def cfg(**kw) -> RunnerConfig:
    base = dict(
        max_num_reqs=32,
        max_num_seqs=12,
        max_num_batched_tokens=48,
        max_model_len=256,
        block_size=8,
        num_kv_blocks=40,
        kernels="torch",
        async_scheduling=False,
        uva=False,
        cudagraph_mode="none",
    )
    base.update(kw)
    return RunnerConfig(**base)


def test_torch_is_the_reference_set_and_triton_needs_cuda():
    assert resolve_kernels("torch", is_cuda=True) == (TORCH, None)
    kernels, note = resolve_kernels("triton", is_cuda=False)
    assert kernels is TORCH and note and "CUDA device" in note


def test_triton_on_cpu_is_a_note_or_under_strict_an_error():
    engine = Engine(cfg(device="cpu", kernels="triton"), ModelSpec(preset="llama-tiny"))
    assert engine.runner.kernels is TORCH
    assert any(n.startswith("runner.kernels: triton") for n in engine.info.notes)
    with pytest.raises(ConfigError, match=r"runner.kernels.*strict"):
        Engine(cfg(device="cpu", kernels="triton", strict=True), ModelSpec(preset="llama-tiny"))


def drive(engine: Engine, seed: int, params: list[SamplingParams]) -> dict[str, list[int]]:
    """A seeded workload with staggered arrivals, chunked prefill, preemption and two aborts."""
    rng = random.Random(seed)
    vocab = engine.vocab_size
    prompts = {
        f"r{i}": [rng.randrange(vocab) for _ in range(rng.randint(1, 90))] for i in range(20)
    }
    arrivals = {rid: i // 3 for i, rid in enumerate(prompts)}  # three requests per step
    aborts = {7: "r2", 15: "r9"}
    requests = {}
    step = 0
    while step < 2000:
        for rid, at in arrivals.items():
            if at == step:
                p = params[int(rid[1:]) % len(params)]
                requests[rid] = engine.add_request(rid, prompts[rid], p, arrival_time=float(step))
        if step in aborts:
            engine.abort_request(aborts[step])
        if not engine.has_unfinished_requests() and step > max(arrivals.values()):
            break
        engine.step()
        step += 1
    assert engine.scheduler.num_preemptions > 0  # the small KV pool forced some
    return {rid: r.output_token_ids for rid, r in requests.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("staged_writes", [True, False])
def test_triton_and_torch_kernels_give_identical_tokens_fp32(staged_writes):
    """fp32 model: greedy and seeded sampling (temperature, top-k, top-p, logprobs) give the same
    tokens with the Triton kernels as with the torch references, through chunked prefill,
    preemption and aborts."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    params = [
        SamplingParams(max_tokens=24, ignore_eos=True),
        SamplingParams(max_tokens=17, temperature=0.8, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=1.0, top_k=20, top_p=0.9, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=0.7, top_p=0.5, logprobs=3, ignore_eos=True),
    ]
    spec = ModelSpec(preset="llama-tiny", dtype="float32")
    out = {}
    for kernels in ("torch", "triton"):
        engine = Engine(cfg(device="cuda", kernels=kernels, staged_writes=staged_writes), spec)
        assert engine.runner.kernels.name == kernels
        out[kernels] = drive(engine, seed=3, params=params)
    assert out["triton"] == out["torch"]


def test_the_whole_triton_path_in_the_interpreter_matches_torch(monkeypatch):
    """CPU, TRITON_INTERPRET=1: the engine with every Triton kernel forced in (warm-up included)
    gives the torch path's tokens, greedy and seeded, through chunked prefill and preemption."""
    if torch.cuda.is_available():
        pytest.skip("the GPU version is the test above")
    import mrv2_prof.runner.worker.model_runner as model_runner
    from mrv2_prof.runner.worker.kernel_set import triton_kernels

    params = [
        SamplingParams(max_tokens=6, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=0.9, top_k=30, top_p=0.8, seed=5, ignore_eos=True),
    ]
    spec = ModelSpec(preset="llama-tiny")
    prompts = {f"r{i}": list(range(3 + 11 * i, 8 + 21 * i)) for i in range(6)}  # 5..55 tokens
    out = {}
    for kernels in ("torch", "triton"):
        if kernels == "triton":
            monkeypatch.setattr(
                model_runner, "resolve_kernels", lambda r, c: (triton_kernels(), None)
            )
        engine = Engine(
            cfg(device="cpu", kernels=kernels, max_model_len=96, num_kv_blocks=12), spec
        )
        assert engine.runner.kernels.name == kernels
        assert (engine.info.warmup_s > 0) == (kernels == "triton")
        reqs = {
            rid: engine.add_request(rid, ids, params[i % 2], arrival_time=float(i))
            for i, (rid, ids) in enumerate(prompts.items())
        }
        while engine.has_unfinished_requests():
            engine.step()
        assert engine.scheduler.num_preemptions > 0
        out[kernels] = {rid: r.output_token_ids for rid, r in reqs.items()}
    assert out["triton"] == out["torch"]
