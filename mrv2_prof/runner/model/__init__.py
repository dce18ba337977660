"""The model: a Llama-style decoder (``args``, ``presets``, ``layers``, ``decoder``), its loader,
and attention with its Triton kernel. This package exports the names the runner uses.

The names load on first use (PEP 562): the CLI's parent process reads configs, presets and the
shipped files through ``args``/``presets``/``shipped`` without importing torch, which only the
runner process needs."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "SUPPORTED_ARCHITECTURES": "args",
    "CheckpointError": "args",
    "ModelArgs": "args",
    "kv_cache_bytes_per_block": "args",
    "kv_cache_shape": "args",
    "token_ids": "args",
    "DecoderModel": "decoder",
    "LlamaForCausalLM": "decoder",
    "MLP": "layers",
    "Attend": "layers",
    "Attention": "layers",
    "DecoderLayer": "layers",
    "RMSNorm": "layers",
    "RotaryEmbedding": "layers",
    "WriteKV": "layers",
    "rope_inv_freq": "layers",
    "PRESETS": "presets",
    "rotate_half": "rotary_triton",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


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
