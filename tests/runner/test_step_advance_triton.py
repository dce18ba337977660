"""The state advance after sampling: the Triton launch against the torch reference (two indexed
writes), and the reference against a hand-worked example. Under the interpreter without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.step_advance import advance_state_ref
from mrv2_prof.runner.worker.step_advance_triton import BLOCK, advance_state_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_reference_by_hand():
    last = torch.tensor([5, 5, 5, 5], dtype=torch.int64)
    done = torch.tensor([10, 20, 30, 40], dtype=torch.int32)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    advance_state_ref(
        last, done, idx, torch.tensor([7, 9]), torch.tensor([1, 4], dtype=torch.int32)
    )
    assert last.tolist() == [5, 9, 5, 7] and done.tolist() == [10, 24, 30, 41]
    advance_state_ref(last, None, idx[:1], torch.tensor([2]), None)
    assert last.tolist() == [5, 9, 5, 2] and done.tolist() == [10, 24, 30, 41]


@pytest.mark.parametrize("num_rows", [1, 5, BLOCK + 3])
@pytest.mark.parametrize("with_advance", [True, False])
def test_equals_the_reference(num_rows, with_advance):
    rng = np.random.default_rng(num_rows)
    num_slots = 2 * BLOCK + 10
    last = torch.from_numpy(rng.integers(0, 2**40, num_slots)).to(DEVICE)
    done = torch.from_numpy(rng.integers(0, 4000, num_slots).astype(np.int32)).to(DEVICE)
    idx = torch.from_numpy(rng.permutation(num_slots)[:num_rows].astype(np.int32)).to(DEVICE)
    sampled = torch.from_numpy(rng.integers(0, 2**40, num_rows)).to(DEVICE)
    advance = torch.from_numpy(rng.integers(0, 300, num_rows).astype(np.int32)).to(DEVICE)
    want_last, want_done = last.clone(), done.clone()
    args = (idx, sampled, advance if with_advance else None)
    advance_state_ref(want_last, want_done if with_advance else None, *args)
    advance_state_triton(last, done if with_advance else None, *args)
    assert torch.equal(last, want_last) and torch.equal(done, want_done)
    assert not torch.equal(want_last, last.new_zeros(num_slots))  # something was written


def test_empty_batch_and_bad_inputs():
    last = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    done = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    advance_state_triton(last, done, empty, empty.long(), empty)
    assert not last.any() and not done.any()
    idx = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="sampled_token_ids has shape"):
        advance_state_triton(last, None, idx, last[:3], None)
    with pytest.raises(ValueError, match="go together"):
        advance_state_triton(last, done, idx, last[:2], None)
    with pytest.raises(ValueError, match="advance has shape"):
        advance_state_triton(last, done, idx, last[:2], idx[:1])


def test_strided_tokens_and_advance():
    """A verify step's last tokens can be a column of a [B, k] tensor: read by stride."""
    last = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    done = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    idx = torch.tensor([6, 2, 4], dtype=torch.int32, device=DEVICE)
    tokens = torch.arange(12, dtype=torch.int64, device=DEVICE).view(3, 4)[:, 1]  # 1, 5, 9
    steps = torch.arange(6, dtype=torch.int32, device=DEVICE)[::2]  # 0, 2, 4
    advance_state_triton(last, done, idx, tokens, steps)
    assert last.tolist() == [0, 0, 5, 0, 9, 0, 1, 0]
    assert done.tolist() == [0, 0, 2, 0, 4, 0, 0, 0]
