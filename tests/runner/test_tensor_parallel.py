"""Tensor parallelism on the CPU (gloo, two processes): a rank's shard of the model gives the
unsharded model's logits and greedy tokens (float32), with the KV cache sharded by KV heads."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model import kv_cache_shape
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.parallel.shard import shard_model
from mrv2_prof.runner.parallel.tensor_parallel import TPGroup

CPU = torch.device("cpu")
BLOCK = 4
NEW_TOKENS = 6


def _meta(query_lens, seq_lens, blocks, slot_mapping) -> AttentionMetadata:
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    return AttentionMetadata(
        num_reqs=len(query_lens),
        num_tokens=int(qsl[-1]),
        query_start_loc=torch.from_numpy(qsl),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor([blocks], dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        query_start_loc_np=qsl,
        seq_lens_np=np.array(seq_lens, dtype=np.int32),
        block_size=BLOCK,
    )


def greedy(model, args, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The prompt's all-token logits (one prefill into a paged KV cache), then NEW_TOKENS greedy
    decode steps through the cache."""
    blocks = list(range(8))
    caches = [
        torch.zeros(kv_cache_shape(args, 8, BLOCK), dtype=torch.float32)
        for _ in range(args.num_hidden_layers)
    ]
    n = len(prompt)
    ids, positions = torch.tensor(prompt), torch.arange(n)
    with torch.no_grad():
        meta = _meta([n], [n], blocks, list(range(n)))
        logits = model.compute_logits(model(ids, positions, caches, meta))
        tokens = [int(logits[-1].argmax())]
        for p in range(n, n + NEW_TOKENS - 1):
            meta = _meta([1], [p + 1], blocks, [p])
            step = model.compute_logits(model(torch.tensor(tokens[-1:]), torch.tensor([p]),
                                              caches, meta))  # fmt: skip
            tokens.append(int(step[-1].argmax()))
    return logits, tokens


def _rank(rank: int, world: int, init: str, spec: ModelSpec, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model, _ = load_model(spec, CPU, torch.float32)
        model = shard_model(model, TPGroup(rank, world))
        prompt = [(7 * i + 3) % 200 for i in range(11)]
        logits, tokens = greedy(model, model.args, prompt)
        kv_heads = model.args.num_key_value_heads
        torch.save({"logits": logits, "tokens": tokens, "kv_heads": kv_heads},
                   os.path.join(out, f"rank{rank}.pt"))  # fmt: skip
        # both ranks done with every collective before either tears gloo down (a rank that
        # tore down while the other still sent once aborted the process: SIGABRT on CI)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(params=["llama-tiny", "qwen2-untied-bias"])
def spec(request, make_hf_checkpoint, tmp_path) -> ModelSpec:
    if request.param == "llama-tiny":
        return ModelSpec(preset="llama-tiny")
    path = make_hf_checkpoint(tmp_path / "ckpt", "qwen2", tied=False, num_kv_heads=2)
    return ModelSpec(preset=None, path=str(path))


def test_two_ranks_give_the_unsharded_logits_and_greedy_tokens(spec, tmp_path: Path):
    model, args = load_model(spec, CPU, torch.float32)
    prompt = [(7 * i + 3) % 200 for i in range(11)]
    want_logits, want_tokens = greedy(model, args, prompt)
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_rank, args=(2, init, spec, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["kv_heads"] == args.num_key_value_heads // 2  # the cache holds its heads
        torch.testing.assert_close(got["logits"], want_logits, atol=1e-5, rtol=0)
        assert got["tokens"] == want_tokens


def test_a_shape_that_does_not_divide_is_refused():
    model, _ = load_model(ModelSpec(preset="llama-tiny"), CPU, torch.float32)
    with pytest.raises(ValueError, match="num_key_value_heads: 2 does not divide by .* 4"):
        shard_model(model, TPGroup(0, 4))
