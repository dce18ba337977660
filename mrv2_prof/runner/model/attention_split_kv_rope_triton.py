"""Split-KV decode attention with QK-norm + RoPE and the KV write as its prologue.

The RoPE fold (``attention_decode_rope_triton.py``) does the RoPE kernel's work in the decode
attention's program; split-KV attention (``attention_split_kv_triton.py``) spreads a request's
keys over ``num_splits`` programs. Here both at once: program ``(i, h, s)`` rotates (and, for
Qwen3, normalises) its query rows itself, and writes the keys of this step's tokens that fall in
its own split: the token at position ``p`` has its rotated k and its v stored at its slot by the
program whose split holds ``p`` (``[s * chunk, (s + 1) * chunk)``, the split kernel's ranges).
The splits partition the positions and a program reads only keys of its own split, so every key
this launch writes is read only by the program that wrote it, after a barrier of its threads: no
ordering between programs is needed. The partials and their reduction (in the same launch, by the
row's last program) are the split kernel's (``reduce_request``), as is a request whose keys all
fall in split 0: that program writes the keys and the output, the others exit.

``rope_attend`` is the model's folded attention: this kernel where ``decode_split_count`` splits
the batch, else the unsplit fold. The contract is the fold's: ``qk_norm_rope_ref`` of the QKV
output, ``write_kv_ref`` of the rotated k and v at the token's slot (slots < 0 skipped), then
``paged_attention_ref`` over the cache; q, k and v are left as they are. With programmatic
dependent launch (``pdl.py``) a program reads its request's metadata, then waits for the kernel
before it (the QKV projection).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.attention_decode_rope_triton import (
    check_rope_attend,
    norm_rope_rows,
    paged_decode_rope_triton,
    rope_launch_args,
    rope_tables,
    write_rotated_kv,
)
from mrv2_prof.runner.model.attention_decode_triton import attend_key_range
from mrv2_prof.runner.model.attention_split_kv_triton import (
    count_and_reduce,
    decode_split_count,
    min_chunk_keys,
    split_chunk,
    store_split,
)
from mrv2_prof.runner.model.split_kv_workspace import split_workspace


@triton.jit(do_not_specialize=["num_reqs", "num_splits", "min_chunk"])
def _split_kv_decode_rope_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, positions_ptr,
    q_weight_ptr, k_weight_ptr, slot_mapping_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_table_ptr, qk_scale, eps, num_reqs, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    v_stride_t, v_stride_h, out_stride_t, out_stride_h, cos_stride, sin_stride,
    cache_stride_block, cache_stride_slot, cache_stride_head, block_table_stride,
    acc_ptr, max_ptr, sum_ptr, counter_ptr, num_splits, min_chunk, num_heads,  # then these
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_POSITIONS: tl.constexpr,
    HAS_NORM: tl.constexpr, USE_GDC: tl.constexpr = False,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if USE_GDC:  # q, k and v are the QKV projection's output
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if q_len == 0:  # padding: no program of the row counts itself, none reduces
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len
    chunk = split_chunk(seq_len, num_splits, min_chunk, BLOCK_N)  # keys per split
    alone = seq_len <= chunk  # split 0 holds (and writes) every key and writes the output
    if alone & (split > 0):
        return
    kv_start = split * chunk
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = rows < G
    dims = tl.arange(0, HEAD_DIM)
    swapped = (dims + HEAD_DIM // 2) % HEAD_DIM
    first = dims < HEAD_DIM // 2
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    for j in range(q_len):  # this step's keys that fall in the split: written here, read here
        pos = ctx_len + j
        if (pos >= kv_start) & (pos < kv_start + chunk):
            tok = (q_start + j).to(tl.int64)
            slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
            if slot >= 0:
                cos, sin = rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride,
                                       sin_stride, dims, HEAD_DIM, HAS_POSITIONS)  # fmt: skip
                write_rotated_kv(
                    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, tok, slot, kv_head, k_stride_t,
                    k_stride_h, v_stride_t, v_stride_h, head_off, cache_stride_block,
                    cache_stride_slot, dims, swapped, first, cos, sin, k_weight_ptr, eps,
                    BLOCK_SIZE, HEAD_DIM, HAS_NORM,
                )  # fmt: skip
    tl.debug_barrier()  # the stores above are seen by every thread's key loads below
    for t in range(q_len):
        kv_end = tl.minimum(ctx_len + t + 1, kv_start + chunk)  # the token's keys in the split
        if kv_start < kv_end:  # else the split holds none of its keys: nothing written
            tok = (q_start + t).to(tl.int64)
            cos, sin = rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride, sin_stride,
                                   dims, HEAD_DIM, HAS_POSITIONS)  # fmt: skip
            q_rows = q_ptr + tok * q_stride_t + head[:, None] * q_stride_h
            q = norm_rope_rows(q_rows, row_ok[:, None], dims, swapped, first, cos, sin,
                                q_weight_ptr, eps, HEAD_DIM, HAS_NORM)  # fmt: skip
            q_pos = tl.zeros([BLOCK_M], tl.int32) + (ctx_len + t)
            acc, m_i, l_i = attend_key_range(
                q, q_pos, kv_start, kv_end, block_row, k_cache_ptr, v_cache_ptr, head_off,
                cache_stride_block, cache_stride_slot, qk_scale,
                BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
            )  # fmt: skip
            store_split(
                out_ptr, acc_ptr, max_ptr, sum_ptr, tok, head, row_ok, dims, num_heads,
                num_splits, split, out_stride_t, out_stride_h, acc, m_i, l_i, alone, HEAD_DIM,
            )  # fmt: skip
    if seq_len > chunk:  # else split 0 wrote the output itself
        count_and_reduce(
            counter_ptr, out_ptr, acc_ptr, max_ptr, sum_ptr, req, kv_head, q_start, q_len,
            seq_len, num_splits, chunk, num_heads, out_stride_t, out_stride_h, G, HEAD_DIM,
            BLOCK_M,
        )  # fmt: skip


def paged_decode_split_kv_rope(
    q: torch.Tensor,  # [T, h, d]: the QKV projection's, not rotated (left as it is)
    k: torch.Tensor,  # [T, kvh, d]: likewise
    v: torch.Tensor,  # [T, kvh, d]
    cos: torch.Tensor,  # [R, >= d/2]
    sin: torch.Tensor,  # [R, >= d/2]
    positions: torch.Tensor | None,  # [T] rows of the tables; None: row t
    q_weight: torch.Tensor | None,  # [d] Qwen3's q norm, or None
    k_weight: torch.Tensor | None,  # [d]
    eps: float,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kvh, d]: this step's k/v written
    meta: AttentionMetadata,
    scale: float,
    *,
    num_splits: int,
) -> torch.Tensor:  # [T, h, d]
    """The fold's contract with each request's keys split ``num_splits`` ways (>= 1)."""
    check_rope_attend(q, k, v, cos, sin, q_weight, k_weight, kv_cache, meta)
    if num_splits < 1:
        raise ValueError(f"split-KV attention: num_splits must be >= 1, got {num_splits}")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or meta.num_reqs == 0:
        return out
    cells = num_tokens * num_heads * num_splits
    acc, maxes, sums, counter = split_workspace(
        q.device, cells, head_dim, meta.num_reqs * num_kv_heads
    )
    args, consts = rope_launch_args(
        out, q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta, scale
    )
    fewest = min_chunk_keys(consts["BLOCK_N"])
    _split_kv_decode_rope_kernel[(meta.num_reqs, num_kv_heads, num_splits)](
        *args, acc, maxes, sums, counter, num_splits, fewest, num_heads, **consts
    )
    return out


def rope_attend(q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta, scale):
    """The model's folded decode attention (``folds_rope`` said yes): split where
    ``decode_split_count`` splits the batch (host ints: the same for every batch of a CUDA-graph
    key), the unsplit fold otherwise."""
    splits = decode_split_count(meta, kv_cache.shape[3], kv_cache.device)
    args = (q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta, scale)
    if splits > 1:
        return paged_decode_split_kv_rope(*args, num_splits=splits)
    return paged_decode_rope_triton(*args)
