"""Speculative decoding with a draft model on the CPU (torch path): self-speculation (the
target's first layer) and a separate tiny draft of the same vocabulary give the plain greedy
tokens whatever k, scheduling mode, chunking, preemption or prefix caching; the drafts are the
draft model's own greedy continuation; sampled tokens follow the target's distribution with the
draft's (non-one-hot) probabilities; no block or slot is left held.

Acceptance with random weights (llama-tiny, these prompts, greedy, measured on the CPU):
self-speculation from the first of two layers accepts about a third of its drafts at k = 1 and
about one in six at k = 4 (28 of 174 here); the separate random draft, whose weights have nothing
in common with the target's, accepts almost none (1 of 260 at k = 4).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_spec_decode import (
    assert_no_leaks,
    make_engine,
    random_traffic,
    repetitive_prompts,
    run_greedy,
)

from mrv2_prof.runner.config import ModelSpec, RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from tests.runner.sampler_cases import chi2_quantile, pearson_chi2


def self_draft(k: int, **kw) -> SpecDecodeConfig:
    return SpecDecodeConfig(
        method="draft_model", num_speculative_tokens=k, draft_target_layers=1, **kw
    )


def preset_draft(k: int, **kw) -> SpecDecodeConfig:
    return SpecDecodeConfig(
        method="draft_model", num_speculative_tokens=k, draft_preset="llama-tiny-draft", **kw
    )


def draft_alone() -> Engine:
    """The draft preset run alone, greedy on the CPU: the oracle of its drafts."""
    cfg = RunnerConfig(
        device="cpu", max_num_reqs=8, max_num_seqs=8, max_model_len=128, block_size=4,
        num_kv_blocks=256, kernels="torch", async_scheduling=False, uva=False,
        cudagraph_mode="none",
    )  # fmt: skip
    return Engine(cfg, ModelSpec(preset="llama-tiny-draft", seed=0))


def device_drafts_of(engine: Engine, req_id: str, k: int) -> list[int]:
    """The drafts the device keeps for ``req_id``'s next verify (all ``k`` of them)."""
    dd, slot = engine.runner.device_drafts, engine.runner.req_states.slot_of[req_id]
    assert int(dd.num[slot]) == k
    return dd.tokens[slot, :k].tolist()


@pytest.fixture(scope="module")
def plain_tokens() -> dict[str, list[int]]:
    return run_greedy(SpecDecodeConfig())[0]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_self_speculation_gives_the_plain_greedy_tokens(plain_tokens, k, async_scheduling):
    tokens, engine = run_greedy(self_draft(k), async_scheduling=async_scheduling)
    assert tokens == plain_tokens
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert stats.num_draft_tokens <= k * stats.num_drafts
    # the draft model shares the target's weights: nothing is copied
    draft = engine.runner.drafter.state.model
    assert draft.model.layers[0] is engine.runner.model.model.layers[0]
    assert len(draft.model.layers) == 1
    assert draft.lm_head_weight.data_ptr() == engine.runner.model.lm_head_weight.data_ptr()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [1, 4])
def test_a_separate_draft_model_gives_the_plain_greedy_tokens(plain_tokens, k, async_scheduling):
    tokens, engine = run_greedy(preset_draft(k), async_scheduling=async_scheduling)
    assert tokens == plain_tokens
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts > 0 and stats.num_draft_tokens > stats.num_drafts * (k > 1)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("spec", [self_draft(3), preset_draft(2)], ids=["self", "preset"])
def test_chunked_prefill_and_preemption(plain_tokens, spec, async_scheduling):
    tokens, engine = run_greedy(
        spec,
        async_scheduling=async_scheduling,
        max_num_batched_tokens=7,
        max_model_len=64,
        num_kv_blocks=20,
    )
    assert tokens == plain_tokens
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.spec.stats.num_drafts > 0


def test_dynamic_k_prefix_caching_and_dense_writes(plain_tokens):
    spec = self_draft(4, dynamic_k=((2, 4), (4, 2)))
    tokens, engine = run_greedy(spec, enable_prefix_caching=True)
    assert tokens == plain_tokens
    stats = engine.scheduler.spec.stats
    assert 0 < stats.num_draft_tokens <= 4 * stats.num_drafts  # k 2 while 3-4 run, then 4
    tokens, _ = run_greedy(self_draft(2), staged_writes=False)
    assert tokens == plain_tokens


@pytest.mark.parametrize("draft_on", ["device", "host"])
def test_drafts_are_the_draft_models_own_greedy_continuation(draft_on):
    """The drafts a prefill's first token gets (copied back to the host with it, or kept in
    the request slot's device buffer for its next verify) equal what the draft model
    (llama-tiny-draft, seed 0) decodes greedily on its own from the prompt and that token."""
    k = 4
    engine = make_engine(preset_draft(k, draft_on=draft_on))
    prompts = repetitive_prompts(engine.vocab_size)
    for i, (rid, ids) in enumerate(prompts.items()):
        engine.add_request(rid, ids, SamplingParams(max_tokens=8), float(i))
    out = engine.step().runner_output  # every prompt fits: one prefill step
    first = dict(zip(out.req_ids, out.sampled_token_ids, strict=True))
    if draft_on == "host":
        assert out.draft_token_ids is not None
        drafts = dict(zip(out.req_ids, out.draft_token_ids, strict=True))
    else:
        assert out.draft_token_ids is None  # never copied to the host
        drafts = {rid: device_drafts_of(engine, rid, k) for rid in out.req_ids}

    alone = draft_alone()
    reqs = {
        rid: alone.add_request(rid, ids + [first[rid]], SamplingParams(max_tokens=k))
        for rid, ids in prompts.items()
    }
    while alone.has_unfinished_requests():
        alone.step()
    assert {rid: r.output_token_ids for rid, r in reqs.items()} == drafts


def test_sampled_tokens_follow_the_target_distribution_with_draft_probabilities():
    """The second token of each request is the first a verify emits: drawn by the lossless
    rule from self-drafted tokens and their (non-one-hot) probabilities. Among the requests
    whose first token is the most frequent one, the second token's frequencies match the
    target's softmax after the prompt and that token (the plain engine's full logprobs),
    chi-square below its 0.999 quantile."""
    temperature = 0.05  # random weights give flat logits: sharpen them
    prompt = [11, 12, 13, 14, 15, 16, 17]
    n = 400
    engine = make_engine(
        self_draft(2), enable_prefix_caching=False, max_num_seqs=40, max_num_reqs=64
    )
    firsts, seconds = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for group in range(0, n, 40):  # 40 requests a batch
        reqs = {}
        for i in range(group, group + 40):
            params = SamplingParams(temperature=temperature, seed=5000 + i, max_tokens=4)
            reqs[i] = engine.add_request(f"s{i}", prompt, params)
        while reqs:
            engine.step()
            for i, r in list(reqs.items()):
                if len(r.output_token_ids) >= 2:
                    firsts[i], seconds[i] = r.output_token_ids[:2]
                    engine.abort_request(r.request_id)
                    del reqs[i]
    engine.step()
    assert_no_leaks(engine)
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts == n  # every second token came out of a verify
    assert 0 < stats.accepted_per_position[0] < n  # the rule accepted some drafts, not all
    probs = engine.runner.drafter.state.probs
    assert float(probs.amax()) < 1.0  # not one-hot

    x1 = int(np.bincount(firsts).argmax())
    chosen = seconds[firsts == x1]
    m = len(chosen)
    assert m >= 100, np.bincount(firsts).max()
    plain = make_engine(SpecDecodeConfig(), enable_prefix_caching=False)
    vocab = plain.vocab_size
    r = plain.add_request("p", prompt + [x1], SamplingParams(max_tokens=1, logprobs=vocab))
    while plain.has_unfinished_requests():
        plain.step()
    lp = np.full(vocab, -np.inf)
    for token, value in r.output_logprobs[0][1:]:
        lp[token] = value
    p = torch.softmax(torch.tensor(lp / temperature), -1).numpy()
    counts = np.bincount(chosen, minlength=vocab).astype(float)
    keep = p * m >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(p[keep] * m, p[~keep].sum() * m)
    assert keep.sum() >= 3, np.sort(p)[-10:]
    assert pearson_chi2(observed, expected) < chi2_quantile(0.999, len(observed) - 1)


def test_a_prefix_cache_hit_is_computed_by_the_draft_too():
    """B repeats A's prompt after A finished: its cached tokens were never a step of B, yet
    its first drafts are the draft model's own continuation (the draft computed the hit's
    tokens into B's fresh cache row; C takes A's old row)."""
    k = 3
    engine = make_engine(preset_draft(k), enable_prefix_caching=True)
    prompt = list(range(20, 44))  # 24 tokens: 6 full blocks of 4
    engine.add_request("a", prompt, SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    engine.add_request("c", list(range(100, 110)), SamplingParams(max_tokens=2))
    b = engine.add_request("b", prompt, SamplingParams(max_tokens=8))
    out = engine.step().runner_output
    assert b.num_cached_tokens > 0
    row = out.req_ids.index("b")
    first, drafts = out.sampled_token_ids[row], device_drafts_of(engine, "b", k)

    alone = draft_alone()
    r = alone.add_request("b", prompt + [first], SamplingParams(max_tokens=k))
    while alone.has_unfinished_requests():
        alone.step()
    assert r.output_token_ids == drafts


def test_a_checkpoint_directory_drafts_as_its_preset_does(plain_tokens, tmp_path):
    """llama-tiny-draft's weights saved as a checkpoint: ``draft.path`` loads them with the
    target's loader, and the run verifies exactly the preset draft's drafts."""
    import json

    from safetensors.torch import save_file

    from mrv2_prof.runner.model.loader import load_preset
    from mrv2_prof.runner.model.presets import PRESETS

    model = load_preset("llama-tiny-draft", 0, torch.device("cpu"), torch.float32)
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()}
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = PRESETS["llama-tiny-draft"].to_hf_config()
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = SpecDecodeConfig(
        method="draft_model", num_speculative_tokens=3, draft_path=str(tmp_path)
    )
    tokens, engine = run_greedy(spec)
    assert tokens == plain_tokens
    _, preset_engine = run_greedy(preset_draft(3))
    assert engine.scheduler.spec.stats == preset_engine.scheduler.spec.stats
    assert engine.scheduler.spec.stats.num_drafts > 0


def test_greedy_requests_beside_sampled_ones_keep_their_tokens(plain_tokens):
    """A batch with sampled requests verifies with the draft's probabilities; the greedy
    requests in it still get exactly the plain greedy tokens."""
    engine = make_engine(self_draft(3))
    prompts = repetitive_prompts(engine.vocab_size)
    reqs = {}
    for i, (rid, ids) in enumerate(prompts.items()):
        sampled = i >= 2
        params = SamplingParams(
            max_tokens=20, temperature=0.8 if sampled else 0.0, seed=i if sampled else None
        )
        reqs[rid] = engine.add_request(rid, ids, params, float(i))
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    assert_no_leaks(engine)
    for rid in ("r0", "r1"):
        assert reqs[rid].output_token_ids == plain_tokens[rid]
    assert engine.scheduler.spec.stats.num_drafts > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_random_accept_reject_abort_preempt_leave_exact_state(async_scheduling):
    """Random requests (greedy and sampled), random aborts and a tight KV cache: after each
    step every running request's host ``num_computed_tokens`` equals the device's (sync), and
    at the end no block or slot is held."""
    engine = make_engine(
        self_draft(3),
        num_kv_blocks=16,
        max_model_len=64,
        max_num_batched_tokens=24,
        async_scheduling=async_scheduling,
    )

    def new_request(rng, n, vocab):
        seg = [rng.randrange(vocab) for _ in range(rng.randrange(2, 7))]
        temperature = rng.choice([0.0, 0.7])
        params = SamplingParams(max_tokens=rng.randrange(1, 25), temperature=temperature, seed=n)
        return seg * rng.randrange(1, 4), params

    def check(engine):
        rs = engine.runner.req_states
        for r in engine.scheduler.running:
            if async_scheduling or r.request_id not in rs.slot_of:
                continue
            if r.num_computed_tokens == r.num_tokens - 1:
                device = int(rs.num_computed_tokens.gpu[rs.slot_of[r.request_id]])
                assert device == r.num_computed_tokens, r.request_id

    random_traffic(engine, 11, 100, 16, new_request, check)
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.spec.stats.num_drafts > 0
    assert_no_leaks(engine)
