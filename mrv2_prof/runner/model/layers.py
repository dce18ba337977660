"""The decoder layer's parts: RMSNorm, rotary embedding, attention (the merged QKV projection,
Qwen3's per-head q/k norm with RoPE, the KV write and paged attention) and the gated MLP (merged
gate/up).

Every op a layer runs besides its GEMMs comes from the ``ModelKernels`` bundle it was built with
(``model_kernels.py``): the torch references or the fused Triton kernels. Parameters are stored
merged (``qkv_proj``, ``gate_up_proj``) but state dicts name them as Hugging Face does
(``merged_linear.py``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mrv2_prof.runner.model.args import ModelArgs
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.merged_linear import MergedLinear, name_parts_in_state_dict
from mrv2_prof.runner.model.model_kernels import (
    TORCH_MODEL_KERNELS,
    Attend,
    ModelKernels,
    WriteKV,
)
from mrv2_prof.runner.model.norm_triton import rmsnorm_ref
from mrv2_prof.runner.model.rotary_triton import rope_cos_sin_cache

__all__ = [
    "MLP",
    "Attend",
    "Attention",
    "DecoderLayer",
    "RMSNorm",
    "RopeTables",
    "RotaryEmbedding",
    "WriteKV",
    "rope_inv_freq",
]


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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, rmsnorm=rmsnorm_ref) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.rmsnorm = rmsnorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rmsnorm(x, self.weight, self.eps)


class RopeTables(NamedTuple):
    """What QK-norm + RoPE reads for a step: cos/sin tables [R, >= d/2] and the row of each
    token (``positions``), or per-token tables [T, d] (``positions`` None)."""

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor | None


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE angles. Without a cache, ``tables`` computes the positions' cos/sin [T, d]
    from ``inv_freq`` every step, in the activations' dtype (the torch decoder's arithmetic); with
    ``cos_sin_cache`` a float32 [max_positions, d] table (cos | sin) is built once and the layers
    read it by position: no per-step work."""

    def __init__(self, args: ModelArgs, cos_sin_cache: bool = False) -> None:
        super().__init__()
        self.args = args
        self.half = args.head_dim // 2
        # A meta build takes shapes only (reset_inv_freq fills the values): torch's arithmetic on
        # the meta device loads torch._dynamo, 1.6 s of every start-up.
        meta = torch.empty(0).is_meta
        positions = args.max_position_embeddings
        inv_freq = torch.empty(self.half) if meta else rope_inv_freq(args)
        cache = None
        if cos_sin_cache:
            cache = (
                torch.empty(positions, 2 * self.half)
                if meta
                else rope_cos_sin_cache(inv_freq, positions)
            )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def reset_inv_freq(self, device: torch.device) -> None:
        self.inv_freq = rope_inv_freq(self.args, device)
        if self.cos_sin_cache is not None:
            max_positions = self.args.max_position_embeddings
            self.cos_sin_cache = rope_cos_sin_cache(self.inv_freq, max_positions)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """The positions' cos and sin [T, d] in ``dtype``, computed from ``inv_freq``."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, d]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        """The cache's two halves read at ``positions``, or (without a cache) this step's
        per-token tables."""
        if self.cos_sin_cache is not None:
            cache = self.cos_sin_cache
            return RopeTables(cache[:, : self.half], cache[:, self.half :], positions)
        return RopeTables(*self(positions, dtype), None)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, kernels: ModelKernels = TORCH_MODEL_KERNELS) -> None:
        super().__init__()
        h, kvh, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, d
        parts = {"q_proj": h * d, "k_proj": kvh * d, "v_proj": kvh * d}
        self.qkv_proj = MergedLinear(args.hidden_size, parts, bias=args.attention_bias)
        name_parts_in_state_dict(self, "qkv_proj")
        self.o_proj = nn.Linear(h * d, args.hidden_size, bias=args.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if args.qk_norm:  # one weight [d] shared by all heads, as in Hugging Face's Qwen3
            self.q_norm = RMSNorm(d, args.rms_norm_eps, kernels.rmsnorm)
            self.k_norm = RMSNorm(d, args.rms_norm_eps, kernels.rmsnorm)
        self.kernels = kernels

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        rope: RopeTables,
        kv_cache: torch.Tensor | None,  # [2, num_blocks, block_size, kvh, d]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv(x, rope, kv_cache, meta.slot_mapping)
        attn = self.attend(q, k, v, kv_cache, meta).reshape(x.shape[0], -1)
        return self.o_proj(attn)

    def qkv(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv_cache: torch.Tensor | None = None,
        slot_mapping: torch.Tensor | None = None,
        norm: RMSNorm | None = None,
        normed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(``norm``, the layer's input norm, where given, fused with the GEMM by the bundle) the
        QKV GEMM, then q/k norm (Qwen3) + RoPE: q [T, h, d], k and v [T, kvh, d] (views of the
        GEMM's output in the Triton path). With ``kv_cache``, k and v are also written at
        ``slot_mapping`` (by the RoPE kernel itself where the bundle fuses the two). ``normed``:
        ``norm(x)``, already made by the layer before (``DecoderLayer.step``)."""
        T, d = x.shape[0], self.head_dim
        q, k, v = self.qkv_proj.split(self.project_qkv(x, norm, normed))
        q, k, v = q.view(T, -1, d), k.view(T, -1, d), v.view(T, -1, d)
        args = (q, k, *rope)
        if self.q_norm is not None and self.k_norm is not None:
            args += (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        if kv_cache is not None and self.kernels.rope_writes_kv:
            q, k = self.kernels.qk_norm_rope(
                *args, v=v, kv_cache=kv_cache, slot_mapping=slot_mapping
            )
            return q, k, v
        q, k = self.kernels.qk_norm_rope(*args)
        if kv_cache is not None:
            self.kernels.write_kv(k, v, kv_cache, slot_mapping)
        return q, k, v

    def project_qkv(
        self, x: torch.Tensor, norm: RMSNorm | None, normed: torch.Tensor | None
    ) -> torch.Tensor:
        """The QKV GEMM's output [T, q + k + v]: of ``normed`` where given (``norm(x)`` made by
        the layer before), else of ``norm(x)`` (fused with the GEMM by the bundle), else of
        ``x``."""
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        if normed is not None:
            return self.kernels.linear(normed, w, b)
        if norm is not None:
            return self.kernels.norm_linear(x, norm.weight, norm.eps, w, b)
        return F.linear(x, w, b)

    def rope_attend(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv_cache: torch.Tensor,
        meta,
        norm: RMSNorm,
        normed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The input norm (unless ``normed`` has it) and QKV GEMM, then QK-norm + RoPE, the KV
        write and attention in the bundle's one launch (``rope_attend``): [T, h, d]."""
        T, d = x.shape[0], self.head_dim
        q, k, v = self.qkv_proj.split(self.project_qkv(x, norm, normed))
        weights: tuple = (None, None, 1e-6)
        if self.q_norm is not None and self.k_norm is not None:
            weights = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        q, k, v = q.view(T, -1, d), k.view(T, -1, d), v.view(T, -1, d)
        return self.kernels.rope_attend(q, k, v, *rope, *weights, kv_cache, meta, d**-0.5)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Paged attention over the cache, this step's k and v already in it: [T, h, d]."""
        return self.kernels.attend(q, k, v, kv_cache, meta, scale=self.head_dim**-0.5)

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
            self.kernels.write_kv(k, v, kv_cache, meta.slot_mapping)
        return self.attend(q, k, v, kv_cache, meta)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, kernels: ModelKernels = TORCH_MODEL_KERNELS) -> None:
        super().__init__()
        inter = args.intermediate_size
        parts = {"gate_proj": inter, "up_proj": inter}
        self.gate_up_proj = MergedLinear(args.hidden_size, parts, bias=False)
        name_parts_in_state_dict(self, "gate_up_proj")
        self.down_proj = nn.Linear(inter, args.hidden_size, bias=False)
        self.kernels = kernels

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + down(silu(gate(x)) * up(x)); the Triton path adds into ``residual``."""
        return self.down(residual, F.linear(x, self.gate_up_proj.weight))

    def down(self, residual: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
        """residual + down(silu(gate) * up) from the gate/up GEMM's output [T, 2I]."""
        return self.kernels.mlp_down(residual, gate_up, self.down_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, kernels: ModelKernels = TORCH_MODEL_KERNELS) -> None:
        super().__init__()
        self.self_attn = Attention(args, kernels)
        self.mlp = MLP(args, kernels)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, kernels.rmsnorm)
        self.post_attention_layernorm = RMSNorm(
            args.hidden_size, args.rms_norm_eps, kernels.rmsnorm
        )
        self.kernels = kernels

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        rope: RopeTables,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """One layer of a forward pass; the KV write happens inside QK-norm + RoPE where the
        bundle fuses it, and both inside attention where it folds them (a decode batch)."""
        return self.step(x, rope, kv_cache, meta)[0]

    def step(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        normed: torch.Tensor | None = None,
        after: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward`` with ``normed`` (this layer's input norm of ``x``, made by the layer
        before, or None) and ``after`` (the norm after this layer: the next layer's input norm
        or the final norm): (x, ``after(x)`` where the bundle made it with the down projection,
        else None)."""
        if self.kernels.folds_rope(x.shape[0], meta, kv_cache):
            attn = self.self_attn.rope_attend(x, rope, kv_cache, meta, self.input_layernorm,
                                              normed)  # fmt: skip
            return self.post_attention_norm(x, attn, after)
        q, k, v = self.pre_attention(x, rope, kv_cache, meta.slot_mapping, normed)
        return self.post_attention_norm(x, self.self_attn.attend(q, k, v, kv_cache, meta), after)

    def pre_attention(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv_cache: torch.Tensor | None = None,
        slot_mapping: torch.Tensor | None = None,
        normed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RMSNorm (unless ``normed`` has it), QKV, QK-norm + RoPE; with ``kv_cache`` also the KV
        write (then only ``self_attn.attend`` is left before ``post_attention``, else
        ``self_attn.attention``)."""
        norm = self.input_layernorm
        return self.self_attn.qkv(x, rope, kv_cache, slot_mapping, norm=norm, normed=normed)

    def post_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + output projection, then residual + MLP; ``attn`` is [T, h, d]. The Triton
        path updates ``x`` in place (and returns it)."""
        return self.post_attention_norm(x, attn, None)[0]  # [T, H]

    def post_attention_norm(
        self, x: torch.Tensor, attn: torch.Tensor, after: RMSNorm | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``post_attention``, and ``after(x)`` where the bundle makes it with the down
        projection (``fuses_down_norm``), else None."""
        o_proj, norm = self.self_attn.o_proj, self.post_attention_layernorm
        args = (x, attn.reshape(x.shape[0], -1), o_proj.weight, o_proj.bias, norm.weight,
                norm.eps, self.mlp.gate_up_proj.weight)  # fmt: skip
        down = self.mlp.down_proj.weight
        if after is not None and self.kernels.fuses_down_norm(x, down):
            gate_up, x = self.kernels.add_norm_linear(*args)
            return x, self.kernels.mlp_down_norm(x, gate_up, down, after.weight, after.eps)
        if self.kernels.add_norm_mlp is not None:
            return self.kernels.add_norm_mlp(*args, down), None
        gate_up, x = self.kernels.add_norm_linear(*args)
        return self.mlp.down(x, gate_up), None
