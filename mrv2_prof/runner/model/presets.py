"""Preset architectures (random weights by seed): the shapes the scenarios name in
``model.preset``."""

from __future__ import annotations

from mrv2_prof.runner.model.args import ModelArgs

PRESETS: dict[str, ModelArgs] = {
    "llama-tiny": ModelArgs(
        architecture="LlamaForCausalLM",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        eos_token_ids=(2,),
        bos_token_id=1,
    ),
    "llama-1b": ModelArgs(
        architecture="LlamaForCausalLM",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling={
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        eos_token_ids=(128001, 128008, 128009),
        bos_token_id=128000,
    ),
    "qwen2-0.5b": ModelArgs(
        architecture="Qwen2ForCausalLM",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        attention_bias=True,
        max_position_embeddings=32768,
        eos_token_ids=(151643, 151645),
        bos_token_id=None,
    ),
}
