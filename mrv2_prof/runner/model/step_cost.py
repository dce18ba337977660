"""What one step of a model must move and compute, per unit of its batch: the constants the
per-step roofline (``analysis/roofline.py``) multiplies by each step's tokens, logits rows,
context and query-key pairs. Counted from the loaded parameters, so a checkpoint's real shapes
(and a GGUF's dequantized weights) are what is counted.

* ``weight_bytes``: every parameter once, except an untied embedding table, of which a step
  reads only its tokens' rows (``embed_row_bytes`` each; 0 when tied: the lm head reads the
  whole table and it is in ``weight_bytes``).
* ``kv_bytes_per_token``: K and V of one token over all layers, in the cache's dtype: read for
  each token of context (the new tokens' included, written once).
* ``logits_bytes_per_row``: one row of logits written (vocab x the weights' itemsize).
* ``matmul_flops_per_token``: 2 x the decoder's matrix parameters (every 2-D parameter but the
  embedding table and the lm head) per token; norms, rotary and activations are left out.
* ``lm_head_flops_per_row``: 2 x hidden x vocab per logits row.
* ``attn_flops_per_pair``: 4 x layers x query heads x head dim per query-key pair (QK^T, PV).

The draft model of speculative decoding is not counted: the roofline is the target's.
"""

from __future__ import annotations

from typing import Any

import torch


def step_cost(model: torch.nn.Module, args: Any, kv_bytes_per_token: int) -> dict[str, int]:
    """The constants above for ``model`` (``ModelArgs`` ``args``)."""
    params = list(model.parameters())
    itemsize = params[0].element_size()
    table = args.vocab_size * args.hidden_size  # the embedding table's elements
    tied = bool(args.tie_word_embeddings)
    matrices = sum(p.numel() for p in params if p.dim() >= 2)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    return {
        "weight_bytes": weight_bytes - (0 if tied else table * itemsize),
        "embed_row_bytes": 0 if tied else args.hidden_size * itemsize,
        "kv_bytes_per_token": int(kv_bytes_per_token),
        "logits_bytes_per_row": args.vocab_size * itemsize,
        "matmul_flops_per_token": 2 * (matrices - table * (1 if tied else 2)),
        "lm_head_flops_per_row": 2 * table,
        "attn_flops_per_pair": 4 * args.num_hidden_layers * args.num_attention_heads
        * args.head_dim,
    }  # fmt: skip
