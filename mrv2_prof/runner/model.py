"""Llama-architecture decoder (Llama, Qwen2) over a flattened token batch with a paged KV cache.

Corresponds to MRV2's model forward: the runner hands it ``input_ids`` and ``positions`` for all
scheduled tokens of all requests, laid end to end (no batch dimension), plus the attention
metadata; logits are computed separately for the tokens that need them (``logits_indices``).
Parameter names equal Hugging Face's state-dict names, so loading a checkpoint is a name map.
The attention calls are injectable so a Triton kernel can replace the torch references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mrv2_prof.runner.attention import AttentionMetadata, paged_attention_ref, write_kv_ref

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

WriteKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
Attend = Callable[..., torch.Tensor]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the one-line message names the file and the problem."""


@dataclass(frozen=True)
class ModelArgs:
    """Architecture of a Llama-style decoder, from a preset or a Hugging Face ``config.json``."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, float] | None = None  # llama3: factor, low/high_freq_factor, original_*
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v bias (Qwen2); Llama's flag also covers o_proj
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.architecture == "LlamaForCausalLM"

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str) -> ModelArgs:
        """Parse a Hugging Face ``config.json`` dict; ``source`` names the file in errors."""

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise CheckpointError(f"{source}: field {key!r} is missing")
            return cfg[key]

        archs = cfg.get("architectures") or [_MODEL_TYPES.get(cfg.get("model_type", ""))]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(
                f"{source}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported")
        if cfg.get("mlp_bias"):
            raise CheckpointError(f"{source}: mlp_bias=true is not supported")
        if cfg.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
        hidden, heads = need("hidden_size"), need("num_attention_heads")
        max_pos = cfg.get("max_position_embeddings") or 4096
        theta, scaling = _parse_rope(cfg, source, max_pos)
        eos = cfg.get("eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            max_position_embeddings=max_pos,
            eos_token_ids=token_ids(eos),
            bos_token_id=cfg.get("bos_token_id"),
        )


def token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    """A config's ``eos_token_id`` (an int, a list or null) as a tuple."""
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _parse_rope(cfg: dict[str, Any], source: str, max_pos: int) -> tuple[float, dict | None]:
    """Theta and llama3 scaling from ``rope_parameters`` (transformers 5) or ``rope_scaling``."""
    params = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    field = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    if any(isinstance(v, dict) for v in params.values()):
        raise CheckpointError(f"{source}: per-layer {field} is not supported")
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{source}: {field}.partial_rotary_factor != 1 is not supported")
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise CheckpointError(
            f"{source}: {field}.rope_type {rope_type!r} is not supported (supported: llama3)"
        )
    params.setdefault("original_max_position_embeddings", max_pos)
    for key in _LLAMA3_KEYS:
        if key not in params:
            raise CheckpointError(f"{source}: {field}.{key} is missing for llama3 scaling")
    return theta, {key: params[key] for key in _LLAMA3_KEYS}


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


def kv_cache_shape(args: ModelArgs, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """Shape of one layer's paged KV cache: [2 (k, v), num_blocks, block_size, kvh, d]."""
    return (2, num_blocks, block_size, args.num_key_value_heads, args.head_dim)


def kv_cache_bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block id costs summed over all layers (a block id addresses every layer)."""
    per_layer = 2 * block_size * args.num_key_value_heads * args.head_dim * dtype.itemsize
    return per_layer * args.num_hidden_layers


def rope_inv_freq(args: ModelArgs, device: torch.device | None = None) -> torch.Tensor:
    """Float32 inverse frequencies [d/2], with llama3 scaling as in Hugging Face transformers."""
    d = args.head_dim
    exponent = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
    inv_freq = 1.0 / (args.rope_theta**exponent)
    if args.rope_scaling is None:
        return inv_freq
    factor = args.rope_scaling["factor"]
    low, high = args.rope_scaling["low_freq_factor"], args.rope_scaling["high_freq_factor"]
    old_context = args.rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE; cos/sin computed in float32 from the positions, cast to the activations."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    def reset_inv_freq(self, device: torch.device) -> None:
        self.inv_freq = rope_inv_freq(self.args, device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, d]
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, write_kv: WriteKV, attend: Attend) -> None:
        super().__init__()
        h, kvh, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, d
        self.q_proj = nn.Linear(args.hidden_size, h * d, bias=args.attention_bias)
        self.k_proj = nn.Linear(args.hidden_size, kvh * d, bias=args.attention_bias)
        self.v_proj = nn.Linear(args.hidden_size, kvh * d, bias=args.attention_bias)
        self.o_proj = nn.Linear(h * d, args.hidden_size, bias=args.o_proj_bias)
        self.write_kv, self.attend = write_kv, attend

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
        kv_cache: torch.Tensor | None,  # [2, num_blocks, block_size, kvh, d]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv(x, cos, sin)
        return self.o_proj(self.attention(q, k, v, kv_cache, meta).reshape(x.shape[0], -1))

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections and RoPE: q [T, h, d], k and v [T, kvh, d]."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)  # [T, h, d]
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)  # [T, kvh, d]
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)  # [T, kvh, d]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, d]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """The KV-cache write and paged attention: the part PIECEWISE graphs leave eager."""
        if kv_cache is not None:
            self.write_kv(k, v, kv_cache, meta.slot_mapping)
        return self.attend(q, k, v, kv_cache, meta, scale=self.head_dim**-0.5)  # [T, h, d]


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, write_kv: WriteKV, attend: Attend) -> None:
        super().__init__()
        self.self_attn = Attention(args, write_kv, attend)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        attn = self.self_attn.attention(*self.pre_attention(x, cos, sin), kv_cache, meta)
        return self.post_attention(x, attn)

    def pre_attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.qkv(self.input_layernorm(x), cos, sin)

    def post_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + output projection, then residual + MLP; ``attn`` is [T, h, d]."""
        x = x + self.self_attn.o_proj(attn.reshape(x.shape[0], -1))
        return x + self.mlp(self.post_attention_layernorm(x))  # [T, H]


class DecoderModel(nn.Module):
    """The ``model.`` prefix of the Hugging Face state dict."""

    def __init__(self, args: ModelArgs, write_kv: WriteKV, attend: Attend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(args, write_kv, attend) for _ in range(args.num_hidden_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(args)


class LlamaForCausalLM(nn.Module):
    """Llama/Qwen2 decoder; ``lm_head`` exists only when the embeddings are untied."""

    def __init__(
        self,
        args: ModelArgs,
        write_kv: WriteKV = write_kv_ref,
        attend: Attend = paged_attention_ref,
    ) -> None:
        super().__init__()
        self.args = args
        self.model = DecoderModel(args, write_kv, attend)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def init_buffers(self) -> None:
        """Recompute the non-persistent RoPE buffer on the weights' device (after a meta build)."""
        self.model.rotary_emb.reset_inv_freq(self.model.embed_tokens.weight.device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor] | None,  # per layer [2, num_blocks, block_size, kvh, d]
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        x, cos, sin = self.embed(input_ids, positions)
        for i, layer in enumerate(self.model.layers):
            kv_cache = kv_caches[i] if kv_caches is not None else None
            x = layer(x, cos, sin, kv_cache, attn_metadata)
        return self.model.norm(x)  # [T, H]

    def embed(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token embeddings [T, H] and the RoPE cos/sin [T, d] of the positions."""
        x = self.model.embed_tokens(input_ids)  # [T, H]
        cos, sin = self.model.rotary_emb(positions, x.dtype)  # [T, d]
        return x, cos, sin

    @property
    def lm_head_weight(self) -> torch.Tensor:
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> float32 logits [N, vocab]; the matmul runs in the weights' dtype."""
        return F.linear(hidden, self.lm_head_weight).float()  # [N, V]
