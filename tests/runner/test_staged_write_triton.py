"""apply_packed_writes_triton against apply_packed_writes_ref (the oracle), and inside
StagedWriteTensor. Results must be equal exactly.

On a machine without CUDA the kernel runs under the Triton interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker import staged_write_triton
from mrv2_prof.runner.worker.staged_write import StagedWriteTensor, apply_packed_writes_ref

BLOCK = staged_write_triton.BLOCK
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pack(writes, dtype):
    """The StagedWriteTensor buffer: rows | starts | lens | offsets | values (one dtype)."""
    lens = np.array([len(v) for _, _, v in writes], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]) if writes else lens
    parts = [
        [r for r, _, _ in writes],
        [s for _, s, _ in writes],
        lens,
        offsets,
        *[v for _, _, v in writes],
    ]
    packed = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    return torch.from_numpy(packed).to(dtype=dtype, device=DEVICE), int(lens.sum())


def random_writes(rng, rows, cols, n, lengths=None):
    """``n`` non-overlapping writes (rows may repeat), of the given lengths or random ones."""
    writes, used = [], {}
    for _ in range(100 * n):
        if len(writes) == n:
            break
        length = lengths[len(writes)] if lengths else int(rng.integers(0, cols + 1))
        row = int(rng.integers(rows))
        start = int(rng.integers(0, cols - length + 1))
        if any(start < e and s < start + length for s, e in used.get(row, [])):
            continue
        used.setdefault(row, []).append((start, start + length))
        writes.append((row, start, rng.integers(-256, 257, size=length)))  # exact in bf16
    assert len(writes) == n, "no room for the writes; use more rows"
    return writes


def check(base, writes, buf_dtype, pad=0):
    """Apply ``writes`` to two copies of ``base`` (kernel and reference); compare exactly."""
    buf, total = pack(writes, buf_dtype)
    if pad:  # a buffer with spare room after the values
        buf = torch.cat([buf, torch.full((pad,), 7, dtype=buf.dtype, device=DEVICE)])
    want, got = base.clone(), base.clone()
    apply_packed_writes_ref(want, buf, len(writes), total)
    staged_write_triton.apply_packed_writes_triton(got, buf, len(writes), total)
    assert_equal(got, want)
    return got


def assert_equal(got, want):
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].tolist()
        pytest.fail(f"first mismatches at {bad}")


DTYPES = [  # (base, buf): StagedWriteTensor's own pairs, then casts the contract also covers
    (torch.int32, torch.int32),
    (torch.int64, torch.int64),
    (torch.float32, torch.int32),
    (torch.float16, torch.int64),
    pytest.param(
        torch.bfloat16,
        torch.int64,
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(),
            reason="the Triton interpreter casts int to bfloat16 by bit pattern",
        ),
    ),
]


def random_base(rng, rows, cols, dtype):
    return torch.from_numpy(rng.integers(-50, 50, size=(rows, cols))).to(DEVICE, dtype)


@pytest.mark.parametrize(("base_dtype", "buf_dtype"), DTYPES)
@pytest.mark.parametrize("n", [1, 37])
def test_random_writes(base_dtype, buf_dtype, n):
    rng = np.random.default_rng(n)
    rows, cols = 13, BLOCK + 45
    check(random_base(rng, rows, cols, base_dtype), random_writes(rng, rows, cols, n), buf_dtype)


@pytest.mark.parametrize(("base_dtype", "buf_dtype"), DTYPES[:2])
def test_lengths_around_the_block(base_dtype, buf_dtype):
    """Empty, single, BLOCK-1/BLOCK/BLOCK+1 and full-row writes, some sharing a row."""
    rng = np.random.default_rng(1)
    rows, cols = 8, 2 * BLOCK + 3
    lengths = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, cols, 0, 2, 1]
    writes = random_writes(rng, rows, cols, len(lengths), lengths)
    assert len({r for r, _, _ in writes}) < len(writes)  # repeated rows
    check(random_base(rng, rows, cols, base_dtype), writes, buf_dtype, pad=5)


def test_no_writes_and_one_column():
    rng = np.random.default_rng(2)
    base = random_base(rng, 6, 1, torch.int32)  # a 1-D StagedWriteTensor viewed as [rows, 1]
    assert torch.equal(check(base, [], torch.int32), base)
    check(base, [(3, 0, np.array([9])), (0, 0, np.array([-4])), (5, 0, np.array([]))], torch.int32)


def test_row_stride_wider_than_the_row():
    """The kernel writes through the row stride (the reference needs a contiguous base)."""
    rng = np.random.default_rng(3)
    wide = random_base(rng, 8, 40, torch.int64)
    writes = random_writes(rng, 8, 24, 11)
    buf, total = pack(writes, torch.int64)
    want, got = wide.clone(), wide.clone()
    cols = want[:, 5:29].contiguous()
    apply_packed_writes_ref(cols, buf, len(writes), total)
    want[:, 5:29] = cols
    view = got[:, 5:29]
    assert view.stride(0) == 40
    staged_write_triton.apply_packed_writes_triton(view, buf, len(writes), total)
    assert_equal(got, want)  # the whole tensor: nothing outside the view changed either


def test_rejects_bad_layouts():
    base = torch.zeros(4, 8, dtype=torch.int32, device=DEVICE)
    buf, total = pack([(1, 0, np.array([1, 2]))], torch.int32)
    with pytest.raises(ValueError, match="unit column stride"):
        staged_write_triton.apply_packed_writes_triton(base.t(), buf, 1, total)
    with pytest.raises(ValueError, match="need"):
        staged_write_triton.apply_packed_writes_triton(base, buf, 1, total + 1)
    with pytest.raises(TypeError, match="integer"):
        staged_write_triton.apply_packed_writes_triton(base, buf.float(), 1, total)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_staged_write_tensor_with_the_kernel(dtype):
    """The buffer StagedWriteTensor really packs, applied by the kernel, over several steps."""
    rng = np.random.default_rng(4)
    rows, cols = 11, BLOCK + 7
    t = StagedWriteTensor(
        (rows, cols), dtype, DEVICE, staged_write_triton.apply_packed_writes_triton
    )
    ref = np.zeros((rows, cols), dtype=np.int64)
    for _ in range(4):
        for row, start, vals in random_writes(rng, rows, cols, int(rng.integers(0, 9))):
            t.stage_write(row, start, vals)
            ref[row, start : start + len(vals)] = vals
        t.apply_write()
        np.testing.assert_array_equal(t.gpu.cpu().numpy(), ref)


# ---- CUDA, real sizes: a [1024, 256] block table and a [1024, 4096] prompt table ----------------


def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.gpu
def test_cuda_small_writes_to_the_block_table():
    """256 appends of 1-3 block ids, as a decode-heavy step stages them."""
    _needs_cuda()
    rng = np.random.default_rng(5)
    writes = random_writes(rng, 1024, 256, 256, [int(x) for x in rng.integers(1, 4, size=256)])
    check(random_base(rng, 1024, 256, torch.int32), writes, torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cuda_prompt_writes_up_to_full_rows(dtype):
    _needs_cuda()
    rng = np.random.default_rng(6)
    lengths = [4096, 1, 0, BLOCK, BLOCK + 1, *rng.integers(1, 4096, size=59).tolist()]
    writes = random_writes(rng, 1024, 4096, len(lengths), lengths)
    check(random_base(rng, 1024, 4096, dtype), writes, dtype)


@pytest.mark.gpu
def test_cuda_apply_does_not_sync():
    _needs_cuda()
    rng = np.random.default_rng(7)
    base = random_base(rng, 1024, 256, torch.int32)
    buf, total = pack(random_writes(rng, 1024, 256, 256, [2] * 256), torch.int32)
    staged_write_triton.apply_packed_writes_triton(base, buf, 256, total)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        staged_write_triton.apply_packed_writes_triton(base, buf, 256, total)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---- the full step's in-graph form: n | (row, col, value) x n, n read on the device ----------


def appends_buffer(triples, cap, dtype=torch.int32):
    """n | triples, padded with garbage up to ``cap`` triples (what lies past n is never read)."""
    flat = [len(triples)] + [x for t in triples for x in t]
    flat += [10**6] * (1 + 3 * cap - len(flat))
    return torch.tensor(flat, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("n, cap", [(0, 4), (1, 1), (5, 8), (130, 200)])
def test_appends_match_the_reference_and_a_numpy_oracle(n, cap):
    """Single-element writes at distinct cells; the count in the buffer bounds them (the
    garbage after it would write out of bounds if read)."""
    from mrv2_prof.runner.worker.staged_write import apply_appends_ref

    rng = np.random.default_rng(n)
    base = random_base(rng, 256, 64, torch.int32)
    cells = rng.choice(256 * 64, size=n, replace=False)
    triples = [(int(c // 64), int(c % 64), int(rng.integers(0, 10**5))) for c in cells]
    buf = appends_buffer(triples, cap)
    want = base.cpu().numpy().copy()
    for r, c, v in triples:
        want[r, c] = v
    ref, got = base.clone(), base.clone()
    apply_appends_ref(ref, buf, cap)
    staged_write_triton.apply_appends_triton(got, buf, cap)
    np.testing.assert_array_equal(ref.cpu().numpy(), want)
    assert_equal(got, ref)


def test_appends_never_write_past_the_capacity():
    """A count above ``cap`` (a stale buffer) writes only ``cap`` entries, like the reference."""
    from mrv2_prof.runner.worker.staged_write import apply_appends_ref

    triples = [(0, i, 100 + i) for i in range(6)]
    buf = appends_buffer(triples, 6)
    ref, got = (torch.zeros(2, 8, dtype=torch.int32, device=DEVICE) for _ in range(2))
    apply_appends_ref(ref, buf, 3)
    staged_write_triton.apply_appends_triton(got, buf, 3)
    assert ref[0].tolist() == [100, 101, 102, 0, 0, 0, 0, 0]
    assert_equal(got, ref)


@pytest.mark.gpu
def test_cuda_appends_in_a_graph_write_each_replays_entries():
    """Captured once, replayed with new entries and counts in the static buffer: each replay
    writes its own step's entries (a [1024, 256] block table, 512 rows of capacity)."""
    _needs_cuda()
    rng = np.random.default_rng(9)
    table = torch.zeros(1024, 256, dtype=torch.int32, device="cuda")
    buf = torch.zeros(1 + 3 * 512, dtype=torch.int32, device="cuda")
    staged_write_triton.apply_appends_triton(table, buf, 512)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        staged_write_triton.apply_appends_triton(table, buf, 512)
    want = np.zeros((1024, 256), dtype=np.int32)
    for n in (3, 512, 0, 77):
        cells = rng.choice(1024 * 256, size=n, replace=False)
        triples = [(int(c // 256), int(c % 256), int(rng.integers(1, 10**6))) for c in cells]
        buf.copy_(appends_buffer(triples, 512).cuda())
        graph.replay()
        for r, c, v in triples:
            want[r, c] = v
        np.testing.assert_array_equal(table.cpu().numpy(), want)
