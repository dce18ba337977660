"""Decode GEMV: ``x @ weight.T`` for a few rows (M <= ``GEMV_MAX_ROWS``), the Triton kernel beside
its torch reference.

At batch 1 a decode step's projections are matrix-vector products: each weight element is read
once and used M times, so the step is a stream of the weights through HBM and only the read
bandwidth matters. cuBLAS serves these shapes with GEMM tiles (64x8, 128x8) and, on some shapes,
a split-K pass with a second reduction kernel. ``gemv_triton`` is one launch per projection: a
program owns ``BLOCK_N`` output features and walks the whole reduction dimension ``K`` in
``BLOCK_K`` steps, each loading a ``[BLOCK_N, BLOCK_K]`` tile of the weight (row-major, as
``nn.Linear`` keeps it, so every row of the tile is one contiguous read) and the ``[M, BLOCK_K]``
slice of the input; products accumulate in float32 and are reduced over K once at the end.
Optional epilogues: a bias, and ``residual += x @ weight.T`` in place (the down projection adding
into the residual stream, as ``addmm_`` does). The output is rounded once to its dtype, as cuBLAS
rounds its float32 accumulator. Optional prologues, which remove the launch of the elementwise
kernel before the GEMM at batch 1: ``norm=(weight, eps)`` applies RMSNorm to each input row
(every program first reduces the row's squares itself: a row is a few KiB, read from L2), and
``silu_mul=True`` reads a gate/up row [2K] and multiplies ``silu(gate) * up`` on the fly. Both
round where their references round (``rmsnorm_ref``, ``silu_and_mul_ref``).

``one_pass=True`` (with ``norm``) drops the RMSNorm prologue's first pass over the row: RMSNorm
scales a row by one number, ``rstd = rsqrt(mean(x^2) + eps)``, so ``W (g * x * rstd) =
rstd * W (g * x)``; the program accumulates ``W (g * x)`` and the row's squares in the same walk
of ``K`` (the slice of ``x`` it loads anyway) and multiplies by ``rstd`` at the end. Nothing is
read twice, and ``x * g`` stays in float32 (no rounding of the normalised row, so it is closer
to exact arithmetic than ``rmsnorm_ref``'s roundings, equal to them within a rounding of the
row's dtype). It is the fused mode's norm without the pass that made it slower on the H200
(``projections_triton.py``: ``fused_onepass``), not yet measured there.

Programmatic dependent launch (``pdl.py``): the program loads its weight tile (the model's own,
never an output of the kernel before it) before ``gdc_wait`` and its input row after it; once
its walk of ``K`` is done it lets the next PDL launch start (``gdc_launch_dependents``), waits
once more at the top level (a no-op, for ``pdl.py``'s third rule) and writes its output.

``GemvTiles.loop_stages`` > 1 software-pipelines the walk of ``K`` (triton's ``tl.range``
stages: the weight tiles of the next steps copied asynchronously into shared memory while this
step multiplies), so a program keeps several tiles in flight instead of one. The pipeliner's
prologue would load the first steps' input ahead of a wait inside the loop, so the first step is
peeled off it: its weight tile loaded before the PDL wait, its input after, the pipelined loop
from the second step on (with no wait inside).

``gemv_ref`` is the torch arithmetic it replaces (the prologue's reference, ``F.linear``, then the
residual add rounded once in float32), the oracle of the tests. Tiles are chosen from host ints
only (``pick_tiles``), so the launch of a CUDA-graph key never changes; the numbers come from
``benchmarks/gemv.py`` on the H200.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_ref, silu_mul
from mrv2_prof.runner.model.norm_triton import rmsnorm_ref
from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl

GEMV_MAX_ROWS = 4  # the kernel's limit (its partial products grow with M)
# The most rows the decode path gives the kernel (``prefers_gemv``): 1. Projection by projection
# cuBLAS's tensor-core tiles win at 2+ rows on the H200 (the docstring there); a small model's
# step at 2-4 rows may still be shorter here, with the prologues' launches saved (a layer of
# SmolLM2-135M is 5 launches at batch 1 and 11 at batch 2: RESULTS.md, twenty-fourth round).
# ``decode_roofline.py``'s ``+gvN`` times N rows (2-4); not yet measured.
GEMV_ROWS = 1
GEMV_MAX_FEATURES = 32768  # ``prefers_gemv``: the LM head (128k+ features) stays on cuBLAS
NO_PROLOGUE, RMSNORM, SILU_MUL = 0, 1, 2
# Warps at M = 1 with the SiLU-and-mul prologue (its exp and the gate/up loads of every K step):
# 8 against 4 took the down projection from 17.5 to 15.2 us (llama-1b) and 6.9 to 6.1 us
# (qwen3-0.6b) on an H100 (``benchmarks/gemv.py --prologue-sweep``, RESULTS.md ninth round)
SILU_MUL_WARPS = 8
# Software pipelining of the walk of K at M = 1 (``GemvTiles.loop_stages``): triton pipelines a
# loop's loads only where they feed a ``tl.dot`` unless the loop asks for stages itself, so the
# GEMV's weight tiles are loaded and consumed one at a time (its ``num_stages`` does nothing).
# Off (0): measured, it is not a win on every GPU and preset (RESULTS.md, fourteenth round). On
# an H200, 3 stages took llama-1b's down projection (K = 8,192) from 181 to 164 µs a step and
# qwen3-0.6b's (K = 3,072) from 120 to 108, and their QKV and o (K = 2,048) from 67 to 83 and
# 51 to 70 µs (two steps are too few to overlap); on an H100, with ``LOOP_MIN_K``, llama-1b's
# and qwen3-0.6b's steps were even (1.141 / 1.133 ms, 0.932 / 0.933) and llama-3-8b's 2.5 %
# longer (its down projection, K = 14,336, 1,261 -> 1,374 µs). ``decode_roofline.py``'s ``+lsN``
# and ``benchmarks/gemv_pipeline.py`` time it.
LOOP_STAGES = 0
# ... and only where K holds this many elements (three 1,024-wide steps: the shorter walks lost)
LOOP_MIN_K = 3072
# The reduction elements a program takes a step at M = 1 (``pick_tiles``' sweep winner on the
# H100; ``decode_roofline.py``'s ``+bkN`` times others in the engine, where under PDL a program
# reads its first step's weights before its wait)
M1_BLOCK_K = 1024


@dataclass(frozen=True)
class GemvTiles:
    block_n: int  # output features per program
    block_k: int  # reduction elements per loop step
    num_warps: int = 4
    num_stages: int = 3
    loop_stages: int = 0  # > 1: K's walk software-pipelined (the loop's own num_stages)


def row_classes(max_rows: int) -> list[int]:
    """Row counts, 2 to ``max_rows``, one of each launch variant the decode path's GEMV can take
    above one row (``BLOCK_M``, M's power of two, picks the tiles): the most rows of each."""
    rows = range(2, min(max_rows, GEMV_ROWS, GEMV_MAX_ROWS) + 1)
    return sorted({max(r for r in rows if triton.next_power_of_2(r) == triton.next_power_of_2(m))
                   for m in rows})  # fmt: skip


def pick_tiles(m: int, n: int, k: int, prologue: int = NO_PROLOGUE) -> GemvTiles:
    """Tiles for M rows against an [n, k] weight: the float32 partial products of a program
    (``block_m * block_n * block_k``) held to 4096, and enough programs to fill the SMs; at
    M = 1 with the SiLU-and-mul prologue, ``SILU_MUL_WARPS`` warps."""
    if m == 1:  # the best of a sweep on nearly every projection of three presets
        warps = SILU_MUL_WARPS if prologue == SILU_MUL else 4
        stages = LOOP_STAGES if k >= LOOP_MIN_K else 0
        return GemvTiles(4, M1_BLOCK_K, num_warps=warps, num_stages=4, loop_stages=stages)
    block_m = triton.next_power_of_2(max(m, 1))
    block_n = 8 if n <= 4096 else 16
    return GemvTiles(block_n=block_n, block_k=max(4096 // (block_m * block_n), 32))


def prefers_gemv(m: int, n: int) -> bool:
    """Whether the decode path takes the kernel for M rows of an [n, *] weight (host ints only,
    so one CUDA-graph key always takes the same path). Measured on the H200
    (``benchmarks/gemv.py``, tiles of ``pick_tiles``): at M = 1 it is 5-70 % faster than cuBLAS
    on the QKV, o and down projections of llama-1b, qwen3-0.6b and llama-3-8b (cuBLAS's GEMM
    tiles, some with a split-K reduction kernel, reach 0.3-3.6 TB/s there) and within 1-8 % of it
    on the gate/up weights, where its RMSNorm prologue saves a launch; at M >= 2 cuBLAS's
    tensor-core tiles win. So M up to ``GEMV_ROWS`` (1 unless a benchmark sets it)."""
    return 1 <= m <= min(GEMV_ROWS, GEMV_MAX_ROWS) and n <= GEMV_MAX_FEATURES


def gemv_ref(
    x: torch.Tensor,  # [M, K], or [M, 2K] gate/up with silu_mul
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    residual: torch.Tensor | None = None,  # [M, N]: returned as residual + x @ weight.T
    *,
    norm: tuple[torch.Tensor, float] | None = None,  # RMSNorm (weight [K], eps) of x first
    silu_mul: bool = False,  # x is gate/up: silu(gate) * up first
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` after the prologue, plus ``residual`` rounded once in float32
    where given."""
    if norm is not None:
        x = rmsnorm_ref(x, *norm)
    if silu_mul:
        x = silu_and_mul_ref(x)
    y = F.linear(x, weight, bias)
    if residual is None:
        return y
    return (residual.float() + y.float()).to(residual.dtype)


@triton.jit
def _x_tile(x_rows, norm_ptr, k, k_ok, row_ok, K, rstd, sum_sq, io_dtype,
            PROLOGUE: tl.constexpr, ONE_PASS: tl.constexpr):  # fmt: skip
    """The input's [BLOCK_M, BLOCK_K] slice at ``k`` after the prologue, in float32, and the
    row's squares so far (the one-pass norm adds this slice's)."""
    x_mask = row_ok[:, None] & k_ok[None, :]
    x = tl.load(x_rows + k[None, :], mask=x_mask, other=0.0)
    if PROLOGUE == 1 and ONE_PASS:  # g * x in float32; the squares of the same slice
        g = tl.load(norm_ptr + k, mask=k_ok, other=0.0)
        xf = x.to(tl.float32)
        sum_sq += tl.sum(xf * xf, axis=1)
        x = g.to(tl.float32)[None, :] * xf
    if PROLOGUE == 1 and not ONE_PASS:  # rmsnorm_ref's roundings: normalised, then * g
        g = tl.load(norm_ptr + k, mask=k_ok, other=0.0)
        x = (x.to(tl.float32) * rstd[:, None]).to(io_dtype)
        x = (g.to(tl.float32)[None, :] * x.to(tl.float32)).to(io_dtype)
    if PROLOGUE == 2:  # silu_and_mul_ref's roundings: silu(gate), then the product
        up = tl.load(x_rows + K + k[None, :], mask=x_mask, other=0.0)
        x = silu_mul(x.to(tl.float32), up.to(tl.float32), io_dtype)
    return x.to(tl.float32), sum_sq


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    b_ptr,  # [N] or a dummy
    norm_ptr,  # [K] RMSNorm weight (RMSNORM) or a dummy
    out_ptr,  # [M, N]: written; or read and written (RESIDUAL)
    N,
    K,
    x_stride,
    w_stride,
    out_stride,
    eps,
    M,
    BLOCK_M: tl.constexpr,  # M rounded up to a power of two
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,  # out += x @ w.T
    PROLOGUE: tl.constexpr,  # NO_PROLOGUE | RMSNORM | SILU_MUL
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ONE_PASS: tl.constexpr = False,  # RMSNORM: the squares summed in the weight walk
    USE_GDC: tl.constexpr = False,  # launched with PDL: wait for the previous grid before x
    LOOP_STAGES: tl.constexpr = 0,  # > 1: the walk of K software-pipelined (``GemvTiles``)
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    col_ok = cols < N
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * w_stride  # [BLOCK_N, 1]
    x_rows = x_ptr + rows[:, None] * x_stride  # [BLOCK_M, 1]
    ks = tl.arange(0, BLOCK_K)
    io_dtype = x_ptr.dtype.element_ty
    sum_sq = tl.zeros([BLOCK_M], tl.float32)
    if USE_GDC and PROLOGUE == 1 and not ONE_PASS:  # the first pass reads x: wait before it
        tl.extra.cuda.gdc_wait()
    rstd = sum_sq
    if PROLOGUE == 1 and not ONE_PASS:  # RMSNORM: each row's rsqrt(mean(x^2) + eps) first
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            mask = row_ok[:, None] & (k < K)[None, :]
            xs = tl.load(x_rows + k[None, :], mask=mask, other=0.0).to(tl.float32)
            sum_sq += tl.sum(xs * xs, axis=1)
        rstd = tl.rsqrt(sum_sq / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    k_first = 0
    if LOOP_STAGES > 1:  # the first step peeled off the pipelined loop, whose prologue would
        k_ok = ks < K  # load x ahead of a wait inside it: its weight tile before the wait
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
        x, sum_sq = _x_tile(x_rows, norm_ptr, ks, k_ok, row_ok, K, rstd, sum_sq, io_dtype,
                            PROLOGUE, ONE_PASS)  # fmt: skip
        acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
        k_first = BLOCK_K
    for k0 in tl.range(k_first, K, BLOCK_K, num_stages=LOOP_STAGES if LOOP_STAGES > 1 else None):
        k = k0 + ks
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if USE_GDC and LOOP_STAGES <= 1:  # the weights are the model's: loaded before waiting;
            tl.extra.cuda.gdc_wait()  # x after (a no-op once the previous grid is done)
        x, sum_sq = _x_tile(x_rows, norm_ptr, k, k_ok, row_ok, K, rstd, sum_sq, io_dtype,
                            PROLOGUE, ONE_PASS)  # fmt: skip
        acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
    y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
    if USE_GDC:  # the walk is done: the next PDL launch may start (it waits for our writes)
        tl.extra.cuda.gdc_wait()  # pdl.py's third rule: the waits above are in a loop
        tl.extra.cuda.gdc_launch_dependents()
    if PROLOGUE == 1 and ONE_PASS:  # rstd * W (g * x): the row's scale, once, at the end
        y *= tl.rsqrt(sum_sq / K + eps)[:, None]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        y += tl.load(out, mask=ok, other=0.0).to(tl.float32)
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=ok)


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    norm: tuple[torch.Tensor, float] | None = None,
    silu_mul: bool = False,
    tiles: GemvTiles | None = None,
    one_pass: bool = False,
) -> torch.Tensor:
    """``gemv_ref`` in one launch. With ``residual`` the sum is written into it (in place) and it
    is returned; otherwise a new [M, N] tensor of ``x``'s dtype. ``one_pass``: the norm's squares
    summed in the weight walk (the module docstring)."""
    if norm is not None and silu_mul:
        raise ValueError("gemv: one prologue at a time (norm or silu_mul)")
    k_in = weight.shape[1] * (2 if silu_mul else 1)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != k_in:
        raise ValueError(f"gemv: x {tuple(x.shape)} does not fit weight {tuple(weight.shape)}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("gemv: x and weight need a contiguous last dimension")
    m, n = x.shape[0], weight.shape[0]
    if m > GEMV_MAX_ROWS:
        raise ValueError(f"gemv: {m} rows > GEMV_MAX_ROWS {GEMV_MAX_ROWS}; use F.linear")
    if residual is not None and (residual.shape != (m, n) or residual.stride(-1) != 1):
        raise ValueError(f"gemv: residual {tuple(residual.shape)} is not [{m}, {n}]")
    out = residual if residual is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    prologue = RMSNORM if norm is not None else SILU_MUL if silu_mul else NO_PROLOGUE
    t = tiles or pick_tiles(m, n, weight.shape[1], prologue)
    _gemv_kernel[(triton.cdiv(n, t.block_n),)](
        x,
        weight,
        bias if bias is not None else weight,
        norm[0] if norm is not None else weight,
        out,
        n,
        weight.shape[1],
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        float(norm[1]) if norm is not None else 0.0,
        m,
        BLOCK_M=triton.next_power_of_2(m),
        HAS_BIAS=bias is not None,
        RESIDUAL=residual is not None,
        PROLOGUE=prologue,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        ONE_PASS=one_pass and norm is not None,
        LOOP_STAGES=t.loop_stages,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
        **launch_options(use_pdl(x.device)),
    )
    return out
