"""Model presets and configs: seeded and finite weights, parameter counts against transformers'
models, ``from_hf_config`` and ``to_hf_config``, KV-cache sizes, and (``gpu``) presets drawn on
the device in bfloat16."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from mrv2_prof.runner.config import ConfigError, ModelSpec
from mrv2_prof.runner.model import (
    PRESETS,
    ModelArgs,
    kv_cache_bytes_per_block,
    kv_cache_shape,
)
from mrv2_prof.runner.model.args import weight_count
from mrv2_prof.runner.model.checkpoint_args import expected_tensors
from mrv2_prof.runner.model.decoder import LlamaForCausalLM
from mrv2_prof.runner.model.loader import load_model, load_preset
from mrv2_prof.runner.model.presets import PRESET_PARAMS
from tests.runner.decoder_forward import CPU, LLAMA3_SCALING, one_shot_logits, prompt


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
