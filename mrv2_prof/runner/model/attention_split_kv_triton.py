"""Split-KV (flash-decoding) paged attention for decode batches: a request's keys over programs.

At small batch the decode kernel (``attention_decode_triton.py``) launches ``num_reqs x kv_heads``
programs, too few to fill the GPU (8 at batch 1 of an 8-kv-head model, on 132 SMs), and each
walks its whole context alone. Here program ``(i, h, s)`` walks split ``s`` of request ``i``'s
keys for kv head ``h`` (``attend_key_range``, the decode kernel's loop) and writes its partial
``(max, sum, acc)`` per query head to a workspace; the splits of a row are then combined in key
order with the usual rescaling. The contract is ``paged_attention_ref``'s for decode batches,
as for the decode kernel: a request with no query tokens (padding) exits at once, one with
several (beside padding requests) has its tokens walked one after the other.

CUDA-graph safety: the split count is a host int (``split_count``: the number of requests, kv
heads and SMs and an upper bound of the context from shapes), so every batch of one graph key
launches the same grid; each request's share is computed on the device from ``seq_lens``
(``split_chunk``: ``cdiv(seq_len, num_splits)`` rounded up to ``BLOCK_N``, so no tile crosses a
split's end, and at least ``min_chunk`` keys). A split with no keys for a token writes nothing and
the reduction reads only the splits that hold keys. A request whose keys all fall in split 0
(``seq_len <= chunk``) is the unsplit kernel's work: split 0 writes its output itself, the other
programs of its row exit, and nothing is stored, counted or reduced for it. The workspace
(partials and counters) grows only outside a capture, as the sampler's does
(``runner/worker/gumbel_argmax_triton.py``).

The reduction runs in the same launch by default (``fused``): each program of a (request, kv
head) row counts itself done on the row's counter (acquire-release at GPU scope, after a
barrier of its threads); the row's last program reduces every token of the request, reading
the partials past L1, and resets the counter to 0 for the next launch. ``fused=False`` launches
a second, reduce-only kernel instead; the benchmark times both. With programmatic dependent
launch (``pdl.py``) both kernels read the request's metadata, then wait for the kernel before.

Policy: ``split_count`` applies ``proposed_split_count`` while ``SPLIT_KV_ENABLED`` is on (the
``runner.split_kv`` setting sets it: ``runner/worker/kernel_paths.py``), else returns 1 (the
unsplit decode kernel); ``FORCED_SPLITS`` forces a count for tests and benchmarks. With the RoPE
fold on, ``attention_split_kv_rope_triton.py`` is this kernel with the fold's prologue.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.attention_decode_triton import DECODE_ROWS, LOG2_E, attend_key_range
from mrv2_prof.runner.model.pdl import launch_options, use_pdl
from mrv2_prof.runner.model.split_kv_workspace import split_workspace

SPLIT_KV_ENABLED = False  # runner.split_kv sets it (kernel_paths.apply_kernel_paths)
FORCED_SPLITS: int | None = None  # tests and benchmarks: this count for every decode batch
PROGRAMS_PER_SM = 2  # split until the grid has about this many programs per SM
MIN_KEYS_PER_SPLIT = 256  # of the largest context the batch's shapes allow
MAX_SPLITS = 32
# The fewest keys of a request's own context a split takes at run time (rounded up to the key
# tile; 0: one tile): a context up to it is walked by one program, which writes its output
# itself. One tile keeps short contexts spread over programs; not yet measured against more.
MIN_CHUNK_KEYS = 0


@functools.lru_cache(maxsize=8)
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def proposed_split_count(num_reqs: int, num_kv_heads: int, max_context: int, sms: int) -> int:
    """Splits per request so that the grid has about ``PROGRAMS_PER_SM`` programs per SM, at
    most one per ``MIN_KEYS_PER_SPLIT`` keys of ``max_context`` and at most ``MAX_SPLITS``."""
    want = PROGRAMS_PER_SM * sms // max(1, num_reqs * num_kv_heads)
    return max(1, min(want, max_context // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


def split_count(num_reqs: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Splits of each request's keys for a decode batch, from host ints only (the same for every
    batch of a CUDA-graph key); 1 = the unsplit decode kernel. ``max_context`` is a bound from
    shapes (the block table's width times the block size), never the batch's own lengths."""
    if FORCED_SPLITS is not None:
        return FORCED_SPLITS
    if not SPLIT_KV_ENABLED:
        return 1
    return proposed_split_count(num_reqs, num_kv_heads, max_context, num_sms(device))


def smallest_unsplit_batch(
    num_kv_heads: int, max_context: int, device: torch.device, most: int
) -> int | None:
    """The smallest decode batch of at most ``most`` requests that ``split_count`` leaves
    unsplit (1 while split-KV is off), or None: a warm-up runs one so that the unsplit kernel is
    compiled beside the split one."""
    for n in range(1, most + 1):
        if split_count(n, num_kv_heads, max_context, device) == 1:
            return n
    return None


def decode_split_count(meta: AttentionMetadata, num_kv_heads: int, device: torch.device) -> int:
    """``split_count`` of a decode batch, its context bound read from shapes (the block table's
    width times the block size): the same for every batch of a CUDA-graph key."""
    max_context = meta.block_table.shape[1] * meta.block_size
    return split_count(meta.num_reqs, num_kv_heads, max_context, device)


def min_chunk_keys(block_n: int) -> int:
    """``MIN_CHUNK_KEYS`` rounded up to whole key tiles of ``block_n`` (at least one): the
    kernels' ``min_chunk`` argument."""
    return max(1, triton.cdiv(MIN_CHUNK_KEYS, block_n)) * block_n


@triton.jit
def split_chunk(seq_len, num_splits, min_chunk, BLOCK_N: tl.constexpr):
    """Keys per split of a request of ``seq_len`` keys: ``cdiv(seq_len, num_splits)`` rounded up
    to whole key tiles, and at least ``min_chunk`` (a multiple of ``BLOCK_N``)."""
    return tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N, min_chunk)


@triton.jit
def store_split(
    out_ptr, acc_ptr, max_ptr, sum_ptr, tok, head, row_ok, dims, num_heads, num_splits, split,
    out_stride_t, out_stride_h, acc, m_i, l_i, alone, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """A token's result of split ``split``: ``alone`` (split 0 holds every key) its attention
    output, what the reduction of that one partial would write; else its partial."""
    if alone:
        o_off = tok * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
        out = acc / l_i[:, None]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), row_ok[:, None])
    else:
        store_partial(acc_ptr, max_ptr, sum_ptr, tok, head, row_ok, dims, num_heads, num_splits,
                      split, acc, m_i, l_i, HEAD_DIM)  # fmt: skip


@triton.jit
def reduce_request(
    out_ptr, acc_ptr, max_ptr, sum_ptr, q_start, q_len, seq_len, kv_head, num_splits, chunk,
    num_heads, out_stride_t, out_stride_h,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    """Each of the request's tokens: its splits' partials combined in key order, written out
    (``chunk``: keys per split, ``split_chunk``)."""
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = rows < G
    dims = tl.arange(0, HEAD_DIM)
    for t in range(q_len):
        tok = (q_start + t).to(tl.int64)
        base = (tok * num_heads + head) * num_splits  # [BLOCK_M] the token's split 0, per head
        m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_run = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for s in range(tl.cdiv(seq_len - q_len + t + 1, chunk)):  # the splits holding keys
            m_s = tl.load(max_ptr + base + s, mask=row_ok, other=0.0, cache_modifier=CACHE)
            l_s = tl.load(sum_ptr + base + s, mask=row_ok, other=1.0, cache_modifier=CACHE)
            a_off = (base + s)[:, None] * HEAD_DIM + dims[None, :]
            a_s = tl.load(acc_ptr + a_off, mask=row_ok[:, None], other=0.0, cache_modifier=CACHE)
            m_new = tl.maximum(m_run, m_s)  # finite: every split read holds a key
            alpha = tl.math.exp2(m_run - m_new)
            beta = tl.math.exp2(m_s - m_new)
            l_run = l_run * alpha + l_s * beta
            acc = acc * alpha[:, None] + a_s * beta[:, None]
            m_run = m_new
        o_off = tok * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
        out = acc / l_run[:, None]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), row_ok[:, None])


@triton.jit
def store_partial(acc_ptr, max_ptr, sum_ptr, tok, head, row_ok, dims, num_heads, num_splits,
                  split, acc, m_i, l_i, HEAD_DIM: tl.constexpr):  # fmt: skip
    """One split's partial of a token (per query head: acc, max, sum) in the workspace."""
    cell = (tok * num_heads + head) * num_splits + split
    tl.store(acc_ptr + cell[:, None] * HEAD_DIM + dims[None, :], acc, row_ok[:, None])
    tl.store(max_ptr + cell, m_i, row_ok)
    tl.store(sum_ptr + cell, l_i, row_ok)


@triton.jit
def count_and_reduce(
    counter_ptr, out_ptr, acc_ptr, max_ptr, sum_ptr, req, kv_head, q_start, q_len, seq_len,
    num_splits, chunk, num_heads, out_stride_t, out_stride_h,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """The fused reduction: this program counts itself done on its row's counter; the row's
    last program reduces the request and resets the counter for the next launch."""
    tl.debug_barrier()  # every thread's partial stores before the release below
    row = req * tl.num_programs(1) + kv_head
    done = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if done == num_splits - 1:  # the row's last split: every partial is visible
        reduce_request(
            out_ptr, acc_ptr, max_ptr, sum_ptr, q_start, q_len, seq_len, kv_head, num_splits,
            chunk, num_heads, out_stride_t, out_stride_h, G, HEAD_DIM, BLOCK_M, ".cg",
        )  # fmt: skip
        tl.store(counter_ptr + row, 0)  # ready for the next launch


# Values that change from step to step are not specialised on: a new value must
# never trigger a compile in the middle of a run.
@triton.jit(do_not_specialize=["num_reqs", "num_splits", "min_chunk"])
def _split_kv_decode_kernel(
    out_ptr,  # [T, h, d]
    query_ptr,  # [T, h, d]
    k_cache_ptr,  # [num_blocks, block_size, kvh, d]
    v_cache_ptr,  # same shape and strides as k_cache
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_blocks] int32
    acc_ptr,  # [T * h * num_splits, d] float32: each split's unnormalised output
    max_ptr,  # [T * h * num_splits] float32: its running max (log2 domain)
    sum_ptr,  # [T * h * num_splits] float32: its sum of weights
    counter_ptr,  # [B * kvh] int32, zero between launches (FUSED)
    qk_scale,  # softmax scale * log2(e)
    num_reqs,
    num_splits,
    min_chunk,  # the fewest keys a split takes (split_chunk), a multiple of BLOCK_N
    num_heads,
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
    FUSED: tl.constexpr,  # the row's last program reduces it
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py): the step's metadata, then wait
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if USE_GDC:  # the query and this step's keys are the RoPE kernel's writes
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if q_len == 0:  # padding: no program of the row counts itself, none reduces
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len
    chunk = split_chunk(seq_len, num_splits, min_chunk, BLOCK_N)  # keys per split
    alone = seq_len <= chunk  # split 0 holds every key: it writes the output, none reduces
    if alone & (split > 0):
        return
    kv_start = split * chunk
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = rows < G
    dims = tl.arange(0, HEAD_DIM)
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    for t in range(q_len):  # one token in a decode
        kv_end = tl.minimum(ctx_len + t + 1, kv_start + chunk)  # the token's keys in the split
        if kv_start < kv_end:  # else the split holds none of its keys: nothing written
            tok = (q_start + t).to(tl.int64)
            q_off = tok * query_stride_t + head[:, None] * query_stride_h + dims[None, :]
            q = tl.load(query_ptr + q_off, mask=row_ok[:, None], other=0.0)
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
    if FUSED:  # noqa: SIM102 (a constexpr, then a run-time test: apart for Triton)
        if seq_len > chunk:  # else split 0 wrote the output itself
            count_and_reduce(
                counter_ptr, out_ptr, acc_ptr, max_ptr, sum_ptr, req, kv_head, q_start, q_len,
                seq_len, num_splits, chunk, num_heads, out_stride_t, out_stride_h,
                G, HEAD_DIM, BLOCK_M,
            )  # fmt: skip


@triton.jit(do_not_specialize=["num_splits", "min_chunk"])
def _split_kv_reduce_kernel(
    out_ptr, acc_ptr, max_ptr, sum_ptr, query_start_loc_ptr, seq_lens_ptr, num_splits,
    min_chunk, num_heads, out_stride_t, out_stride_h,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py): the partials after the wait
):  # fmt: skip
    req = tl.program_id(0)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start  # 0 (padding): no token to reduce
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    seq_len = tl.load(seq_lens_ptr + req)
    chunk = split_chunk(seq_len, num_splits, min_chunk, BLOCK_N)
    if seq_len > chunk:  # else split 0 wrote the output itself
        reduce_request(
            out_ptr, acc_ptr, max_ptr, sum_ptr, q_start, q_len, seq_len, tl.program_id(1),
            num_splits, chunk, num_heads, out_stride_t, out_stride_h, G, HEAD_DIM, BLOCK_M, "",
        )  # fmt: skip


def paged_decode_split_kv(
    query: torch.Tensor,  # [T, h, d], T <= num_reqs
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kvh, d]
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [T, h, d], rows past query_start_loc[num_reqs] left unwritten
    *,
    num_splits: int,
    block_n: int = 64,
    fused: bool = True,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """Attention of a decode batch (checked by ``paged_attention_triton``, the entry point) with
    each request's keys split ``num_splits`` ways (>= 1)."""
    if num_splits < 1:
        raise ValueError(f"split-KV attention: num_splits must be >= 1, got {num_splits}")
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    block_m = max(DECODE_ROWS, triton.next_power_of_2(group))
    device = query.device
    cells = num_tokens * num_heads * num_splits
    acc, maxes, sums, counter = split_workspace(
        device, cells, head_dim, meta.num_reqs * num_kv_heads
    )
    pdl = use_pdl(device)
    _split_kv_decode_kernel[(meta.num_reqs, num_kv_heads, num_splits)](
        out, query, kv_cache[0], kv_cache[1], meta.query_start_loc, meta.seq_lens,
        meta.block_table, acc, maxes, sums, counter, scale * LOG2_E, meta.num_reqs, num_splits,
        min_chunk_keys(block_n), num_heads, query.stride(0), query.stride(1), out.stride(0),
        out.stride(1), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        meta.block_table.stride(0),
        G=group, HEAD_DIM=head_dim, BLOCK_SIZE=meta.block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32", FUSED=fused,
        num_warps=num_warps, num_stages=num_stages, **launch_options(pdl),
    )  # fmt: skip
    if not fused:
        _split_kv_reduce_kernel[(meta.num_reqs, num_kv_heads)](
            out, acc, maxes, sums, meta.query_start_loc, meta.seq_lens, num_splits,
            min_chunk_keys(block_n), num_heads,
            out.stride(0), out.stride(1), G=group, HEAD_DIM=head_dim, BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=num_warps, **launch_options(pdl),
        )  # fmt: skip
    return out
