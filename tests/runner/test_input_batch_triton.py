"""prepare_inputs_triton against prepare_inputs_ref (the oracle); integer outputs equal exactly.

On a machine without CUDA the kernel runs under the Triton interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker import input_batch_triton
from mrv2_prof.runner.worker.input_batch import prepare_inputs_ref

BLOCK_T = input_batch_triton.BLOCK_T
BLOCK_R = input_batch_triton.BLOCK_R
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class State:
    """Persistent request rows as the runner keeps them: [slots] vectors, [slots, cols] tables.

    With ``pad_cols`` the two tables are column slices of wider tensors, so their row stride
    differs from their width (the kernel must use the stride it is given).
    """

    def __init__(self, rng, num_slots, max_len, block_size, pad_cols=0, big_ids=False):
        max_blocks = -(-max_len // block_size)
        ids_hi = 2**40 if big_ids else 50_000
        prefill = rng.integers(0, 50_000, size=(num_slots, max_len + pad_cols))
        blocks_lo = 2**27 if big_ids else 0  # 2**27 * 16 overflows int32 in the slot mapping
        table = blocks_lo + rng.permutation(num_slots * (max_blocks + pad_cols))
        self._prefill = torch.from_numpy(prefill.astype(np.int32))
        self._table = torch.from_numpy(table.reshape(num_slots, -1).astype(np.int32))
        self.last_sampled = torch.from_numpy(rng.integers(0, ids_hi, size=num_slots))
        self.num_computed = np.zeros(num_slots, dtype=np.int32)
        self.num_prefill = rng.integers(1, max_len, size=num_slots).astype(np.int32)
        self.max_blocks = max_blocks
        self.max_len, self.block_size = max_len, block_size

    def tables(self, device):
        """(prefill_token_ids, block_table) on ``device``, sliced there to keep the row stride."""
        return (
            self._prefill.to(device)[:, : self.max_len],
            self._table.to(device)[:, : self.max_blocks],
        )

    def schedule(self, slot, computed, num_prefill):
        self.num_computed[slot], self.num_prefill[slot] = computed, num_prefill


def request(rng, state, slot, kind, count=None):
    """Set ``slot`` up for one scheduled chunk of ``kind``; returns its token count."""
    max_len = state.max_len
    if kind == "decode":  # every position past the prompt: tokens come from last_sampled
        num_prefill = int(rng.integers(1, max_len - 1))
        state.schedule(slot, int(rng.integers(num_prefill, max_len - 1)), num_prefill)
        return 1
    if kind == "prefill":  # a chunk entirely inside the prompt
        if count is None:
            num_prefill = int(rng.integers(2, max_len + 1))
            computed = int(rng.integers(0, num_prefill - 1))
            count = int(rng.integers(1, num_prefill - computed + 1))
        else:
            computed = int(rng.integers(0, max_len - count + 1))
            num_prefill = int(rng.integers(computed + count, max_len + 1))
        state.schedule(slot, computed, num_prefill)
        return count
    if kind == "boundary":  # the chunk starts in the prompt and runs past its end
        count = count or int(rng.integers(2, max_len // 2))
        computed = int(rng.integers(0, max_len - count))
        state.schedule(slot, computed, computed + int(rng.integers(1, count)))
        return count
    raise ValueError(kind)


def make_batch(rng, state, kinds, counts=None):
    num_slots = state.num_computed.shape[0]
    idx = rng.permutation(num_slots)[: len(kinds)].astype(np.int32)  # any slot order
    counts = counts or [None] * len(kinds)
    n = [request(rng, state, int(s), k, c) for s, k, c in zip(idx, kinds, counts, strict=True)]
    return idx, np.asarray(n, dtype=np.int32)


def device_args(state, idx, counts):
    """prepare_inputs_* arguments on DEVICE (the host copies happen here, not in the call)."""
    prefill_token_ids, block_table = state.tables(DEVICE)
    return [
        torch.from_numpy(idx).to(DEVICE),
        torch.from_numpy(counts).to(DEVICE),
        int(counts.sum()),
        torch.from_numpy(state.num_computed).to(DEVICE),
        torch.from_numpy(state.num_prefill).to(DEVICE),
        prefill_token_ids,
        state.last_sampled.to(DEVICE),
        block_table,
        state.block_size,
    ]


def run_both(state, idx, counts):
    args = device_args(state, idx, counts)
    return prepare_inputs_ref(*args), input_batch_triton.prepare_inputs_triton(*args)


def assert_same(ref, out):
    assert out.keys() == ref.keys()
    for key, want in ref.items():
        got = out[key]
        assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
        assert got.shape == want.shape, (key, got.shape, want.shape)
        if not torch.equal(got, want):
            bad = (got != want).nonzero().flatten()[:5].tolist()
            pytest.fail(f"{key}: first mismatches at {bad}: {got[bad].tolist()} != {want[bad]}")


NUM_SLOTS = BLOCK_R + 44  # a full batch sums its query starts over more than one BLOCK_R chunk


@pytest.mark.parametrize("num_reqs", [1, 7, NUM_SLOTS])
@pytest.mark.parametrize("mix", ["decode", "prefill", "mixed"])
def test_matches_reference(num_reqs, mix):
    rng = np.random.default_rng([num_reqs, len(mix)])
    state = State(rng, NUM_SLOTS, max_len=48, block_size=16)
    if mix == "mixed":
        kinds = rng.choice(["decode", "prefill", "boundary"], size=num_reqs).tolist()
    else:
        kinds = [mix] * num_reqs
    idx, counts = make_batch(rng, state, kinds)
    assert_same(*run_both(state, idx, counts))


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_chunks_longer_than_a_block(block_size):
    """Token counts around BLOCK_T and KV block boundaries, crossing the prompt's end."""
    rng = np.random.default_rng(block_size)
    state = State(rng, 9, max_len=2 * BLOCK_T + 40, block_size=block_size)
    counts = [BLOCK_T - 1, BLOCK_T, BLOCK_T + 1, 2 * BLOCK_T + 3, 1, 17]
    kinds = ["prefill", "boundary", "prefill", "boundary", "decode", "boundary"]
    idx, counts = make_batch(rng, state, kinds, counts)
    assert_same(*run_both(state, idx, counts))


def test_strided_tables_and_int64_ranges():
    """Tables with a row stride wider than their width; slots and ids past int32."""
    rng = np.random.default_rng(7)
    state = State(rng, 12, max_len=40, block_size=16, pad_cols=5, big_ids=True)
    prefill_token_ids, _ = state.tables(DEVICE)
    assert prefill_token_ids.stride(0) != prefill_token_ids.shape[1]
    idx, counts = make_batch(rng, state, ["boundary", "decode", "prefill"] * 3)
    ref, out = run_both(state, idx, counts)
    assert int(ref["slot_mapping"].min()) >= 2**31 and int(ref["input_ids"].max()) > 2**31
    assert_same(ref, out)


def test_zero_token_request_and_empty_batch():
    rng = np.random.default_rng(3)
    state = State(rng, 6, max_len=32, block_size=4)
    idx, counts = make_batch(rng, state, ["prefill", "decode", "decode"])
    counts[0] = 0  # not scheduled by our scheduler, but the contract still holds
    assert_same(*run_both(state, idx, counts))
    ref, out = run_both(state, idx[:0], counts[:0])
    assert out["query_start_loc"].tolist() == [0]
    assert_same(ref, out)


def test_rejects_mismatched_layouts():
    rng = np.random.default_rng(0)
    state = State(rng, 4, max_len=16, block_size=4)
    args = device_args(state, *make_batch(rng, state, ["decode"]))
    transposed = args[:5] + [args[5].t()] + args[6:]
    with pytest.raises(ValueError, match="unit stride"):
        input_batch_triton.prepare_inputs_triton(*transposed)
    too_many = args[:1] + [torch.ones(2, dtype=torch.int32, device=DEVICE)] + args[2:]
    with pytest.raises(ValueError, match="num_scheduled_tokens"):
        input_batch_triton.prepare_inputs_triton(*too_many)


# ---- CUDA, real sizes: 1024 slots, 256 requests, max_model_len 4096, up to 8192 tokens ----------


def _gpu_batch(kinds, counts=None, seed=0):
    rng = np.random.default_rng(seed)
    state = State(rng, 1024, max_len=4096, block_size=16, pad_cols=8)
    idx, counts = make_batch(rng, state, kinds, counts)
    return state, idx, counts


def _mixed_8192(rng):
    """200 decodes and 56 prefill/boundary chunks, 8192 tokens in all."""
    chunk = [int(c) for c in rng.multinomial(8192 - 200 - 56, np.ones(56) / 56) + 1]
    kinds = ["decode"] * 200 + rng.choice(["prefill", "boundary"], size=56).tolist()
    return kinds, [None] * 200 + chunk


@pytest.mark.gpu
@pytest.mark.parametrize("mix", ["decode", "prefill", "mixed"])
def test_cuda_matches_reference_at_real_sizes(mix):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(11)
    if mix == "decode":
        kinds, counts = ["decode"] * 256, None
    elif mix == "prefill":
        kinds, counts = ["prefill"] * 256, [32] * 256
    else:
        kinds, counts = _mixed_8192(rng)
    state, idx, counts = _gpu_batch(kinds, counts)
    assert len(idx) == 256 and int(counts.sum()) in (256, 8192)
    assert_same(*run_both(state, idx, counts))


@pytest.mark.gpu
def test_cuda_launch_does_not_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    state, idx, counts = _gpu_batch(*_mixed_8192(np.random.default_rng(5)))
    args = device_args(state, idx, counts)
    input_batch_triton.prepare_inputs_triton(*args)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        input_batch_triton.prepare_inputs_triton(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("prepare", ["ref", "triton"])
def test_writes_into_persistent_buffers_in_place(prepare):
    """Two steps into one set of ``InputBuffers``: each step's results land in the buffers'
    first rows (the same storage, no new tensors) and equal a fresh-tensor build of that step;
    the rows past the step keep what was there (the larger first step's values)."""
    from mrv2_prof.runner.worker.input_buffers import InputBuffers

    fn = prepare_inputs_ref if prepare == "ref" else input_batch_triton.prepare_inputs_triton
    rng = np.random.default_rng(11)
    state = State(rng, NUM_SLOTS, max_len=48, block_size=16)
    buffers = InputBuffers.allocate(256, NUM_SLOTS, state.max_blocks, DEVICE)
    first = None
    for kinds in (["prefill", "boundary", "decode", "prefill"], ["decode", "decode"]):
        idx, counts = make_batch(rng, state, kinds)
        args = device_args(state, idx, counts)
        want = prepare_inputs_ref(*args)
        views = buffers.views(int(counts.sum()), len(kinds))
        got = fn(*args, out=views)
        assert all(got[k].data_ptr() == views[k].data_ptr() for k in views)
        assert_same(want, got)
        if first is None:
            first = {k: v.clone() for k, v in got.items()}
    t, r = int(counts.sum()), len(kinds)
    assert torch.equal(buffers.input_ids[t : len(first["input_ids"])], first["input_ids"][t:])
    assert torch.equal(buffers.seq_lens[r : len(first["seq_lens"])], first["seq_lens"][r:])


def test_persistent_buffers_refuse_a_step_too_large_or_a_wrong_layout():
    from mrv2_prof.runner.worker.input_buffers import InputBuffers

    buffers = InputBuffers.allocate(8, 2, 4, DEVICE)
    with pytest.raises(ValueError, match="exceeds the input buffers"):
        buffers.views(9, 1)
    rng = np.random.default_rng(3)
    state = State(rng, 4, max_len=16, block_size=4)
    idx, counts = make_batch(rng, state, ["decode", "decode"])
    views = buffers.views(2, 2)
    views["seq_lens"] = views["seq_lens"].long()
    with pytest.raises(ValueError, match=r"out\['seq_lens'\] must be a contiguous \[2\]"):
        input_batch_triton.prepare_inputs_triton(*device_args(state, idx, counts), out=views)


@pytest.mark.parametrize("prepare", ["ref", "triton"])
@pytest.mark.parametrize("max_len", [48, 16 * 300])  # 3 block columns; 300 (more than BLOCK_C)
def test_gathers_the_block_table_rows_in_the_same_launch(prepare, max_len):
    """With a ``block_table`` buffer in ``out``, input prep also writes the batch's table rows
    (from a table with a row stride wider than its width), equal to ``index_select`` of the
    rows in batch order; the other outputs are those of a build without it."""
    from mrv2_prof.runner.worker.input_buffers import InputBuffers

    fn = prepare_inputs_ref if prepare == "ref" else input_batch_triton.prepare_inputs_triton
    rng = np.random.default_rng(12)
    state = State(rng, NUM_SLOTS, max_len=max_len, block_size=16, pad_cols=5)
    buffers = InputBuffers.allocate(max_len * 4, NUM_SLOTS, state.max_blocks, DEVICE)
    buffers.block_table.fill_(-7)
    idx, counts = make_batch(rng, state, ["decode", "prefill", "decode", "boundary"])
    args = device_args(state, idx, counts)
    want = prepare_inputs_ref(*args)
    views = buffers.views(int(counts.sum()), len(idx), block_table=True)
    got = fn(*args, out=views)
    table = got.pop("block_table")
    assert table.data_ptr() == buffers.block_table.data_ptr()
    assert_same(want, got)
    _, full_table = state.tables("cpu")
    assert torch.equal(table.cpu(), full_table[torch.from_numpy(idx).long()])
    assert (buffers.block_table[len(idx) :] == -7).all()  # rows past the batch untouched


def test_block_table_buffer_of_a_wrong_layout_is_refused():
    from mrv2_prof.runner.worker.input_buffers import InputBuffers

    rng = np.random.default_rng(3)
    state = State(rng, 4, max_len=16, block_size=4)
    buffers = InputBuffers.allocate(8, 4, state.max_blocks + 1, DEVICE)  # one column too many
    idx, counts = make_batch(rng, state, ["decode", "decode"])
    views = buffers.views(2, 2, block_table=True)
    with pytest.raises(ValueError, match=r"out\['block_table'\] must be a \[2, 4\]"):
        input_batch_triton.prepare_inputs_triton(*device_args(state, idx, counts), out=views)
