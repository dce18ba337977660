"""Decode attention with QK-norm + RoPE and the KV write as its prologue: one launch instead of two.

In a decode batch a layer runs, between the QKV projection and attention, the QK-norm + RoPE
kernel (``rotary_triton.py``), which rotates q and k in place and stores k and v at their cache
slots. Its program is a token; the decode attention's (``attention_decode_triton.py``) is a
request and kv head, which in a decode batch holds that token's whole query group and its one k
and v head. So the attention program can do the RoPE kernel's work for its heads itself: read
its query rows and its k and v rows from the QKV projection's output (not rotated), normalise
(Qwen3's per-head RMSNorm) and rotate them with ``qk_norm_rope_ref``'s arithmetic (float32 from
the float32 table, rounded where the RoPE kernel rounds), store the rotated k and v at the
token's slot (slots < 0 skipped), make the stores visible to its own threads (a barrier) and
attend over the cache with ``attend_keys``, the token's own key included. Each k/v head of a
token is written by exactly one program, and no other program reads it in this launch.
A decoder layer at batch 1 is then one launch shorter: five with the fused GEMV prologues, eight
with the plain ones.

The rotated q and k are not written back to the QKV output (nothing reads them after attention).
Rotation pairs dimension j with j + d/2 (neox style); a program reads each row twice, as it is
and with its halves swapped, so that ``x * cos + rotate_half(x) * sin`` is elementwise.

``folds_rope`` decides from host ints only (the same for every batch of a CUDA-graph key): a
decode batch (no more tokens than requests) with a KV cache, while ``ROPE_IN_DECODE_ATTENTION`` is
on (the ``runner.rope_in_attention`` setting sets it: ``runner/worker/kernel_paths.py``). Where
split-KV attention serves the batch, ``attention_split_kv_rope_triton.rope_attend`` hands it to
the split kernel with the same prologue; otherwise to this one. It is
off until measured on the H200 (``benchmarks/decode_roofline.py --variant ...+fold``); read at
each call, so it must be set before a CUDA graph is captured. PIECEWISE graphs cut the
layer at attention and keep the separate kernel. With programmatic dependent launch
(``pdl.py``) a program reads its request's metadata, then waits for the kernel before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention import AttentionMetadata
from mrv2_prof.runner.model.attention_decode_triton import (
    DECODE_ROWS,
    LOG2_E,
    attend_keys,
    is_decode_batch,
)
from mrv2_prof.runner.model.attention_triton import check_head_dim, decode_keys, decode_launch
from mrv2_prof.runner.model.pdl import launch_options, use_pdl

ROPE_IN_DECODE_ATTENTION = False  # off until measured (the module docstring)


def folds_rope(num_tokens: int, meta: AttentionMetadata, kv_cache: torch.Tensor | None) -> bool:
    """Whether a layer's RoPE and KV write go into this kernel for a batch (host ints only)."""
    if not ROPE_IN_DECODE_ATTENTION or kv_cache is None or num_tokens == 0:
        return False
    return is_decode_batch(num_tokens, meta.num_reqs)


@triton.jit
def norm_rope_rows(
    rows_ptr,  # [R, 1] each row's first element
    ok,  # [R, 1] which rows are read
    dims,  # [HEAD_DIM]
    swapped,  # [HEAD_DIM]: (dims + HALF) % HEAD_DIM
    first,  # [HEAD_DIM]: dims < HALF
    cos,  # [HEAD_DIM] float32: the angle of dims % HALF
    sin,
    w_ptr,  # [HEAD_DIM] norm weight (HAS_NORM)
    eps,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """``qk_norm_rope_ref`` of R rows in the rows' dtype: the RoPE kernel's roundings."""
    x = tl.load(rows_ptr + dims[None, :], mask=ok, other=0.0)
    io = x.dtype
    xf = x.to(tl.float32)
    xs = tl.load(rows_ptr + swapped[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)[:, None]
        w = tl.load(w_ptr + dims).to(tl.float32)[None, :]
        ws = tl.load(w_ptr + swapped).to(tl.float32)[None, :]
        xf = ((xf * rstd).to(io).to(tl.float32) * w).to(io).to(tl.float32)
        xs = ((xs * rstd).to(io).to(tl.float32) * ws).to(io).to(tl.float32)
    c, s = cos[None, :], sin[None, :]
    return tl.where(first[None, :], xf * c - xs * s, xf * c + xs * s).to(io)


@triton.jit
def rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride, sin_stride, dims,
                HEAD_DIM: tl.constexpr, HAS_POSITIONS: tl.constexpr):  # fmt: skip
    """A token's cos and sin over ``dims`` (float32), from its position's row of the tables."""
    row = tl.load(positions_ptr + tok).to(tl.int64) if HAS_POSITIONS else tok
    cos = tl.load(cos_ptr + row * cos_stride + dims % (HEAD_DIM // 2)).to(tl.float32)
    sin = tl.load(sin_ptr + row * sin_stride + dims % (HEAD_DIM // 2)).to(tl.float32)
    return cos, sin


@triton.jit
def write_rotated_kv(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, tok, slot, kv_head, k_stride_t, k_stride_h,
    v_stride_t, v_stride_h, head_off, cache_stride_block, cache_stride_slot, dims, swapped,
    first, cos, sin, k_weight_ptr, eps,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """A token's k head normalised and rotated, and its v head, stored at its slot (>= 0)."""
    one = tl.arange(0, 1)
    k_row = k_ptr + tok * k_stride_t + kv_head * k_stride_h + one[:, None] * 0
    k = norm_rope_rows(k_row, one[:, None] == 0, dims, swapped, first, cos, sin, k_weight_ptr,
                       eps, HEAD_DIM, HAS_NORM)  # fmt: skip
    dst = (slot // BLOCK_SIZE) * cache_stride_block + head_off + one[:, None] * 0
    dst += (slot % BLOCK_SIZE) * cache_stride_slot + dims[None, :]
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty))
    v = tl.load(v_ptr + tok * v_stride_t + kv_head * v_stride_h + one[:, None] * 0
                + dims[None, :])  # fmt: skip
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["num_reqs"])
def _paged_decode_rope_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, positions_ptr,
    q_weight_ptr, k_weight_ptr, slot_mapping_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_table_ptr, qk_scale, eps, num_reqs, q_stride_t, q_stride_h, k_stride_t, k_stride_h,
    v_stride_t, v_stride_h, out_stride_t, out_stride_h, cos_stride, sin_stride,
    cache_stride_block, cache_stride_slot, cache_stride_head, block_table_stride,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_POSITIONS: tl.constexpr,
    HAS_NORM: tl.constexpr, USE_GDC: tl.constexpr = False,
):  # fmt: skip
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    ctx_len = tl.load(seq_lens_ptr + req) - q_len
    if USE_GDC:  # q, k and v are the QKV projection's output
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = (rows < G)[:, None]
    dims = tl.arange(0, HEAD_DIM)
    swapped = (dims + HEAD_DIM // 2) % HEAD_DIM
    first = dims < HEAD_DIM // 2
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    head_off = kv_head * cache_stride_head
    for t in range(q_len):  # one token in a decode; none in a padding request
        tok = (q_start + t).to(tl.int64)
        cos, sin = rope_tables(cos_ptr, sin_ptr, positions_ptr, tok, cos_stride, sin_stride,
                               dims, HEAD_DIM, HAS_POSITIONS)  # fmt: skip
        q_rows = q_ptr + tok * q_stride_t + head[:, None] * q_stride_h
        q = norm_rope_rows(q_rows, row_ok, dims, swapped, first, cos, sin, q_weight_ptr, eps,
                           HEAD_DIM, HAS_NORM)  # fmt: skip
        slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
        if slot >= 0:  # the token's k and v at its slot, where attention reads them
            write_rotated_kv(
                k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, tok, slot, kv_head, k_stride_t,
                k_stride_h, v_stride_t, v_stride_h, head_off, cache_stride_block,
                cache_stride_slot, dims, swapped, first, cos, sin, k_weight_ptr, eps,
                BLOCK_SIZE, HEAD_DIM, HAS_NORM,
            )  # fmt: skip
        tl.debug_barrier()  # the stores above are seen by every thread's key loads below
        q_pos = tl.zeros([BLOCK_M], tl.int32) + (ctx_len + t)
        out = attend_keys(
            q, q_pos, ctx_len + t + 1, block_row, k_cache_ptr, v_cache_ptr, head_off,
            cache_stride_block, cache_stride_slot, qk_scale,
            BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip
        o_off = tok * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), row_ok)


def paged_decode_rope_triton(
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
) -> torch.Tensor:  # [T, h, d]
    """``qk_norm_rope_ref``, the KV write and ``paged_attention_ref`` of a decode batch in one
    launch: the attention output (rows past ``query_start_loc[num_reqs]`` left unwritten)."""
    check_rope_attend(q, k, v, cos, sin, q_weight, k_weight, kv_cache, meta)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0 or meta.num_reqs == 0:
        return out
    args, consts = rope_launch_args(
        out, q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta, scale
    )
    _paged_decode_rope_kernel[(meta.num_reqs, kv_cache.shape[3])](*args, **consts)
    return out


def rope_launch_args(out, q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta,
                     scale) -> tuple[tuple, dict]:  # fmt: skip
    """The arguments both folded decode kernels take first, in this order (this one and the
    split-KV one, ``attention_split_kv_rope_triton.py``), and their constexprs and launch
    options."""
    group = q.shape[1] // kv_cache.shape[3]
    args = (
        out, q, k, v, kv_cache[0], kv_cache[1], cos, sin,
        positions if positions is not None else meta.slot_mapping,
        q_weight if q_weight is not None else cos, k_weight if k_weight is not None else cos,
        meta.slot_mapping, meta.query_start_loc, meta.seq_lens, meta.block_table,
        scale * LOG2_E, float(eps), meta.num_reqs, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), cos.stride(0),
        sin.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        meta.block_table.stride(0),
    )  # fmt: skip
    consts = dict(
        G=group, HEAD_DIM=q.shape[2], BLOCK_SIZE=meta.block_size,
        BLOCK_M=max(DECODE_ROWS, triton.next_power_of_2(group)),
        BLOCK_N=decode_keys(q.dtype, meta.num_reqs, kv_cache.shape[3], q.device),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        HAS_POSITIONS=positions is not None, HAS_NORM=q_weight is not None,
        **launch_options(use_pdl(q.device)),
        **decode_launch(meta.num_reqs, kv_cache.shape[3], q.device, q.shape[2]),
    )  # fmt: skip
    return args, consts


def check_rope_attend(q, k, v, cos, sin, q_weight, k_weight, kv_cache, meta) -> None:
    """The shapes a folded decode attention takes (this kernel's and the split-KV one's)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    shape = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    check_head_dim(head_dim)
    if k.shape != (num_tokens, num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(f"decode rope attention: {shape} do not fit {tuple(kv_cache.shape)}")
    if num_heads % num_kv_heads or kv_cache.shape[4] != head_dim:
        raise ValueError(f"decode rope attention: {shape} do not fit {tuple(kv_cache.shape)}")
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, sin, kv_cache)):
        raise ValueError("decode rope attention: every tensor needs a contiguous last dimension")
    if min(cos.shape[1], sin.shape[1]) < head_dim // 2 or (q_weight is None) != (k_weight is None):
        raise ValueError(
            f"decode rope attention: cos/sin must be [rows, >= {head_dim // 2}], and q and k "
            "normalised together (both weights or none)"
        )
    if not is_decode_batch(num_tokens, meta.num_reqs):
        raise ValueError(
            f"decode rope attention: {num_tokens} tokens > {meta.num_reqs} requests is not a "
            "decode batch"
        )
