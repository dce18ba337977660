"""Triton paged attention and KV write against the torch references in ``attention.py``.

Without CUDA the kernels run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET`` is set
by ``tests/conftest.py`` before triton is imported). CPU sizes are tiny and float32; the
``gpu`` tests at the 1B preset's shapes in bfloat16 and float32: ``test_attention_triton_gpu.py``.
"""

from __future__ import annotations

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
from tests.runner.attention_batches import (
    ALL_TILES,
    DEVICE,
    SHAPES,
    TOL,
    assert_close_verbose,
    attend,
    make_batch,
    mixed_reqs,
    reference,
)

paged_attention_triton = attention_triton.paged_attention_triton
write_kv_triton = attention_triton.write_kv_triton

# --------------------------------------------------------------------------------------------
# CPU (interpreter on CPU tensors, or the real kernels when CUDA is present)


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


def test_decode_key_tile_follows_the_grid_against_the_sms(monkeypatch):
    """16-bit decode kernels walk ``DECODE_KEYS`` (128) keys a step while requests x kv heads fit
    one program per SM, ``WIDE_DECODE_KEYS`` (64) beyond (132 SMs, 8 kv heads: batch 16 against
    17); float32 always 16; without a device, one program's tile; the dispatch launches what it
    says (the decode kernel's ``block_n``), and the warm-up's wide batch is the first wide one."""
    import mrv2_prof.runner.model.attention_split_kv_triton as split_kv

    monkeypatch.setattr(split_kv, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    keys = attention_triton.decode_keys
    assert [keys(torch.bfloat16, b, 8, cpu) for b in (1, 16, 17, 256)] == [128, 128, 64, 64]
    assert keys(torch.float16, 1, 132, cpu) == 128 and keys(torch.float16, 1, 133, cpu) == 64
    assert keys(torch.float32, 1, 8, cpu) == 16 and keys(torch.bfloat16) == 128
    assert attention_triton.smallest_wide_batch(8, cpu) == 17
    assert attention_triton.smallest_wide_batch(2, cpu) == 67
    launched = []
    decode = attention_triton.paged_decode_triton

    def spy(*args, block_n, **kwargs):
        launched.append(block_n)
        return decode(*args, block_n=block_n, **kwargs)

    monkeypatch.setattr(attention_triton, "paged_decode_triton", spy)
    monkeypatch.setattr(split_kv, "num_sms", lambda device: 4)  # 2 kv heads: 2 requests fit
    for n in (2, 3):
        batch = make_batch([(20, 1)] * n, 2, 2, 16, 8, torch.float16, DEVICE, seed=n)
        assert_close_verbose(attend(batch), reference(batch), *TOL[torch.bfloat16])
    assert launched == [128, 64]


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
