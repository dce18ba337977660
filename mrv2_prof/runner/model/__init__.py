"""The model: a Llama-style decoder (``args``, ``presets``, ``layers``, ``decoder``), its loader,
and attention with its Triton kernel. This package exports the names the runner uses."""

from mrv2_prof.runner.model.args import (
    SUPPORTED_ARCHITECTURES,
    CheckpointError,
    ModelArgs,
    kv_cache_bytes_per_block,
    kv_cache_shape,
    token_ids,
)
from mrv2_prof.runner.model.decoder import DecoderModel, LlamaForCausalLM
from mrv2_prof.runner.model.layers import (
    MLP,
    Attend,
    Attention,
    DecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    WriteKV,
    rope_inv_freq,
)
from mrv2_prof.runner.model.presets import PRESETS
from mrv2_prof.runner.model.rotary_triton import rotate_half

__all__ = [
    "MLP",
    "PRESETS",
    "SUPPORTED_ARCHITECTURES",
    "Attend",
    "Attention",
    "CheckpointError",
    "DecoderLayer",
    "DecoderModel",
    "LlamaForCausalLM",
    "ModelArgs",
    "RMSNorm",
    "RotaryEmbedding",
    "WriteKV",
    "kv_cache_bytes_per_block",
    "kv_cache_shape",
    "rope_inv_freq",
    "token_ids",
    "rotate_half",
]
