"""Paged attention and KV-cache write as Triton kernels (MRV2's attention backend on the GPU).

``write_kv_triton`` and ``paged_attention_triton`` have the contracts of ``write_kv_ref`` and
``paged_attention_ref`` in ``mrv2_prof/runner/model/attention.py`` (the torch references, the CPU
path and the oracles in tests), for mixed batches of prefill chunks and decodes over the paged
cache.

Both are CUDA-graph safe: they read only the device tensors of ``AttentionMetadata``
(``query_start_loc``, ``seq_lens``, ``block_table``, ``slot_mapping``) and host ints (the
number of tokens and requests, the block size), never its ``*_np`` mirrors; nothing syncs with
the host and no shape depends on device data. Padding is free: a slot < 0 is not written, a
request with no query tokens launches programs that exit at once, and output rows of tokens past
``query_start_loc[num_reqs]`` are left unwritten (as in the reference).

Attention reads every key and value from the cache, the chunk's own included: the model calls
``write_kv`` for a layer before ``attend``, so the chunk is already stored at its slots. The
``key``/``value`` arguments are therefore unused (they stay in the signature so the reference and
the kernel are interchangeable); with a cache dtype narrower than the activations' the chunk's
own keys are seen rounded to it, where the reference uses them fresh. With ``kv_cache=None`` (a
dummy or profiling run without a cache) the call falls back to ``paged_attention_ref``, which
handles that case eagerly.

Kernel design. A program owns one kv head and a block of ``BLOCK_Q`` query tokens of one request,
and processes the ``G = num_heads / num_kv_heads`` query heads that share the kv head together:
its ``BLOCK_M = BLOCK_Q * G`` rows (row r = token r // G, head r % G; spare rows when G is not a
power of two are masked) go through ``tl.dot`` against ``BLOCK_N`` keys at a time, so each key
tile is loaded once for the whole group. The loop walks the request's context through its
block-table row (keys gathered per slot, so ``BLOCK_N`` is independent of the block size) with an
online softmax in float32 (``exp2``, scale folded in), up to the last key the block's last query
may see; a causal mask ``key_pos <= query_pos`` covers both the context and the chunk.

Mapping programs to requests without host knowledge of per-request lengths: request i owns the
program indices ``[query_start_loc[i] // BLOCK_Q + i, query_start_loc[i+1] // BLOCK_Q + i + 1)``,
which covers ``cdiv(q_len_i, BLOCK_Q)`` blocks, so ``num_tokens // BLOCK_Q + num_reqs`` programs
(host ints) per kv head cover every batch. A program finds its request by a binary search of
``query_start_loc`` and exits early when it is past its request's last token.

Decode batches (no more tokens than requests, a host-int test) go to a kernel of their own,
``attention_decode_triton.py``: one program per request and kv head, no search. Here, tile sizes
are chosen from host ints only: decode-heavy batches (on average <= 4 query tokens a
request) take 16 rows, so a decode wastes few rows; prefill-heavy batches take 64 rows (one
Hopper warp-group MMA) for better tensor-core use; float32 takes small tiles. Splitting one
request's context over several programs (split-KV / flash-decoding, so that a few long decodes
fill the GPU) is built in ``attention_split_kv_triton.py``: a decode batch goes there when its
``split_count`` (host ints: requests, kv heads, SMs and the block table's width) is above 1,
which is off by default until it is measured on the GPU. Not done: skipping the causal mask on
tiles wholly below the diagonal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model import attention_split_kv_triton as split_kv
from mrv2_prof.runner.model.attention import AttentionMetadata, paged_attention_ref
from mrv2_prof.runner.model.attention_decode_triton import (
    LOG2_E,
    attend_keys,
    is_decode_batch,
    paged_decode_triton,
)
from mrv2_prof.runner.model.attention_split_kv_triton import (
    decode_split_count,
    paged_decode_split_kv,
)


@dataclass(frozen=True)
class AttentionTiles:
    """Launch shape of the attention kernel: rows per program, keys per step, warps, stages."""

    block_m: int  # query rows of a program: BLOCK_Q tokens x G heads (rounded up to >= G)
    block_n: int  # keys per inner-loop step
    num_warps: int = 4
    num_stages: int = 3


DECODE_TILES = AttentionTiles(block_m=16, block_n=64)
PREFILL_TILES = AttentionTiles(block_m=64, block_n=64)
# float32 runs its dots on CUDA cores (ieee precision): larger tiles spill registers.
FLOAT32_TILES = AttentionTiles(block_m=16, block_n=16, num_stages=2)


# Keys per loop step of the decode kernels (one program per request and kv head, unsplit, split
# and with the RoPE fold) in 16 bits, where a batch's requests x kv heads fit one program per SM:
# 128 took 15-21 % off the kernel at context 160 and 29-41 % at 1,000 against 64 on an H100
# (batch 1 and 8, llama-1b's and qwen3-0.6b's heads; 4 warps and 3 stages stayed best; 256 not
# tried: benchmarks/decode_attention_tiles.py, RESULTS.md). A wider grid keeps the 64 keys its
# batches were measured with (batch 64-256, H200): a 128-key tile's pipelined K and V take twice
# the shared memory (3 x 64 KiB at head_dim 128, one program an SM), and with many programs an SM
# what it runs at once counts; 128 there is not yet measured.
DECODE_KEYS = 128
WIDE_DECODE_KEYS = 64
# Warps and pipeline stages of the folded decode kernels on a wide grid. 2 warps (against
# Triton's 4) took 1-3 % off llama-1b's step at batch 64 / 256 and 2-4 % off llama-3-8b's on an
# H100, the kernel alone 8-10 % (RESULTS.md, twelfth round); 1 or 2 stages won at batch 256 only.
# benchmarks/decode_roofline.py's ``wwN`` / ``wsN`` set them.
WIDE_DECODE_WARPS = 2
WIDE_DECODE_STAGES = 3
# A cap on the wide grid's registers a thread (``maxnreg``), None: ptxas's own choice. Triton 3.6
# compiles llama-1b's wide kernel at 164 (6 programs an SM, registers bound) and at 128 with 24
# bytes spilled (8; benchmarks/kernel_resources.py --maxnreg). 8 programs an SM did not shorten
# it at batch 64 / 256 and 96 registers cost 9-12 % (H100, decode_roofline.py's ``wrN``,
# twenty-first round): off.
WIDE_DECODE_MAXNREG: int | None = None
# The most shared memory one block may take on sm_90 (H100 / H200), and what a folded decode
# kernel takes beside its K and V buffers (the block-table entries, the reductions: 7-13 KiB).
MAX_BLOCK_SHARED = 227 * 1024
SHARED_MARGIN = 16 * 1024
# Pipeline stages of the folded decode kernel on a narrow grid (Triton's 4 warps). Triton's
# pipeliner loads the walk's block-table entries a stage ahead of their K and V rows; at 3 (and
# 4) stages a tile's K and V are issued only after the tile before was reduced, at 5 the first
# two tiles' entries are read together and two tiles' K and V are in flight at once (71 KiB of
# shared memory at head_dim 64, 137 KiB at 128, against 38.5 / 72.5; sm_90 code, read by
# benchmarks/walk_schedule.py). benchmarks/decode_roofline.py's ``dsN`` sets it: at 5, 1-6 % off
# llama-1b's and SmolLM2's batch-1 attention and nothing off qwen3-0.6b's, the steps inside the
# spread of two invocations (H100, twenty-first round), so 3 stays.
DECODE_STAGES = 3


def wide_grid(num_reqs: int, num_kv_heads: int, device: torch.device | None) -> bool:
    """Whether the unsplit decode grid (``num_reqs`` x ``num_kv_heads`` programs) has more
    programs than ``device`` has SMs (None: one SM). Host ints only."""
    sms = 1 if device is None else split_kv.num_sms(device)
    return num_reqs * num_kv_heads > sms


def decode_keys(
    dtype: torch.dtype, num_reqs: int = 1, num_kv_heads: int = 1, device: torch.device | None = None
) -> int:
    """Keys per loop step of the decode kernels: CUDA-core dots in float32 take small key tiles
    (``FLOAT32_TILES``); tensor cores ``WIDE_DECODE_KEYS`` on a ``wide_grid``, else
    ``DECODE_KEYS``. Host ints only: one CUDA-graph key always takes one tile."""
    if dtype == torch.float32:
        return FLOAT32_TILES.block_n
    return WIDE_DECODE_KEYS if wide_grid(num_reqs, num_kv_heads, device) else DECODE_KEYS


def narrow_stages(head_dim: int) -> int:
    """``DECODE_STAGES``, or 4 where the two tiles' K and V that 5 or more stages keep in flight
    would not fit ``MAX_BLOCK_SHARED`` with ``SHARED_MARGIN`` (head_dim 256 in bf16: 269 KiB);
    4 stages keep one tile, as 3 do (``benchmarks/kernel_resources.py`` reads both). Sized for
    2-byte caches and ``DECODE_KEYS``: float32's 16-key tiles are smaller still."""
    two_tiles = 2 * 2 * DECODE_KEYS * head_dim * 2  # K and V, 2 bytes an element
    if DECODE_STAGES >= 5 and two_tiles + SHARED_MARGIN > MAX_BLOCK_SHARED:
        return 4
    return DECODE_STAGES


def decode_launch(
    num_reqs: int, num_kv_heads: int, device: torch.device | None, head_dim: int
) -> dict:
    """``num_warps`` / ``num_stages`` of the folded decode kernels: ``WIDE_DECODE_WARPS`` /
    ``WIDE_DECODE_STAGES`` (and ``WIDE_DECODE_MAXNREG`` where set) on a ``wide_grid``, else
    Triton's 4 warps (the narrow grid's best, third round) and ``narrow_stages``. Host ints
    only."""
    if not wide_grid(num_reqs, num_kv_heads, device):
        return {"num_stages": narrow_stages(head_dim)}
    launch = {"num_warps": WIDE_DECODE_WARPS, "num_stages": WIDE_DECODE_STAGES}
    return launch if WIDE_DECODE_MAXNREG is None else {**launch, "maxnreg": WIDE_DECODE_MAXNREG}


def smallest_wide_batch(num_kv_heads: int, device: torch.device) -> int:
    """The smallest decode batch whose grid takes ``WIDE_DECODE_KEYS`` (more programs than SMs):
    a warm-up runs it beside the small ones, so both key tiles are compiled."""
    return split_kv.num_sms(device) // num_kv_heads + 1


def pick_tiles(num_tokens: int, num_reqs: int, dtype: torch.dtype) -> AttentionTiles:
    """Tiles for a batch from host ints only (the same for every batch of a CUDA-graph key)."""
    if dtype == torch.float32:
        return FLOAT32_TILES
    return DECODE_TILES if num_tokens <= 4 * num_reqs else PREFILL_TILES


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [T, kvh, d]
    value_ptr,  # [T, kvh, d]
    k_cache_ptr,  # [num_blocks, block_size, kvh, d]
    v_cache_ptr,  # same shape and strides as k_cache
    slot_mapping_ptr,  # [T], < 0 = skip
    key_stride_t,
    key_stride_h,
    value_stride_t,
    value_stride_h,
    cache_stride_block,
    cache_stride_slot,
    cache_stride_head,
    block_size,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < num_kv_heads)[:, None]
    cache_off = (
        (slot // block_size) * cache_stride_block
        + (slot % block_size) * cache_stride_slot
        + heads[:, None] * cache_stride_head
        + dims[None, :]
    )
    k = tl.load(key_ptr + t * key_stride_t + heads[:, None] * key_stride_h + dims[None, :], mask)
    v = tl.load(
        value_ptr + t * value_stride_t + heads[:, None] * value_stride_h + dims[None, :], mask
    )
    tl.store(k_cache_ptr + cache_off, k.to(k_cache_ptr.dtype.element_ty), mask)
    tl.store(v_cache_ptr + cache_off, v.to(v_cache_ptr.dtype.element_ty), mask)


def write_kv_triton(
    key: torch.Tensor,  # [T, kvh, d]
    value: torch.Tensor,  # [T, kvh, d]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kvh, d]
    slot_mapping: torch.Tensor,  # [T] int64, < 0 = padding, not written
) -> None:
    """Store each token's key/value at its slot (block * block_size + offset); skip slots < 0."""
    num_tokens, num_kv_heads, head_dim = key.shape
    check_head_dim(head_dim)
    if value.shape != key.shape or kv_cache.shape[3:] != key.shape[1:]:
        raise ValueError(
            f"write_kv: key {tuple(key.shape)}, value {tuple(value.shape)} and kv_cache "
            f"{tuple(kv_cache.shape)} disagree on [kvh, d]"
        )
    if key.stride(-1) != 1 or value.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("write_kv: key, value and kv_cache need a contiguous last dimension")
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        kv_cache[0],
        kv_cache[1],
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        kv_cache.shape[2],
        num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
    )


@triton.jit
def _find_request(query_start_loc_ptr, num_reqs, block_idx, BLOCK_Q: tl.constexpr):
    """The last request i with query_start_loc[i] // BLOCK_Q + i <= block_idx (binary search)."""
    lo: tl.int32 = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# Values that change from step to step are not specialised on: a new value must
# never trigger a compile in the middle of a run.
@triton.jit(do_not_specialize=["num_reqs"])
def _paged_attention_kernel(
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
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program (>= BLOCK_Q * G, power of two)
    BLOCK_N: tl.constexpr,  # keys per loop step
    DOT_PRECISION: tl.constexpr,
):
    block_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    req = _find_request(query_start_loc_ptr, num_reqs, block_idx, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    q_block_start = (block_idx - (q_start // BLOCK_Q + req)) * BLOCK_Q  # first token, chunk-local
    if q_block_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    tok = q_block_start + rows // G  # chunk-local query token of each row
    head = kv_head * G + rows % G
    row_ok = (rows < BLOCK_Q * G) & (tok < q_len)
    q_pos = ctx_len + tok  # position in the sequence; padding rows see at least key 0
    dims = tl.arange(0, HEAD_DIM)
    q_off = (q_start + tok)[:, None] * query_stride_t + head[:, None] * query_stride_h
    q = tl.load(query_ptr + q_off + dims[None, :], mask=row_ok[:, None], other=0.0)

    kv_end = ctx_len + tl.minimum(q_block_start + BLOCK_Q, q_len)  # keys the last row may see
    block_row = block_table_ptr + req.to(tl.int64) * block_table_stride
    out = attend_keys(
        q, q_pos, kv_end, block_row, k_cache_ptr, v_cache_ptr, kv_head * cache_stride_head,
        cache_stride_block, cache_stride_slot, qk_scale,
        BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DOT_PRECISION,
    )  # fmt: skip
    o_off = (q_start + tok)[:, None] * out_stride_t + head[:, None] * out_stride_h
    tl.store(out_ptr + o_off + dims[None, :], out.to(out_ptr.dtype.element_ty), row_ok[:, None])


def paged_attention_triton(
    query: torch.Tensor,  # [T, h, d]
    key: torch.Tensor,  # [T, kvh, d]; unused: already in kv_cache (see the module docstring)
    value: torch.Tensor,  # [T, kvh, d]; unused, as key
    kv_cache: torch.Tensor | None,  # [2, num_blocks, block_size, kvh, d]; None in a dummy run
    meta: AttentionMetadata,
    scale: float,
    *,
    tiles: AttentionTiles | None = None,
) -> torch.Tensor:  # [T, h, d]
    """Causal attention of each request's chunk over its cached context plus the chunk itself.

    By default a batch with no more tokens than requests (a decode step) goes to the decode
    kernel (``attention_decode_triton.py``), or its split-KV form when ``split_count`` says so,
    and any other to this module's, with the tiles of ``pick_tiles``; ``tiles`` forces this
    module's kernel with that launch shape (benchmarks, tests).

    Without a cache: a profiling run's batch (``meta.profiling``) gets zeros, the output's
    memory and no more, as the kernels take no other (``startup.profile_run``); any other
    batch the torch reference.
    """
    if kv_cache is None:
        if meta.profiling:
            return torch.zeros_like(query)
        return paged_attention_ref(query, key, value, kv_cache, meta, scale)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    check_head_dim(head_dim)
    if num_heads % num_kv_heads or kv_cache.shape[4] != head_dim:
        raise ValueError(
            f"paged_attention: query {tuple(query.shape)} does not fit kv_cache "
            f"{tuple(kv_cache.shape)} (need num_heads % num_kv_heads == 0 and equal head_dim)"
        )
    if kv_cache.shape[2] != meta.block_size:
        raise ValueError(
            f"paged_attention: kv_cache block size {kv_cache.shape[2]} != meta.block_size "
            f"{meta.block_size}"
        )
    if query.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("paged_attention: query and kv_cache need a contiguous last dimension")
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0 or meta.num_reqs == 0:
        return out
    if tiles is None and is_decode_batch(num_tokens, meta.num_reqs):
        keys = decode_keys(query.dtype, meta.num_reqs, num_kv_heads, query.device)
        splits = decode_split_count(meta, num_kv_heads, query.device)
        if splits > 1:
            return paged_decode_split_kv(
                query, kv_cache, meta, scale, out, num_splits=splits, block_n=keys
            )
        return paged_decode_triton(query, kv_cache, meta, scale, out, block_n=keys)
    group = num_heads // num_kv_heads
    tiles = tiles or pick_tiles(num_tokens, meta.num_reqs, query.dtype)
    block_m = max(tiles.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + meta.num_reqs, num_kv_heads)
    _paged_attention_kernel[grid](
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
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=tiles.block_n,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out


def check_head_dim(head_dim: int) -> None:
    """The head sizes the attention kernels' ``tl.dot`` tiles take (else ValueError)."""
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(
            f"Triton attention needs head_dim to be a power of two in [16, 256] "
            f"(tl.dot tiles), got {head_dim}; use runner.kernels: torch for this model"
        )
