"""Prompt logprobs: the host plan on a hand-worked batch, the chunked computation against
log_softmax, and whole engine runs against Hugging Face transformers on the same weights,
through chunked prefill, chunks of rows inside one prompt, preemption and async scheduling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine import make_engine

from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.worker import prompt_logprobs
from mrv2_prof.runner.worker.prompt_logprobs import compute_prompt_logprobs, plan_prompt_logprobs


def test_plan_picks_the_positions_whose_next_token_is_a_prompt_token():
    # batch: a (prompt 6, chunk of 4 from position 0), b (decode, no prompt logprobs),
    # c (prompt 5, last chunk: positions 3, 4), d (prompt 3, whole prompt: positions 0..2)
    req_ids = ["a", "b", "c", "d"]
    qsl = np.array([0, 4, 5, 7, 10])
    seq_lens = np.array([4, 20, 5, 3])
    wanted = {
        "a": (2, np.array([10, 11, 12, 13, 14, 15])),
        "c": (0, np.array([20, 21, 22, 23, 24])),
        "d": (1, np.array([30, 31, 32])),
    }
    plan = plan_prompt_logprobs(req_ids, qsl, seq_lens, wanted)
    # a: positions 0..3 predict 11..14 (rows 0..3); c: position 3 predicts 24 (row 5), position
    # 4 is the last prompt token (its next token is an output); d: positions 0, 1 (rows 7, 8)
    assert plan.rows.tolist() == [0, 1, 2, 3, 5, 7, 8]
    assert plan.targets.tolist() == [11, 12, 13, 14, 24, 31, 32]
    assert plan.spans == [("a", 0, 4, 2), ("c", 3, 1, 0), ("d", 0, 2, 1)]
    assert plan.num_top == 2
    assert plan_prompt_logprobs(["b"], qsl[:2], seq_lens[:1], wanted) is None


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_computation_matches_log_softmax(chunk):
    g = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(12, 8, generator=g)
    weight = torch.randn(50, 8, generator=g)
    rows = torch.tensor([0, 2, 3, 7, 11])
    targets = torch.tensor([5, 49, 0, 17, 17])
    ids, lps = compute_prompt_logprobs(lambda h: h @ weight.T, hidden, rows, targets, 4, chunk)
    ref = torch.log_softmax(hidden[rows] @ weight.T, dim=-1)
    assert ids[:, 0].tolist() == targets.tolist()
    assert torch.equal(ids[:, 1:], torch.topk(ref, 4, dim=-1).indices)
    torch.testing.assert_close(lps, ref.gather(1, ids), rtol=1e-5, atol=1e-5)


def hf_log_softmax(path, ids: list[int]) -> torch.Tensor:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def check_against(ref: torch.Tensor, prompt: list[int], got: list, k: int) -> None:
    assert len(got) == len(prompt) - 1
    for i, entries in enumerate(got):
        row = ref[i]  # position i predicts prompt token i + 1
        assert len(entries) == 1 + k
        assert entries[0][0] == prompt[i + 1]
        assert [t for t, _ in entries[1:]] == torch.topk(row, k).indices.tolist()
        for t, lp in entries:
            assert lp == pytest.approx(row[t].item(), abs=1e-4)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prompt_logprobs_match_transformers(
    tmp_path, make_hf_checkpoint, monkeypatch, async_scheduling
):
    """Prompts longer than the step budget (chunked prefill) and than the row chunk (several
    logits chunks inside one prompt); a request that could hit the prefix cache computes its
    whole prompt anyway."""
    monkeypatch.setattr(prompt_logprobs, "CHUNK_ROWS", 5)
    path = make_hf_checkpoint(tmp_path, "llama", False, 2, eos_token_id=None)
    engine = make_engine(
        path, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=128,
        async_scheduling=async_scheduling,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    a = rng.integers(3, 256, size=41).tolist()
    b = rng.integers(3, 256, size=23).tolist()
    warm = engine.add_request("warm", a[:33], SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():  # a's first 32 tokens are now in the prefix cache
        engine.step()
    assert warm.is_finished
    reqs = {
        "a": engine.add_request("a", a, SamplingParams(max_tokens=3, prompt_logprobs=3)),
        "b": engine.add_request("b", b, SamplingParams(max_tokens=2, prompt_logprobs=0)),
        "c": engine.add_request("c", a, SamplingParams(max_tokens=2)),
    }
    while engine.has_unfinished_requests():
        engine.step()
    assert reqs["a"].num_cached_tokens == 0 and reqs["c"].num_cached_tokens > 0
    check_against(hf_log_softmax(path, a), a, reqs["a"].prompt_logprobs, 3)
    check_against(hf_log_softmax(path, b), b, reqs["b"].prompt_logprobs, 0)
    assert reqs["c"].prompt_logprobs == []


def test_prompt_logprobs_survive_preemption(tmp_path, make_hf_checkpoint):
    """A request preempted mid-prompt computes its prompt again on resume: the positions it
    already has are not repeated, none is missing."""
    path = make_hf_checkpoint(tmp_path, "llama", False, 2, eos_token_id=None)
    engine = make_engine(path, max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=32)
    rng = np.random.default_rng(1)
    prompts = {f"p{i}": rng.integers(3, 256, size=30 + 5 * i).tolist() for i in range(4)}
    reqs = {
        rid: engine.add_request(rid, ids, SamplingParams(max_tokens=12, prompt_logprobs=2))
        for rid, ids in prompts.items()
    }
    while engine.has_unfinished_requests():
        engine.step()
    assert sum(r.num_preemptions for r in reqs.values()) > 0
    for rid, ids in prompts.items():
        check_against(hf_log_softmax(path, ids), ids, reqs[rid].prompt_logprobs, 2)
