"""Triton paged attention and KV write against the torch references in ``attention.py``.

Without CUDA the kernels run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET`` is set
by ``tests/conftest.py`` before triton is imported). CPU sizes are tiny and float32;
the ``gpu`` tests use the 1B preset's shapes in bfloat16 and float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import mrv2_prof.runner.model.attention_triton as attention_triton
from mrv2_prof.runner.config import ModelSpec
from mrv2_prof.runner.model import kv_cache_shape
from mrv2_prof.runner.model.attention import (
    AttentionMetadata,
    paged_attention_ref,
    write_kv_ref,
)
from mrv2_prof.runner.model.loader import load_model

INTERPRET = not torch.cuda.is_available()

AttentionTiles = attention_triton.AttentionTiles
paged_attention_triton = attention_triton.paged_attention_triton
write_kv_triton = attention_triton.write_kv_triton

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


# --------------------------------------------------------------------------------------------
# CPU (interpreter on CPU tensors, or the real kernels when CUDA is present)

DEVICE = torch.device("cpu" if INTERPRET else "cuda")

SHAPES = [  # (kv heads, group G, head_dim, block_size)
    (2, 1, 64, 16),
    (2, 2, 128, 8),
    (1, 4, 64, 32),
    (2, 8, 64, 16),
    (1, 3, 128, 16),  # G not a power of two: spare rows in every program
]


@pytest.mark.parametrize("tiles", list(ALL_TILES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "kvh{}-G{}-d{}-bs{}".format(*s))
def test_mixed_batch_matches_reference(shape, tiles):
    kvh, group, head_dim, block_size = shape
    batch = make_batch(mixed_reqs(block_size), kvh, group, head_dim, block_size, device=DEVICE)
    assert_close_verbose(attend(batch, ALL_TILES[tiles]), reference(batch), *TOL[torch.float32])


def test_padded_strided_batch_and_default_tiles():
    """CUDA-graph style padding (empty requests, -1 slots past the last request), a query that
    is a view into a fused projection and a block table with a wider row stride."""
    batch = make_batch(
        mixed_reqs(8), 2, 4, 64, 8, device=DEVICE, seed=3, pad_reqs=2, pad_tokens=3, strided=True
    )
    assert not batch.query.is_contiguous()
    assert batch.meta.block_table.stride(0) > batch.meta.block_table.shape[1]
    assert_close_verbose(attend(batch), reference(batch), *TOL[torch.float32])


def test_decode_only_batch():
    reqs = [(ctx, 1) for ctx in (0, 1, 15, 16, 31, 40)]
    batch = make_batch(reqs, 2, 4, 64, 16, device=DEVICE, seed=5)
    for tiles in (None, ALL_TILES["decode"]):
        assert_close_verbose(attend(batch, tiles), reference(batch), *TOL[torch.float32])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "kvh{}-G{}-d{}-bs{}".format(*s))
def test_decode_batches_take_the_decode_kernel_and_match_the_reference(shape, monkeypatch):
    """No more tokens than requests: padded like a CUDA-graph batch (empty requests, -1 slots),
    and one with a two-token request beside an empty one (the count still fits), a query that
    is a view and a wider block-table stride. The decode kernel runs, and only it."""
    kvh, group, head_dim, block_size = shape
    calls = []
    decode = attention_triton.paged_decode_triton
    monkeypatch.setattr(
        attention_triton, "paged_decode_triton", lambda *a, **k: calls.append(1) or decode(*a, **k)
    )
    bs = block_size
    cases = [
        ([(c, 1) for c in (0, 1, bs - 1, bs, 2 * bs + 3, 70)], 2, 0),  # 6 + 2 empty requests
        ([(bs + 1, 2), (5, 1), (0, 1)], 1, 0),  # 4 tokens, 4 requests: one has two tokens
        ([(9, 1), (40, 1)], 2, 2),  # -1 slots past the last request's token
    ]
    for seed, (reqs, pad_reqs, pad_tokens) in enumerate(cases):
        batch = make_batch(
            reqs, kvh, group, head_dim, bs, device=DEVICE, seed=seed, pad_reqs=pad_reqs,
            pad_tokens=pad_tokens, strided=seed == 1,
        )  # fmt: skip
        assert batch.meta.num_tokens <= batch.meta.num_reqs
        assert_close_verbose(attend(batch), reference(batch), *TOL[torch.float32])
    assert len(calls) == len(cases)
    mixed = make_batch(mixed_reqs(bs), kvh, group, head_dim, bs, device=DEVICE)
    assert_close_verbose(attend(mixed), reference(mixed), *TOL[torch.float32])
    assert len(calls) == len(cases)  # more tokens than requests: the general kernel


def test_write_kv_skips_padding_slots():
    gen = torch.Generator().manual_seed(7)
    num_blocks, block_size, kvh, d, T = 6, 8, 3, 64, 12
    kv_cache = torch.randn(2, num_blocks, block_size, kvh, d, generator=gen)
    fused = torch.randn(T, 2 * kvh + 1, d, generator=gen)  # key and value as strided views
    key, value = fused[:, :kvh], fused[:, kvh : 2 * kvh]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:T]
    slots[[0, 5, 11]] = -1
    expected = kv_cache.clone()
    valid = slots >= 0
    write_kv_ref(key[valid], value[valid], expected, slots[valid])
    actual = kv_cache.clone().to(DEVICE)
    write_kv_triton(key.to(DEVICE), value.to(DEVICE), actual, slots.to(DEVICE))
    assert torch.equal(actual.cpu(), expected)
    assert not torch.equal(expected, kv_cache)


def test_without_cache_falls_back_to_reference():
    batch = make_batch([(0, 4), (0, 2)], 2, 2, 64, 16, device=DEVICE)
    out = paged_attention_triton(batch.query, batch.key, batch.value, None, batch.meta, 0.125)
    expected = paged_attention_ref(batch.query, batch.key, batch.value, None, batch.meta, 0.125)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_unsupported_head_dim_is_a_clear_error():
    batch = make_batch([(3, 2)], 1, 2, 64, 16)
    query = torch.zeros(2, 2, 48)
    with pytest.raises(ValueError, match="head_dim to be a power of two.*got 48"):
        paged_attention_triton(query, query, query, batch.kv_cache, batch.meta, 0.1)
    with pytest.raises(ValueError, match="got 48"):
        write_kv_triton(query, query, torch.zeros(2, 1, 16, 2, 48), batch.meta.slot_mapping)


def test_tiles_come_from_host_ints_only():
    pick = attention_triton.pick_tiles
    assert pick(256, 256, torch.bfloat16) == ALL_TILES["decode"]
    assert pick(4 * 64, 64, torch.bfloat16) == ALL_TILES["decode"]  # e.g. 3 draft tokens each
    assert pick(2048 + 63, 64, torch.bfloat16) == ALL_TILES["prefill"]
    assert pick(8, 8, torch.float32) == ALL_TILES["float32"]


def test_llama_tiny_with_triton_attention_gives_reference_logits():
    """End to end: the model with the Triton write_kv/attend injected, over a paged cache, gives
    the reference model's logits for a prefill chunk with context, a fresh prompt and a decode."""
    spec, bs = ModelSpec(preset="llama-tiny", seed=0), 4
    ref_model, args = load_model(spec, DEVICE, torch.float32)
    tri_model, _ = load_model(
        spec, DEVICE, torch.float32, write_kv=write_kv_triton, attend=paged_attention_triton
    )
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, args.vocab_size, (n,), generator=gen) for n in (11, 6, 9)]
    rows = [[3, 9, 1], [7, 0], [5, 2, 8]]
    ctx = [5, 0, 8]  # (tokens, context already cached, block-table row) per request

    def run(model, caches, batch):
        qlens = [len(t) - c for t, c, _ in batch]
        slots = [r[p // bs] * bs + p % bs for t, c, r in batch for p in range(c, len(t))]
        qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
        seq = np.array([len(t) for t, _, _ in batch], dtype=np.int32)
        width = max(len(r) for _, _, r in batch)
        table = [r + [0] * (width - len(r)) for _, _, r in batch]
        meta = AttentionMetadata(
            len(batch),
            int(qsl[-1]),
            torch.from_numpy(qsl).to(DEVICE),
            torch.from_numpy(seq).to(DEVICE),
            torch.tensor(table, dtype=torch.int32, device=DEVICE),
            torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            qsl,
            seq,
            bs,
        )
        input_ids = torch.cat([t[c:] for t, c, _ in batch]).to(DEVICE)
        positions = torch.cat([torch.arange(c, len(t)) for t, c, _ in batch]).to(DEVICE)
        with torch.no_grad():
            return model.compute_logits(model(input_ids, positions, caches, meta))

    logits, caches = [], []
    for model in (ref_model, tri_model):
        kv = [torch.zeros(kv_cache_shape(args, 12, bs), device=DEVICE) for _ in range(2)]
        run(model, kv, [(t[:c], 0, r) for t, c, r in zip(ids, ctx, rows, strict=True) if c])
        logits.append(run(model, kv, list(zip(ids, ctx, rows, strict=True))))
        caches.append(kv)
    assert logits[0].shape == (11 - 5 + 6 + 9 - 8, args.vocab_size)
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)
    for got, want in zip(caches[1], caches[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# GPU: the 1B preset's shapes (32 query heads, 8 kv heads, head_dim 64), bf16 and fp32

needs_cuda = pytest.mark.skipif(INTERPRET, reason="needs CUDA")
CUDA = torch.device("cuda")


def decode_reqs(num: int, max_ctx: int, seed: int) -> list[tuple[int, int]]:
    gen = torch.Generator().manual_seed(seed)
    return [(int(c), 1) for c in torch.randint(1, max_ctx, (num,), generator=gen)]


GPU_BATCHES = {
    "decode256-ctx2k": lambda: decode_reqs(256, 2048, seed=1),
    "decode256-ctx200": lambda: decode_reqs(256, 200, seed=3),
    "mixed-prefill2k": lambda: [(0, 2048), (700, 300), (16, 1)] + decode_reqs(61, 2048, seed=2),
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(GPU_BATCHES))
def test_gpu_1b_shapes_match_reference(name, dtype):
    batch = make_batch(GPU_BATCHES[name](), 8, 4, 64, 16, dtype, CUDA, seed=11)
    assert_close_verbose(attend(batch), reference(batch), *TOL[dtype])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tiles", [*ALL_TILES, "m128-w8", "n128"])
@pytest.mark.parametrize("shape", SHAPES + [(8, 4, 64, 16)], ids=lambda s: "-".join(map(str, s)))
def test_gpu_every_tile_and_shape_compiles_and_matches(shape, tiles):
    extra = {"m128-w8": AttentionTiles(128, 64, 8, 3), "n128": AttentionTiles(16, 128)}
    kvh, group, head_dim, block_size = shape
    reqs = mixed_reqs(block_size) + [(0, 300), (517, 129)] + decode_reqs(20, 1000, seed=4)
    for dtype in (torch.bfloat16, torch.float32) if tiles == "float32" else (torch.bfloat16,):
        batch = make_batch(reqs, kvh, group, head_dim, block_size, dtype, CUDA, seed=6)
        out = attend(batch, ALL_TILES.get(tiles) or extra[tiles])
        assert_close_verbose(out, reference(batch), *TOL[dtype])


@pytest.mark.gpu
@needs_cuda
def test_gpu_write_kv_bf16_skips_padding_slots():
    batch = make_batch(decode_reqs(64, 512, seed=8), 8, 4, 64, 16, torch.bfloat16, CUDA)
    slots = batch.meta.slot_mapping.clone()
    slots[::3] = -1
    expected = batch.kv_cache.clone()
    valid = slots >= 0
    write_kv_ref(batch.key[valid] + 1, batch.value[valid] - 1, expected, slots[valid])
    write_kv_triton(batch.key + 1, batch.value - 1, batch.kv_cache, slots)
    assert torch.equal(batch.kv_cache, expected)


@pytest.mark.gpu
@needs_cuda
def test_gpu_cuda_graph_replay_reads_new_metadata():
    """Captured once, replayed on another batch of the same token/request counts: the kernels
    take everything per-request from the device metadata (no host values baked in)."""
    a = make_batch([(30, 40), (100, 1), (0, 7), (5, 1)], 8, 4, 64, 16, torch.bfloat16, CUDA, 1)
    b = make_batch([(2, 1), (0, 45), (64, 1), (300, 2)], 8, 4, 64, 16, torch.bfloat16, CUDA, 2)
    assert (a.meta.num_tokens, a.meta.num_reqs) == (b.meta.num_tokens, b.meta.num_reqs)
    num_blocks = max(a.kv_cache.shape[1], b.kv_cache.shape[1])
    cache = torch.zeros((2, num_blocks, *a.kv_cache.shape[2:]), dtype=torch.bfloat16, device=CUDA)
    width = max(a.meta.block_table.shape[1], b.meta.block_table.shape[1])
    static = {
        "query": a.query.clone(),
        "key": a.key.clone(),
        "value": a.value.clone(),
        "qsl": a.meta.query_start_loc.clone(),
        "seq_lens": a.meta.seq_lens.clone(),
        "table": torch.zeros(4, width, dtype=torch.int32, device=CUDA),
        "slots": a.meta.slot_mapping.clone(),
    }
    meta = AttentionMetadata(
        4, a.meta.num_tokens, static["qsl"], static["seq_lens"], static["table"], static["slots"],
        a.meta.query_start_loc_np, a.meta.seq_lens_np, 16,
    )  # fmt: skip

    def load(batch: Batch) -> None:
        cache.zero_()
        cache[:, : batch.kv_cache.shape[1]].copy_(batch.kv_cache)
        for kv in cache:  # the chunk's slots: the captured write_kv fills them again
            kv.view(-1, *kv.shape[2:])[batch.meta.slot_mapping] = 0
        static["table"].zero_()
        static["table"][:, : batch.meta.block_table.shape[1]].copy_(batch.meta.block_table)
        for name, src in [
            ("query", batch.query),
            ("key", batch.key),
            ("value", batch.value),
            ("qsl", batch.meta.query_start_loc),
            ("seq_lens", batch.meta.seq_lens),
            ("slots", batch.meta.slot_mapping),
        ]:
            static[name].copy_(src)

    def step() -> torch.Tensor:
        write_kv_triton(static["key"], static["value"], cache, static["slots"])
        return paged_attention_triton(
            static["query"], static["key"], static["value"], cache, meta, a.scale
        )

    load(a)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for batch in (b, a):
        load(batch)
        graph.replay()
        assert_close_verbose(out, reference(batch), *TOL[torch.bfloat16])
