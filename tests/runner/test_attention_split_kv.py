"""Split-KV decode attention (``attention_split_kv_triton.py``) against ``paged_attention_ref``.

Without CUDA the kernels run on CPU tensors in Triton's interpreter (``tests/conftest.py``), at
tiny sizes; the ``gpu`` tests run the 1B preset's attention shapes (32 query heads, 8 kv heads,
head_dim 64, block size 16) at contexts up to 8k, and a CUDA graph's replay on new lengths.
"""

from __future__ import annotations

import math

import pytest
import torch

import mrv2_prof.runner.model.attention_split_kv_triton as split_kv
import mrv2_prof.runner.model.attention_triton as attention_triton
import mrv2_prof.runner.model.split_kv_workspace as split_kv_workspace
from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace
from tests.runner.attention_batches import (
    DEVICE,
    INTERPRET,
    TOL,
    Batch,
    assert_close_verbose,
    attend,
    decode_reqs,
    make_batch,
    mixed_reqs,
    reference,
)

SHAPES = [  # (kv heads, group G, head_dim, block_size)
    (2, 1, 16, 8),  # no GQA: one row of sixteen in every program
    (2, 4, 32, 8),
    (1, 3, 16, 4),  # G not a power of two: spare rows
]


def split_attend(batch: Batch, num_splits: int, block_n: int = 16, fused: bool = True):
    out = torch.full_like(batch.query, float("nan"))  # a row left unwritten shows
    split_kv.paged_decode_split_kv(
        batch.query, batch.kv_cache, batch.meta, batch.scale, out,
        num_splits=num_splits, block_n=block_n, fused=fused,
    )  # fmt: skip
    return out[: batch.num_real_tokens]


def chunk_of(seq_len: int, num_splits: int, block_n: int, min_keys: int = 0) -> int:
    """Keys per split: ceil(seq / splits) rounded up to whole key tiles, and at least
    ``min_keys`` (``MIN_CHUNK_KEYS``) rounded up to whole tiles, at least one."""
    per_split = math.ceil(math.ceil(seq_len / num_splits) / block_n) * block_n
    return max(per_split, max(1, math.ceil(min_keys / block_n)) * block_n)


def splits_with_keys(seq_len: int, num_splits: int, block_n: int, min_keys: int = 0) -> int:
    """How many of a decode's splits hold keys."""
    return math.ceil(seq_len / chunk_of(seq_len, num_splits, block_n, min_keys))


def decode_batch(block_size: int, kvh: int, group: int, head_dim: int, dtype, seed: int) -> Batch:
    """Decodes shorter than one split, at block boundaries and over several blocks, and two
    padding requests with a -1 slot past the last token."""
    bs = block_size
    reqs = [(0, 1), (2, 1), (bs - 1, 1), (2 * bs, 1), (5 * bs + 3, 1), (70, 1)]
    return make_batch(reqs, kvh, group, head_dim, bs, dtype, DEVICE, seed, pad_reqs=2, pad_tokens=1)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 8])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "kvh{}-G{}-d{}-bs{}".format(*s))
def test_split_decode_matches_reference(shape, num_splits):
    kvh, group, head_dim, bs = shape
    batch = decode_batch(bs, kvh, group, head_dim, torch.float32, seed=num_splits)
    seqs = batch.meta.seq_lens_np[: batch.meta.num_reqs - 2]
    used = [splits_with_keys(int(s), num_splits, 16) for s in seqs]
    assert num_splits == 1 or (min(used) < num_splits and max(used) > 1)  # some empty, some not
    assert_close_verbose(split_attend(batch, num_splits), reference(batch), *TOL[torch.float32])


@pytest.mark.parametrize("num_splits", [2, 5])
def test_two_launch_reduce_matches_reference(num_splits):
    batch = decode_batch(8, 2, 4, 32, torch.float32, seed=7)
    out = split_attend(batch, num_splits, fused=False)
    assert_close_verbose(out, reference(batch), *TOL[torch.float32])


@pytest.mark.parametrize("fused", [True, False])
def test_a_request_with_two_tokens_beside_padding(fused):
    """As many tokens as requests, one request holding two (each sees its own keys), one
    holding none."""
    batch = make_batch([(17, 2), (5, 1), (0, 1)], 2, 2, 16, 4, device=DEVICE, seed=2, pad_reqs=1)
    assert batch.meta.num_tokens == batch.meta.num_reqs == 4
    out = split_attend(batch, 3, fused=fused)
    assert_close_verbose(out, reference(batch), *TOL[torch.float32])


# Triton's interpreter multiplies bfloat16 tl.dot operands as their raw bits (triton 3.9;
# triton-lang/triton#11584): on CPU float16 takes the narrow-dtype path (same code, the bfloat16
# tolerance), bfloat16 itself runs here on CUDA and in the gpu tests below.
NARROW = [
    torch.float16,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(INTERPRET, reason="interpreter: bfloat16 tl.dot unsupported"),
    ),
]


@pytest.mark.parametrize("block_n", [16, 64])
@pytest.mark.parametrize("dtype", NARROW, ids=str)
def test_narrow_dtypes(dtype, block_n):
    batch = make_batch([(200, 1), (40, 1), (1, 1)], 2, 4, 32, 16, dtype, DEVICE, 4, pad_reqs=1)
    out = split_attend(batch, 2 if block_n == 64 else 4, block_n=block_n)
    assert out.dtype == dtype
    assert_close_verbose(out, reference(batch), *TOL[torch.bfloat16])


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("min_keys", [0, 40])
def test_a_context_in_one_split_is_written_by_that_split(min_keys, fused, monkeypatch):
    """A request whose keys all fall in split 0 (a context up to one key tile, or up to
    ``MIN_CHUNK_KEYS`` rounded up to tiles) has its output written by split 0 itself: no partial
    of it is stored (its workspace cells keep the NaN put there) and no counter moves; a longer
    one stores a partial in each split holding its keys and is reduced from them as before."""
    monkeypatch.setattr(split_kv, "MIN_CHUNK_KEYS", min_keys)
    num_splits, block_n, kvh, group = 4, 16, 2, 2
    reqs = [(0, 1), (15, 1), (16, 1), (30, 1), (47, 1), (48, 1), (90, 1)]
    batch = make_batch(reqs, kvh, group, 16, 8, device=DEVICE, seed=11, pad_reqs=1)
    num_heads, cells = kvh * group, batch.query.shape[0] * kvh * group * num_splits
    acc, maxes, sums, counter = split_kv_workspace.split_workspace(
        batch.query.device, cells, 16, batch.meta.num_reqs * kvh
    )
    for t in (acc, maxes, sums):
        t.fill_(float("nan"))
    out = split_attend(batch, num_splits, block_n=block_n, fused=fused)
    assert_close_verbose(out, reference(batch), *TOL[torch.float32])
    stored = maxes[:cells].view(-1, num_heads, num_splits)[: len(reqs)].isfinite()
    alone = []
    for i, (ctx, q_len) in enumerate(reqs):
        seq = ctx + q_len
        used = splits_with_keys(seq, num_splits, block_n, min_keys)
        alone.append(used == 1)
        assert stored[i, :, :used].all() != (used == 1), (seq, stored[i])
        assert not stored[i, :, used:].any(), (seq, stored[i])
    assert alone == [True, True] + [min_keys > 0] * 3 + [False, False]
    assert not counter[: batch.meta.num_reqs * kvh].any()


def test_counters_are_reset_and_a_second_call_agrees():
    batch = decode_batch(8, 2, 2, 16, torch.float32, seed=9)
    first = split_attend(batch, 3)
    counter = split_kv_workspace.WORKSPACE.buffers(batch.query.device)[3]
    assert counter.numel() >= batch.meta.num_reqs * 2 and not counter.any()
    torch.testing.assert_close(split_attend(batch, 3), first, atol=0, rtol=0)


def test_split_count_policy_is_off_by_default_and_forced_by_the_override(monkeypatch):
    cpu = torch.device("cpu")
    assert split_kv.FORCED_SPLITS is None and not split_kv.SPLIT_KV_ENABLED
    assert {split_kv.split_count(b, 8, 8192, cpu) for b in (1, 8, 64, 256)} == {1}
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", 6)
    assert split_kv.split_count(64, 8, 512, cpu) == 6


def test_proposed_split_count_fills_the_sms(monkeypatch):
    """132 SMs, 2 programs each: 264 programs over num_reqs x 8 kv heads, at most one split per
    256 keys of the context bound and 32 in all."""
    monkeypatch.setattr(split_kv, "SPLIT_KV_ENABLED", True)
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    cases = {(1, 8192): 32, (1, 2048): 8, (1, 512): 2, (1, 256): 1, (8, 8192): 4,
             (16, 8192): 2, (64, 8192): 1}  # fmt: skip
    for (reqs, context), want in cases.items():
        assert split_kv.split_count(reqs, 8, context, cpu) == want, (reqs, context)
    assert split_kv.proposed_split_count(1, 8, 100, 132) == 1  # shorter than one split's keys


def test_the_smallest_unsplit_batch_is_where_the_policy_stops_splitting(monkeypatch):
    """A warm-up runs it so that the unsplit kernel is compiled beside the split one: 132 SMs
    over 8 kv heads split every batch of up to 16 requests (want = 264 // (8 n) >= 2), not 17;
    none within a cap below that; 1 while split-KV is off; none under a forced count."""
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    assert split_kv.smallest_unsplit_batch(8, 8192, cpu, 256) == 1  # off: nothing splits
    monkeypatch.setattr(split_kv, "SPLIT_KV_ENABLED", True)
    assert split_kv.smallest_unsplit_batch(8, 8192, cpu, 256) == 17
    assert split_kv.split_count(16, 8, 8192, cpu) == 2  # the batch before it still splits
    assert split_kv.smallest_unsplit_batch(8, 8192, cpu, 16) is None
    assert split_kv.smallest_unsplit_batch(8, 256, cpu, 256) == 1  # a bound of one split
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", 4)
    assert split_kv.smallest_unsplit_batch(8, 8192, cpu, 256) is None


def test_dispatch_takes_the_split_kernel_for_decodes_only(monkeypatch):
    calls = []
    split = attention_triton.paged_decode_split_kv
    monkeypatch.setattr(
        attention_triton,
        "paged_decode_split_kv",
        lambda *a, **k: calls.append(k["num_splits"]) or split(*a, **k),
    )
    batch = decode_batch(8, 2, 4, 32, torch.float32, seed=5)
    assert_close_verbose(attend(batch), reference(batch), *TOL[torch.float32])
    assert calls == []  # the default policy: no split
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", 3)
    assert_close_verbose(attend(batch), reference(batch), *TOL[torch.float32])
    assert calls == [3]
    mixed = make_batch(mixed_reqs(8), 2, 4, 32, 8, device=DEVICE)
    assert_close_verbose(attend(mixed), reference(mixed), *TOL[torch.float32])
    assert calls == [3]  # more tokens than requests: the general kernel


def test_the_workspace_fits_the_launch_and_grows_outside_a_capture(monkeypatch):
    """``split_workspace``: acc of ``cells * head_dim``, max and sum of ``cells``, ``rows``
    counters at zero; a launch that fits reuses them, a larger one at least doubles each."""
    ws = KernelWorkspace("the split-KV attention workspace", "run", split_kv_workspace.make)
    monkeypatch.setattr(split_kv_workspace, "WORKSPACE", ws)
    cpu = torch.device("cpu")
    acc, maxes, sums, counter = first = split_kv_workspace.split_workspace(cpu, 10, 16, 4)
    assert (acc.numel(), maxes.numel(), sums.numel(), counter.numel()) == (160, 10, 10, 4)
    assert not counter.any()
    assert split_kv_workspace.split_workspace(cpu, 6, 16, 3) is first  # fits: the same buffers
    grown = split_kv_workspace.split_workspace(cpu, 12, 16, 4)
    assert [t.numel() for t in grown] == [320, 20, 20, 8]  # at least doubled
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="split-KV attention workspace grows during a CUDA"):
        split_kv_workspace.split_workspace(torch.device("cuda"), 21, 16, 8)


def test_a_split_count_below_one_is_refused():
    batch = decode_batch(8, 1, 2, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        split_attend(batch, 0)


# --------------------------------------------------------------------------------------------
# GPU: the 1B preset's attention shapes, contexts up to 8k

needs_cuda = pytest.mark.skipif(INTERPRET, reason="needs CUDA")
CUDA = torch.device("cuda")
GPU_BATCHES = {
    "b1-ctx8k": lambda: [(8191, 1)],
    "b8-ctx2k-8k": lambda: decode_reqs(7, 8192, seed=1) + [(2047, 1)],
    "b64-ctx2k": lambda: decode_reqs(64, 2048, seed=2),
    "b8-short": lambda: decode_reqs(8, 40, seed=3),  # most splits hold no keys
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-launch"])
@pytest.mark.parametrize("num_splits", [2, 7, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(GPU_BATCHES))
def test_gpu_1b_shapes_match_reference(name, dtype, num_splits, fused):
    batch = make_batch(GPU_BATCHES[name](), 8, 4, 64, 16, dtype, CUDA, 11, pad_reqs=2)
    block_n = 16 if dtype == torch.float32 else 64  # as the dispatcher picks
    out = split_attend(batch, num_splits, block_n=block_n, fused=fused)
    assert_close_verbose(out, reference(batch), *TOL[dtype])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-launch"])
def test_gpu_a_minimum_chunk_leaves_short_contexts_to_one_split(fused, monkeypatch):
    """``MIN_CHUNK_KEYS`` 256 at the 1B shapes in bf16 (128-key tiles), 8 splits: contexts up to
    256 keys are split 0's alone (it writes their output), longer ones split in 256-key or
    larger shares, all against the reference."""
    monkeypatch.setattr(split_kv, "MIN_CHUNK_KEYS", 256)
    reqs = [(99, 1), (255, 1), (256, 1), (700, 1), (4000, 1)]  # 100, 256, 257, 701, 4001 keys
    batch = make_batch(reqs, 8, 4, 64, 16, torch.bfloat16, CUDA, 5, pad_reqs=2)
    used = [splits_with_keys(c + 1, 8, 128, 256) for c, _ in reqs]
    assert used == [1, 1, 2, 3, 8]
    out = split_attend(batch, 8, block_n=128, fused=fused)
    assert_close_verbose(out, reference(batch), *TOL[torch.bfloat16])


@pytest.mark.gpu
@needs_cuda
def test_gpu_cuda_graph_replay_reads_new_lengths(monkeypatch):
    """Captured once through the dispatcher with a forced split count, replayed on batches of
    the same request count and other lengths: each split's share comes from the device."""
    monkeypatch.setattr(split_kv, "FORCED_SPLITS", 8)
    shape = (8, 4, 64, 16, torch.bfloat16, CUDA)
    a = make_batch([(4000, 1), (30, 1), (900, 1)], *shape, 1, pad_reqs=1)
    b = make_batch([(7, 1), (6000, 1), (2, 1)], *shape, 2, pad_reqs=1)
    num_blocks = max(a.kv_cache.shape[1], b.kv_cache.shape[1])
    cache = torch.zeros((2, num_blocks, *a.kv_cache.shape[2:]), dtype=torch.bfloat16, device=CUDA)
    width = max(a.meta.block_table.shape[1], b.meta.block_table.shape[1])
    table = torch.zeros(4, width, dtype=torch.int32, device=CUDA)
    query, seq_lens = a.query.clone(), a.meta.seq_lens.clone()
    meta = type(a.meta)(**{**vars(a.meta), "seq_lens": seq_lens, "block_table": table})

    def load(batch: Batch) -> None:
        cache.zero_()
        cache[:, : batch.kv_cache.shape[1]].copy_(batch.kv_cache)
        table.zero_()
        table[:, : batch.meta.block_table.shape[1]].copy_(batch.meta.block_table)
        query.copy_(batch.query)
        seq_lens.copy_(batch.meta.seq_lens)

    def step() -> torch.Tensor:
        return attention_triton.paged_attention_triton(query, a.key, a.value, cache, meta, a.scale)

    load(a)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and size the workspace outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for batch in (b, a):
        load(batch)
        graph.replay()
        assert_close_verbose(out[:3], reference(batch), *TOL[torch.bfloat16])
