"""What the captured CUDA graphs run: every call the graph code makes into the model.

* FULL (``full_body``): the model's whole forward pass, then the LM head into static logits.
* PIECEWISE (``PiecewiseBody``): the model cut at its attention calls. Segment 0 embeds the
  tokens and runs layer 0 up to its q/k/v; segment i runs layer i-1's output projection and MLP
  and layer i up to its q/k/v; the last segment runs the last layer's rest and the final norm.
  Each segment is one graph; layer i's paged attention runs eagerly between segments i and i+1,
  with the batch's real metadata. Given the static ``slot_mapping`` buffer and a model whose
  RoPE kernel writes the KV cache (the Triton ops), each segment also writes its layer's k/v
  into the cache, so only the attention is left eager; otherwise the KV write runs eagerly
  before it. The residual stream, q/k/v and the attention output cross from one segment to the
  next in static buffers owned here (their shapes follow the layer interface), and so do the
  RoPE cos/sin when the model computes them per step; RoPE tables read by position need no
  copy (the positions are a static buffer already).

This module is the one place to change when the model's layer interface (``embed``,
``pre_attention``, ``self_attn.attend`` / ``self_attn.attention``, ``post_attention``, ``norm``)
changes; ``cudagraph_runner.py`` only captures and replays what it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.layers import RopeTables


def full_body(
    model,
    kv_caches: list[torch.Tensor],
    input_ids: torch.Tensor,  # [B] static
    positions: torch.Tensor,  # [B] static
    meta: AttentionMetadata,  # over static buffers
    logits: torch.Tensor,  # [B, V] static, the weights' dtype: written
) -> None:
    """The FULL graph's work for one capture size: the forward pass, then the LM head straight
    into the static logits (one GEMM, no cast: the samplers read the weights' dtype)."""
    hidden = model(input_ids, positions, kv_caches, meta)
    torch.mm(hidden, model.lm_head_weight.t(), out=logits)


class PiecewiseBody:
    """The PIECEWISE segments of one model and KV cache, and the eager attention between them."""

    def __init__(
        self,
        model,
        kv_caches: list[torch.Tensor],
        max_tokens: int,
        slot_mapping: torch.Tensor | None = None,
    ) -> None:
        """``max_tokens``: the largest piecewise capture size (0: no piecewise graphs).
        ``slot_mapping``: the static [max_tokens] slot buffer, for the KV write in the segments
        (slots < 0 are not written); None keeps the KV write eager."""
        self.model, self.kv_caches = model, kv_caches
        self.slot_mapping = slot_mapping
        self.kv_in_segments = slot_mapping is not None and model.kernels.rope_writes_kv
        self._rope: dict[int, RopeTables] = {}  # per capture size: what the later segments read
        args = model.args
        dev, dtype = kv_caches[0].device, model.model.embed_tokens.weight.dtype
        h, kvh, d = args.num_attention_heads, args.num_key_value_heads, args.head_dim

        def zeros(*shape):
            return torch.zeros((max_tokens, *shape), dtype=dtype, device=dev)

        self.x = zeros(args.hidden_size)  # the residual stream
        self.cos = zeros(d)
        self.sin = zeros(d)
        self.q = zeros(h, d)
        self.k = zeros(kvh, d)
        self.v = zeros(kvh, d)
        self.attn = zeros(h, d)
        self.hidden = zeros(args.hidden_size)  # after the final norm

    def segments(
        self, input_ids: torch.Tensor, positions: torch.Tensor, size: int
    ) -> list[Callable[[], None]]:
        """The ``num_layers + 1`` segments of capture size ``size``, reading the static
        ``input_ids`` / ``positions`` buffers."""
        m = self.model
        layers = m.model.layers

        def kv(i: int) -> tuple:
            if not self.kv_in_segments:
                return ()
            return self.kv_caches[i], self.slot_mapping[:size]

        def first() -> None:
            x, rope = m.embed(input_ids[:size], positions[:size])
            self.x[:size].copy_(x)
            if rope.positions is None:  # per-token cos/sin: kept for the later segments
                self.cos[:size].copy_(rope.cos)
                self.sin[:size].copy_(rope.sin)
                rope = RopeTables(self.cos[:size], self.sin[:size], None)
            self._rope[size] = rope
            self._store_qkv(size, layers[0].pre_attention(x, rope, *kv(0)))

        def middle(i: int) -> Callable[[], None]:
            def run() -> None:
                x, normed = layers[i - 1].post_attention_norm(
                    self.x[:size], self.attn[:size], layers[i].input_layernorm
                )
                self.x[:size].copy_(x)
                qkv = layers[i].pre_attention(x, self._rope[size], *kv(i), normed=normed)
                self._store_qkv(size, qkv)

            return run

        def last() -> None:
            x, normed = layers[-1].post_attention_norm(
                self.x[:size], self.attn[:size], m.model.norm
            )
            self.hidden[:size].copy_(normed if normed is not None else m.model.norm(x))

        return [first, *(middle(i) for i in range(1, len(layers))), last]

    def _store_qkv(self, size: int, qkv) -> None:
        for buf, t in zip((self.q, self.k, self.v), qkv, strict=True):
            buf[:size].copy_(t)

    def run(
        self, replays: Sequence[Callable[[], None]], num_tokens: int, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states [T, H]: each segment's replay, then that layer's attention (and KV
        write, unless the segments do it), eagerly."""
        t = num_tokens
        for i, layer in enumerate(self.model.model.layers):
            replays[i]()
            attend = layer.self_attn.attend if self.kv_in_segments else layer.self_attn.attention
            attn = attend(self.q[:t], self.k[:t], self.v[:t], self.kv_caches[i], meta)
            self.attn[:t].copy_(attn)
        replays[-1]()
        return self.hidden[:t]
