"""Rotary embedding of q and k in one kernel, with Qwen3's per-head RMSNorm of q and k before it:
the Triton kernel beside its torch reference, and the cos/sin cache it reads.

RoPE is neox style (``rotate_half``): dimension j < d/2 of a head pairs with j + d/2, and both
turn by the angle ``position * inv_freq[j]``. The angles' cos and sin come from tables of rows
[R, >= d/2] of which the first d/2 columns are read, row ``positions[t]`` for token t (or row t
when no positions are given). Two layouts fit: the torch decoder's per-token ``cos``/``sin``
[T, d] (both halves equal), and ``rope_cos_sin_cache``'s [max_positions, d] float32 table, cos in
the first half and sin in the second (vLLM's ``cos_sin_cache``), read through two column views.

``qk_norm_rope_ref`` is the torch decoder's arithmetic: the table rows cast to q's dtype,
optionally ``rmsnorm_ref`` of every head (Qwen3's ``q_norm``/``k_norm``), then
``x * cos + rotate_half(x) * sin`` in q's dtype; it returns new tensors.

``qk_norm_rope_triton`` rotates q [T, h, d] and k [T, kvh, d] in place (strided views of the
fused QKV projection are fine) in one launch, one program per token for all its q and k heads,
float32 math from the float32 table, one rounding to the io dtype at the end (and, with the
norm, where ``rmsnorm_ref`` rounds). Any head count and any even head_dim (masked up to powers of
two). Given the KV cache, the same launch also stores the rotated k and the token's v at its slot
(``write_kv``'s contract, slots < 0 skipped), so a decoder layer needs no separate KV write.
CUDA-graph safe: positions and slots are read on the device, shapes come from the tensors. With
programmatic dependent launch (``pdl.py``) a program reads its table row, then waits for the
kernel before it.
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.model.norm_triton import rmsnorm_ref
from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """[max_positions, d] float32: cos of each position's angles, then their sin (d/2 each).
    The angles are the torch decoder's: ``position.float() * inv_freq``."""
    positions = torch.arange(max_positions, device=inv_freq.device)
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [P, d/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def qk_norm_rope_ref(
    q: torch.Tensor,  # [T, h, d]
    k: torch.Tensor,  # [T, kvh, d]
    cos: torch.Tensor,  # [R, >= d/2]
    sin: torch.Tensor,  # [R, >= d/2]
    positions: torch.Tensor | None = None,  # [T] rows of the tables; None: row t
    q_weight: torch.Tensor | None = None,  # [d]: per-head RMSNorm of q first (Qwen3)
    k_weight: torch.Tensor | None = None,  # [d]
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rope(norm(q)), rope(norm(k))) as new tensors, in the torch decoder's arithmetic."""
    half = q.shape[-1] // 2
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
    cos, sin = cos[:, :half].to(q.dtype), sin[:, :half].to(q.dtype)
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)  # [T, 1, d]
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    if q_weight is not None:
        q = rmsnorm_ref(q, q_weight, eps)
    if k_weight is not None:
        k = rmsnorm_ref(k, k_weight, eps)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@triton.jit
def _norm_rope_heads(
    x_ptr,  # the token's first head
    stride_h,
    num_heads,
    cos,  # [BLOCK_HALF] float32
    sin,
    w_ptr,  # [d] norm weight (read when HAS_NORM)
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """Norm (optionally) and rotate one token's heads in place; returns the two rotated halves
    [BLOCK_H, BLOCK_HALF] in the io dtype."""
    heads = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    mask = (heads < num_heads)[:, None] & (j < HALF)[None, :]
    ptr = x_ptr + heads[:, None] * stride_h + j[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0)
    io = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        rstd = tl.rsqrt(sum_sq / HEAD_DIM + eps)[:, None]
        w1 = tl.load(w_ptr + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
        # rmsnorm_ref rounds the normalised head, then the product with the weight
        x1 = ((x1 * rstd).to(io).to(tl.float32) * w1).to(io).to(tl.float32)
        x2 = ((x2 * rstd).to(io).to(tl.float32) * w2).to(io).to(tl.float32)
    c, s = cos[None, :], sin[None, :]
    o1 = (x1 * c - x2 * s).to(io)
    o2 = (x2 * c + x1 * s).to(io)
    tl.store(ptr, o1, mask=mask)
    tl.store(ptr + HALF, o2, mask=mask)
    return o1, o2


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,  # [T, h, d]
    k_ptr,  # [T, kvh, d]
    v_ptr,  # [T, kvh, d] (read when WRITE_KV)
    cos_ptr,  # [R, >= d/2]
    sin_ptr,
    positions_ptr,  # [T] (read when HAS_POSITIONS)
    q_weight_ptr,  # [d] (read when HAS_NORM)
    k_weight_ptr,
    k_cache_ptr,  # [num_blocks, block_size, kvh, d] (written when WRITE_KV)
    v_cache_ptr,
    slot_mapping_ptr,  # [T], < 0 = not written
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    cos_stride,
    sin_stride,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    block_size,
    num_q_heads,
    num_k_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_POSITIONS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    WRITE_KV: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL (pdl.py): tables first, then wait
):
    t = tl.program_id(0).to(tl.int64)
    row = tl.load(positions_ptr + t).to(tl.int64) if HAS_POSITIONS else t
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cos_ptr + row * cos_stride + j, mask=j < HALF, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + row * sin_stride + j, mask=j < HALF, other=0.0).to(tl.float32)
    if USE_GDC:  # q, k and v are the QKV projection's output; the next kernel may start now
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _norm_rope_heads(
        q_ptr + t * q_stride_t,
        q_stride_h,
        num_q_heads,
        cos,
        sin,
        q_weight_ptr,
        eps,
        HEAD_DIM,
        HALF,
        BLOCK_HQ,
        BLOCK_HALF,
        HAS_NORM,
    )
    k1, k2 = _norm_rope_heads(
        k_ptr + t * k_stride_t,
        k_stride_h,
        num_k_heads,
        cos,
        sin,
        k_weight_ptr,
        eps,
        HEAD_DIM,
        HALF,
        BLOCK_HK,
        BLOCK_HALF,
        HAS_NORM,
    )
    if WRITE_KV:
        slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
        if slot >= 0:
            heads = tl.arange(0, BLOCK_HK)
            mask = (heads < num_k_heads)[:, None] & (j < HALF)[None, :]
            dst = (
                (slot // block_size) * cache_stride_block
                + (slot % block_size) * cache_stride_slot
                + heads[:, None] * cache_stride_head
                + j[None, :]
            )
            cache_dtype = k_cache_ptr.dtype.element_ty
            tl.store(k_cache_ptr + dst, k1.to(cache_dtype), mask=mask)
            tl.store(k_cache_ptr + dst + HALF, k2.to(cache_dtype), mask=mask)
            src = v_ptr + t * v_stride_t + heads[:, None] * v_stride_h + j[None, :]
            v1 = tl.load(src, mask=mask, other=0.0)
            v2 = tl.load(src + HALF, mask=mask, other=0.0)
            tl.store(v_cache_ptr + dst, v1.to(cache_dtype), mask=mask)
            tl.store(v_cache_ptr + dst + HALF, v2.to(cache_dtype), mask=mask)


def qk_norm_rope_triton(
    q: torch.Tensor,  # [T, h, d], updated in place
    k: torch.Tensor,  # [T, kvh, d], updated in place
    cos: torch.Tensor,  # [R, >= d/2]
    sin: torch.Tensor,  # [R, >= d/2]
    positions: torch.Tensor | None = None,  # [T]
    q_weight: torch.Tensor | None = None,  # [d]
    k_weight: torch.Tensor | None = None,  # [d]
    eps: float = 1e-6,
    *,
    v: torch.Tensor | None = None,  # [T, kvh, d]: with kv_cache, written with the new k
    kv_cache: torch.Tensor | None = None,  # [2, num_blocks, block_size, kvh, d]
    slot_mapping: torch.Tensor | None = None,  # [T] int64, < 0 = not written
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qk_norm_rope_ref`` in one launch, in place; returns (q, k). With ``kv_cache`` the same
    launch stores the rotated k and ``v`` at their slots (what ``write_kv`` does after it)."""
    num_tokens, num_q_heads, head_dim = q.shape
    half = head_dim // 2
    if head_dim % 2 or k.dim() != 3 or k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(
            f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} need equal tokens and an "
            "even, equal head_dim"
        )
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("qk_norm_rope: q, k, cos and sin need a contiguous last dimension")
    if cos.dim() != 2 or sin.dim() != 2 or min(cos.shape[1], sin.shape[1]) < half:
        raise ValueError(f"qk_norm_rope: cos/sin tables must be [rows, >= {half}]")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("qk_norm_rope: q and k are normalised together (both weights or none)")
    write_kv = kv_cache is not None
    if write_kv and (
        v is None
        or slot_mapping is None
        or v.shape != k.shape
        or v.stride(-1) != 1
        or kv_cache.shape[3:] != k.shape[1:]
        or kv_cache.stride(-1) != 1
    ):
        raise ValueError(
            "qk_norm_rope: a KV write needs v shaped like k, slot_mapping and a kv_cache "
            "[2, blocks, block_size, kvh, d], each with a contiguous last dimension"
        )
    if num_tokens == 0:
        return q, k
    # without a KV write the cache arguments are never read: q stands in for them
    k_cache, v_cache = (kv_cache[0], kv_cache[1]) if write_kv else (q, q)
    cache_strides = kv_cache.stride()[1:4] if write_kv else (0, 0, 0)
    vv = v if write_kv else k
    _qk_norm_rope_kernel[(num_tokens,)](
        q,
        k,
        vv,
        cos,
        sin,
        positions if positions is not None else q,
        q_weight if q_weight is not None else q,
        k_weight if k_weight is not None else q,
        k_cache,
        v_cache,
        slot_mapping if write_kv else q,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        vv.stride(0),
        vv.stride(1),
        cos.stride(0),
        sin.stride(0),
        *cache_strides,
        kv_cache.shape[2] if write_kv else 1,
        num_q_heads,
        k.shape[1],
        eps,
        HEAD_DIM=head_dim,
        HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_q_heads),
        BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
        HAS_POSITIONS=positions is not None,
        HAS_NORM=q_weight is not None,
        WRITE_KV=write_kv,
        **launch_options(use_pdl(q.device)),
    )
    return q, k
