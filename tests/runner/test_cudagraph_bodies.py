"""What the CUDA graphs run, run eagerly on the CPU: the PIECEWISE segments with the attention
between them, and the FULL body, each equal to the model's own forward pass."""

from __future__ import annotations

import torch

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model import kv_cache_shape
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.worker.block_table import BlockTables
from mrv2_prof.runner.worker.cudagraph_bodies import PiecewiseBody, full_body
from mrv2_prof.runner.worker.input_batch import dummy_batch

CPU = torch.device("cpu")
BLOCK_SIZE = 4


def model_and_batch(num_tokens: int, num_reqs: int):
    model, args = load_model(ModelSpec(preset="llama-tiny"), CPU, torch.float32)
    kv_caches = [
        torch.randn(kv_cache_shape(args, 8, BLOCK_SIZE), generator=torch.Generator().manual_seed(i))
        for i in range(args.num_hidden_layers)
    ]
    tables = BlockTables(num_reqs, 8, CPU, staged=True)
    batch = dummy_batch(num_tokens, num_reqs, num_reqs, CPU, tables)
    batch.input_ids.copy_(torch.randint(0, args.vocab_size, (num_tokens,)))
    batch.slot_mapping.copy_(torch.arange(num_tokens))  # the torch KV write needs real slots
    return model, kv_caches, batch


def test_the_piecewise_segments_with_eager_attention_are_the_forward_pass():
    model, kv_caches, batch = model_and_batch(num_tokens=11, num_reqs=3)
    meta = batch.attn_metadata(BLOCK_SIZE)
    body = PiecewiseBody(model, kv_caches, max_tokens=16)  # buffers larger than the batch
    input_ids = torch.zeros(16, dtype=torch.int64)
    positions = torch.zeros(16, dtype=torch.int64)
    input_ids[:11], positions[:11] = batch.input_ids, batch.positions
    segments = body.segments(input_ids, positions, 11)
    assert len(segments) == model.args.num_hidden_layers + 1
    hidden = body.run(segments, 11, meta)
    assert torch.equal(hidden, model(batch.input_ids, batch.positions, kv_caches, meta))


def test_the_full_body_is_the_forward_pass_and_the_lm_head():
    model, kv_caches, batch = model_and_batch(num_tokens=5, num_reqs=5)  # one token each
    meta = batch.attn_metadata(BLOCK_SIZE)
    logits = torch.zeros(5, model.args.vocab_size)
    full_body(model, kv_caches, batch.input_ids, batch.positions, meta, logits)
    hidden = model(batch.input_ids, batch.positions, kv_caches, meta)
    assert torch.equal(logits, model.compute_logits(hidden))
