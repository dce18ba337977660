"""StagedWriteTensor against a dense numpy reference, with exact byte accounting."""

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.staged_write import DenseWriteTensor, StagedWriteTensor


def random_writes(rng, rows, cols, n):
    """n non-overlapping-per-apply ragged writes: (row, start, values)."""
    writes, used = [], {}
    for _ in range(n):
        row = int(rng.integers(rows))
        length = int(rng.integers(1, cols + 1))
        start = int(rng.integers(0, cols - length + 1))
        if any(start < e and s < start + length for s, e in used.get(row, [])):
            continue
        used.setdefault(row, []).append((start, start + length))
        writes.append((row, start, rng.integers(-1000, 1000, size=length)))
    return writes


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("cls", [StagedWriteTensor, DenseWriteTensor])
def test_matches_dense_reference_after_random_writes(cls, dtype):
    rng = np.random.default_rng(0)
    rows, cols = 13, 37
    t = cls((rows, cols), dtype, torch.device("cpu"))
    ref = np.zeros((rows, cols), dtype=np.int64)
    for _ in range(30):
        for row, start, vals in random_writes(rng, rows, cols, int(rng.integers(0, 8))):
            # arrays and plain lists (the scheduler's block ids), mixed in one apply
            t.stage_write(row, start, vals.tolist() if row % 2 else vals)
            ref[row, start : start + len(vals)] = vals
        t.apply_write()
        np.testing.assert_array_equal(t.gpu.numpy(), ref)


def test_one_dimensional_tensor():
    t = StagedWriteTensor((8,), torch.int32, torch.device("cpu"))
    t.stage_write(3, 0, 7)
    t.stage_write(5, 0, [9])
    t.apply_write()
    assert t.gpu.tolist() == [0, 0, 0, 7, 0, 9, 0, 0]


def test_byte_accounting_is_exact():
    t = StagedWriteTensor((1024, 256), torch.int32, torch.device("cpu"))
    t.stage_write(2, 3, [3, 1, 2])
    t.stage_write(0, 1, [-1, -2, -5])
    t.stage_write(2, 10, [4])
    stats = t.apply_write()
    # header: rows, starts, lens, offsets of 3 writes = 12 int32; values: 7 int32
    assert stats.writes == 3
    assert stats.rows == 2
    assert stats.elements == 7
    assert stats.staged_bytes == (4 * 3 + 7) * 4
    assert stats.dense_bytes == 1024 * 256 * 4
    assert t.gpu[2, 3:6].tolist() == [3, 1, 2]
    assert t.gpu[0, 1:4].tolist() == [-1, -2, -5]
    assert t.gpu[2, 10].item() == 4
    assert t.apply_write() is None  # nothing staged


def test_dense_variant_moves_the_whole_tensor_every_apply():
    t = DenseWriteTensor((64, 16), torch.int32, torch.device("cpu"))
    t.stage_write(1, 0, [5, 6])
    s = t.apply_write()
    assert (s.writes, s.elements, s.staged_bytes) == (1, 2, 64 * 16 * 4)
    assert t.apply_write().staged_bytes == 64 * 16 * 4


def test_overlapping_and_out_of_range_writes_are_refused():
    t = StagedWriteTensor((4, 8), torch.int32, torch.device("cpu"))
    t.stage_write(1, 2, [1, 2, 3])
    with pytest.raises(ValueError, match="overlap"):
        t.stage_write(1, 4, [9])
    with pytest.raises(IndexError):
        t.stage_write(1, 6, [1, 2, 3])
    with pytest.raises(IndexError):
        t.stage_write(4, 0, [1])
    t.stage_write(1, 5, [4])  # adjacent, not overlapping
    t.apply_write()
    assert t.gpu[1].tolist() == [0, 0, 1, 2, 3, 4, 0, 0]


@pytest.mark.gpu
def test_staged_write_on_cuda_matches_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(1)
    rows, cols = 1024, 512
    t = StagedWriteTensor((rows, cols), torch.int32, torch.device("cuda"))
    ref = np.zeros((rows, cols), dtype=np.int64)
    for _ in range(20):
        for row, start, vals in random_writes(rng, rows, cols, 200):
            t.stage_write(row, start, vals)
            ref[row, start : start + len(vals)] = vals
        t.apply_write()
    np.testing.assert_array_equal(t.gpu.cpu().numpy(), ref)


def test_packed_buffers_are_reused_in_turn_and_grow_when_needed():
    """Applies pack into ``STAGING_DEPTH`` host buffers in turn (no allocation per apply), a
    larger apply grows them, and every apply lands the values it staged (a numpy oracle)."""
    from mrv2_prof.runner.worker.staged_write import STAGING_DEPTH

    rng = np.random.default_rng(7)
    t = StagedWriteTensor((6, 500), torch.int32, torch.device("cpu"))
    want = np.zeros((6, 500), dtype=np.int32)
    seen = []
    for step in range(3 * STAGING_DEPTH):
        width = 400 if step == STAGING_DEPTH else 3  # one apply larger than the buffers
        for row in rng.permutation(6)[:2]:
            vals = rng.integers(0, 1000, width)
            t.stage_write(int(row), 10, vals)
            want[row, 10 : 10 + width] = vals
        t.apply_write()
        seen.append(tuple(h.data_ptr() for h in t._staging.host))
        assert np.array_equal(t.gpu.numpy(), want), step
    assert len(set(seen[:STAGING_DEPTH])) == 1  # the same buffers before the growth
    assert len(set(seen[STAGING_DEPTH:])) == 1 and seen[-1] != seen[0]  # grown once


def test_single_element_writes_are_taken_out_as_triples_with_their_stats():
    """``take_singles``: one-element writes leave as (row, col, value) triples, counted as
    3 values each and the count; anything else (a longer write, too many) stays staged and
    applies as before."""
    t = StagedWriteTensor((4, 8), torch.int32, torch.device("cpu"))
    assert t.take_singles(4) == ([], None)  # nothing staged
    t.stage_write(2, 5, [41])
    t.stage_write(0, 0, np.array([7]))
    triples, stats = t.take_singles(4)
    assert triples == [2, 5, 41, 0, 0, 7]
    assert (stats.writes, stats.rows, stats.elements) == (2, 2, 2)
    assert stats.staged_bytes == 4 * (1 + 3 * 2) and stats.dense_bytes == 4 * 4 * 8
    assert t.apply_write() is None  # taken: nothing left to apply
    t.stage_write(1, 0, [1, 2])  # a longer write
    assert t.take_singles(4) is None
    t.apply_write()
    for row in range(3):
        t.stage_write(row, 7, [9])
    assert t.take_singles(2) is None  # more than the limit: they stay staged
    t.apply_write()
    assert t.gpu[:, 7].tolist() == [9, 9, 9, 0] and t.gpu[1, :2].tolist() == [1, 2]
    assert t.gpu[2, 5] == 0  # the taken write was not applied here
