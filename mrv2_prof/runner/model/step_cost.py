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

``ops`` (nested in the same dict, with ``layers``) splits the step into the model's ops for the
per-kernel roofline (``analysis/kernel_roofline.py``): per op, the bytes and FLOPs of one launch
(one layer's) as ``weight_bytes`` (read once per launch) plus ``bytes_per_token``,
``bytes_per_row`` (logits rows) and ``bytes_per_context`` (KV tokens read) times the step's
counts, and ``flops_per_token``, ``flops_per_row`` and ``flops_per_pair`` likewise (a key left
out is 0). The projections (``qkv``, ``o``, ``gate_up``, ``down``) and ``lm_head`` are their
weights (as above); ``attention`` reads one layer's K and V per context token and does
4 x heads x head dim FLOPs per pair. The elementwise ops count their activations read and
written per token: ``norm`` (RMSNorm: a row in, a row out), ``add_norm`` (the residual add and
the post-attention norm: two rows in, two out), ``qk_rope`` (q and k in and out, v in, and the
layer's K and V written to the cache), ``kv_write`` (k and v in, K and V out), ``silu_mul``
(gate and up in, one row out). ``mlp`` is the batch-1 MLP in one launch: the gate/up and down
weights and the post-attention norm's.
"""

from __future__ import annotations

from typing import Any

import torch


def step_cost(model: torch.nn.Module, args: Any, kv_bytes_per_token: int) -> dict[str, Any]:
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
        "layers": args.num_hidden_layers,
        "ops": op_cost(model, args, kv_bytes_per_token),
    }  # fmt: skip


def _weight(linear: torch.nn.Module) -> tuple[int, int]:
    """(bytes of weight and bias, 2 x the weight's elements: FLOPs per token)."""
    params = [p for p in (linear.weight, getattr(linear, "bias", None)) if p is not None]
    return sum(p.numel() * p.element_size() for p in params), 2 * linear.weight.numel()


def op_cost(model: torch.nn.Module, args: Any, kv_bytes_per_token: int) -> dict[str, dict]:
    """Per op, one launch's bytes and FLOPs (the module doc's ``ops``), from layer 0's shapes."""
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    item = attn.qkv_proj.weight.element_size()
    hidden, inter = args.hidden_size, args.intermediate_size
    q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    kv_layer = int(kv_bytes_per_token) // args.num_hidden_layers  # K and V of one token
    ops: dict[str, dict] = {}
    for name, linear in (("qkv", attn.qkv_proj), ("o", attn.o_proj),
                         ("gate_up", mlp.gate_up_proj), ("down", mlp.down_proj)):  # fmt: skip
        nbytes, flops = _weight(linear)
        ops[name] = {"weight_bytes": nbytes, "flops_per_token": flops}
    gate_up, down = ops["gate_up"], ops["down"]
    ops["mlp"] = {  # the norm's weight too: the kernel applies it
        "weight_bytes": gate_up["weight_bytes"] + down["weight_bytes"] + hidden * item,
        "flops_per_token": gate_up["flops_per_token"] + down["flops_per_token"],
    }
    ops["attention"] = {"bytes_per_context": kv_layer, "flops_per_pair": 4 * q}
    table = args.vocab_size * hidden
    ops["lm_head"] = {"weight_bytes": table * item, "bytes_per_row": args.vocab_size * item,
                      "flops_per_row": 2 * table}  # fmt: skip
    norm = {"weight_bytes": hidden * item}
    ops["norm"] = {**norm, "bytes_per_token": 2 * hidden * item}
    ops["add_norm"] = {**norm, "bytes_per_token": 4 * hidden * item}
    qk_norm = 2 * attn.head_dim * item if attn.q_norm is not None else 0
    ops["qk_rope"] = {"weight_bytes": qk_norm,
                      "bytes_per_token": (2 * (q + kv) + kv) * item + kv_layer}  # fmt: skip
    ops["kv_write"] = {"bytes_per_token": 2 * kv * item + kv_layer}
    ops["silu_mul"] = {"bytes_per_token": 3 * inter * item}
    return ops
