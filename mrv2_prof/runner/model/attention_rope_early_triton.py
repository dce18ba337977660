"""The folded decode attention's first token, its serial loads cut short (``EARLY_FIRST_TOKEN``).

A folded decode attention program (``attention_decode_rope_triton.py`` and the split-KV one)
walks its request's tokens in a loop whose trip count is read at run time: for each, after the
PDL wait, its position, then the RoPE angles at that position, its slot, then (under ``slot >= 0``)
its k and v rows, the KV write, the barrier, and, in the split kernel, its query rows. At batch 1
every one of those loads waits for the one before it: some six dependent round trips to memory
before the first key is read, each a few hundred nanoseconds, in a kernel whose keys take
0.05-0.25 µs at the roof (RESULTS.md, "What would close the remaining gaps").

With the switch on, the first token of a request (a decode step's only one) is taken out of the
loop's dependent chain:

* before the wait, its position, RoPE angles and slot (the step's metadata and the tables,
  ``pdl.py``'s rule 1) and, in the split kernel, the request's length;
* after it, its query rows, k row and v row in one batch of loads, none waiting for another;
  rotated with the fold's arithmetic (``rope_rows``), k and v stored at the slot under a mask
  (``slot >= 0``, and in the split kernel the split that holds the position), no branch.

The loop then handles the request's later tokens only, as before. What a program computes and
writes is unchanged: the kernels' references and tests are the fold's. The row arithmetic both
paths share lives here too (``rope_rows``, ``slot_offsets``), below the fold's module. Off until
measured on the H200 (``benchmarks/decode_roofline.py``'s ``+early``): read at each launch, so it
must be set before a CUDA graph is captured.
"""

from __future__ import annotations

import triton
import triton.language as tl

EARLY_FIRST_TOKEN = False  # the module docstring: off until measured


@triton.jit
def rope_rows(x, xs, w_ptr, dims, swapped, first, cos, sin, eps,
              HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):  # fmt: skip
    """``qk_norm_rope_ref`` of R loaded rows ``x`` (and ``xs``, the same with halves swapped) in
    their dtype: the RoPE kernel's roundings (``norm_rope_rows`` loads, then this)."""
    io = x.dtype
    xf = x.to(tl.float32)
    xs = xs.to(tl.float32)
    if HAS_NORM:
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)[:, None]
        w = tl.load(w_ptr + dims).to(tl.float32)[None, :]
        ws = tl.load(w_ptr + swapped).to(tl.float32)[None, :]
        xf = ((xf * rstd).to(io).to(tl.float32) * w).to(io).to(tl.float32)
        xs = ((xs * rstd).to(io).to(tl.float32) * ws).to(io).to(tl.float32)
    c, s = cos[None, :], sin[None, :]
    return tl.where(first[None, :], xf * c - xs * s, xf * c + xs * s).to(io)


@triton.jit
def first_token_slot(slot_mapping_ptr, q_start, q_len):
    """A request's first token (row 0 for a request of none) and its slot (-1 for a request of
    none): metadata only, so read before the wait (its angles: ``rope_tables`` of the token)."""
    tok = tl.where(q_len > 0, q_start, 0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    return tok, tl.where(q_len > 0, slot, -1)


@triton.jit
def first_token_rows(q_ptr, k_ptr, v_ptr, tok, head, row_ok, kv_head, q_stride_t, q_stride_h,
                     k_stride_t, k_stride_h, v_stride_t, v_stride_h, dims, swapped,
                     q_len):  # fmt: skip
    """The token's query rows [BLOCK_M, d] and its k and v rows [1, d] (q and k also with their
    halves swapped): loads of the QKV output issued together, after the wait."""
    one = tl.arange(0, 1)[:, None]
    q_rows = q_ptr + tok * q_stride_t + head[:, None] * q_stride_h
    has_token = (one * 0 + q_len) > 0  # [1, 1]: the request has a token this step
    q_ok = row_ok[:, None] & has_token
    k_row = k_ptr + tok * k_stride_t + kv_head * k_stride_h + one * 0
    v_row = v_ptr + tok * v_stride_t + kv_head * v_stride_h + one * 0
    q = tl.load(q_rows + dims[None, :], mask=q_ok, other=0.0)
    qs = tl.load(q_rows + swapped[None, :], mask=q_ok, other=0.0)
    k = tl.load(k_row + dims[None, :], mask=has_token, other=0.0)
    ks = tl.load(k_row + swapped[None, :], mask=has_token, other=0.0)
    v = tl.load(v_row + dims[None, :], mask=has_token, other=0.0)
    return q, qs, k, ks, v


@triton.jit
def slot_offsets(slot, head_off, cache_stride_block, cache_stride_slot, dims,
                 BLOCK_SIZE: tl.constexpr):  # fmt: skip
    """A kv head's [1, d] element offsets at cache slot ``slot`` (the fold's KV write and
    ``store_first_kv`` both store there)."""
    one = tl.arange(0, 1)[:, None]
    dst = (slot // BLOCK_SIZE) * cache_stride_block + head_off + one * 0
    return dst + (slot % BLOCK_SIZE) * cache_stride_slot + dims[None, :]


@triton.jit
def store_first_kv(k_cache_ptr, v_cache_ptr, k, v, slot, write, head_off, cache_stride_block,
                   cache_stride_slot, dims, BLOCK_SIZE: tl.constexpr):  # fmt: skip
    """The rotated k [1, d] and v [1, d] at ``slot`` where ``write`` (a scalar condition; the
    address is formed from slot 0 where it is not)."""
    one = tl.arange(0, 1)[:, None]
    dst = slot_offsets(tl.where(write, slot, 0), head_off, cache_stride_block, cache_stride_slot,
                       dims, BLOCK_SIZE)  # fmt: skip
    ok = (one * 0 + write.to(tl.int32)) > 0
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=ok)


@triton.jit
def first_token_rope_write(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, q_weight_ptr, k_weight_ptr, tok, slot, write,
    q_len, head, row_ok, kv_head, q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t,
    v_stride_h, head_off, cache_stride_block, cache_stride_slot, dims, swapped, first, cos, sin,
    eps, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """The first token, after the wait: its rows loaded together, q and k normalised (Qwen3) and
    rotated, k and v stored at ``slot`` where ``write``; its rotated query rows."""
    q, qs, k, ks, v = first_token_rows(
        q_ptr, k_ptr, v_ptr, tok, head, row_ok, kv_head, q_stride_t, q_stride_h, k_stride_t,
        k_stride_h, v_stride_t, v_stride_h, dims, swapped, q_len,
    )  # fmt: skip
    q = rope_rows(q, qs, q_weight_ptr, dims, swapped, first, cos, sin, eps, HEAD_DIM, HAS_NORM)
    k = rope_rows(k, ks, k_weight_ptr, dims, swapped, first, cos, sin, eps, HEAD_DIM, HAS_NORM)
    store_first_kv(k_cache_ptr, v_cache_ptr, k, v, slot, write, head_off, cache_stride_block,
                   cache_stride_slot, dims, BLOCK_SIZE)  # fmt: skip
    return q
