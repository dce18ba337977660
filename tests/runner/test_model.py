"""The decoder against Hugging Face transformers, chunked and batched forwards, a sharded
checkpoint. Presets and configs: ``test_model_presets.py``; loader errors:
``test_model_checkpoint_errors.py``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model import kv_cache_shape, rope_inv_freq
from mrv2_prof.runner.model.loader import load_model
from tests.runner.decoder_forward import (
    ATOL_HF,
    ATOL_SELF,
    LLAMA3_SCALING,
    hf_logits,
    load,
    metadata,
    one_shot_logits,
    prompt,
    slots,
)


@pytest.mark.parametrize(
    ("arch", "tied", "num_kv_heads"),
    [("llama", False, 2), ("llama", True, 4), ("qwen2", True, 2), ("qwen2", False, 1)],
    ids=["llama-untied-gqa", "llama-tied-mha", "qwen2-tied-gqa", "qwen2-untied-mqa"],
)
def test_logits_match_hf(make_hf_checkpoint, tmp_path, arch, tied, num_kv_heads):
    path = make_hf_checkpoint(tmp_path, arch, tied, num_kv_heads)
    model, args = load(path)
    assert args.tie_word_embeddings == tied and args.attention_bias == (arch == "qwen2")
    assert hasattr(model, "lm_head") != tied
    ids = prompt(13)
    expected = hf_logits(path, ids)
    ours = one_shot_logits(model, ids)
    assert ours.dtype == torch.float32 and ours.shape == (13, 256)
    torch.testing.assert_close(ours, expected, atol=ATOL_HF, rtol=0)


def test_llama3_rope_scaling_matches_hf(make_hf_checkpoint, tmp_path):
    path = make_hf_checkpoint(tmp_path, "llama", rope_scaling=LLAMA3_SCALING, rope_theta=5e5)
    model, args = load(path)
    assert args.rope_theta == 5e5
    assert args.rope_scaling == {k: v for k, v in LLAMA3_SCALING.items() if k != "rope_type"}
    unscaled = rope_inv_freq(replace(args, rope_scaling=None))
    assert not torch.equal(model.model.rotary_emb.inv_freq, unscaled)

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, hf.model.rotary_emb.inv_freq)
    ids = prompt(9)
    torch.testing.assert_close(
        one_shot_logits(model, ids, start_pos=300),
        hf_logits(path, ids, start_pos=300),
        atol=ATOL_HF,
        rtol=0,
    )


def test_chunked_prefill_over_paged_cache(make_hf_checkpoint, tmp_path):
    path = make_hf_checkpoint(tmp_path, "llama")
    model, args = load(path)
    ids, block_size, blocks = prompt(11), 4, [5, 2, 7]
    kv_caches = [torch.zeros(kv_cache_shape(args, 8, block_size)) for _ in range(2)]
    full = one_shot_logits(model, ids)
    expected_hf = hf_logits(path, ids)
    for start, end in [(0, 3), (3, 9), (9, 11)]:
        n = end - start
        meta = metadata([n], [end], [blocks], slots(blocks, start, end, block_size), block_size)
        with torch.no_grad():
            hidden = model(ids[start:end], torch.arange(start, end), kv_caches, meta)
            logits = model.compute_logits(hidden)  # [n, V]
        torch.testing.assert_close(logits, full[start:end], atol=ATOL_SELF, rtol=0)
        torch.testing.assert_close(logits[-1], expected_hf[end - 1], atol=ATOL_HF, rtol=0)
    unused = [b for b in range(8) if b not in blocks]
    assert all(cache[:, unused].abs().sum() == 0 for cache in kv_caches)
    assert all(cache[:, blocks].abs().sum() > 0 for cache in kv_caches)


def test_mixed_batch_equals_each_request_alone(make_hf_checkpoint, tmp_path):
    path = make_hf_checkpoint(tmp_path, "qwen2")
    model, args = load(path)
    bs = 4
    a, b, c = prompt(9, seed=2), prompt(6, seed=3), prompt(8, seed=4)
    # (tokens, context length, block-table row): a prefill chunk with context, a fresh prefill,
    # a one-token decode.
    reqs = [(a, 5, [1, 6, 3]), (b, 0, [0, 4]), (c, 7, [2, 5])]
    kv_caches = [torch.zeros(kv_cache_shape(args, 8, bs)) for _ in range(args.num_hidden_layers)]

    def run(batch, caches):
        query_lens = [len(ids) - ctx for ids, ctx, _ in batch]
        slot_mapping = sum((slots(row, ctx, len(ids), bs) for ids, ctx, row in batch), [])
        meta = metadata(
            query_lens,
            [len(ids) for ids, _, _ in batch],
            [row for _, _, row in batch],
            slot_mapping,
            bs,
        )
        input_ids = torch.cat([ids[ctx:] for ids, ctx, _ in batch])
        positions = torch.cat([torch.arange(ctx, len(ids)) for ids, ctx, _ in batch])
        with torch.no_grad():
            logits = model.compute_logits(model(input_ids, positions, caches, meta))
        return logits.split(query_lens)

    for ids, ctx, row in reqs:  # the context already in the cache
        if ctx:
            run([(ids[:ctx], 0, row)], kv_caches)
    before = [cache.clone() for cache in kv_caches]
    batched = run(reqs, kv_caches)
    for req, got in zip(reqs, batched, strict=True):
        alone = run([req], [cache.clone() for cache in before])[0]
        torch.testing.assert_close(got, alone, atol=ATOL_SELF, rtol=0)
        ids, ctx, _ = req
        torch.testing.assert_close(got, one_shot_logits(model, ids)[ctx:], atol=ATOL_SELF, rtol=0)


def test_sharded_checkpoint_and_generation_eos(make_hf_checkpoint, tmp_path):
    single = make_hf_checkpoint(tmp_path, "llama", eos_token_id=[2, 3], name="single")
    sharded = make_hf_checkpoint(tmp_path, "llama", max_shard_size="50KB", name="sharded")
    assert len(list(sharded.glob("*.safetensors"))) > 1
    (model_a, args_a), (model_b, _) = load(single), load(sharded)
    assert args_a.eos_token_ids == (2, 3) and args_a.bos_token_id == 1
    ids = prompt(5)
    torch.testing.assert_close(one_shot_logits(model_a, ids), one_shot_logits(model_b, ids))
    (single / "generation_config.json").unlink()
    config = json.loads((single / "config.json").read_text())
    (single / "config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    assert load(single)[1].eos_token_ids == (7,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bfloat16_on_cuda_matches_hf(make_hf_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    cuda = torch.device("cuda")
    path = make_hf_checkpoint(tmp_path, "llama", num_kv_heads=2)
    model, _ = load(path, torch.bfloat16, cuda)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="eager"
    ).to(cuda)
    ids = prompt(32).to(cuda)
    with torch.no_grad():
        expected = hf(input_ids=ids[None]).logits[0].float()
    ours = one_shot_logits(model, ids)
    # bf16: our attention reference computes in float32, HF's eager path in bf16.
    torch.testing.assert_close(ours, expected, atol=0.05, rtol=0.02)

    model, args = load_model(ModelSpec(preset="llama-1b"), cuda, torch.bfloat16)
    logits = one_shot_logits(model, prompt(8, vocab_size=args.vocab_size).to(cuda))
    assert logits.shape == (8, args.vocab_size) and torch.isfinite(logits).all()
