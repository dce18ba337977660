"""Triton paged attention and KV write against the torch references at the 1B preset's shapes
(32 query heads, 8 kv heads, head_dim 64) in bfloat16 and float32, on CUDA (``gpu`` tests), and
a CUDA graph's replay of them on new metadata. The small CPU checks: ``test_attention_triton.py``.
"""

from __future__ import annotations

import pytest
import torch

import mrv2_prof.runner.model.attention_triton as attention_triton
from mrv2_prof.runner.model.attention import AttentionMetadata, write_kv_ref
from tests.runner.attention_batches import (
    ALL_TILES,
    INTERPRET,
    SHAPES,
    TOL,
    Batch,
    assert_close_verbose,
    attend,
    decode_reqs,
    make_batch,
    mixed_reqs,
    reference,
)

AttentionTiles = attention_triton.AttentionTiles
paged_attention_triton = attention_triton.paged_attention_triton
write_kv_triton = attention_triton.write_kv_triton

# --------------------------------------------------------------------------------------------
# GPU: the 1B preset's shapes (32 query heads, 8 kv heads, head_dim 64), bf16 and fp32

needs_cuda = pytest.mark.skipif(INTERPRET, reason="needs CUDA")
CUDA = torch.device("cuda")


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
