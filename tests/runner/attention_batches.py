"""The attention kernel tests' batches and checks: seeded mixed batches over a paged cache whose
block-table rows are shuffled block ids (``make_batch``), the float32 torch reference on them,
the kernel's call, and a comparison that names the first mismatches. The benchmark
``benchmarks/attention_triton.py`` builds its batches here too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import mrv2_prof.runner.model.attention_triton as attention_triton
from mrv2_prof.runner.model.attention import (
    AttentionMetadata,
    paged_attention_ref,
    write_kv_ref,
)

INTERPRET = not torch.cuda.is_available()

AttentionTiles = attention_triton.AttentionTiles
paged_attention_triton = attention_triton.paged_attention_triton

CPU = torch.device("cpu")
TOL = {  # (atol, rtol) of the kernel against the float32 reference
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),  # bf16 inputs, output and softmax weights in the P @ V dot
}
ALL_TILES = {
    "decode": attention_triton.DECODE_TILES,  # 16 rows, 64 keys a step
    "prefill": attention_triton.PREFILL_TILES,  # 64 rows, 64 keys a step
    "float32": attention_triton.FLOAT32_TILES,  # 16 rows, 16 keys a step
}

# --------------------------------------------------------------------------------------------
# Batches


@dataclass
class Batch:
    query: torch.Tensor  # [T, h, d]
    key: torch.Tensor  # [T, kvh, d]
    value: torch.Tensor  # [T, kvh, d]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, kvh, d], this step's chunk written
    meta: AttentionMetadata
    scale: float
    num_real_tokens: int


def make_batch(
    reqs: list[tuple[int, int]],  # (context length, query length) per request
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device = CPU,
    seed: int = 0,
    *,
    pad_reqs: int = 0,
    pad_tokens: int = 0,
    strided: bool = False,
) -> Batch:
    """A seeded mixed batch over a random cache whose block-table rows are shuffled block ids.

    Every cache slot starts as noise, so the context is whatever the cache holds; the chunk's own
    keys/values are then written at their slots (as the model's ``write_kv`` does before
    ``attend``). Table entries past a request's blocks name other requests' blocks, so a read past
    ``seq_len`` would show. ``pad_reqs``/``pad_tokens`` add CUDA-graph style padding (requests with
    no tokens, tokens with slot -1); ``strided`` makes the query and block table views with row
    strides larger than their widths.
    """
    gen = torch.Generator().manual_seed(seed)  # block ids and layout
    seq_lens = [ctx + q for ctx, q in reqs]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    free = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_req) + 2
    rows = []
    for n in blocks_per_req:
        row = [free.pop() for _ in range(n)]
        rows.append(row + torch.randint(0, num_blocks, (width - n,), generator=gen).tolist())
    rows += [[0] * width] * pad_reqs
    slot_mapping = []
    for (ctx, q), row in zip(reqs, rows, strict=False):
        slot_mapping += [
            row[p // block_size] * block_size + p % block_size for p in range(ctx, ctx + q)
        ]
    num_real = len(slot_mapping)
    slot_mapping += [-1] * pad_tokens
    num_tokens = len(slot_mapping)
    query_lens = [q for _, q in reqs] + [0] * pad_reqs
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    seq_lens_np = np.array(seq_lens + [0] * pad_reqs, dtype=np.int32)

    values = torch.Generator(device).manual_seed(seed)  # data, drawn where it is used
    num_heads = num_kv_heads * group

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=values, device=device).to(dtype)

    kv_cache = randn(2, num_blocks, block_size, num_kv_heads, head_dim)
    q_all = randn(num_tokens, num_heads + 2, head_dim)
    query = q_all[:, :num_heads] if strided else q_all[:, :num_heads].contiguous()
    key, value = (
        randn(num_tokens, num_kv_heads, head_dim),
        randn(num_tokens, num_kv_heads, head_dim),
    )
    table = torch.tensor(rows, dtype=torch.int32, device=device)
    if strided:
        table = torch.cat([table, torch.full_like(table, -7)], dim=1)[:, :width]
    slots = torch.tensor(slot_mapping, dtype=torch.int64, device=device)
    write_kv_ref(key[:num_real], value[:num_real], kv_cache, slots[:num_real])

    meta = AttentionMetadata(
        num_reqs=len(query_lens),
        num_tokens=num_tokens,
        query_start_loc=torch.from_numpy(query_start_loc).to(device),
        seq_lens=torch.from_numpy(seq_lens_np).to(device),
        block_table=table,
        slot_mapping=slots,
        query_start_loc_np=query_start_loc,
        seq_lens_np=seq_lens_np,
        block_size=block_size,
    )
    return Batch(query, key, value, kv_cache, meta, head_dim**-0.5, num_real)


def mixed_reqs(block_size: int) -> list[tuple[int, int]]:
    """(context, query) lengths that hit every branch, scaled to the block size."""
    bs = block_size
    return [
        (2 * bs - 1, 1),  # decode, seq_len exactly at a block boundary
        (bs + 3, 1),  # decode inside a block
        (0, 5),  # fresh short chunk
        (0, 1),  # fresh one-token prompt
        (bs - 2, 2 * bs + 5),  # chunk with context, spanning several blocks
        (bs, bs),  # chunk starting and ending at block boundaries
    ]


def reference(batch: Batch) -> torch.Tensor:
    """The torch reference in float32 on the batch's inputs (rows of real tokens only)."""
    out = paged_attention_ref(
        batch.query.float(),
        batch.key.float(),
        batch.value.float(),
        batch.kv_cache.float(),
        batch.meta,
        batch.scale,
    )
    return out[: batch.num_real_tokens]


def attend(batch: Batch, tiles: AttentionTiles | None = None) -> torch.Tensor:
    out = paged_attention_triton(
        batch.query, batch.key, batch.value, batch.kv_cache, batch.meta, batch.scale, tiles=tiles
    )
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    return out[: batch.num_real_tokens]


def assert_close_verbose(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float):
    """``assert_close`` that first names the first mismatching (token, head, dim) entries."""
    actual, expected = actual.float().cpu(), expected.float().cpu()
    bad = ((actual - expected).abs() > atol + rtol * expected.abs()) | actual.isnan()
    if bad.any():
        where = bad.nonzero()[:5].tolist()
        found = [(i, actual[tuple(i)].item(), expected[tuple(i)].item()) for i in where]
        pytest.fail(f"{int(bad.sum())} mismatches; first (index, kernel, reference): {found}")
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


DEVICE = torch.device("cpu" if INTERPRET else "cuda")

SHAPES = [  # (kv heads, group G, head_dim, block_size)
    (2, 1, 64, 16),
    (2, 2, 128, 8),
    (1, 4, 64, 32),
    (2, 8, 64, 16),
    (1, 3, 128, 16),  # G not a power of two: spare rows in every program
]


def decode_reqs(num: int, max_ctx: int, seed: int) -> list[tuple[int, int]]:
    gen = torch.Generator().manual_seed(seed)
    return [(int(c), 1) for c in torch.randint(1, max_ctx, (num,), generator=gen)]
