"""Speculative decoding with a draft model on the GPU, Triton kernels and CUDA graphs:
self-speculation (llama-tiny's first layer) and the separate tiny draft give plain decoding's
greedy tokens (float32, as the n-gram GPU test: a verify's multi-token forward and a decode's
agree to the argmax), every draft round replays the fused draft graph (no eager round, a replay
counted per key, the captures timed), and sampled requests run through the sampled graphs."""

from __future__ import annotations

import pytest
import torch
from test_spec_decode_gpu import generate, make_engine

from mrv2_prof.runner.config import SpecDecodeConfig
from mrv2_prof.runner.core.request import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def draft(k: int, **source) -> SpecDecodeConfig:
    return SpecDecodeConfig(method="draft_model", num_speculative_tokens=k, **source)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "spec",
    [
        draft(2, draft_target_layers=1),
        draft(4, draft_target_layers=1),
        draft(2, draft_preset="llama-tiny-draft"),
    ],
    ids=["self-k2", "self-k4", "preset-k2"],
)
def test_greedy_tokens_equal_plain_decoding_and_the_draft_graph_replays(spec, async_scheduling):
    plain = generate(make_engine(SpecDecodeConfig(), async_scheduling=async_scheduling))
    engine = make_engine(spec, async_scheduling=async_scheduling)
    assert generate(engine) == plain
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts > 0
    if spec.draft_target_layers is not None:
        assert stats.num_accepted_tokens > 0
    drafter = engine.runner.drafter
    graphs = drafter.graphs
    assert graphs is not None and engine.runner.info.draft_capture_s > 0
    assert drafter.num_eager == 0, drafter.notes
    assert sum(graphs.replays.values()) > 0
    assert {k for _, k, _, _ in graphs.replays} == {spec.num_speculative_tokens}
    # the decode steps' catch-up ran inside the draft graph (q = 1)
    assert any(q == 1 and n > 0 for (*_, q), n in graphs.replays.items()), graphs.replays
    assert sum(engine.runner.graphs.replays.values()) > 0  # the target's graphs too


def test_sampled_requests_replay_the_sampled_draft_graph():
    engine = make_engine(draft(2, draft_target_layers=1))
    for i in range(4):
        params = SamplingParams(temperature=0.8, seed=i, max_tokens=24)
        engine.add_request(f"s{i}", [5, 6, 7, 8] * 3, params, float(i))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.info.num_kv_blocks
    drafter = engine.runner.drafter
    assert drafter.num_eager == 0
    assert any(sampled for _, _, sampled, _ in drafter.graphs.replays)
    assert engine.scheduler.spec.stats.num_drafts > 0
