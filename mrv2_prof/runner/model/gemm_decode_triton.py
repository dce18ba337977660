"""Decode GEMM: ``x @ weight.T`` for 2 to 256 rows, a weight-streaming split-K Triton kernel beside
its torch reference.

At decode a projection's weight [N, K] is far larger than its input [M, K] and output [M, N]
(M is the batch, at most a few hundred), so the GEMM is a stream of the weights through HBM.
With N = 2048 and 64-wide tiles there are only 32 tiles of N for the 132 SMs of an H200, so the
reduction dimension is split too: a program owns a ``[BLOCK_M, BLOCK_N]`` tile of the output and
one of ``split_k`` ranges of K, walks it in ``BLOCK_K`` steps with ``tl.dot`` (tensor cores,
float32 accumulation; float32 inputs are multiplied in IEEE precision, never TF32) on a
``[BLOCK_K, BLOCK_N]`` tile of the weight (row-major as ``nn.Linear`` keeps it: each weight row
is one contiguous read) and the ``[BLOCK_M, BLOCK_K]`` slice of the input.

With ``split_k == 1`` the program finishes the tile itself: optional bias, optional
``residual += x @ weight.T`` in place (the down projection adding into the residual stream, as
``addmm_`` does), rounded once to the output dtype. With ``split_k > 1`` each program writes its
float32 partial sums into a workspace ``[split_k, M, N]`` and a second small kernel adds the
splits in a fixed order (deterministic, no atomics), then the bias and the residual, and rounds
once. With ``LAST_SPLIT_REDUCES`` there is no second kernel: each split counts itself done on
its output tile's counter (``COUNTERS``, a ``KernelWorkspace``), and the tile's last split adds
the tile's partials in split order (the same sums on every run), finishes the tile and resets
the counter. Triton's interpreter (CPU tensors) multiplies bfloat16 ``tl.dot`` operands as their
raw bits (triton 3.9, triton-lang/triton#11584), so there the operands are widened to float32 first
(exact: the products are those of the tensor cores, accumulated in float32 as there).

With ``silu_mul`` the input is a gate/up ``[M, 2K]``: each step makes its slice of
``silu(gate) * up`` as it reads it, rounded where ``silu_and_mul_triton`` rounds, so the down
projection needs no launch before it and gives the same bits.

Programmatic dependent launch (``pdl.py``): both kernels keep its rules. The GEMM program reads
its first step's weight tile (the model's), then waits (``gdc_wait``), then reads that step's
``x`` and walks the rest of its K range: the first step is peeled off the loop, as the GEMV's
pipelined walk is, so that the weight read overlaps the kernel before. The wait is never inside
the loop: Triton's software pipeliner issues a ``tl.dot`` loop's loads for the first stages
ahead of the loop body, so a wait inside the loop let ``x`` be read before the kernel that
writes it had finished (on an H100 under FULL graphs, 18 of 20 requests' greedy tokens changed;
eagerly, with launch gaps, none). Once its walk of ``K`` is done it lets the next launch start
(``gdc_launch_dependents``) before it writes. The reduce kernel waits before it reads the
workspace or the residual.

``gemm_decode_ref`` is the torch arithmetic it replaces (``F.linear``, then the residual add
rounded once in float32), the oracle of the tests. Tiles are chosen from host ints only
(``pick_gemm_tiles``), so the launch of a CUDA-graph key never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mrv2_prof.runner.model.activation_triton import silu_and_mul_ref, silu_mul
from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace
from mrv2_prof.runner.model.optional_triton import tl, triton
from mrv2_prof.runner.model.pdl import launch_options, use_pdl

GEMM_DECODE_MAX_ROWS = 256  # the decode batches the kernel serves
TARGET_SMS = 132  # the H100's / H200's SMs: what a split aims to fill
MAX_SPLIT_K = 16
MIN_STEPS_PER_SPLIT = 2  # BLOCK_K steps each split walks at least
REDUCE_BLOCK = 1024  # output elements per program of the split reduction
# A split GEMM in one launch: each output tile's last split to finish (a counter per tile) sums
# the tile's partials in split order and writes it, instead of the reduction kernel after the
# GEMM. Off: on an H100 (qwen3-0.6b, batch 2-64) the down projection's last split summing its
# tile alone took longer than the separate reduction kernel (benchmarks/RESULTS.md).
LAST_SPLIT_REDUCES = False


@dataclass(frozen=True)
class DecodeGemmTiles:
    block_m: int  # rows per program (a power of two >= 16: tl.dot's smallest tile)
    block_n: int  # output features per program
    block_k: int  # reduction elements per loop step
    split_k: int = 1  # ranges of K, each its own program; > 1: a reduction kernel after
    num_warps: int = 4
    num_stages: int = 3


def _make_counters(device: torch.device, tiles: int) -> tuple[torch.Tensor]:
    return (torch.zeros(tiles, dtype=torch.int32, device=device),)


COUNTERS = KernelWorkspace(
    "the decode GEMM's tile counters", "run a decode step eagerly", _make_counters
)


def effective_split(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(splits launched, K elements per split): each split a whole number of ``block_k`` steps,
    and no split left empty (``split_k`` is lowered where K is short)."""
    per_split = triton.cdiv(triton.cdiv(k, max(split_k, 1)), block_k) * block_k
    return triton.cdiv(k, per_split), per_split


def pick_gemm_tiles(
    m: int, n: int, k: int, elem_bytes: int = 2, silu_mul: bool = False
) -> DecodeGemmTiles:
    """Tiles for M rows against an [n, k] weight, from host ints only. ``block_m`` covers the
    batch: 16 rows up to 16, 64 at 17-64 (for sm_90 Triton compiles a 16- or 32-row tile's dot
    to ``mma.sync`` and a 64-row one to ``wgmma``; on an H100 the 32-row tile took qwen3-0.6b's
    o 45 % longer than the 64-row one at twice the rows, and the 64-row tile at 24 and 32 rows
    beat cuBLAS where the 32-row one had lost: RESULTS.md, twenty-third and twenty-fourth
    rounds), 128 above. Up to 64
    rows: 32 output features a program, 128-element steps of K, 4 stages, and where the tiles
    are fewer than the SMs, K split so that the programs number at least one per SM (each split
    walking at least ``MIN_STEPS_PER_SPLIT`` steps; at 17-64 rows, where a program's 120 KiB of
    shared memory leaves an SM one, at most one per SM, so the programs run in one wave): the
    winners of ``benchmarks/decode_gemm.py``'s sweep at qwen3-0.6b's shapes and 16 / 64 rows on
    an H100 (RESULTS.md, twenty-second round). Above 64 rows, untuned: 64 features, 64-element
    steps, about two programs per SM, 3 stages. The stages are then bounded by shared memory
    (``bounded_stages``: float32 with the SiLU-and-mul prologue at 64 rows takes 2)."""
    block_m = 16 if m <= 16 else 64 if m <= 64 else 128
    narrow = block_m <= 64
    block_n = 32 if narrow else 64
    block_k = 128 if narrow else 64
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split_k = 1
    if tiles < TARGET_SMS:
        most = max(1, triton.cdiv(k, block_k) // MIN_STEPS_PER_SPLIT)
        want = triton.cdiv(TARGET_SMS if narrow else 2 * TARGET_SMS, tiles)
        if block_m == 64:  # 120 KiB of shared memory: one program an SM, so at most one wave
            want = max(1, TARGET_SMS // tiles)
        split_k = max(1, min(want, most, MAX_SPLIT_K))
        split_k = effective_split(k, block_k, split_k)[0]
    stages = bounded_stages(4 if narrow else 3, block_m, block_n, block_k, elem_bytes, silu_mul)
    return DecodeGemmTiles(block_m, block_n, block_k, split_k, num_warps=4, num_stages=stages)


SHARED_BOUND = 211 * 1024  # an H100's / H200's 227 KiB a block, less a 16 KiB margin


def bounded_stages(
    stages: int, block_m: int, block_n: int, block_k: int, elem_bytes: int, silu_mul: bool
) -> int:
    """The most stages, up to ``stages`` (at least 2), whose input tiles fit ``SHARED_BOUND``:
    ``stages`` x (the row tile, twice with the SiLU-and-mul prologue (gate and up), + the
    weight tile) x ``elem_bytes``. An upper bound of what Triton 3.6 allocates for sm_90
    (compiled on the CPU: bf16 at 64 rows, 4 stages 120 KiB, 136 with the prologue; float32
    with it 272 KiB at 4 stages, 192 with a spill at 3, 112 at 2: RESULTS.md, twenty-fifth
    round), so bf16 keeps its stages and float32 with the prologue at 64 rows takes 2."""
    per_stage = (block_m * block_k * (2 if silu_mul else 1) + block_n * block_k) * elem_bytes
    while stages > 2 and stages * per_stage > SHARED_BOUND:
        stages -= 1
    return stages


# rows with one launch variant (one block_m, and so one split and stage count, of
# pick_gemm_tiles): a warm-up that runs one count of each compiles every variant a step can hit
ROW_CLASSES = ((2, 16), (17, 64), (65, 128), (129, 256))


def gemm_decode_ref(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    residual: torch.Tensor | None = None,  # [M, N]: returned as residual + x @ weight.T
    silu_mul: bool = False,  # x is gate/up [M, 2K]: silu_and_mul_ref(x) is the input
) -> torch.Tensor:
    """``x @ weight.T (+ bias)``, plus ``residual`` rounded once in float32 where given."""
    if silu_mul:
        x = silu_and_mul_ref(x)
    y = F.linear(x, weight, bias)
    if residual is None:
        return y
    return (residual.float() + y.float()).to(residual.dtype)


# The batch's rows change from step to step: not specialised on (a new value must never
# trigger a compile in the middle of a run; only BLOCK_M and the split, constexprs, do).
@triton.jit(do_not_specialize=["M"])
def _gemm_decode_kernel(
    x_ptr,  # [M, K]; or [M, 2K] gate/up (SILU_MUL)
    w_ptr,  # [N, K]
    b_ptr,  # [N] or a dummy
    out_ptr,  # [M, N]: written; or read and written (RESIDUAL); unused with SPLIT
    ws_ptr,  # [split_k, M, N] float32 partial sums (SPLIT) or a dummy
    counter_ptr,  # [>= output tiles] int32, zero between launches (LAST_REDUCES) or a dummy
    M,
    N,
    K,
    x_stride,
    w_stride,
    out_stride,
    k_per_split,  # a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,  # write float32 partials to the workspace, no epilogue
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,  # out += x @ w.T
    DOT_F32: tl.constexpr = False,  # the interpreter: bfloat16 operands widened (exact) first
    USE_GDC: tl.constexpr = False,  # launched with PDL: wait for the previous grid before x
    LAST_REDUCES: tl.constexpr = False,  # SPLIT: a tile's last split sums the tile (one launch)
    SILU_MUL: tl.constexpr = False,  # x is gate/up: silu(gate) * up, rounded as silu_and_mul's
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_ok, row_ok = cols < N, rows < M
    ks = tl.arange(0, BLOCK_K)
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * w_stride  # [1, BLOCK_N]: a weight row each
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * x_stride  # [BLOCK_M, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # The first step peeled off the loop: its weight tile (the model's) read before the wait,
    # x after it. The wait is before the loop, never in it: the pipeliner would hoist x's loads
    # above it.
    k = k_start + ks
    k_ok = k < k_end
    w = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    x = _load_x(x_rows, k, row_ok[:, None] & k_ok[None, :], K, SILU_MUL)
    if DOT_F32:
        x, w = x.to(tl.float32), w.to(tl.float32)
    acc = tl.dot(x, w, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), input_precision="ieee")
    for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
        k = k0 + ks
        k_ok = k < k_end
        w = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        x = _load_x(x_rows, k, row_ok[:, None] & k_ok[None, :], K, SILU_MUL)
        if DOT_F32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision="ieee")  # ignored for 16-bit inputs
    if USE_GDC:  # the walk is done: the next PDL launch may start (it waits for our writes)
        tl.extra.cuda.gdc_launch_dependents()
    ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT:
        part = (rows.to(tl.int64))[:, None] * N + cols[None, :]  # this tile in a split's [M, N]
        tl.store(ws_ptr + pid_k * M * N + part, acc, mask=ok)
        if LAST_REDUCES:  # count this split done on its tile; the tile's last split sums it
            tl.debug_barrier()  # every thread's partial stores before the release below
            tile = pid_m * tl.num_programs(0) + pid_n
            done = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if done == tl.num_programs(2) - 1:  # every split's partial is visible
                y = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in range(tl.num_programs(2)):  # a fixed order: the same sums every run
                    y += tl.load(
                        ws_ptr + s * M * N + part, mask=ok, other=0.0, cache_modifier=".cg"
                    )
                _epilogue(y, b_ptr, out_ptr, rows, cols, col_ok, ok, out_stride, HAS_BIAS, RESIDUAL)
                tl.store(counter_ptr + tile, 0)  # ready for the next launch
    else:
        _epilogue(acc, b_ptr, out_ptr, rows, cols, col_ok, ok, out_stride, HAS_BIAS, RESIDUAL)


@triton.jit
def _load_x(x_rows, k, mask, K, SILU_MUL: tl.constexpr):
    """A step's ``[BLOCK_M, BLOCK_K]`` slice of x; with ``SILU_MUL`` of ``silu(gate) * up`` from
    a gate/up row (``activation_triton.silu_mul``: the SiLU-and-mul kernel's bits)."""
    x = tl.load(x_rows + k[None, :], mask=mask, other=0.0)
    if SILU_MUL:
        up = tl.load(x_rows + K + k[None, :], mask=mask, other=0.0)
        x = silu_mul(x.to(tl.float32), up.to(tl.float32), x.dtype)
    return x


@triton.jit
def _epilogue(acc, b_ptr, out_ptr, rows, cols, col_ok, ok, out_stride,
              HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr):  # fmt: skip
    """A tile's float32 sums plus the bias, plus the residual read, rounded once and stored."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    if RESIDUAL:
        acc += tl.load(out, mask=ok, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M"])
def _gemm_decode_splitk_reduce_kernel(
    ws_ptr,  # [SPLIT_K, M, N] float32 partial sums
    b_ptr,  # [N] or a dummy
    out_ptr,  # [M, N]: written; or read and written (RESIDUAL)
    M,
    N,
    out_stride,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_GDC: tl.constexpr = False,
):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # flat [M, N] index
    ok = idx < M * N
    row, col = idx // N, idx % N
    bias = tl.zeros([BLOCK], tl.float32)
    if HAS_BIAS:  # a model weight: read before waiting
        bias = tl.load(b_ptr + col, mask=ok, other=0.0).to(tl.float32)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    y = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):  # a fixed order: the same sums on every run
        y += tl.load(ws_ptr + s * M * N + idx, mask=ok, other=0.0)
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    y += bias
    out = out_ptr + row * out_stride + col
    if RESIDUAL:
        y += tl.load(out, mask=ok, other=0.0).to(tl.float32)
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=ok)


def _check(x, weight, bias, residual, silu_mul: bool = False) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] * (1 + silu_mul):
        shapes = f"x {tuple(x.shape)} does not fit weight {tuple(weight.shape)}"
        raise ValueError(f"gemm_decode: {shapes}")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("gemm_decode: x and weight need a contiguous last dimension")
    if x.dtype != weight.dtype:
        raise ValueError(f"gemm_decode: x is {x.dtype} but weight is {weight.dtype}")
    m, n = x.shape[0], weight.shape[0]
    if not 1 <= m <= GEMM_DECODE_MAX_ROWS:
        raise ValueError(f"gemm_decode: {m} rows, not in 1..{GEMM_DECODE_MAX_ROWS}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"gemm_decode: bias {tuple(bias.shape)} is not [{n}]")
    if residual is not None and (tuple(residual.shape) != (m, n) or residual.stride(-1) != 1):
        raise ValueError(f"gemm_decode: residual {tuple(residual.shape)} is not [{m}, {n}]")


def _check_tiles(t: DecodeGemmTiles) -> None:
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(t, name)
        if v < 16 or v & (v - 1):
            raise ValueError(f"gemm_decode: tiles {name}={v} is not a power of two >= 16")
    if t.split_k < 1:
        raise ValueError(f"gemm_decode: tiles split_k={t.split_k} < 1")


def gemm_decode_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    *,
    tiles: DecodeGemmTiles | None = None,
    silu_mul: bool = False,
) -> torch.Tensor:
    """``gemm_decode_ref`` in one launch (two with ``split_k > 1``, unless ``LAST_SPLIT_REDUCES``).
    With ``residual`` the sum is written into it (in place) and it is returned; otherwise a new
    [M, N] tensor of ``x``'s dtype. With ``silu_mul`` x is a gate/up [M, 2K] and the GEMM's
    input ``silu(gate) * up``, made as each step reads it (no ``silu_and_mul`` launch)."""
    _check(x, weight, bias, residual, silu_mul)
    m, n = x.shape[0], weight.shape[0]
    t, splits, per_split = _tiles(x, weight, tiles, silu_mul)
    out = residual if residual is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    ws = out
    if splits > 1:
        ws = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    last = splits > 1 and LAST_SPLIT_REDUCES
    output_tiles = triton.cdiv(n, t.block_n) * triton.cdiv(m, t.block_m)
    counters = COUNTERS.get(x.device, output_tiles)[0] if last else ws
    pdl = launch_options(use_pdl(x.device))
    _launch(x, weight, bias, out, ws, counters, t, per_split, splits > 1, residual is not None,
            last, silu_mul)  # fmt: skip
    if splits > 1 and not last:
        _gemm_decode_splitk_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            ws,
            bias if bias is not None else ws,
            out,
            m,
            n,
            out.stride(0),
            SPLIT_K=splits,
            HAS_BIAS=bias is not None,
            RESIDUAL=residual is not None,
            BLOCK=REDUCE_BLOCK,
            num_warps=4,
            **pdl,
        )
    return out


def gemm_decode_partials(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    tiles: DecodeGemmTiles | None = None,
    silu_mul: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` as float32 partial sums ``[splits, M, N]``, one a split of K (one, where
    K is not split), in one launch, for a kernel after it to sum in split order (as the split
    reduction does: ``gemm_add_norm_triton``); ``silu_mul`` as ``gemm_decode_triton``'s."""
    _check(x, weight, None, None, silu_mul)
    t, splits, per_split = _tiles(x, weight, tiles, silu_mul)
    ws = torch.empty((splits, x.shape[0], weight.shape[0]), dtype=torch.float32, device=x.device)
    _launch(x, weight, None, ws, ws, ws, t, per_split, True, False, False, silu_mul)
    return ws


def _tiles(
    x, weight, tiles: DecodeGemmTiles | None, silu_mul: bool
) -> tuple[DecodeGemmTiles, int, int]:
    """(the tiles, checked, the splits launched, K elements a split) of a checked launch."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    t = tiles or pick_gemm_tiles(m, n, k, x.element_size(), silu_mul)
    _check_tiles(t)
    return t, *effective_split(k, t.block_k, t.split_k)


def _launch(x, weight, bias, out, ws, counters, t, per_split, split, residual, last, silu_mul):
    """The GEMM kernel over every output tile and split of K."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    grid = (triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m), triton.cdiv(k, per_split))
    _gemm_decode_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,
        out,
        ws,
        counters,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        per_split,
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        RESIDUAL=residual,
        DOT_F32=x.device.type == "cpu" and x.dtype == torch.bfloat16,
        LAST_REDUCES=last,
        SILU_MUL=silu_mul,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
        **launch_options(use_pdl(x.device)),
    )
