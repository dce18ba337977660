"""Device-side input prep against a hand-written per-token loop over the same persistent state."""

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.input_batch import prepare_inputs_ref


def make_state(rng, num_slots, max_len, max_blocks, block_size):
    prefill = rng.integers(0, 1000, size=(num_slots, max_len)).astype(np.int32)
    num_prefill = rng.integers(1, max_len, size=num_slots).astype(np.int32)
    last = rng.integers(0, 1000, size=num_slots).astype(np.int64)
    table = rng.permutation(num_slots * max_blocks).reshape(num_slots, max_blocks).astype(np.int32)
    return prefill, num_prefill, last, table


def loop_reference(idx, counts, computed, num_prefill, prefill, last, table, block_size):
    ids, pos, slots = [], [], []
    for b, slot in enumerate(idx):
        for j in range(counts[b]):
            p = computed[slot] + j
            pos.append(p)
            ids.append(prefill[slot, p] if p < num_prefill[slot] else last[slot])
            slots.append(table[slot, p // block_size] * block_size + p % block_size)
    qsl = np.concatenate([[0], np.cumsum(counts)])
    seq_lens = [computed[s] + counts[b] for b, s in enumerate(idx)]
    return ids, pos, slots, qsl, seq_lens, qsl[1:] - 1


@pytest.mark.parametrize("seed", range(10))
def test_matches_loop_reference(seed):
    rng = np.random.default_rng(seed)
    num_slots, max_len, block_size = 17, 64, 4
    max_blocks = max_len // block_size
    prefill, num_prefill, last, table = make_state(rng, num_slots, max_len, max_blocks, block_size)
    num_reqs = int(rng.integers(1, num_slots + 1))
    idx = rng.permutation(num_slots)[:num_reqs].astype(np.int32)  # any slot order
    computed = rng.integers(0, max_len // 2, size=num_slots).astype(np.int32)
    # mix decodes (1 token past the prompt) and prefill chunks
    counts = np.array(
        [1 if rng.random() < 0.5 else rng.integers(1, max_len // 2) for _ in range(num_reqs)],
        dtype=np.int32,
    )
    for b, s in enumerate(idx):
        if counts[b] == 1 and rng.random() < 0.5:
            num_prefill[s] = min(num_prefill[s], computed[s])  # a true decode step
    t = torch.from_numpy
    out = prepare_inputs_ref(
        t(idx),
        t(counts),
        int(counts.sum()),
        t(computed),
        t(num_prefill),
        t(prefill),
        t(last),
        t(table),
        block_size,
    )
    ids, pos, slots, qsl, seq_lens, logits_idx = loop_reference(
        idx, counts, computed, num_prefill, prefill, last, table, block_size
    )
    assert out["input_ids"].tolist() == ids
    assert out["positions"].tolist() == pos
    assert out["slot_mapping"].tolist() == slots
    assert out["query_start_loc"].tolist() == qsl.tolist()
    assert out["seq_lens"].tolist() == seq_lens
    assert out["logits_indices"].tolist() == logits_idx.tolist()


@pytest.mark.gpu
def test_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(0)
    num_slots, max_len, block_size = 1024, 4096, 16
    prefill, num_prefill, last, table = make_state(
        rng, num_slots, max_len, max_len // block_size, block_size
    )
    idx = rng.permutation(num_slots)[:256].astype(np.int32)
    computed = rng.integers(0, max_len // 2, size=num_slots).astype(np.int32)
    counts = rng.integers(1, 32, size=256).astype(np.int32)
    args = [idx, counts, computed, num_prefill, prefill, last, table]
    cpu = prepare_inputs_ref(
        *[torch.from_numpy(a) for a in args[:2]],
        int(counts.sum()),
        *[torch.from_numpy(a) for a in args[2:]],
        block_size,
    )
    gpu = prepare_inputs_ref(
        *[torch.from_numpy(a).cuda() for a in args[:2]],
        int(counts.sum()),
        *[torch.from_numpy(a).cuda() for a in args[2:]],
        block_size,
    )
    for k in cpu:
        assert torch.equal(cpu[k], gpu[k].cpu()), k
