"""Llama-architecture decoder (Llama, Qwen2) over a flattened token batch with a paged KV cache.

Corresponds to MRV2's model forward: the runner hands it ``input_ids`` and ``positions`` for all
scheduled tokens of all requests, laid end to end (no batch dimension), plus the attention
metadata; logits are computed separately for the tokens that need them (``logits_indices``).
State-dict names equal Hugging Face's, so loading a checkpoint is a name map (the merged QKV and
gate/up projections name their parts as the checkpoint does). The per-layer ops come from a
``ModelKernels`` bundle, so the fused Triton kernels can replace the torch references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mrv2_prof.runner.model.args import ModelArgs
from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.layers import DecoderLayer, RMSNorm, RopeTables, RotaryEmbedding
from mrv2_prof.runner.model.model_kernels import TORCH_MODEL_KERNELS, ModelKernels


class DecoderModel(nn.Module):
    """The ``model.`` prefix of the Hugging Face state dict."""

    def __init__(self, args: ModelArgs, kernels: ModelKernels) -> None:
        super().__init__()
        # Built without its own random init (the loader fills every weight): Embedding's
        # ``normal_`` on the meta device loads torch._dynamo, 1.6 s of every start-up.
        shape = (args.vocab_size, args.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(
            DecoderLayer(args, kernels) for _ in range(args.num_hidden_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, kernels.rmsnorm)
        self.rotary_emb = RotaryEmbedding(args, cos_sin_cache=kernels.cos_sin_cache)


class LlamaForCausalLM(nn.Module):
    """Llama/Qwen2 decoder; ``lm_head`` exists only when the embeddings are untied. A rank's
    shard (``runner/parallel/shard.py``) sets ``tp``: its LM head holds a vocab slice."""

    tp = None  # the tensor-parallel group of a shard: logits are gathered across it

    def __init__(self, args: ModelArgs, kernels: ModelKernels = TORCH_MODEL_KERNELS) -> None:
        super().__init__()
        self.args = args
        self.kernels = kernels
        self.model = DecoderModel(args, kernels)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def init_buffers(self) -> None:
        """Recompute the non-persistent RoPE buffers on the weights' device (after a meta build)."""
        self.model.rotary_emb.reset_inv_freq(self.model.embed_tokens.weight.device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[torch.Tensor] | None,  # per layer [2, num_blocks, block_size, kvh, d]
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        x, rope = self.embed(input_ids, positions)
        layers, normed = self.model.layers, None
        for i, layer in enumerate(layers):
            kv_cache = kv_caches[i] if kv_caches is not None else None
            # the norm after the layer: where the bundle makes it with the down projection
            # (ModelKernels.fuses_down_norm), the next layer takes it as its input norm
            after = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm
            x, normed = layer.step(x, rope, kv_cache, attn_metadata, normed, after)
        return normed if normed is not None else self.model.norm(x)  # [T, H]

    def embed(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, RopeTables]:
        """Token embeddings [T, H] and the RoPE tables of the positions: the cos/sin cache read
        at ``positions`` (no work), or this step's per-token cos/sin [T, d]."""
        x = self.model.embed_tokens(input_ids)  # [T, H]
        return x, self.model.rotary_emb.tables(positions, x.dtype)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> logits [N, vocab] in the weights' dtype: one GEMM. The samplers read them
        as they are (the Triton sampler upcasts in registers, the torch one with ``.float()``),
        which is the same float32 values as ``compute_logits`` without a [N, V] copy."""
        logits = F.linear(hidden, self.lm_head_weight)  # [N, V] (a shard: [N, V / world])
        return logits if self.tp is None else self.tp.all_gather_last(logits)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> float32 logits [N, vocab]; the matmul runs in the weights' dtype."""
        return self.logits(hidden).float()  # [N, V]
