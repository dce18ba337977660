"""Speculative decoding on the GPU with the Triton kernels and CUDA graphs: greedy tokens (and
logprobs) equal plain decoding's (float32, so that a verify's multi-token forward and a decode's
agree to the last bit of the argmax), and under ``dynamic_k`` every step of a uniform decode
batch replays a FULL graph: a decode its decode graph, a verify the FULL verify graph of the
step's k, its requests padded up to k (placeholder draft slots) when they drafted different
numbers of tokens or none."""

from __future__ import annotations

import random

import pytest
import torch

from mrv2_prof.runner.config import PAD_DRAFT, ModelSpec, RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker.cudagraph_manager import BatchDescriptor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DYNAMIC = SpecDecodeConfig(method="ngram", num_speculative_tokens=4, dynamic_k=((2, 4), (6, 2)))
# the table alone, drafts on the host: the scheduler pads with PAD_DRAFT placeholders
DYNAMIC_HOST = SpecDecodeConfig(
    method="ngram",
    num_speculative_tokens=4,
    dynamic_k=((2, 4), (6, 2)),
    draft_on="host",
    adaptive=False,
)


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


def generate(
    engine: Engine, n: int = 8, max_tokens: int = 40, logprobs: int = 0, full: bool = False
) -> dict:
    """Greedy outputs per request (the requests themselves with ``full``)."""
    rng = random.Random(3)
    reqs = {}
    for i in range(n):
        seg = [rng.randrange(engine.vocab_size) for _ in range(4 + i % 4)]
        params = SamplingParams(max_tokens=max_tokens - 3 * i, logprobs=logprobs)
        reqs[f"r{i}"] = engine.add_request(f"r{i}", seg * 4, params, float(i))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.info.num_kv_blocks
    return reqs if full else {rid: r.output_token_ids for rid, r in reqs.items()}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "spec",
    [SpecDecodeConfig(method="ngram", num_speculative_tokens=k) for k in (1, 2, 4)]
    + [DYNAMIC, DYNAMIC_HOST, SpecDecodeConfig(method="ngram", draft_on="host")],
    ids=["k1", "k2", "k4", "dynamic", "dynamic-host", "k4-host"],
)
def test_greedy_tokens_equal_plain_decoding_with_triton_and_graphs(spec, async_scheduling):
    plain = generate(make_engine(SpecDecodeConfig(), async_scheduling=async_scheduling))
    engine = make_engine(spec, async_scheduling=async_scheduling)
    assert generate(engine) == plain
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    assert sum(engine.runner.graphs.replays.values()) > 0
    assert engine.runner.info.spec_drafts_on == ("host" if spec.draft_on == "host" else "device")


def test_async_device_drafts_never_sit_out_and_take_fewer_steps_on_the_gpu():
    """Async scheduling, Triton kernels, FULL graphs, the device's n-gram kernel: no request
    sits out, every uniform decode step verifies (B, 1 + k) through its FULL verify graph, and
    the run takes fewer engine steps than plain decoding."""

    def run(spec):
        engine = make_engine(spec, async_scheduling=True)
        steps = sat_out = 0
        rng = random.Random(5)
        reqs = []
        for i in range(8):
            seg = [rng.randrange(engine.vocab_size) for _ in range(4 + i % 4)]
            reqs.append(engine.add_request(f"r{i}", seg * 4, SamplingParams(max_tokens=64)))
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
            sat_out += engine.scheduler.spec.num_sat_out if engine.scheduler.spec else 0
        engine.step()  # hands the last finished ids to the runner
        return [r.output_token_ids for r in reqs], steps, sat_out, engine

    plain, plain_steps, _, _ = run(SpecDecodeConfig())
    tokens, steps, sat_out, engine = run(SpecDecodeConfig(method="ngram", num_speculative_tokens=4))
    assert tokens == plain
    assert sat_out == 0
    assert steps < plain_steps, (steps, plain_steps)
    assert any(m == "full" and isinstance(key, tuple) for m, key in engine.runner.graphs.replays)
    assert engine.held_resources() == {"request_slots": 0, "slots_to_release": 0, "kv_blocks": 0}
    print(f"engine steps: {steps} with n-gram k=4 on the device, {plain_steps} plain")


@pytest.mark.parametrize(
    "spec",
    [SpecDecodeConfig(method="ngram", num_speculative_tokens=2), DYNAMIC],
    ids=["k2", "dynamic"],
)
def test_greedy_logprobs_equal_plain_decoding_with_triton_and_graphs(spec):
    """Requests asking for logprobs are speculated; each emitted token's logprob and top-3
    (from its verify row) equal plain decoding's."""
    plain = generate(make_engine(SpecDecodeConfig()), logprobs=3, full=True)
    engine = make_engine(spec)
    got = generate(engine, logprobs=3, full=True)
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    for rid, want in plain.items():
        g = got[rid]
        assert g.output_token_ids == want.output_token_ids, rid
        assert len(g.output_logprobs) == len(want.output_logprobs) == len(g.output_token_ids)
        for i, (ge, we) in enumerate(zip(g.output_logprobs, want.output_logprobs, strict=True)):
            assert [t for t, _ in ge] == [t for t, _ in we], (rid, i)
            torch.testing.assert_close(
                torch.tensor([v for _, v in ge]),
                torch.tensor([v for _, v in we]),
                atol=1e-3,
                rtol=1e-4,
            )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_every_uniform_step_under_dynamic_k_replays_full(async_scheduling):
    """Every step whose requests all decode (before drafting) replays FULL: a plain decode its
    decode graph, a verify its FULL verify graph of the step's k, with every request padded up
    to k (the reasons name k and the padded slots). Without the padding a verify whose
    requests drafted different numbers of tokens fails here."""
    engine = make_engine(DYNAMIC_HOST, async_scheduling=async_scheduling)
    graphs = engine.runner.graphs
    assert set(graphs.verify_keys) == {3, 5}  # k = 2 and 4 were captured
    assert engine.scheduler.spec.pad_capacity == {2: 8, 4: 8}  # the engine pads to them
    queued = []
    queue_step = engine.runner.queue_step

    def queue(so):
        queued.append(so)
        return queue_step(so)

    engine.runner.queue_step = queue
    seen = []
    dispatch = graphs.dispatch

    def recording(batch: BatchDescriptor, needs_hidden=False, verify=False, padded=0):
        d = dispatch(batch, needs_hidden, verify, padded)
        seen.append((queued[-1], verify, padded, d))
        return d

    graphs.dispatch = recording
    generate(engine)
    decodes = verifies = padded_steps = mixed_k = 0
    for so, verify, padded, d in seen:
        spec = so.scheduled_spec_decode_tokens
        decode_batch = not so.scheduled_new_reqs and all(
            n == 1 + len(spec.get(rid, ())) for rid, n in so.num_scheduled_tokens.items()
        )
        if not decode_batch:  # a prefill or a mixed batch: no FULL graph, a reason naming k
            assert not verify or (d.mode != "full" and "k" in d.reason), d.reason
            continue
        if not verify:
            assert (d.mode, d.query_len) == ("full", 1), d.reason
            decodes += 1
            continue
        ks = {len(t) for t in spec.values()}
        assert len(ks) == 1 and set(spec) == set(so.num_scheduled_tokens), so.num_scheduled_tokens
        (k,) = ks
        assert (d.mode, d.query_len) == ("full", 1 + k), d.reason
        assert d.reason.startswith(f"uniform verify k={k}, ")
        verifies += 1
        assert padded == sum(t.count(PAD_DRAFT) for t in spec.values())
        if padded:
            assert d.reason.endswith(f", {padded} of {k * so.num_reqs} draft slots padded")
            padded_steps += 1
        mixed_k += len({k - t.count(PAD_DRAFT) for t in spec.values()}) > 1
    assert decodes > 0 and verifies > 0 and padded_steps > 0 and mixed_k > 0
    assert any(m == "full" and isinstance(key, tuple) for m, key in graphs.replays)
    assert engine.close() == []  # no uniform decode step fell back from padding
    print(
        f"uniform decode steps: {decodes} decode FULL, {verifies} verify FULL "
        f"({padded_steps} padded, {mixed_k} with mixed real k)"
    )
