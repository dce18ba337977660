"""Speculative decoding end to end on the CPU (torch path): n-gram drafts verified by the
target, greedy tokens identical to plain decoding whatever k, scheduling mode, chunking or
preemption; the bookkeeping (blocks, slots, ``num_computed_tokens``) exact after random
accept/reject/abort/preempt sequences; sampled tokens distributed as the target's."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from mrv2_prof.runner.config import ModelSpec, RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.core.request import RequestStatus, SamplingParams
from mrv2_prof.runner.engine import Engine
from tests.runner.sampler_cases import chi2_quantile, pearson_chi2

NUM_REQUESTS = 4
MAX_TOKENS = 20


def make_engine(spec: SpecDecodeConfig, **runner) -> Engine:
    cfg = dict(
        device="cpu",
        max_num_reqs=16,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=128,
        block_size=4,
        num_kv_blocks=256,
        kernels="torch",
        async_scheduling=False,
        uva=False,
        cudagraph_mode="none",
    )
    cfg.update(runner)
    return Engine(RunnerConfig(**cfg, spec_decode=spec), ModelSpec(preset="llama-tiny"))


def repetitive_prompts(vocab: int, seed: int = 0) -> dict[str, list[int]]:
    """Prompts of a repeated segment, so the n-gram drafter finds matches."""
    rng = random.Random(seed)
    out = {}
    for i in range(NUM_REQUESTS):
        segment = [rng.randrange(vocab) for _ in range(5 + i)]
        out[f"r{i}"] = segment * 3 + segment[:2]
    return out


def run_greedy(spec: SpecDecodeConfig, **runner) -> tuple[dict[str, list[int]], Engine]:
    engine = make_engine(spec, **runner)
    prompts = repetitive_prompts(engine.vocab_size)
    reqs = {
        rid: engine.add_request(rid, ids, SamplingParams(max_tokens=MAX_TOKENS), float(i))
        for i, (rid, ids) in enumerate(prompts.items())
    }
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # hands the last finished ids to the runner
    assert_no_leaks(engine)
    return {rid: r.output_token_ids for rid, r in reqs.items()}, engine


def assert_no_leaks(engine: Engine) -> None:
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.info.num_kv_blocks
    engine.kv_cache_manager.check_consistency()
    assert len(engine.runner.req_states.slot_of) == 0


@pytest.fixture(scope="module")
def plain_tokens() -> dict[str, list[int]]:
    return run_greedy(SpecDecodeConfig())[0]


def ngram(k: int, **kw) -> SpecDecodeConfig:
    return SpecDecodeConfig(method="ngram", num_speculative_tokens=k, **kw)


@pytest.mark.parametrize("draft_on", ["device", "host"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_tokens_equal_plain_decoding(plain_tokens, k, async_scheduling, draft_on):
    tokens, engine = run_greedy(
        ngram(k, draft_on=draft_on),
        async_scheduling=async_scheduling,
        max_num_reqs=16 if async_scheduling else 8,
    )
    assert tokens == plain_tokens
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0  # speculation happened
    assert stats.num_draft_tokens <= k * stats.num_drafts
    assert sum(n for _, n in stats.accepted_lengths) == stats.num_accepted_tokens
    # position j is accepted only where every position before it was
    per_pos = stats.accepted_per_position
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert sum(per_pos) == stats.num_accepted_tokens


@pytest.mark.parametrize("draft_on", ["device", "host"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_tokens_equal_with_chunked_prefill_and_preemption(
    plain_tokens, async_scheduling, draft_on
):
    # 7 tokens a step chunk every prompt; 16 blocks of 4 cannot hold the four requests' 37-46
    # tokens each at once, so requests are preempted and recomputed (their slots reused).
    tokens, engine = run_greedy(
        ngram(3, draft_on=draft_on),
        async_scheduling=async_scheduling,
        max_num_batched_tokens=7,
        num_kv_blocks=16,
        max_model_len=64,
    )
    assert tokens == plain_tokens
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    assert engine.held_resources() == {"request_slots": 0, "slots_to_release": 0, "kv_blocks": 0}


@pytest.mark.parametrize("draft_on", ["device", "host"])
def test_greedy_tokens_equal_under_dynamic_k_and_prefix_caching(plain_tokens, draft_on):
    # 4 running requests: k = 2 (the table alone: adaptive k is tested below)
    spec = ngram(4, dynamic_k=((2, 4), (4, 2)), draft_on=draft_on, adaptive=False)
    tokens, engine = run_greedy(spec, enable_prefix_caching=True)
    assert tokens == plain_tokens
    stats = engine.scheduler.spec.stats
    assert 0 < stats.num_draft_tokens <= 2 * stats.num_drafts
    assert spec.k_for(1) == 4 and spec.k_for(3) == 2 and spec.k_for(5) == 0
    assert spec.possible_ks(8) == [0, 2, 4] and spec.max_k == 4


def repetitive_request(rng: random.Random, n: int, vocab: int):
    """A random prompt, repetitive 7 times in 10 (a segment repeated), and its params."""
    seg = [rng.randrange(vocab) for _ in range(rng.randrange(2, 7))]
    prompt = seg * rng.randrange(1, 4) if rng.random() < 0.7 else seg
    return prompt, SamplingParams(max_tokens=rng.randrange(1, 25))


def assert_host_state_exact(engine) -> None:
    """Every running request that is decoding has computed all its tokens but the last, and
    that count equals the device's; a request still in its prompt has computed less."""
    rs = engine.runner.req_states
    device = rs.num_computed_tokens.gpu
    for r in engine.scheduler.running:
        assert r.num_computed_tokens == r.num_tokens - 1 or r.num_computed_tokens < (
            r.num_prompt_tokens
        ), r.request_id
        if r.request_id in rs.slot_of and r.num_computed_tokens == r.num_tokens - 1:
            assert int(device[rs.slot_of[r.request_id]]) == r.num_computed_tokens


def random_traffic(engine, seed, steps, max_requests, new_request, check) -> None:
    """Seeded traffic: at each of ``steps`` rounds a new request (``new_request(rng, n, vocab)``
    gives its prompt and params) one time in two until ``max_requests``, an abort of a live
    request 8 times in 100, one engine step, then ``check(engine)``; then run to the end."""
    rng = random.Random(seed)
    live, n = [], 0
    for _ in range(steps):
        if n < max_requests and rng.random() < 0.5:
            prompt, params = new_request(rng, n, engine.vocab_size)
            engine.add_request(f"q{n}", prompt, params, float(n))
            live.append(f"q{n}")
            n += 1
        if live and rng.random() < 0.08:
            engine.abort_request(live.pop(rng.randrange(len(live))))
        if not engine.has_unfinished_requests():
            continue
        engine.step()
        check(engine)
        live = [rid for rid in live if rid in engine.scheduler.requests]
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()


def test_random_accept_reject_abort_preempt_leave_exact_state():
    """Random requests (some repetitive, some not), random aborts and a tight KV cache: after
    each step every running request's host ``num_computed_tokens`` equals the device's, and
    at the end no block or slot is held."""
    engine = make_engine(ngram(3), num_kv_blocks=16, max_model_len=64, max_num_batched_tokens=24)
    random_traffic(engine, 7, 120, 20, repetitive_request, assert_host_state_exact)
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.spec.stats.num_drafts > 0
    assert_no_leaks(engine)


def test_a_stop_token_inside_an_accepted_run_ends_the_request(plain_tokens):
    """The plain run's 6th token of r0 as a stop token: with speculation the request stops
    there too, whatever its verify accepted after it."""
    stop = plain_tokens["r0"][5]
    first = plain_tokens["r0"].index(stop)
    engine = make_engine(ngram(4))
    prompts = repetitive_prompts(engine.vocab_size)
    req = engine.add_request(
        "r0", prompts["r0"], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,))
    )
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    assert req.output_token_ids == plain_tokens["r0"][: first + 1]
    assert req.status is RequestStatus.FINISHED_STOPPED
    assert_no_leaks(engine)


def test_sampled_tokens_follow_the_target_distribution():
    """A prompt whose last token is a one-token prefill chunk of its own, so it is verified
    with the n-gram drafts the repeated prompt gives (a one-hot draft): over many seeds the
    first emitted token's frequencies match the target's softmax at that position (from the
    plain engine's full logprobs), chi-square below its 0.999 quantile."""
    temperature = 0.05  # random weights give flat logits: sharpen them
    prompt = [11, 12, 13] * 4 + [11]  # chunks of 12 and 1; drafts 12, 13 for the last token
    plain = make_engine(SpecDecodeConfig(), enable_prefix_caching=False)
    vocab = plain.vocab_size
    r = plain.add_request("p", prompt, SamplingParams(max_tokens=1, logprobs=vocab))
    while plain.has_unfinished_requests():
        plain.step()
    lp = np.full(vocab, -np.inf)
    for token, value in r.output_logprobs[0][1:]:
        lp[token] = value
    p = torch.softmax(torch.tensor(lp / temperature), -1).numpy()

    engine = make_engine(ngram(2), enable_prefix_caching=False, max_num_batched_tokens=12)
    n = 400
    counts = np.zeros(vocab)
    for i in range(n):
        params = SamplingParams(temperature=temperature, seed=1000 + i, max_tokens=3)
        r = engine.add_request(f"s{i}", prompt, params)
        while not r.output_token_ids:
            engine.step()
        counts[r.output_token_ids[0]] += 1
        engine.abort_request(r.request_id)
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts == n and stats.num_draft_tokens == 2 * n  # every first token verified
    keep = p * n >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(p[keep] * n, p[~keep].sum() * n)
    assert keep.sum() >= 5, np.sort(p)[-10:]  # a test with several cells, not one lump
    assert pearson_chi2(observed, expected) < chi2_quantile(0.999, len(observed) - 1)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_greedy_tokens_equal_with_dense_writes(plain_tokens, async_scheduling):
    """``staged_writes: false``: the host's rolled-back ``num_computed_tokens`` is sent every
    step instead of the device advancing it. Under async scheduling the host's count runs
    ahead of the device's with drafts on the device, so the drafts go to the host: a note."""
    tokens, engine = run_greedy(
        ngram(2), staged_writes=False, async_scheduling=async_scheduling, max_num_reqs=16
    )
    assert tokens == plain_tokens
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    on = "host" if async_scheduling else "device"
    assert engine.runner.info.spec_drafts_on == on
    assert any("drafts on the host" in n for n in engine.runner.info.notes) == async_scheduling


def long_run(spec: SpecDecodeConfig, async_scheduling: bool, max_tokens: int = 64):
    """The repetitive prompts to ``max_tokens`` (EOS ignored): the outputs, the engine steps
    it took and the requests that sat out, summed over the steps."""
    engine = make_engine(spec, async_scheduling=async_scheduling, max_num_reqs=16)
    prompts = repetitive_prompts(engine.vocab_size)
    reqs = {
        rid: engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens), float(i))
        for i, (rid, ids) in enumerate(prompts.items())
    }
    steps = sat_out = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        sat_out += engine.scheduler.spec.num_sat_out if engine.scheduler.spec else 0
    engine.step()
    assert_no_leaks(engine)
    return {rid: r.output_token_ids for rid, r in reqs.items()}, steps, sat_out, engine


def test_async_device_drafts_never_sit_out_and_take_fewer_steps():
    """Under async scheduling, drafts on the device: no request sits out a step, the tokens
    are plain decoding's, and the run takes fewer engine steps than plain decoding (these
    random-weight outputs fall into cycles the n-gram lookup predicts). Drafts on the host sit
    out every other step: more steps than plain decoding."""
    plain, plain_steps, _, _ = long_run(SpecDecodeConfig(), True)
    tokens, steps, sat_out, engine = long_run(ngram(3), True)
    assert tokens == plain
    assert sat_out == 0
    stats = engine.scheduler.spec.stats
    assert stats.num_accepted_tokens > 0.5 * stats.num_drafts  # drafts are mostly right
    assert steps < plain_steps
    host_tokens, host_steps, host_sat_out, _ = long_run(ngram(3, draft_on="host"), True)
    assert host_tokens == plain
    assert host_sat_out > 0 and host_steps > plain_steps


def test_async_device_drafts_draft_what_the_host_index_drafts():
    """The device's n-gram drafts are the host index's: the same verifies (drafted, accepted)
    in sync mode, where the host drafts from the same complete histories."""
    _, _, _, device = long_run(ngram(3), False)
    _, _, _, host = long_run(ngram(3, draft_on="host"), False)
    d, h = device.scheduler.spec.stats, host.scheduler.spec.stats
    assert d.accepted_lengths == h.accepted_lengths
    assert (d.num_draft_tokens, d.num_accepted_tokens) == (
        h.num_draft_tokens,
        h.num_accepted_tokens,
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_random_traffic_with_device_drafts_returns_every_slot_and_block(async_scheduling):
    """Random prompts, aborts and a tight KV cache with drafts on the device: every reserved
    slot rolled back is counted, the device's computed count never exceeds the host's
    (optimistic under async: equal in sync) and nothing is held at the end."""
    engine = make_engine(
        ngram(3), num_kv_blocks=16, max_model_len=64, max_num_batched_tokens=24,
        async_scheduling=async_scheduling, max_num_reqs=32,
    )  # fmt: skip
    reserved = reclaimed = 0
    spec = engine.scheduler.spec
    take = spec.take_verifies

    def counting():  # the engine takes the step's verifies (and resets the count) each step
        nonlocal reclaimed
        reclaimed += spec.num_reclaimed
        return take()

    spec.take_verifies = counting

    def check(engine):
        nonlocal reserved
        reserved += spec.num_reserved
        rs = engine.runner.req_states
        for r in engine.scheduler.running:
            slot = rs.slot_of.get(r.request_id)
            if slot is not None and r.num_computed_tokens >= r.num_prompt_tokens:
                device = int(rs.num_computed_tokens.gpu[slot])
                if async_scheduling:
                    assert device <= r.num_computed_tokens, r.request_id
                else:
                    assert device == r.num_computed_tokens == r.num_tokens - 1, r.request_id
            assert spec.num_sat_out == 0

    random_traffic(engine, 7, 120, 20, repetitive_request, check)
    assert engine.scheduler.num_preemptions > 0
    assert 0 < reclaimed <= reserved
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    assert_no_leaks(engine)
    assert engine.held_resources() == {"request_slots": 0, "slots_to_release": 0, "kv_blocks": 0}
