"""Paged attention over the block table, for mixed prefill/decode batches (torch reference).

Corresponds to MRV2's attention backend call: the KV of the scheduled tokens is written into the
paged cache at ``slot_mapping``; each request then attends causally over its context (read back
from the cache through its block-table row) and the fresh keys of its own chunk. This is the
oracle for the Triton kernel and the CPU path: correct, not fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    """Per-step attention inputs. Device tensors for kernels, CPU mirrors for the reference."""

    num_reqs: int
    num_tokens: int
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32: context + this step's tokens
    block_table: torch.Tensor  # [B, max_blocks] int32, rows gathered through idx_mapping
    slot_mapping: torch.Tensor  # [T] int64, -1 = do not write
    query_start_loc_np: np.ndarray  # [B+1] CPU mirror (known by the scheduler)
    seq_lens_np: np.ndarray  # [B] CPU mirror
    block_size: int
    # a start-up profiling run, before the KV cache exists: it measures memory, and a kernel
    # path whose attention works through the cache (Triton) allocates its output and no more
    profiling: bool = False


def write_kv_ref(
    key: torch.Tensor,  # [T, kvh, d]
    value: torch.Tensor,  # [T, kvh, d]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kvh, d]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Store each token's key/value at its slot (flat index block * block_size + offset).

    The reference needs every slot >= 0 (the Triton kernel also skips -1 padding slots).
    """
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat_k = kv_cache[0].view(num_blocks * block_size, *kv_cache.shape[3:])
    flat_v = kv_cache[1].view(num_blocks * block_size, *kv_cache.shape[3:])
    flat_k.index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def paged_attention_ref(
    query: torch.Tensor,  # [T, h, d]
    key: torch.Tensor,  # [T, kvh, d]
    value: torch.Tensor,  # [T, kvh, d]
    kv_cache: torch.Tensor | None,  # [2, num_blocks, block_size, kvh, d]; None in a dummy run
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [T, h, d]
    """Causal attention of each request's chunk over its cached context plus the chunk itself."""
    num_heads, num_kv_heads = query.shape[1], key.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    bs = meta.block_size
    for i in range(meta.num_reqs):
        q_start, q_end = int(meta.query_start_loc_np[i]), int(meta.query_start_loc_np[i + 1])
        q_len = q_end - q_start
        if q_len == 0:
            continue
        seq_len = int(meta.seq_lens_np[i])
        ctx_len = seq_len - q_len
        k_new, v_new = key[q_start:q_end], value[q_start:q_end]
        if ctx_len > 0:
            assert kv_cache is not None, "context tokens need a KV cache"
            n_blocks = -(-ctx_len // bs)
            blocks = meta.block_table[i, :n_blocks].long()
            k_ctx = kv_cache[0, blocks].reshape(n_blocks * bs, num_kv_heads, -1)[:ctx_len]
            v_ctx = kv_cache[1, blocks].reshape(n_blocks * bs, num_kv_heads, -1)[:ctx_len]
            k_all = torch.cat([k_ctx.to(key.dtype), k_new], dim=0)
            v_all = torch.cat([v_ctx.to(value.dtype), v_new], dim=0)
        else:
            k_all, v_all = k_new, v_new
        q = query[q_start:q_end].float().transpose(0, 1)  # [h, q, d]
        k = k_all.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [h, s, d]
        v = v_all.float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [h, q, s]
        q_pos = torch.arange(q_len, device=query.device).unsqueeze(1) + ctx_len
        k_pos = torch.arange(seq_len, device=query.device).unsqueeze(0)
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1).to(query.dtype)
    return out
