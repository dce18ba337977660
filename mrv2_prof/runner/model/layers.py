"""The decoder layer's parts: RMSNorm, rotary embedding, attention (projections, Qwen3's per-head
q/k norm, RoPE, the injectable KV write and paged attention) and the gated MLP."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mrv2_prof.runner.model.args import ModelArgs
from mrv2_prof.runner.model.attention import AttentionMetadata

WriteKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
Attend = Callable[..., torch.Tensor]


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
        self.qk_norm = args.qk_norm
        if self.qk_norm:  # one weight [d] shared by all heads, as in Hugging Face's Qwen3
            self.q_norm = RMSNorm(d, args.rms_norm_eps)
            self.k_norm = RMSNorm(d, args.rms_norm_eps)
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
        """Projections, q/k norm (Qwen3) and RoPE: q [T, h, d], k and v [T, kvh, d]."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)  # [T, h, d]
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)  # [T, kvh, d]
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)  # [T, kvh, d]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
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
