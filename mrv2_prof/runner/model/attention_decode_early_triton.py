"""Folded split-KV decode attention that reads the context's keys before the PDL wait.

With programmatic dependent launch (``pdl.py``) a decode attention program starts while the QKV
projection before it still runs, and waits (``gdc_wait``) before it reads that projection's
output. The folded kernels (``attention_split_kv_rope_triton.py``,
``attention_decode_rope_triton.py``) read only the request's metadata before the wait; every key
tile is loaded after it, and the step's own key is stored, made visible by a barrier and loaded
back. At batch 1 that chain is most of the kernel's 5-8 µs a layer (``RESULTS.md``). Yet only the
step's own keys come from the QKV output: the context's keys (positions < ``seq_len - q_len``)
were written by earlier steps, complete before this launch began, as its metadata was (a kernel
of the chain lets its dependents start only after its own wait, so every kernel two or more back
has finished: the premise on which the folded kernels read their metadata early).

Program ``(i, h, s)`` (the split kernel's grid) here, before the wait: the metadata, the
block-table entries of its split's first ``PRE_N`` context keys and their K rows, and the first
token's RoPE angles. After it: their
V rows (issued with the q/k/v loads, so the latencies overlap), the query rows rotated, the
split's remaining context keys (``attend_key_range``), then the step's own keys in the split,
each rotated from the QKV output in registers and folded into the online softmax on its own
(token ``t`` sees new keys ``j <= t``). A new key is still stored at its slot, for later steps,
by token ``j``'s pass (slots < 0 skipped); nothing in this launch reads it back, so no barrier.
As in the reference (``paged_attention_ref``), a token sees the step's keys as the QKV output
gives them, not as the cache holds them. The partials, their reduction and a request that is
split 0's alone are the split kernel's (``store_split``, ``count_and_reduce``); one split is the
unsplit fold's work.

The contract is the fold's (``rope_attend``). ``EARLY_DECODE_ATTENTION`` routes every folded
decode batch here (off until measured: ``benchmarks/decode_roofline.py --variant ...+pre``);
``PREFETCH_KEYS`` sets ``PRE_N`` (0: the decode key tile, ``decode_keys``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention_decode_rope_triton import (
    check_rope_attend,
    norm_rope_rows,
    rope_launch_args,
    rope_tables,
    rotated_k,
    slot_offsets,
    v_row,
)
from mrv2_prof.runner.model.attention_decode_triton import attend_key_range, softmax_rows
from mrv2_prof.runner.model.attention_split_kv_triton import (
    count_and_reduce,
    min_chunk_keys,
    split_chunk,
    store_split,
)
from mrv2_prof.runner.model.split_kv_workspace import split_workspace

EARLY_DECODE_ATTENTION = False  # off until measured (the module docstring)
PREFETCH_KEYS = 0  # context keys a program reads before the wait (0: the decode key tile)


@triton.jit
def merge_states(acc, m_i, l_i, acc2, m2, l2):
    """Two online-softmax states over disjoint keys as one; either may be empty (m = -inf)."""
    m = tl.maximum(m_i, m2)
    some = m > float("-inf")
    a = tl.where(some, tl.math.exp2(m_i - m), 0.0)
    b = tl.where(some, tl.math.exp2(m2 - m), 0.0)
    return acc * a[:, None] + acc2 * b[:, None], m, l_i * a + l2 * b


@triton.jit
def attend_one_key(q, k, v, acc, m_i, l_i, qk_scale):
    """One key (``k``, ``v``: [1, HEAD_DIM] float32) folded into ``q``'s rows' state."""
    s = tl.sum(q.to(tl.float32) * k, axis=1) * qk_scale
    m = tl.maximum(m_i, s)
    alpha = tl.math.exp2(m_i - m)
    p = tl.math.exp2(s - m)
    return acc * alpha[:, None] + p[:, None] * v, m, l_i * alpha + p


@triton.jit(do_not_specialize=["num_reqs", "num_splits", "min_chunk"])
def _early_decode_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, positions_ptr,
    q_weight_ptr, k_weight_ptr, slot_mapping_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_table_ptr, qk_scale, eps, num_reqs, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    v_stride_t, v_stride_h, out_stride_t, out_stride_h, cos_stride, sin_stride,
    cache_stride_block, cache_stride_slot, cache_stride_head, block_table_stride,
    acc_ptr, max_ptr, sum_ptr, counter_ptr, num_splits, min_chunk, num_heads,  # then these
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_POSITIONS: tl.constexpr,
    HAS_NORM: tl.constexpr, PRE_N: tl.constexpr, USE_GDC: tl.constexpr = False,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len  # keys of earlier steps: complete before this launch
    chunk = split_chunk(seq_len, num_splits, min_chunk, BLOCK_N)  # keys per split
    alone = seq_len <= chunk  # split 0 holds every key and writes the output
    kv_start = split * chunk
    old_end = tl.minimum(ctx_len, kv_start + chunk)  # the split's context keys: [kv_start, here)
    dims = tl.arange(0, HEAD_DIM)
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    pre_pos = kv_start + tl.arange(0, PRE_N)
    active = (q_len > 0) & ((split == 0) | (seq_len > chunk))  # else it exits after the wait
    pre_ok = pre_pos < tl.where(active, old_end, kv_start)  # (no `&` of masks: the interpreter)
    block = tl.load(block_row + pre_pos // BLOCK_SIZE, mask=pre_ok, other=0).to(tl.int64)
    pre_off = block * cache_stride_block + (pre_pos % BLOCK_SIZE) * cache_stride_slot + head_off
    k0 = tl.load(k_cache_ptr + pre_off[None, :] + dims[:, None], mask=pre_ok[None, :], other=0.0)
    # the first token's RoPE angles (metadata and tables), used by its query and its key
    row0 = tl.where(active, q_start, 0).to(tl.int64)  # a padding request's: row 0
    if HAS_POSITIONS:
        row0 = tl.load(positions_ptr + row0, mask=active, other=0).to(tl.int64)
    cos0 = tl.load(cos_ptr + row0 * cos_stride + dims % (HEAD_DIM // 2)).to(tl.float32)
    sin0 = tl.load(sin_ptr + row0 * sin_stride + dims % (HEAD_DIM // 2)).to(tl.float32)
    if USE_GDC:  # q, k and v are the QKV projection's output
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if q_len == 0:  # padding: no program of the row counts itself, none reduces
        return
    if alone & (split > 0):
        return
    v0 = tl.load(v_cache_ptr + pre_off[:, None] + dims[None, :], mask=pre_ok[:, None], other=0.0)
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = rows < G
    swapped = (dims + HEAD_DIM // 2) % HEAD_DIM
    first = dims < HEAD_DIM // 2
    for t in range(q_len):
        kv_end = tl.minimum(ctx_len + t + 1, kv_start + chunk)  # the token's keys in the split
        if kv_start < kv_end:  # else the split holds none of its keys: nothing written
            tok = (q_start + t).to(tl.int64)
            cos, sin = cos0, sin0
            if t > 0:
                cos, sin = rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride,
                                       sin_stride, dims, HEAD_DIM, HAS_POSITIONS)  # fmt: skip
            q_rows = q_ptr + tok * q_stride_t + head[:, None] * q_stride_h
            q = norm_rope_rows(q_rows, row_ok[:, None], dims, swapped, first, cos, sin,
                                q_weight_ptr, eps, HEAD_DIM, HAS_NORM)  # fmt: skip
            acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            if kv_start < old_end:  # the keys read before the wait
                qk = tl.dot(q, k0.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
                qk = tl.where(pre_ok[None, :], qk, float("-inf"))
                p, alpha, m_i, l_i = softmax_rows(qk, m_i, l_i)
                acc = tl.dot(p.to(q.dtype), v0.to(q.dtype), acc, input_precision=DOT_PRECISION)
            # the rest of the split's context: its keys masked as seen by a row at old_end - 1
            q_pos = tl.zeros([BLOCK_M], tl.int32) + (old_end - 1)
            acc2, m2, l2 = attend_key_range(
                q, q_pos, kv_start + PRE_N, old_end, block_row, k_cache_ptr, v_cache_ptr,
                head_off, cache_stride_block, cache_stride_slot, qk_scale,
                BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
            )  # fmt: skip
            acc, m_i, l_i = merge_states(acc, m_i, l_i, acc2, m2, l2)
            for j in range(t + 1):  # the step's keys token t sees: those in the split
                pos = ctx_len + j
                if (pos >= kv_start) & (pos < kv_end):
                    key_tok = (q_start + j).to(tl.int64)
                    slot = tl.load(slot_mapping_ptr + key_tok).to(tl.int64)
                    kc, ks = cos0, sin0
                    if j > 0:
                        kc, ks = rope_tables(cos_ptr, sin_ptr, positions_ptr, key_tok,
                                             cos_stride, sin_stride, dims, HEAD_DIM,
                                             HAS_POSITIONS)  # fmt: skip
                    k = rotated_k(k_ptr, key_tok, kv_head, k_stride_t, k_stride_h, dims,
                                  swapped, first, kc, ks, k_weight_ptr, eps, HEAD_DIM,
                                  HAS_NORM)  # fmt: skip
                    v = v_row(v_ptr, key_tok, kv_head, v_stride_t, v_stride_h, dims)
                    if (j == t) & (slot >= 0):  # token j's pass stores its key, once
                        dst = slot_offsets(slot, head_off, cache_stride_block, cache_stride_slot,
                                           dims, BLOCK_SIZE)  # fmt: skip
                        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty))
                        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty))
                    kf, vf = k.to(tl.float32), v.to(tl.float32)
                    acc, m_i, l_i = attend_one_key(q, kf, vf, acc, m_i, l_i, qk_scale)
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


def paged_decode_early(
    q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta, scale, *, num_splits
) -> torch.Tensor:  # [T, h, d]
    """The fold's contract (``paged_decode_split_kv_rope``'s arguments) with each request's
    keys split ``num_splits`` ways (>= 1), its first context keys read before the PDL wait."""
    check_rope_attend(q, k, v, cos, sin, q_weight, k_weight, kv_cache, meta)
    if num_splits < 1:
        raise ValueError(f"early decode attention: num_splits must be >= 1, got {num_splits}")
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
    pre = PREFETCH_KEYS or consts["BLOCK_N"]
    if pre < 16 or pre & (pre - 1):
        raise ValueError(f"early decode attention: PREFETCH_KEYS {pre} is not a power of 2 >= 16")
    fewest = min_chunk_keys(consts["BLOCK_N"])
    _early_decode_kernel[(meta.num_reqs, num_kv_heads, num_splits)](
        *args, acc, maxes, sums, counter, num_splits, fewest, num_heads, PRE_N=pre, **consts
    )
    return out
