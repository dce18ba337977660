"""The decoder against Hugging Face transformers, chunked and batched forwards, loader errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from mrv2_prof.runner.config import ConfigError, ModelSpec
from mrv2_prof.runner.model import (
    PRESETS,
    ModelArgs,
    kv_cache_bytes_per_block,
    kv_cache_shape,
    rope_inv_freq,
)
from mrv2_prof.runner.model.args import weight_count
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.checkpoint_args import expected_tensors
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.loader import CheckpointError, load_model, load_preset
from mrv2_prof.runner.model.presets import PRESET_PARAMS

CPU = torch.device("cpu")
ATOL_HF = 1e-4  # float32, ours vs transformers (different op order in attention)
ATOL_SELF = 1e-5  # float32, ours vs ours with a different chunking/batching
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # with head_dim 16 this hits all three bands
}


def prompt(n: int, vocab_size: int = 256, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
) -> AttentionMetadata:
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    width = max(len(row) for row in block_tables)
    table = [row + [0] * (width - len(row)) for row in block_tables]
    return AttentionMetadata(
        num_reqs=len(query_lens),
        num_tokens=int(query_start_loc[-1]),
        query_start_loc=torch.from_numpy(query_start_loc),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor(table, dtype=torch.int32),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64),
        query_start_loc_np=query_start_loc,
        seq_lens_np=np.array(seq_lens, dtype=np.int32),
        block_size=block_size,
    )


def slots(blocks: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions [start, end) of a request whose block-table row is ``blocks``."""
    return [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]


def one_shot_logits(model, ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
    """All-token logits of ``ids`` as one fresh prefill without a KV cache."""
    n = len(ids)
    meta = metadata([n], [n], [[0]], [0] * n, block_size=16)
    positions = torch.arange(start_pos, start_pos + n, device=ids.device)
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, None, meta))


def hf_logits(path: Path, ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    positions = torch.arange(start_pos, start_pos + len(ids))[None]
    with torch.no_grad():
        return hf(input_ids=ids[None], position_ids=positions).logits[0].float()


def load(path: Path, dtype: torch.dtype = torch.float32, device: torch.device = CPU):
    return load_model(ModelSpec(preset=None, path=str(path)), device, dtype)


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


def test_hf_config_defaults_and_legacy_rope_fields():
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "rope_theta": 5e5,
        "rope_scaling": {
            **{k: v for k, v in LLAMA3_SCALING.items() if k != "rope_type"},
            "type": "llama3",
        },
        "eos_token_id": 2,
    }
    args = ModelArgs.from_hf_config(cfg, "x/config.json")
    assert (args.head_dim, args.num_key_value_heads, args.rope_theta) == (8, 8, 5e5)
    assert args.rope_scaling is not None and args.rope_scaling["factor"] == 8.0
    assert args.eos_token_ids == (2,) and not args.tie_word_embeddings


def test_presets_are_seeded_and_finite():
    def weights(seed: int) -> dict[str, torch.Tensor]:
        model, _ = load_model(ModelSpec(preset="llama-tiny", seed=seed), CPU, torch.float32)
        return model.state_dict()

    first, again, other = weights(0), weights(0), weights(1)
    assert first.keys() == again.keys() and "lm_head.weight" in first
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(
        first["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"]
    )
    model, args = load_model(ModelSpec(preset="llama-tiny"), CPU, torch.float32)
    assert args == PRESETS["llama-tiny"]
    logits = one_shot_logits(model, prompt(16, vocab_size=args.vocab_size))
    assert logits.shape == (16, 512) and torch.isfinite(logits).all()
    assert len(set(logits.argmax(-1).tolist())) > 1
    with pytest.raises(ConfigError, match=r"model\.preset.*llama-tiny"):
        load_model(ModelSpec(preset="gpt-9"), CPU, torch.float32)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_build_on_meta_with_the_documented_parameter_count(name):
    with torch.device("meta"):
        model = LlamaForCausalLM(PRESETS[name])
    params = list(model.parameters())
    assert all(p.is_meta for p in params)
    assert sum(p.numel() for p in params) == PRESET_PARAMS[name]


def test_preset_shapes_of_the_public_models():
    qwen3, llama8 = PRESETS["qwen3-0.6b"], PRESETS["llama-3-8b"]
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.tie_word_embeddings
    assert qwen3.head_dim * qwen3.num_attention_heads == 2 * qwen3.hidden_size
    assert (qwen3.rope_theta, qwen3.rope_scaling) == (1e6, None)
    assert qwen3.eos_token_ids == (151645, 151643)
    assert not llama8.qk_norm and not llama8.tie_word_embeddings
    assert llama8.rope_scaling == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert (llama8.eos_token_ids, llama8.bos_token_id) == ((128001, 128008, 128009), 128000)
    assert round(PRESET_PARAMS["qwen3-0.6b"] / 1e6) == 596


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_equal_transformers_models_of_their_hf_config(name):
    """``to_hf_config`` reads back equal, and transformers builds the same parameter count from
    it (its own config class: defaults it fills in must not change the shapes)."""
    import transformers

    args = PRESETS[name]
    cfg = args.to_hf_config()
    assert ModelArgs.from_hf_config(cfg, "preset") == args
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    assert type(hf_cfg).__name__ == args.architecture.replace("ForCausalLM", "Config")
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert type(hf).__name__ == args.architecture
    assert sum(p.numel() for p in hf.parameters()) == PRESET_PARAMS[name]
    with torch.device("meta"):
        ours = LlamaForCausalLM(args)
    hf_shapes = {k: tuple(v.shape) for k, v in hf.state_dict().items() if "rotary" not in k}
    if args.tie_word_embeddings:
        hf_shapes.pop("lm_head.weight")
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == hf_shapes


_TINY = PRESETS["llama-tiny"]
WEIGHT_COUNT_CASES = {
    **{name: PRESETS[name] for name in PRESETS},
    "llama-bias-tied": replace(_TINY, attention_bias=True, tie_word_embeddings=True),
    "qwen2-untied": replace(PRESETS["qwen2-0.5b"], tie_word_embeddings=False),
    "qwen3-bias": replace(PRESETS["qwen3-0.6b"], attention_bias=True),
}


@pytest.mark.parametrize("name", list(WEIGHT_COUNT_CASES))
def test_weight_count_is_the_transformers_models_parameter_count(name):
    """The arithmetic the checks before a run use (no model built) against transformers' own
    model of the same config, and against the tensors the loader expects."""
    import transformers

    args = WEIGHT_COUNT_CASES[name]
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**args.to_hf_config())
        )
    assert weight_count(args) == sum(p.numel() for p in hf.parameters())
    shapes = expected_tensors(args).values()
    assert weight_count(args) == sum(math.prod(shape) for shape in shapes)


def test_qwen3_hf_config_fields():
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_theta": 1e6,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "eos_token_id": 7,
    }
    args = ModelArgs.from_hf_config(cfg, "x/config.json")
    assert (args.head_dim, args.num_key_value_heads, args.rope_theta) == (32, 2, 1e6)
    assert args.qk_norm and not args.attention_bias and not args.o_proj_bias
    with_bias = ModelArgs.from_hf_config({**cfg, "attention_bias": True}, "x/config.json")
    assert with_bias.attention_bias and with_bias.o_proj_bias
    by_type = {k: v for k, v in cfg.items() if k != "architectures"}
    assert ModelArgs.from_hf_config(by_type, "x/config.json") == args


def test_kv_cache_sizes():
    args = PRESETS["llama-1b"]
    assert kv_cache_shape(args, 10, 16) == (2, 10, 16, 8, 64)
    assert kv_cache_bytes_per_block(args, 16, torch.bfloat16) == 2 * 16 * 8 * 64 * 2 * 16


def _edit_config(path: Path, **fields) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **fields}))


def _edit_tensors(path: Path, drop: str | None = None, reshape: str | None = None) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:32].clone()
    save_file(tensors, file, metadata={"format": "pt"})


CHECKPOINT_ERRORS = {
    "missing-config": (
        lambda p: (p / "config.json").unlink(),
        ["config.json", "missing"],
    ),
    "invalid-json": (
        lambda p: (p / "config.json").write_text("{not json"),
        ["config.json", "invalid JSON"],
    ),
    "architecture": (
        lambda p: _edit_config(p, architectures=["MistralForCausalLM"]),
        ["config.json", "MistralForCausalLM", "LlamaForCausalLM, Qwen2ForCausalLM"],
    ),
    "rope-type": (
        lambda p: _edit_config(p, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
        ["config.json", "rope_parameters.rope_type", "yarn"],
    ),
    "no-safetensors": (
        lambda p: (p / "model.safetensors").unlink(),
        ["no *.safetensors"],
    ),
    "missing-tensor": (
        lambda p: _edit_tensors(p, drop="model.layers.1.mlp.up_proj.weight"),
        ["'model.layers.1.mlp.up_proj.weight' is missing"],
    ),
    "missing-lm-head": (
        lambda p: _edit_tensors(p, drop="lm_head.weight"),
        ["'lm_head.weight' is missing"],
    ),
    "shape": (
        lambda p: _edit_tensors(p, reshape="model.norm.weight"),
        ["model.safetensors", "'model.norm.weight'", "[32]", "expected [64]"],
    ),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_ERRORS))
def test_checkpoint_errors_name_the_file_and_field(make_hf_checkpoint, tmp_path, case):
    path = make_hf_checkpoint(tmp_path, "llama")
    break_it, expected = CHECKPOINT_ERRORS[case]
    break_it(path)
    with pytest.raises(CheckpointError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for part in expected:
        assert part in message


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as info:
        load(tmp_path / "meta-llama/Llama-3.2-1B")
    assert str(tmp_path / "meta-llama/Llama-3.2-1B") in str(info.value)


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-3-8b"])
def test_preset_initialises_on_the_device_in_bfloat16(name):
    """Weights are drawn on the GPU in bf16: the peak allocation is the weights themselves (no
    float32 copy, no host tensor), and the seed fixes them."""
    import time

    cuda = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = load_preset(name, 0, cuda, torch.bfloat16)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    weight_bytes = 2 * PRESET_PARAMS[name]
    peak = torch.cuda.max_memory_allocated() - base
    print(f"{name}: {weight_bytes / 1e9:.2f} GB in {init_s:.2f} s, peak {peak / 1e9:.2f} GB")
    assert all(p.device.type == "cuda" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == PRESET_PARAMS[name]
    assert peak <= weight_bytes + (64 << 20)
    first = model.model.layers[0].mlp.down_proj.weight[:4, :8].clone()
    del model
    again = load_preset(name, 0, cuda, torch.bfloat16)
    assert torch.equal(again.model.layers[0].mlp.down_proj.weight[:4, :8], first)
