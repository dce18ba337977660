"""Preset architectures (random weights by seed): the shapes the scenarios name in
``model.preset``. Each copies the ``config.json`` of the public model it is named after:
Llama-3.2-1B, Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.1-8B (``PRESET_PARAMS``: their parameter
counts, a tied embedding counted once)."""

from __future__ import annotations

from mrv2_prof.runner.model.args import ModelArgs

LLAMA3_EOS = (128001, 128008, 128009)  # <|end_of_text|>, <|eom_id|>, <|eot_id|>

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
    # a draft model for llama-tiny (speculative decoding): its vocabulary, one narrow layer
    "llama-tiny-draft": ModelArgs(
        architecture="LlamaForCausalLM",
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
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
        eos_token_ids=LLAMA3_EOS,
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
    "qwen3-0.6b": ModelArgs(
        architecture="Qwen3ForCausalLM",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,  # not hidden_size / heads (64): q and o are 2048 wide
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        eos_token_ids=(151645, 151643),  # <|im_end|>, <|endoftext|>
        bos_token_id=None,
    ),
    "llama-3-8b": ModelArgs(
        architecture="LlamaForCausalLM",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling={
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        eos_token_ids=LLAMA3_EOS,
        bos_token_id=128000,
    ),
}

PRESET_PARAMS: dict[str, int] = {
    "llama-tiny": 139_584,
    "llama-tiny-draft": 42_080,
    "llama-1b": 1_235_814_400,
    "qwen2-0.5b": 494_032_768,
    "qwen3-0.6b": 596_049_920,
    "llama-3-8b": 8_030_261_248,
}
