"""Folded decode attention over several kv heads a program: a cache slot's heads read together.

The folded decode kernel (``attention_decode_rope_triton.py``) gives a program one request and
one kv head, so it reads ``HEAD_DIM`` elements of each cache slot (128 bytes at head_dim 64 in
bf16) and the slot's other heads are read by other programs, at other times. Here program
``(i, p)`` takes request ``i`` and ``PACK`` adjacent kv heads ``[p * PACK, (p + 1) * PACK)``:
it reads ``PACK * HEAD_DIM`` contiguous elements of each slot (the cache keeps a slot's heads side
by side), and its ``PACK * G`` query rows share one ``tl.dot`` over that width. A row's query is
zero outside its own head's dims (the tile is block-diagonal), so its scores are its own head's
alone; its output is read back from its head's dims only (the other dims hold its weights applied
to other heads' values, never stored). Fewer, wider programs: the wide batches' attention, at
about half its bandwidth roof with a program a head, is what it is for.

The contract is the fold's (``paged_decode_rope_triton``): ``qk_norm_rope_ref`` of the QKV
output, ``write_kv_ref`` of the rotated k and v at each token's slot (slots < 0 skipped), then
``paged_attention_ref`` over the cache; q, k and v are left as they are. QK-norm and RoPE use the
fold's arithmetic (``norm_rope_rows`` over the packed dims: a row's squares are summed over its
own head's dims, the others being zero). ``DECODE_HEADS_PER_PROGRAM`` (1: off, this kernel
unused) sets ``PACK`` for the unsplit fold of ``rope_attend`` where it divides the kv heads; off
until measured (``benchmarks/decode_roofline.py --variant ...+packN``), read at each call, so set
before a CUDA graph is captured. With programmatic dependent launch (``pdl.py``) a program reads
its request's metadata, then waits for the QKV projection.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.attention_decode_rope_triton import (
    check_rope_attend,
    norm_rope_rows,
    rope_launch_args,
    rope_tables,
    write_rotated_kv,
)
from mrv2_prof.runner.model.attention_decode_triton import DECODE_ROWS

DECODE_HEADS_PER_PROGRAM = 1  # a power of two; 1: off until measured (the module docstring)
# A key tile's elements (packed dims x keys): the fold's keys a step, fewer where the packed
# width would make the tile larger (8 warps from half of it)
TILE_ELEMENTS = 8192


def packs(num_kv_heads: int) -> int:
    """kv heads a program for a model of ``num_kv_heads``: ``DECODE_HEADS_PER_PROGRAM`` (a power
    of two) where it divides them, else 1 (the one-head kernels)."""
    pack = DECODE_HEADS_PER_PROGRAM
    if pack > 1 and pack & (pack - 1) == 0 and num_kv_heads % pack == 0:
        return pack
    return 1


@triton.jit
def attend_packed(
    q, q_pos, kv_end, block_row, k_cache_ptr, v_cache_ptr, col_off, cache_stride_block,
    cache_stride_slot, qk_scale, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """``attend_keys`` over a slot's ``WIDTH`` packed dims (``col_off``: each dim's offset in a
    slot): the rows' normalised float32 outputs over all the packed dims."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, WIDTH], tl.float32)
    for n_start in range(0, kv_end, BLOCK_N):
        k_pos = n_start + tl.arange(0, BLOCK_N)
        k_ok = k_pos < kv_end
        block = tl.load(block_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot
        k = tl.load(k_cache_ptr + slot[None, :] + col_off[:, None], mask=k_ok[None, :], other=0.0)
        qk = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale  # [M, N]
        qk = tl.where(k_pos[None, :] <= q_pos[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: key 0 is visible to every row
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + slot[:, None] + col_off[None, :], mask=k_ok[:, None], other=0.0)
        v = v.to(q.dtype)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc / l_i[:, None]


@triton.jit(do_not_specialize=["num_reqs"])
def _packed_decode_rope_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, positions_ptr,
    q_weight_ptr, k_weight_ptr, slot_mapping_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_table_ptr, qk_scale, eps, num_reqs, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    v_stride_t, v_stride_h, out_stride_t, out_stride_h, cos_stride, sin_stride,
    cache_stride_block, cache_stride_slot, cache_stride_head, block_table_stride,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_POSITIONS: tl.constexpr,
    HAS_NORM: tl.constexpr, PACK: tl.constexpr, USE_GDC: tl.constexpr = False,
):  # fmt: skip
    req = tl.program_id(0)
    first_head = tl.program_id(1) * PACK  # the pack's first kv head
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    ctx_len = tl.load(seq_lens_ptr + req) - q_len
    if USE_GDC:  # q, k and v are the QKV projection's output
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.arange(0, BLOCK_M)  # row r: query head first_head * G + r, of kv head r // G
    cols = tl.arange(0, PACK * HEAD_DIM)  # col c: dim c % HEAD_DIM of kv head c // HEAD_DIM
    mine = ((rows // G)[:, None] == (cols // HEAD_DIM)[None, :]) & (rows < PACK * G)[:, None]
    dims = cols % HEAD_DIM
    swapped = (dims + HEAD_DIM // 2) % HEAD_DIM
    first = dims < HEAD_DIM // 2
    col_off = (first_head + cols // HEAD_DIM) * cache_stride_head + dims
    head = first_head * G + rows
    one_dims = tl.arange(0, HEAD_DIM)  # a single head's, for its k/v write
    one_swapped = (one_dims + HEAD_DIM // 2) % HEAD_DIM
    one_first = one_dims < HEAD_DIM // 2
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    for t in range(q_len):  # one token in a decode; none in a padding request
        tok = (q_start + t).to(tl.int64)
        slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
        if slot >= 0:  # the token's k and v of each head of the pack at its slot
            cos1, sin1 = rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride,
                                     sin_stride, one_dims, HEAD_DIM, HAS_POSITIONS)  # fmt: skip
            for i in tl.static_range(PACK):
                write_rotated_kv(
                    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, tok, slot, first_head + i,
                    k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                    (first_head + i) * cache_stride_head, cache_stride_block, cache_stride_slot,
                    one_dims, one_swapped, one_first, cos1, sin1, k_weight_ptr, eps,
                    BLOCK_SIZE, HEAD_DIM, HAS_NORM,
                )  # fmt: skip
        tl.debug_barrier()  # the stores above are seen by every thread's key loads below
        cos, sin = rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride, sin_stride,
                               dims, HEAD_DIM, HAS_POSITIONS)  # fmt: skip
        q_rows = q_ptr + tok * q_stride_t + head[:, None] * q_stride_h
        q = norm_rope_rows(q_rows, mine, dims, swapped, first, cos, sin, q_weight_ptr, eps,
                           HEAD_DIM, HAS_NORM)  # fmt: skip
        q = tl.where(mine, q, 0.0)  # zero outside the row's head: its scores are its own
        q_pos = tl.zeros([BLOCK_M], tl.int32) + (ctx_len + t)
        out = attend_packed(
            q, q_pos, ctx_len + t + 1, block_row, k_cache_ptr, v_cache_ptr, col_off,
            cache_stride_block, cache_stride_slot, qk_scale,
            BLOCK_M, PACK * HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip
        o_off = tok * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=mine)


def paged_decode_packed_rope(
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
    pack: int,
) -> torch.Tensor:  # [T, h, d]
    """The fold's contract with ``pack`` kv heads a program (a divisor of the kv heads)."""
    check_rope_attend(q, k, v, cos, sin, q_weight, k_weight, kv_cache, meta)
    num_kv_heads = kv_cache.shape[3]
    if pack < 1 or pack & (pack - 1) or num_kv_heads % pack or kv_cache.stride(3) != q.shape[2]:
        raise ValueError(
            f"packed decode attention: {pack} heads a program must be a power of two dividing "
            f"{num_kv_heads} kv heads kept side by side in a slot"
        )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0 or meta.num_reqs == 0:
        return out
    args, consts = rope_launch_args(
        out, q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta, scale
    )
    group, width = q.shape[1] // num_kv_heads, pack * q.shape[2]
    keys = max(16, min(consts["BLOCK_N"], TILE_ELEMENTS // width))  # the tile's size held
    consts.pop("HEADS_FIRST", None)
    consts.update(
        BLOCK_M=max(DECODE_ROWS, triton.next_power_of_2(pack * group)),
        BLOCK_N=keys,
        PACK=pack,
        num_warps=4 if width * keys <= TILE_ELEMENTS // 2 else 8,
    )
    _packed_decode_rope_kernel[(meta.num_reqs, num_kv_heads // pack)](*args, **consts)
    return out
