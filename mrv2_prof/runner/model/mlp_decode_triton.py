"""The batch-1 MLP in one launch: post-attention RMSNorm, gate/up, SiLU-and-mul and down added
into the residual stream, the Triton kernel beside its torch reference.

At batch 1 the fused GEMV path (``projections_triton.py``) runs a layer's MLP as two launches:
gate/up with the norm as its prologue (``gemv_triton``, ``one_pass``), then down with
SiLU-and-mul as its prologue and the residual add as its epilogue. Each launch is a program per
four output features streaming its weight rows, and a small model's layer is a few microseconds
of each (SmolLM2-135M: 3.8 + 3.5 µs in the graph on an H100, RESULTS.md eighteenth round): the
boundary between them, a wait for the gate/up output and a second walk, is a large part of it.

Here a program owns ``BLOCK_I`` of the intermediate features instead. It walks the hidden row
once for its gate and up rows (the one-pass norm: ``W (g * x)`` and the row's squares in the same
walk, ``rstd`` applied at the end, as ``gemv_triton``'s ``one_pass``), rounds gate and up to the
weights' dtype, takes ``silu(gate) * up`` with ``silu_and_mul_ref``'s roundings, and multiplies
those ``BLOCK_I`` activations by its columns of the down weight: a float32 partial of the whole
output row, added into a float32 workspace row with atomics. The last program to finish (a
counter, as the split-KV reduction's: ``attention_split_kv_triton.count_and_reduce``) adds the
workspace into the residual stream, rounds once (the down GEMV's epilogue), and zeroes the
workspace and the counter for the next launch. Nothing of the intermediate row is written.
The down weight is read as ``nn.Linear`` keeps it ([H, I]: a program's columns are ``BLOCK_I``
elements of each row) or as the view of a transposed copy (``w.t().contiguous().t()``: its
columns contiguous).

The atomics make the sum's order, and so its last float32 bits, vary from run to run (the bf16
residual may then differ by one rounding between two runs of one prompt, and a near-tie of the
logits by a token); the fused GEMV's fixed-order sums do not. An order-free form (each partial
scaled by 2^32 and added as an int64: integer sums do not depend on their order) was measured
and lost: 64-bit atomics took SmolLM2's MLP from 5.6 to 8.4 µs, slower than the two GEMVs'
7.2 (H100, ``benchmarks/mlp_decode.py``). ``projections_triton.FUSED_MLP`` (the
``runner.fused_mlp`` setting, off by default for that reason; ``kernel_paths.py`` has the
measurements) turns it on.

Programmatic dependent launch (``pdl.py``): a program loads its first gate/up tiles and its
first down tile (the model's weights) before ``gdc_wait`` and the residual row after it; the
workspace and the counter are touched only after the wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_ref, silu_mul
from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace
from mrv2_prof.runner.model.norm_triton import rmsnorm_ref
from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl

TILE_ELEMENTS = 16384  # a weight tile's elements ([BLOCK_I, BLOCK_K] and [BLOCK_H, BLOCK_I])


@dataclass(frozen=True)
class MlpTiles:
    block_i: int  # intermediate features per program
    block_k: int  # hidden elements per step of the gate/up walk
    block_h: int  # output features per step of the down walk
    num_warps: int = 8


def pick_mlp_tiles(hidden: int, inter: int) -> MlpTiles:
    """Tiles from host ints only: 16 intermediate features a program up to 2,048 of them (96
    programs for SmolLM2-135M and qwen3-0.6b), 32 above; weight tiles of ``TILE_ELEMENTS``."""
    bi = 16 if inter <= 2048 else 32
    whole = triton.next_power_of_2(hidden)
    return MlpTiles(bi, min(whole, TILE_ELEMENTS // bi), min(whole, TILE_ELEMENTS // bi))


def mlp_decode_ref(
    x: torch.Tensor,  # [1, H] the residual stream
    norm_weight: torch.Tensor,  # [H]
    eps: float,
    gate_up_weight: torch.Tensor,  # [2I, H]: gate rows, then up rows
    down_weight: torch.Tensor,  # [H, I]
) -> torch.Tensor:
    """``x + down(silu(gate) * up)`` of ``RMSNorm(x)``'s gate/up, as a new tensor: the unfused
    references' arithmetic (``rmsnorm_ref``, ``F.linear``, ``silu_and_mul_ref``, the down
    product added once in float32)."""
    gate_up = F.linear(rmsnorm_ref(x, norm_weight, eps), gate_up_weight)
    y = F.linear(silu_and_mul_ref(gate_up), down_weight)
    return (x.float() + y.float()).to(x.dtype)


@triton.jit
def _down_partial(wd, a, sum_ptr, h, h_ok):
    """One down tile's float32 partial of the output features ``h``, added into the workspace."""
    part = tl.sum(wd.to(tl.float32) * a[None, :], axis=1)
    tl.atomic_add(sum_ptr + h, part, mask=h_ok, sem="relaxed", scope="gpu")


@triton.jit
def _mlp_decode_kernel(
    x_ptr,  # [H]: the residual stream, read, then written by the last program
    norm_ptr,  # [H]
    gu_ptr,  # [2I, H]
    down_ptr,  # [H, I]: row-major, or a transposed copy's view (strides 1, H)
    sum_ptr,  # [>= H] float32 workspace, zero between launches
    counter_ptr,  # [1] int32, zero between launches
    H,
    INTER,
    gu_stride,
    down_stride_h,
    down_stride_i,
    eps,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_GDC: tl.constexpr = False,  # launched with PDL: weights before the wait, x after
):
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < INTER
    ks = tl.arange(0, BLOCK_K)
    hs = tl.arange(0, BLOCK_H)
    io_dtype = x_ptr.dtype.element_ty
    g_rows = gu_ptr + i.to(tl.int64)[:, None] * gu_stride
    u_rows = gu_ptr + (i + INTER).to(tl.int64)[:, None] * gu_stride
    d_cols = down_ptr + i.to(tl.int64)[None, :] * down_stride_i
    # the first down tile, a model weight, loaded now (under the kernel before, with PDL)
    wd0 = tl.load(d_cols + hs.to(tl.int64)[:, None] * down_stride_h,
                  mask=(hs < H)[:, None] & i_ok[None, :], other=0.0)  # fmt: skip
    gate = tl.zeros([BLOCK_I], tl.float32)
    up = tl.zeros([BLOCK_I], tl.float32)
    sum_sq = tl.zeros([1], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + ks
        k_ok = k < H
        w_ok = i_ok[:, None] & k_ok[None, :]
        wg = tl.load(g_rows + k[None, :], mask=w_ok, other=0.0)
        wu = tl.load(u_rows + k[None, :], mask=w_ok, other=0.0)
        if USE_GDC:  # x is the kernel before's output (a no-op after the first step)
            tl.extra.cuda.gdc_wait()
        xf = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        sum_sq += tl.sum(xf * xf, axis=0)
        xg = (tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * xf)[None, :]
        gate += tl.sum(wg.to(tl.float32) * xg, axis=1)
        up += tl.sum(wu.to(tl.float32) * xg, axis=1)
    if USE_GDC:  # pdl.py's third rule (the wait above is in a loop); then let the next start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rstd = tl.rsqrt(sum_sq / H + eps)  # [1]
    gate = (gate * rstd).to(io_dtype).to(tl.float32)  # the gate/up GEMV's rounding
    up = (up * rstd).to(io_dtype).to(tl.float32)
    a = tl.where(i_ok, silu_mul(gate, up, io_dtype).to(tl.float32), 0.0)  # silu_and_mul_ref's
    _down_partial(wd0, a, sum_ptr, hs, hs < H)
    for h0 in range(BLOCK_H, H, BLOCK_H):
        h = h0 + hs
        h_ok = h < H
        wd = tl.load(d_cols + h.to(tl.int64)[:, None] * down_stride_h,
                     mask=h_ok[:, None] & i_ok[None, :], other=0.0)  # fmt: skip
        _down_partial(wd, a, sum_ptr, h, h_ok)
    tl.debug_barrier()  # every thread's atomics before the release below
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:  # the last program: every partial is in the workspace
        for h0 in range(0, H, BLOCK_H):
            h = h0 + hs
            h_ok = h < H
            s = tl.load(sum_ptr + h, mask=h_ok, other=0.0, cache_modifier=".cg")
            r = tl.load(x_ptr + h, mask=h_ok, other=0.0).to(tl.float32)
            tl.store(x_ptr + h, (r + s).to(io_dtype), mask=h_ok)
            tl.store(sum_ptr + h, tl.zeros([BLOCK_H], tl.float32), mask=h_ok)
        tl.store(counter_ptr, 0)  # ready for the next launch


def make_workspace(device: torch.device, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum [hidden] float32, counter [1] int32)``, zeros: the kernel leaves them so."""
    return (
        torch.zeros(hidden, dtype=torch.float32, device=device),
        torch.zeros(1, dtype=torch.int32, device=device),
    )


WORKSPACE = KernelWorkspace(
    "the fused MLP's workspace", "run a batch-1 step eagerly", make_workspace
)


def mlp_workspace(device: torch.device, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum [>= hidden] float32, counter [1] int32)`` of ``device``'s workspace, grown to fit."""
    return WORKSPACE.get(device, hidden)


def check_mlp(x, norm_weight, gate_up_weight, down_weight) -> None:
    """The shapes the kernel takes: one contiguous row and weights that fit it."""
    hidden, inter = down_weight.shape
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != hidden or x.stride(-1) != 1:
        raise ValueError(f"fused MLP: x {tuple(x.shape)} is not one contiguous row of {hidden}")
    if gate_up_weight.shape != (2 * inter, hidden) or norm_weight.shape != (hidden,):
        raise ValueError(
            f"fused MLP: gate/up {tuple(gate_up_weight.shape)} and norm "
            f"{tuple(norm_weight.shape)} do not fit down {tuple(down_weight.shape)}"
        )
    if gate_up_weight.stride(-1) != 1 or 1 not in down_weight.stride():
        raise ValueError(
            "fused MLP: gate/up needs a contiguous last dimension, down a contiguous dimension"
        )


def mlp_decode_triton(
    x: torch.Tensor,  # [1, H]: the residual stream, updated in place
    norm_weight: torch.Tensor,
    eps: float,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    tiles: MlpTiles | None = None,
) -> torch.Tensor:
    """``mlp_decode_ref`` in one launch, written into ``x`` (returned)."""
    check_mlp(x, norm_weight, gate_up_weight, down_weight)
    hidden, inter = down_weight.shape
    t = tiles or pick_mlp_tiles(hidden, inter)
    sums, counter = mlp_workspace(x.device, hidden)
    _mlp_decode_kernel[(triton.cdiv(inter, t.block_i),)](
        x, norm_weight, gate_up_weight, down_weight, sums, counter, hidden, inter,
        gate_up_weight.stride(0), *down_weight.stride(), float(eps),
        BLOCK_I=t.block_i, BLOCK_K=t.block_k, BLOCK_H=t.block_h, num_warps=t.num_warps,
        **launch_options(use_pdl(x.device)),
    )  # fmt: skip
    return x
