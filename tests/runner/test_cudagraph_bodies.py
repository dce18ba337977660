"""What the CUDA graphs run, run eagerly on the CPU: the PIECEWISE segments with the attention
between them, and the FULL body, each equal to the model's own forward pass."""

from __future__ import annotations

import pytest
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


@pytest.mark.parametrize("prologue", [True, False], ids=["prologue", "no-prologue"])
def test_the_piecewise_segments_carry_the_down_projections_norm_across_layers(
    monkeypatch, prologue
):
    """The Triton bundle with every projection of 2+ rows on the decode GEMM and its switches
    on (``DOWN_ADD_NORM``: a layer's down projection makes the next layer's input norm, the
    last one's the final norm; ``DOWN_SILU_MUL`` or not): the segments give the forward pass's
    hidden states, and the bits of the forward with the switches off."""
    from mrv2_prof.runner.model import projections_triton as proj
    from mrv2_prof.runner.model.model_kernels import triton_model_kernels

    model, kv_caches, batch = model_and_batch(num_tokens=11, num_reqs=3)
    triton_model, _ = load_model(ModelSpec(preset="llama-tiny"), CPU, torch.float32,
                                 kernels=triton_model_kernels())  # fmt: skip
    triton_model.load_state_dict(model.state_dict())
    meta = batch.attn_metadata(BLOCK_SIZE)
    for name, value in (("DECODE_GEMM", "triton"), ("GEMM_MAX_FEATURES", None),
                        ("GEMM_ROWS", ((2, 256),))):  # fmt: skip
        monkeypatch.setattr(proj, name, value)
    monkeypatch.setattr(proj, "O_ADD_NORM", False)  # the baseline: the three switches off
    want = triton_model(batch.input_ids, batch.positions, kv_caches, meta)
    for name in ("DOWN_SILU_MUL", "O_ADD_NORM", "DOWN_ADD_NORM"):
        monkeypatch.setattr(proj, name, prologue or name != "DOWN_SILU_MUL")
    fused, kernel = [], proj.gemm_add_norm_triton

    def counted(*a, **k):
        fused.append("o" if k.get("round_first", True) else "down")
        return kernel(*a, **k)

    monkeypatch.setattr(proj, "gemm_add_norm_triton", counted)
    body = PiecewiseBody(triton_model, kv_caches, max_tokens=16)
    input_ids = torch.zeros(16, dtype=torch.int64)
    positions = torch.zeros(16, dtype=torch.int64)
    input_ids[:11], positions[:11] = batch.input_ids, batch.positions
    hidden = body.run(body.segments(input_ids, positions, 11), 11, meta)
    assert fused == ["o", "down"] * model.args.num_hidden_layers  # each layer's two, once
    assert torch.equal(hidden, triton_model(batch.input_ids, batch.positions, kv_caches, meta))
    assert torch.equal(hidden, want)
