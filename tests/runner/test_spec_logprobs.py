"""Requests that ask for logprobs are speculated (CPU, torch path): every token a verify emits
gets the logprob and top-k the plain sampler gives it, from the target row that produced it.
With greedy decoding the tokens and their logprobs equal plain decoding's (k = 1..4, padded and
not, sync and async), and each entry's first pair is the emitted token with the log-softmax of
an independent full forward of the model over the request's tokens (torch reference). Also: a
verify whose slots are all placeholders draws, for a sampled request, the very token the plain
sampler draws (its RNG position is its first row's, not shifted by the placeholders)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_spec_decode import MAX_TOKENS, make_engine, repetitive_prompts
from test_spec_decode import ngram as device_ngram
from test_spec_padding import ngram, padded_engine, padded_steps

from mrv2_prof.runner.config import PAD_DRAFT, SpecDecodeConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.model.attention import AttentionMetadata

NUM_LOGPROBS = 3


def run(engine: Engine, **params) -> dict:
    prompts = repetitive_prompts(engine.vocab_size)
    reqs = {
        rid: engine.add_request(rid, ids, SamplingParams(max_tokens=MAX_TOKENS, **params), i)
        for i, (rid, ids) in enumerate(prompts.items())
    }
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    return reqs


@pytest.fixture(scope="module")
def plain():
    engine = make_engine(SpecDecodeConfig())
    return engine, run(engine, logprobs=NUM_LOGPROBS)


def assert_same_logprobs(got, want) -> None:
    for rid, w in want.items():
        g = got[rid]
        assert g.output_token_ids == w.output_token_ids, rid
        assert len(g.output_logprobs) == len(g.output_token_ids) == len(w.output_logprobs)
        for i, (ge, we) in enumerate(zip(g.output_logprobs, w.output_logprobs, strict=True)):
            assert len(ge) == 1 + NUM_LOGPROBS and ge[0][0] == g.output_token_ids[i]
            assert [t for t, _ in ge] == [t for t, _ in we], (rid, i)
            torch.testing.assert_close(
                torch.tensor([v for _, v in ge]),
                torch.tensor([v for _, v in we]),
                rtol=1e-5,
                atol=1e-5,
                msg=lambda m, rid=rid, i=i: f"{rid} token {i}: {m}",
            )


@pytest.mark.parametrize("pad", ["unpadded", "padded", "device"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_logprobs_equal_plain_decoding(plain, k, async_scheduling, pad):
    """Drafts on the host, unpadded or padded by the scheduler; or on the device."""
    runner = dict(async_scheduling=async_scheduling, max_num_reqs=16 if async_scheduling else 8)
    if pad == "padded":
        engine, queued = padded_engine(ngram(k), **runner)
    else:
        engine = make_engine(ngram(k) if pad == "unpadded" else device_ngram(k), **runner)
    reqs = run(engine, logprobs=NUM_LOGPROBS)
    assert_same_logprobs(reqs, plain[1])
    stats = engine.scheduler.spec.stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0  # they were speculated
    if pad == "padded":
        assert padded_steps(queued) and stats.num_padded_slots > 0


def test_logprobs_are_the_log_softmax_of_a_full_forward(plain):
    """The torch reference: the model over each request's prompt and outputs in one eager
    forward without a KV cache; each output token's logprob is the log-softmax at the
    position before it, and the top-k are its largest."""
    engine = make_engine(ngram(3))
    reqs = run(engine, logprobs=NUM_LOGPROBS)
    assert engine.scheduler.spec.stats.num_accepted_tokens > 0
    model = engine.runner.model
    for r in reqs.values():
        logits = reference_logits(model, r.prompt_token_ids + r.output_token_ids)
        n = len(r.prompt_token_ids)
        lsm = torch.log_softmax(logits.float(), dim=-1)
        for i, entry in enumerate(r.output_logprobs):
            row = lsm[n - 1 + i]
            top = torch.topk(row, NUM_LOGPROBS).indices.tolist()
            assert [t for t, _ in entry] == [r.output_token_ids[i], *top]
            want = [float(row[t]) for t, _ in entry]
            torch.testing.assert_close(
                torch.tensor([v for _, v in entry]), torch.tensor(want), rtol=1e-4, atol=1e-4
            )


def reference_logits(model, tokens: list[int]) -> torch.Tensor:
    """[T, V] logits of every position, one forward with no KV cache."""
    t = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.int64)
    positions = torch.arange(t, dtype=torch.int64)
    meta = AttentionMetadata(
        num_reqs=1,
        num_tokens=t,
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([t], dtype=torch.int32),
        block_table=torch.zeros((1, 1), dtype=torch.int32),
        slot_mapping=torch.full((t,), -1, dtype=torch.int64),
        query_start_loc_np=np.array([0, t], dtype=np.int32),
        seq_lens_np=np.array([t], dtype=np.int32),
        block_size=4,
    )
    with torch.no_grad():
        return model.logits(model(ids, positions, None, meta))


def test_sampled_tokens_of_placeholder_only_verifies_equal_plain_sampling():
    """A greedy request of a repeated segment drafts, so its steps are padded; two seeded
    sampled requests of distinct tokens (temperature 1 over 512 tokens: no n-gram recurs) never
    draft, so each of their verifies holds placeholders only and emits its bonus token: the
    plain sampler's draw at the same position, token for token."""
    spec_engine, queued = padded_engine(ngram(3))
    prompts = {"g": [7, 8, 9, 10] * 4, "s1": list(range(100, 117)), "s2": list(range(300, 311))}
    params = {
        "g": SamplingParams(max_tokens=MAX_TOKENS),
        "s1": SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=5, logprobs=2),
        "s2": SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=6),
    }
    outputs = []
    for engine in (make_engine(SpecDecodeConfig()), spec_engine):
        reqs = {rid: engine.add_request(rid, p, params[rid], i) for i, (rid, p) in
                enumerate(prompts.items())}  # fmt: skip
        while engine.has_unfinished_requests():
            engine.step()
        engine.step()
        outputs.append({rid: r.output_token_ids for rid, r in reqs.items()})
    assert outputs[1] == outputs[0]
    stats = spec_engine.scheduler.spec.stats
    assert {rid for rid, _ in stats.accepted_lengths} == {"g"}  # only g verified real drafts
    placeholder_only = [
        so
        for so in padded_steps(queued)
        if all(t == PAD_DRAFT for t in so.scheduled_spec_decode_tokens.get("s1", [0]))
    ]
    assert placeholder_only  # s1 verified placeholders only
    assert len(set(outputs[0]["s1"])) > 10  # a sampled (not a looping greedy) output
