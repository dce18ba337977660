"""Speculative decoding on the GPU with the Triton kernels and CUDA graphs: greedy tokens equal
plain decoding's (float32, so that a verify's multi-token forward and a decode's agree to the
last bit of the argmax), and under ``dynamic_k`` every uniform step — a decode, or a verify in
which every request verifies the step's k — replays a FULL graph."""

from __future__ import annotations

import random

import pytest
import torch

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.spec_decode.config import SpecDecodeConfig
from mrv2_prof.runner.worker.cudagraph_manager import BatchDescriptor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DYNAMIC = SpecDecodeConfig(method="ngram", num_speculative_tokens=4, dynamic_k=((2, 4), (6, 2)))


def make_engine(spec: SpecDecodeConfig, **runner) -> Engine:
    cfg = dict(
        device="cuda",
        max_num_reqs=32,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=256,
        block_size=16,
        num_kv_blocks=512,
        kernels="triton",
        async_scheduling=False,
        cudagraph_mode="full_and_piecewise",
    )
    cfg.update(runner)
    return Engine(
        RunnerConfig(**cfg, spec_decode=spec), ModelSpec(preset="llama-tiny", dtype="float32")
    )


def generate(engine: Engine, n: int = 8, max_tokens: int = 40) -> dict[str, list[int]]:
    rng = random.Random(3)
    reqs = {}
    for i in range(n):
        seg = [rng.randrange(engine.vocab_size) for _ in range(4 + i % 4)]
        params = SamplingParams(max_tokens=max_tokens - 3 * i)
        reqs[f"r{i}"] = engine.add_request(f"r{i}", seg * 4, params, float(i))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.info.num_kv_blocks
    return {rid: r.output_token_ids for rid, r in reqs.items()}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "spec",
    [SpecDecodeConfig(method="ngram", num_speculative_tokens=k) for k in (1, 2, 4)] + [DYNAMIC],
    ids=["k1", "k2", "k4", "dynamic"],
)
def test_greedy_tokens_equal_plain_decoding_with_triton_and_graphs(spec, async_scheduling):
    plain = generate(make_engine(SpecDecodeConfig(), async_scheduling=async_scheduling))
    engine = make_engine(spec, async_scheduling=async_scheduling)
    assert generate(engine) == plain
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    assert sum(engine.runner.graphs.replays.values()) > 0


def test_every_uniform_step_under_dynamic_k_replays_full():
    engine = make_engine(DYNAMIC)
    graphs = engine.runner.graphs
    seen = []
    dispatch = graphs.dispatch

    def recording(batch: BatchDescriptor, needs_hidden=False, verify=False):
        d = dispatch(batch, needs_hidden, verify)
        seen.append((batch, verify, engine.scheduler.spec.k, d))
        return d

    graphs.dispatch = recording
    generate(engine)
    assert {q for q in graphs.verify_keys} == {3, 5}  # k = 2 and 4 were captured
    uniform_verifies = 0
    for batch, verify, k, d in seen:
        q = batch.uniform_query_len
        if q == 1 and not verify:
            assert d.mode == "full", d.reason
        elif verify and q in graphs.verify_keys:  # the step's k, or a k every draft was cut to
            uniform_verifies += q == 1 + k
            assert (d.mode, d.query_len) == ("full", q), d.reason
            assert d.reason.startswith(f"uniform verify k={q - 1}, ")
        elif verify:
            assert d.mode != "full" and "k" in d.reason
    assert uniform_verifies > 0
    assert any(m == "full" and isinstance(key, tuple) for m, key in graphs.replays)
