"""A rank's shard of a loaded model, cut in place (``tensor_parallel.py`` says which way each
weight is split), and the vocab-parallel embedding and LM head.

Every rank loads the whole checkpoint and keeps its slices: the merged QKV rows of its query
heads and of its KV heads (``num_attention_heads / N`` and ``num_key_value_heads / N``; each
must divide), the gate and up rows of its ``intermediate_size / N`` columns, the matching input
columns of the output and down projections, and its ``vocab_size / N`` rows of the embedding and
the LM head (tied or not). Norm weights stay whole. The model's ``args`` become the rank's view
(its heads and columns), so the KV cache is allocated for the rank's KV heads.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from mrv2_prof.runner.parallel.tensor_parallel import TPGroup, tp_kernels


def shard_model(model: nn.Module, tp: TPGroup) -> nn.Module:
    """Cut ``model`` (a loaded ``LlamaForCausalLM``) to ``tp``'s shard; returns it."""
    if tp.world == 1:
        return model
    args = model.args
    d = args.head_dim
    q0, q1 = tp.split(args.num_attention_heads, "model.num_attention_heads")
    k0, k1 = tp.split(args.num_key_value_heads, "model.num_key_value_heads")
    i0, i1 = tp.split(args.intermediate_size, "model.intermediate_size")
    v0, v1 = tp.split(args.vocab_size, "model.vocab_size")
    kernels = tp_kernels(model.kernels, tp)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        _cut_merged(attn.qkv_proj, {"q_proj": (q0 * d, q1 * d), "k_proj": (k0 * d, k1 * d),
                                    "v_proj": (k0 * d, k1 * d)})  # fmt: skip
        attn.num_heads, attn.num_kv_heads = q1 - q0, k1 - k0
        _cut(attn.o_proj, "weight", 1, q0 * d, q1 * d)
        _cut_merged(mlp.gate_up_proj, {"gate_proj": (i0, i1), "up_proj": (i0, i1)})
        _cut(mlp.down_proj, "weight", 1, i0, i1)
        layer.kernels = attn.kernels = mlp.kernels = kernels
    embed = model.model.embed_tokens
    model.model.embed_tokens = VocabParallelEmbedding(embed.weight, v0, v1, tp)
    if not args.tie_word_embeddings:
        _cut(model.lm_head, "weight", 0, v0, v1)
    model.kernels = kernels
    model.tp = tp  # LlamaForCausalLM.logits gathers the vocab slices
    model.args = replace(
        args,
        num_attention_heads=q1 - q0,
        num_key_value_heads=k1 - k0,
        intermediate_size=i1 - i0,
    )
    return model


class VocabParallelEmbedding(nn.Module):
    """The rank's rows ``[start, end)`` of the embedding: each rank looks up the ids in its
    range (the others read row 0 and are zeroed), then one all-reduce gives every rank the
    whole lookup. ``weight`` is the slice (the tied LM head reads it too)."""

    def __init__(self, weight: torch.Tensor, start: int, end: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach()[start:end].clone(), requires_grad=False)
        self.start, self.end, self.tp = start, end, tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.start) & (input_ids < self.end)
        local = torch.where(mine, input_ids - self.start, torch.zeros_like(input_ids))
        x = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(x)


def _cut(module: nn.Module, name: str, dim: int, start: int, end: int) -> None:
    p = getattr(module, name)
    setattr(module, name, nn.Parameter(p.detach().narrow(dim, start, end - start).clone(),
                                       requires_grad=False))  # fmt: skip
    if isinstance(module, nn.Linear):
        module.in_features, module.out_features = module.weight.shape[1], module.weight.shape[0]


def _cut_merged(linear: nn.Module, ranges: dict[str, tuple[int, int]]) -> None:
    """A merged projection's parts, each cut to its rows ``[start, end)``."""
    rows, offset, parts = [], 0, {}
    for name, size in linear.parts.items():
        a, b = ranges[name]
        rows.append(torch.arange(offset + a, offset + b))
        parts[name] = b - a
        offset += size
    keep = torch.cat(rows)
    linear.weight = nn.Parameter(linear.weight.detach()[keep].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[keep].clone(), requires_grad=False)
    linear.parts = parts
    linear.out_features = linear.weight.shape[0]
