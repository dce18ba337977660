"""Batch-1 decode attention with the output projection as its epilogue: one launch fewer a layer.

At batch 1 a decoder layer with the fused GEMVs (``projections_triton.py``: ``fused_onepass``)
is five launches: QKV with the input norm, the folded attention (``attention_decode_rope_
triton.py``: RoPE, the KV write, attention), o into the residual stream, gate/up with the
post-attention norm, down with SiLU-and-mul into the residual stream. Each costs 3-8 µs however
few bytes it reads, so a small model's step is its launches (RESULTS.md: SmolLM2-135M's 157
kernels). The o projection is linear in the heads' outputs, so it splits by kv head with no
reduction between programs: ``o @ W_o.T = sum_g o_g @ W_o[:, g].T``, ``o_g`` the attention output
of kv head ``g``'s query group. Here program ``(g, r)`` does the fold's work for kv head ``g``
(every ``r`` the same: the group's attention is a few hundred keys, read from L2 by all of them),
rounds the group's output to the activations' dtype as the unfused path's attention output is,
and multiplies it by its slice of ``W_o``: output features ``[r * BLOCK_H, (r + 1) * BLOCK_H)``,
the group's columns. It writes the float32 partial sums ``parts[g, features]``; nothing is added
into the residual stream here. The next two kernels take the sum instead: the gate/up GEMV reads
``x + sum_g parts[g]`` (rounded to the stream's dtype, as the o GEMV's residual epilogue rounds
it) as its input row, and the down GEMV adds that same rounded sum to its own product when it
writes the stream (``gemv_triton``'s ``parts``). Rounded once where the unfused path rounds once;
the float32 sums differ from the o GEMV's only in their order.

Every program of a kv head writes the token's rotated k and v at its slot (the same bytes) and
the group's output to a scratch row (the same bytes), each read back by its own threads after a
barrier, so no program waits for another. With PDL (``pdl.py``) the ``W_o`` slice is a model
weight: it is loaded before the wait (``PREFETCH_O``), with the step's metadata.

``folds_o`` decides from host ints only: ``O_FOLD`` on, the RoPE fold serving the batch, one
request of one token, no split of its keys (``decode_split_count``), no o bias, and the gate/up
and down projections on the fused one-pass GEMVs (``projections_triton.takes_parts``). Off until
``benchmarks/decode_roofline.py --variant fused_onepass+pdl+fold+ofold`` measures it.
``rope_attend_o_ref`` is the torch arithmetic it replaces, the oracle of the tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.attention import AttentionMetadata, paged_attention_ref, write_kv_ref
from mrv2_prof.runner.model.attention_decode_rope_triton import (
    check_rope_attend,
    folds_rope,
    norm_rope_rows,
    rope_tables,
    write_rotated_kv,
)
from mrv2_prof.runner.model.attention_decode_triton import DECODE_ROWS, LOG2_E, attend_keys
from mrv2_prof.runner.model.attention_split_kv_triton import decode_split_count, num_sms
from mrv2_prof.runner.model.attention_triton import decode_keys
from mrv2_prof.runner.model.pdl import launch_options, use_pdl
from mrv2_prof.runner.model.projections_triton import takes_parts
from mrv2_prof.runner.model.rotary_triton import qk_norm_rope_ref

O_FOLD = False  # off until measured (the module docstring)
PREFETCH_O = True  # W_o's slice loaded before the PDL wait (else after attention)
MAX_O_TILE = 16384  # W_o elements a program holds: BLOCK_H x the group's padded columns


def folds_o(x, meta: AttentionMetadata, kv_cache, o_bias, gate_up_weight, down_weight) -> bool:
    """Whether a layer's o projection goes into the folded attention for the batch of ``x``'s
    rows (host ints only)."""
    if not O_FOLD or o_bias is not None or not folds_rope(x.shape[0], meta, kv_cache):
        return False
    if x.shape[0] != 1 or meta.num_reqs != 1:
        return False
    if decode_split_count(meta, kv_cache.shape[3], kv_cache.device) != 1:
        return False
    return takes_parts(x, gate_up_weight, down_weight)


def o_rows(hidden: int, num_kv_heads: int, group_cols: int, sms: int) -> int:
    """Output features a program takes (``BLOCK_H``): at most 64 and ``MAX_O_TILE`` weights,
    halved down to 16 while the grid has fewer programs than ``sms``."""
    block = 64
    while block > 16 and (block * group_cols > MAX_O_TILE or
                          num_kv_heads * triton.cdiv(hidden, block) < sms):  # fmt: skip
        block //= 2
    return block


_parts: dict[torch.device, list[torch.Tensor]] = {}


def parts_buffer(device: torch.device, numel: int) -> torch.Tensor:
    """``numel`` float32 of the device's partial sums: grown (never during a CUDA graph capture),
    never shrunk; a grown-out buffer is kept, as a captured graph may still write it."""
    have = _parts.setdefault(device, [])
    if not have or have[-1].numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "the folded o projection's partial sums grow during a CUDA graph capture: run "
                "a batch-1 decode eagerly before capturing"
            )
        have.append(torch.empty(max(numel, 2 * (have[-1].numel() if have else 0)),
                                dtype=torch.float32, device=device))  # fmt: skip
    return have[-1][:numel]


@triton.jit
def _decode_rope_o_kernel(
    parts_ptr, scratch_ptr, o_weight_ptr, q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr,
    cos_ptr, sin_ptr, positions_ptr, q_weight_ptr, k_weight_ptr, slot_mapping_ptr,
    seq_lens_ptr, block_table_ptr, qk_scale, eps, q_stride_h, k_stride_h, v_stride_h,
    cos_stride, sin_stride, cache_stride_block, cache_stride_slot, cache_stride_head,
    hidden, o_stride,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, GROUP_COLS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_POSITIONS: tl.constexpr, HAS_NORM: tl.constexpr,
    PREFETCH: tl.constexpr, USE_GDC: tl.constexpr = False,
):  # fmt: skip
    kv_head = tl.program_id(0)
    feats = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # this program's o features
    cols = tl.arange(0, GROUP_COLS)  # the group's heads side by side (padded)
    w_ptrs = o_weight_ptr + feats.to(tl.int64)[:, None] * o_stride + kv_head * G * HEAD_DIM
    w_mask = (feats[:, None] < hidden) & (cols[None, :] < G * HEAD_DIM)
    if PREFETCH:  # a model weight: read before the wait
        w = tl.load(w_ptrs + cols[None, :], mask=w_mask, other=0.0)
    ctx_len = tl.load(seq_lens_ptr) - 1  # one request, one token: position ctx_len
    slot = tl.load(slot_mapping_ptr).to(tl.int64)
    if USE_GDC:  # q, k and v are the QKV projection's output
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.arange(0, BLOCK_M)
    head = kv_head * G + rows
    row_ok = (rows < G)[:, None]
    dims = tl.arange(0, HEAD_DIM)
    swapped = (dims + HEAD_DIM // 2) % HEAD_DIM
    first = dims < HEAD_DIM // 2
    cos, sin = rope_tables(cos_ptr, sin_ptr, positions_ptr, 0, cos_stride, sin_stride, dims,
                           HEAD_DIM, HAS_POSITIONS)  # fmt: skip
    q = norm_rope_rows(q_ptr + head[:, None] * q_stride_h, row_ok, dims, swapped, first, cos, sin,
                       q_weight_ptr, eps, HEAD_DIM, HAS_NORM)  # fmt: skip
    head_off = kv_head * cache_stride_head
    if slot >= 0:  # every program of the kv head stores the same bytes
        write_rotated_kv(
            k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, 0, slot, kv_head, 0, k_stride_h, 0,
            v_stride_h, head_off, cache_stride_block, cache_stride_slot, dims, swapped, first,
            cos, sin, k_weight_ptr, eps, BLOCK_SIZE, HEAD_DIM, HAS_NORM,
        )  # fmt: skip
    tl.debug_barrier()  # the stores above are seen by every thread's key loads below
    q_pos = tl.zeros([BLOCK_M], tl.int32) + ctx_len
    out = attend_keys(
        q, q_pos, ctx_len + 1, block_table_ptr, k_cache_ptr, v_cache_ptr, head_off,
        cache_stride_block, cache_stride_slot, qk_scale,
        BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip
    # the group's output rounded as the unfused attention output, read back as one flat row
    scratch = scratch_ptr + head[:, None] * HEAD_DIM + dims[None, :]
    tl.store(scratch, out.to(scratch_ptr.dtype.element_ty), mask=row_ok)
    tl.debug_barrier()
    o = tl.load(scratch_ptr + kv_head * G * HEAD_DIM + cols, mask=cols < G * HEAD_DIM, other=0.0)
    if not PREFETCH:
        w = tl.load(w_ptrs + cols[None, :], mask=w_mask, other=0.0)
    y = tl.sum(w.to(tl.float32) * o.to(tl.float32)[None, :], axis=1)  # [BLOCK_H]
    tl.store(parts_ptr + kv_head * hidden + feats, y, mask=feats < hidden)


def rope_attend_o_triton(q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta,
                         scale, o_weight) -> torch.Tensor:  # fmt: skip
    """``rope_attend_o_ref`` in one launch: the float32 partial sums [kv_heads, hidden] of a
    batch of one token (``folds_o``), valid until the next call on the device."""
    check_rope_attend(q, k, v, cos, sin, q_weight, k_weight, kv_cache, meta)
    num_heads, head_dim = q.shape[1], q.shape[2]
    kvh, hidden = kv_cache.shape[3], o_weight.shape[0]
    if q.shape[0] != 1 or meta.num_reqs != 1 or o_weight.shape[1] != num_heads * head_dim:
        raise ValueError(f"decode o fold: q {tuple(q.shape)}, o weight "
                         f"{tuple(o_weight.shape)}: one token of one request")  # fmt: skip
    group = num_heads // kvh
    group_cols = triton.next_power_of_2(group) * head_dim
    block_h = o_rows(hidden, kvh, group_cols, num_sms(q.device))
    parts = parts_buffer(q.device, kvh * hidden).view(kvh, hidden)
    scratch = torch.empty(num_heads * head_dim, dtype=q.dtype, device=q.device)
    _decode_rope_o_kernel[(kvh, triton.cdiv(hidden, block_h))](
        parts, scratch, o_weight, q, k, v, kv_cache[0], kv_cache[1], cos, sin,
        positions if positions is not None else meta.slot_mapping,
        q_weight if q_weight is not None else cos, k_weight if k_weight is not None else cos,
        meta.slot_mapping, meta.seq_lens, meta.block_table, scale * LOG2_E, float(eps),
        q.stride(1), k.stride(1), v.stride(1), cos.stride(0), sin.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), hidden, o_weight.stride(0),
        G=group, HEAD_DIM=head_dim, BLOCK_SIZE=meta.block_size,
        BLOCK_M=max(DECODE_ROWS, triton.next_power_of_2(group)),
        BLOCK_N=decode_keys(q.dtype, 1, kvh, q.device), BLOCK_H=block_h, GROUP_COLS=group_cols,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        HAS_POSITIONS=positions is not None, HAS_NORM=q_weight is not None, PREFETCH=PREFETCH_O,
        **launch_options(use_pdl(q.device)),
    )  # fmt: skip
    return parts


def rope_attend_o_ref(q, k, v, cos, sin, positions, q_weight, k_weight, eps, kv_cache, meta,
                      scale, o_weight) -> torch.Tensor:  # fmt: skip
    """QK-norm + RoPE, the KV write (slots >= 0), paged attention rounded to q's dtype, then each
    kv head's group times its columns of ``o_weight`` in float32: [kv_heads, hidden]."""
    qr, kr = qk_norm_rope_ref(q, k, cos, sin, positions, q_weight, k_weight, eps)
    ok = meta.slot_mapping >= 0
    write_kv_ref(kr[ok], v[ok], kv_cache, meta.slot_mapping[ok])
    attn = paged_attention_ref(qr, kr, v, kv_cache, meta, scale).to(q.dtype)  # [T, h, d]
    kvh = kv_cache.shape[3]
    cols = attn[0].reshape(kvh, -1).float()  # [kv_heads, group * d]
    w = o_weight.float().reshape(o_weight.shape[0], kvh, -1)  # [hidden, kv_heads, group * d]
    return torch.einsum("gc,hgc->gh", cols, w)
