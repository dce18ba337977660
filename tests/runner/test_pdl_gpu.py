"""Programmatic dependent launch on a Hopper GPU: an engine whose model kernels are launched with
PDL (``runner.pdl``) serves the same tokens with the same logprobs, bit for bit, as one
launched without it (PDL changes when a kernel starts, never its arithmetic; a kernel that read
its input before the kernel writing it had finished would differ). llama-1b's sizes, random
weights, in bfloat16, through CUDA graphs: a batch-1 request, then four together, with the
batch-1 GEMV plain and fused (one-pass norm), with split-KV attention forced, and with RoPE
folded into decode attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model import attention_split_kv_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="needs a Hopper GPU or later",
    ),
]

CONFIG = RunnerConfig(
    device="cuda",
    max_num_reqs=8,
    max_num_seqs=4,
    max_model_len=512,
    num_kv_blocks=128,
    kernels="triton",
    cudagraph_mode="full_and_piecewise",
    cudagraph_capture_sizes=(1, 2, 4),
)


def _serve(config: RunnerConfig) -> list[tuple[list[int], list]]:
    engine = Engine(config, ModelSpec(preset="llama-1b"))
    try:
        params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=3)
        first = engine.add_request("alone", list(range(100, 400)), params)
        while engine.has_unfinished_requests():
            engine.step()
        rest = [
            engine.add_request(f"r{i}", list(range(7 * i, 7 * i + 40 + 30 * i)), params)
            for i in range(4)
        ]
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.close()
    return [(r.output_token_ids, r.output_logprobs) for r in [first, *rest]]


@pytest.mark.parametrize(
    ("decode_gemv", "splits", "fold"),
    [("plain", None, False), ("fused_onepass", None, False), ("plain", 4, False),
     ("fused_onepass", None, True), ("plain", 4, True)],
)  # fmt: skip
def test_gpu_pdl_serves_the_same_tokens_and_logprobs(monkeypatch, decode_gemv, splits, fold):
    monkeypatch.setattr(attention_split_kv_triton, "FORCED_SPLITS", splits)
    config = dataclasses.replace(CONFIG, decode_gemv=decode_gemv, rope_in_attention=fold)
    without = _serve(dataclasses.replace(config, pdl=False))  # auto (the default) takes it
    with_pdl = _serve(dataclasses.replace(config, pdl=True))
    assert [len(t) for t, _ in with_pdl] == [24] * 5
    assert with_pdl == without
