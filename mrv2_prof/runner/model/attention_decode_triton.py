"""Paged attention for decode batches as a Triton kernel: one program per request and kv head.

``paged_attention_triton`` (``attention_triton.py``) hands a batch here when it has no more query
tokens than requests (``num_tokens <= num_reqs``, host ints: a decode step, padded or not, and
the same for every batch of a CUDA-graph key). The contract is ``paged_attention_ref``'s
(``mrv2_prof/runner/model/attention.py``, the torch reference and the tests' oracle), for every
batch of that shape: a request with no query tokens (padding) exits at once, and one with several
(possible beside padding requests) has them walked one after the other, each over the keys it may
see (the causal mask as a bound of the loop).

Why a second kernel: the general kernel maps programs to requests by a binary search of
``query_start_loc`` (eight dependent loads at 256 requests) and gives a program ``BLOCK_Q``
tokens of one request, so a decode batch launches two programs a request, one of which exits.
Here program ``(i, h)`` is request ``i``, kv head ``h``: its ``G`` query heads are the rows of the
``tl.dot`` (padded to 16), and ``attend_keys`` (shared with the general kernel) walks the keys;
its unnormalised form ``attend_key_range`` walks one split's in ``attention_split_kv_triton.py``.
On an H200 this is 1-7 % faster than the general kernel's decode launch at batch 64 and 256
(``benchmarks/RESULTS.md``, the fourth host-path round). ``num_reqs`` is taken, unused, so that
both kernels have one signature. With programmatic dependent launch (``pdl.py``) a program reads
its request's metadata, then waits for the kernel before it (the RoPE kernel's KV write).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.pdl import launch_options, use_pdl

LOG2_E = 1.4426950408889634
DECODE_ROWS = 16  # tl.dot's smallest M: the G query heads of a kv head, padded


def is_decode_batch(num_tokens: int, num_reqs: int) -> bool:
    """Whether ``paged_attention_triton`` hands a batch to this kernel: no more query tokens
    than requests (host ints only, so the same for every batch of a CUDA-graph key)."""
    return num_tokens <= num_reqs


@triton.jit
def attend_key_range(
    q,  # [BLOCK_M, HEAD_DIM] the program's query rows
    q_pos,  # [BLOCK_M] int32: each row's position; it sees keys at positions <= its own
    kv_start,  # keys to walk: [kv_start, kv_end), kv_start <= every row's position
    kv_end,  # <= the last row's position + 1
    block_row,  # the request's block-table row
    k_cache_ptr,
    v_cache_ptr,
    head_off,  # the kv head's offset in a cache slot
    cache_stride_block,
    cache_stride_slot,
    qk_scale,  # softmax scale * log2(e)
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The online softmax of ``q``'s rows over the cached keys ``[kv_start, kv_end)`` of a
    request, gathered per slot through its block-table row ``BLOCK_N`` at a time, in float32
    (``exp2``, the scale folded in): ``(acc, m, l)``, the unnormalised output, the running max
    (log2 domain) and the sum of weights. Keys are masked by position only (``k_pos <= q_pos``),
    so a caller that stops short of a row's last key (a split of the context) ends its range a
    multiple of ``BLOCK_N`` past ``kv_start``: no tile reaches past it. An empty range
    (``kv_start >= kv_end``) gives ``(0, -inf, 0)``."""
    dims = tl.arange(0, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n_start in range(kv_start, kv_end, BLOCK_N):
        k_pos = n_start + tl.arange(0, BLOCK_N)
        k_ok = k_pos < kv_end
        block = tl.load(block_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        kv_off = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot + head_off
        k = tl.load(k_cache_ptr + kv_off[None, :] + dims[:, None], mask=k_ok[None, :], other=0.0)
        qk = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale  # [M, N]
        qk = tl.where(k_pos[None, :] <= q_pos[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: key kv_start is visible to every row
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + dims[None, :], mask=k_ok[:, None], other=0.0)
        v = v.to(q.dtype)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def attend_keys(
    q,  # [BLOCK_M, HEAD_DIM] the program's query rows
    q_pos,  # [BLOCK_M] int32: each row's position; it sees keys at positions <= its own
    kv_end,  # keys to walk: [0, kv_end), the last row's own included
    block_row,  # the request's block-table row
    k_cache_ptr,
    v_cache_ptr,
    head_off,  # the kv head's offset in a cache slot
    cache_stride_block,
    cache_stride_slot,
    qk_scale,  # softmax scale * log2(e)
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Causal attention of ``q``'s rows over a request's cached keys ``[0, kv_end)``
    (``attend_key_range``, normalised): the rows' float32 outputs. Both attention kernels walk
    their keys here."""
    acc, m_i, l_i = attend_key_range(
        q, q_pos, 0, kv_end, block_row, k_cache_ptr, v_cache_ptr, head_off, cache_stride_block,
        cache_stride_slot, qk_scale, BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip
    return acc / l_i[:, None]


@triton.jit(do_not_specialize=["num_reqs"])
def _paged_decode_kernel(
    out_ptr,  # [T, h, d]
    query_ptr,  # [T, h, d]
    k_cache_ptr,  # [num_blocks, block_size, kvh, d]
    v_cache_ptr,  # same shape and strides as k_cache
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_blocks] int32
    qk_scale,  # softmax scale * log2(e)
    num_reqs,
    query_stride_t,
    query_stride_h,
    out_stride_t,
    out_stride_h,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    block_table_stride,
    G: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per KV-cache block
    BLOCK_M: tl.constexpr,  # rows: G heads, padded to a power of two >= 16
    BLOCK_N: tl.constexpr,  # keys per loop step
    DOT_PRECISION: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py): the step's metadata, then wait
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    ctx_len = tl.load(seq_lens_ptr + req) - q_len
    if USE_GDC:  # the query and this step's keys are the RoPE kernel's writes
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = rows < G
    dims = tl.arange(0, HEAD_DIM)
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    for t in range(q_len):  # one token in a decode; none in a padding request
        tok = (q_start + t).to(tl.int64)
        q_off = tok * query_stride_t + head[:, None] * query_stride_h + dims[None, :]
        q = tl.load(query_ptr + q_off, mask=row_ok[:, None], other=0.0)
        q_pos = tl.zeros([BLOCK_M], tl.int32) + (ctx_len + t)  # every row: the same token
        out = attend_keys(
            q, q_pos, ctx_len + t + 1, block_row, k_cache_ptr, v_cache_ptr, head_off,
            cache_stride_block, cache_stride_slot, qk_scale,
            BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip
        o_off = tok * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), row_ok[:, None])


def paged_decode_triton(
    query: torch.Tensor,  # [T, h, d], T <= num_reqs
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kvh, d]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, h, d], rows past query_start_loc[num_reqs] left unwritten
    *,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """Attention of a decode batch (checked by ``paged_attention_triton``, the entry point)."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    _paged_decode_kernel[(meta.num_reqs, num_kv_heads)](
        out,
        query,
        kv_cache[0],
        kv_cache[1],
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_table,
        scale * LOG2_E,
        meta.num_reqs,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        meta.block_table.stride(0),
        G=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=meta.block_size,
        BLOCK_M=max(DECODE_ROWS, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=num_warps,
        num_stages=num_stages,
        **launch_options(use_pdl(query.device)),
    )
    return out
