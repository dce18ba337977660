"""Device n-gram drafts (``spec_decode/ngram_device.py``): the torch reference against the host
``propose`` on seeded histories and hand-worked cases. The ``gpu`` test uses a real table (256
slots of 4096 tokens, batch 64). A whole step and its Triton kernel: ``test_ngram_step.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.core.ngram_proposer import propose
from mrv2_prof.runner.worker.spec_decode.ngram_device import ngram_propose_ref
from tests.runner.ngram_tables import DEVICE, FILL, WINDOWS, needs_cuda


def random_batch(rng, num_slots: int, seq_len: int, num_rows: int, vocab: int, window, edges: int):
    """A history table, ``num_rows`` distinct slots in random order, and their lengths: ``edges``
    of them (at most) from the edge cases (1, 2, min_n, min_n + 1, max_n, max_n + 1, the table's
    width), the rest at random; one row in five inactive (at least one). Most rows end in a copy
    of an earlier stretch of their history, so that long n-grams match too."""
    history = rng.integers(0, vocab, (num_slots, seq_len)).astype(np.int32)
    slots = rng.permutation(num_slots)[:num_rows]
    min_n, max_n = window
    edge_lengths = np.unique([1, 2, min_n, min_n + 1, max_n, max_n + 1, seq_len])
    lengths = rng.integers(1, seq_len + 1, num_rows)
    picked = rng.permutation(edge_lengths)[:edges]
    lengths[: len(picked)] = picked
    for s, n_len in zip(slots, lengths, strict=True):
        if n_len >= 4 and rng.random() < 0.7:
            span = int(rng.integers(1, min(n_len // 2, 2 * max_n) + 1))
            at = int(rng.integers(0, n_len - 2 * span + 1))
            history[s, n_len - span : n_len] = history[s, at : at + span]
    order = rng.permutation(num_rows)
    active = rng.permutation(num_rows) >= max(num_rows // 5, 1)
    return history, slots[order], lengths[order], active


def host_expected(history, slots, lengths, active, k, min_n, max_n, width):
    """``propose`` per row, laid out as the device call writes it over ``FILL``."""
    tokens = np.full((history.shape[0], width), FILL, dtype=np.int64)
    num = np.full(history.shape[0], 99, dtype=np.int32)  # slots of no row keep 99
    for s, n_len, on in zip(slots, lengths, active, strict=True):
        drafts = propose(history[s, :n_len].tolist(), k, min_n, max_n) if on else []
        tokens[s, : len(drafts)] = drafts
        num[s] = len(drafts)
    return tokens, num


def run(fn, history, slots, lengths, active, k, min_n, max_n, width, device=DEVICE):
    """``fn`` on torch copies of the numpy inputs; returns (out_tokens, out_num) as numpy."""
    out_tokens = torch.full((history.shape[0], width), FILL, dtype=torch.int64, device=device)
    out_num = torch.full((history.shape[0],), 99, dtype=torch.int32, device=device)
    fn(
        torch.from_numpy(history).to(device),
        torch.from_numpy(np.asarray(slots)).to(device),
        torch.from_numpy(np.asarray(lengths)).to(device),
        torch.from_numpy(np.asarray(active, dtype=bool)).to(device),
        k,
        min_n,
        max_n,
        out_tokens,
        out_num,
    )
    return out_tokens.cpu().numpy(), out_num.cpu().numpy()


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"n{w[0]}-{w[1]}")
def test_reference_equals_host_propose(window):
    min_n, max_n = window
    drafted = 0
    for seed in range(6):
        rng = np.random.default_rng([seed, *window])
        vocab = int(rng.integers(5, 9))
        k = int(rng.integers(1, 6))
        seq_len = int(rng.integers(max_n + 2, 48))
        history, slots, lengths, active = random_batch(rng, 24, seq_len, 16, vocab, window, 7)
        slots = slots.astype(np.int32 if seed % 2 else np.int64)
        want = host_expected(history, slots, lengths, active, k, min_n, max_n, 6)
        got = run(ngram_propose_ref, history, slots, lengths, active, k, min_n, max_n, 6)
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"seed {seed}")
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"seed {seed}")
        drafted += int((want[1][slots] > 0).sum())
    assert drafted >= 10  # the histories match often enough to test something


def by_hand(rows: list[list[int]], active=None, k: int = 3, window=(2, 3), fn=ngram_propose_ref):
    """``fn`` on a table of the ``rows`` (slot b = row b, padded with 0 to width 12)."""
    history = np.zeros((len(rows), 12), dtype=np.int32)
    for s, row in enumerate(rows):
        history[s, : len(row)] = row
    slots = np.arange(len(rows))
    active = [True] * len(rows) if active is None else active
    tokens, num = run(fn, history, slots, [len(r) for r in rows], active, k, *window, 4)
    return tokens.tolist(), num.tolist()


def test_reference_by_hand():
    x = FILL
    rows = [
        [1, 2, 3, 4, 5],  # no earlier 4 5 or 5: nothing, tokens untouched
        [7, 8, 9, 7, 8],  # "7 8" at 0, then 9 7 8: cut by the history's end at k = 4
        [1, 2, 5, 1, 2, 6, 1, 2],  # "1 2" at 0 and 3: the right-most (3) wins -> 6 1 2
        [4, 1, 2, 8, 9, 1, 2, 3, 4, 1, 2],  # "4 1 2" at 0 (n=3) beats "1 2" at 5 -> 8 9 1 2
        [3, 3, 3, 3],  # inactive
        [5, 5],  # "5" at 0 only matches at n = 1, outside (2, 3)
    ]
    tokens, num = by_hand(rows, active=[True] * 4 + [False, True], k=4)
    assert num == [0, 3, 3, 4, 0, 0]
    assert tokens == [
        [x, x, x, x],
        [9, 7, 8, x],
        [6, 1, 2, x],
        [8, 9, 1, 2],
        [x, x, x, x],
        [x, x, x, x],
    ]
    # the window overlapping the suffix counts: "5" at 0 then 5; "3 3 3" at 0 then 3 (k = 2)
    assert by_hand([[5, 5], [3, 3, 3, 3]], k=2, window=(1, 3)) == (
        [[5, x, x, x], [3, x, x, x]],
        [1, 1],
    )
    # k = 0: no drafts at all, out_num 0 for the rows, tokens untouched
    assert by_hand([[7, 8, 7, 8]], k=0) == ([[x, x, x, x]], [0])


def test_rows_write_only_their_slots_and_bad_arguments():
    history = torch.tensor([[1, 2, 1, 2], [6, 6, 6, 6], [4, 5, 4, 5]], dtype=torch.int32)
    out_tokens = torch.full((3, 2), FILL, dtype=torch.int64)
    out_num = torch.full((3,), 99, dtype=torch.int32)
    args = (torch.tensor([2, 0]), torch.tensor([3, 4]), torch.tensor([True, True]), 2, 1, 2)
    ngram_propose_ref(history, *args, out_tokens, out_num)
    # slot 2: "4 5 4" -> "4" at 0 then 5 4; slot 0: "1 2" at 0 then 1 2; slot 1 untouched
    assert out_num.tolist() == [2, 99, 2]
    assert out_tokens.tolist() == [[1, 2], [FILL, FILL], [5, 4]]
    with pytest.raises(ValueError, match="needs 1 <= min <= max"):
        ngram_propose_ref(history, *args[:4], 3, 2, out_tokens, out_num)
    with pytest.raises(ValueError, match="out_tokens has shape"):
        ngram_propose_ref(history, *args[:3], 3, 1, 2, out_tokens, out_num)
    with pytest.raises(ValueError, match="lengths has shape"):
        ngram_propose_ref(history, args[0], args[1][:1], *args[2:], out_tokens, out_num)


def test_inactive_rows_may_share_a_sink_slot():
    """Padding rows all point at one sink slot (the last), inactive: it gets 0 drafts."""
    history = np.array([[1, 2, 1, 2], [3, 4, 3, 4], [5, 5, 5, 5]], dtype=np.int32)
    slots, lengths, active = [2, 0, 2, 2], [4, 4, 4, 3], [False, True, False, False]
    tokens, num = run(ngram_propose_ref, history, slots, lengths, active, 2, 1, 2, 3)
    assert num.tolist() == [2, 99, 0]
    assert tokens.tolist() == [[1, 2, FILL], [FILL] * 3, [FILL] * 3]


# --------------------------------------------------------------------------------------------
# GPU: a real table


def real_batch(seed: int):
    rng = np.random.default_rng(seed)
    return random_batch(rng, 256, 4096, 64, 50, (2, 4), 6)


@pytest.mark.gpu
@needs_cuda
def test_gpu_reference_equals_cpu():
    args = (*real_batch(4), 4, 2, 4, 8)
    want = run(ngram_propose_ref, *args, device=torch.device("cpu"))
    got = run(ngram_propose_ref, *args, device=torch.device("cuda"))
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
