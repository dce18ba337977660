"""Device n-gram drafts (``spec_decode/ngram_device.py``, ``ngram_triton.py``): the torch
reference against the host ``propose`` on seeded histories and hand-worked cases, and the Triton
kernel against the reference (under the interpreter without CUDA). The ``gpu`` tests use a real
table (256 slots of 4096 tokens, batch 64)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from mrv2_prof.runner.core.ngram_proposer import propose
from mrv2_prof.runner.worker.spec_decode.ngram_device import (
    ngram_propose,
    ngram_propose_ref,
    ngram_step,
    ngram_step_ref,
)
from mrv2_prof.runner.worker.spec_decode.ngram_triton import ngram_propose_triton, ngram_step_triton

INTERPRET = not torch.cuda.is_available()
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
WINDOWS = [(1, 1), (2, 4), (1, 3), (3, 3)]
FILL = -7  # what out_tokens holds before a call: positions past the drafts keep it


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


# --------------------------------------------------------------------------------------------
# Triton: the kernel against the reference (the interpreter runs it without CUDA)


def test_kernel_by_hand():
    rows = [[1, 2, 3, 4, 5], [7, 8, 9, 7, 8], [1, 2, 5, 1, 2, 6, 1, 2], [3, 3, 3, 3]]
    assert by_hand(rows, [True] * 3 + [False], 4, fn=ngram_propose_triton) == by_hand(
        rows, [True] * 3 + [False], 4
    )


@pytest.mark.parametrize("block", [16, 256])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"n{w[0]}-{w[1]}")
def test_kernel_equals_the_reference(window, block):
    """Block 16 scans a 64-token history in several steps (from its end, stopping at the block
    with the right-most match); 256 in one."""
    min_n, max_n = window
    kernel = functools.partial(ngram_propose_triton, block=block)
    drafted = 0
    for seed in range(4):
        rng = np.random.default_rng([seed, 7, *window])
        k = int(rng.integers(1, 6))
        history, slots, lengths, active = random_batch(rng, 8, 64, 6, 5, window, 2)
        args = (history, slots, lengths, active, k, min_n, max_n, 5)
        want = run(ngram_propose_ref, *args)
        got = run(kernel, *args)
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"seed {seed}")
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"seed {seed}")
        drafted += int((want[1][slots] > 0).sum())
    assert drafted >= 6


def test_dispatch():
    history = np.array([[1, 2, 3, 1, 2]], dtype=np.int32)
    for use_triton in (False, True):
        fn = functools.partial(ngram_propose, triton=use_triton)
        tokens, num = run(fn, history, [0], [5], [True], 2, 1, 2, 2)
        assert num.tolist() == [2] and tokens.tolist() == [[3, 1]]


@pytest.mark.parametrize("fn", [ngram_propose_ref, ngram_propose_triton], ids=["ref", "triton"])
def test_inactive_rows_may_share_a_sink_slot(fn):
    """Padding rows all point at one sink slot (the last), inactive: it gets 0 drafts."""
    history = np.array([[1, 2, 1, 2], [3, 4, 3, 4], [5, 5, 5, 5]], dtype=np.int32)
    slots, lengths, active = [2, 0, 2, 2], [4, 4, 4, 3], [False, True, False, False]
    tokens, num = run(fn, history, slots, lengths, active, 2, 1, 2, 3)
    assert num.tolist() == [2, 99, 0]
    assert tokens.tolist() == [[1, 2, FILL], [FILL] * 3, [FILL] * 3]


# --------------------------------------------------------------------------------------------
# A whole step (ngram_step_*): the history appends, then the drafts

KINDS = ("decode", "final", "last", "mid", "padding")
KIND_ODDS = (0.35, 0.15, 0.2, 0.15, 0.15)


def step_case(rng, num_slots: int, width: int, num_rows: int, k: int, verify: bool, vocab: int):
    """A step's inputs as numpy arrays (a dict of ``ngram_step``'s keywords) over tables of
    ``num_slots + 1`` rows (the last: the sink) and ``width + 1`` columns (the last: the sink
    column). Each real row has a slot of its own and is one of: a decode (a verify in a verify
    step: ``num_slots`` in [0, k], ``num_accepted`` up to it), a prompt's final chunk (``seq ==
    prompt``), a prompt chunk leaving one prompt token (``seq == prompt - 1``), an earlier chunk
    (``seq < prompt - 1``); padding rows (count 0) point at any slot, a real row's too. Every
    real token lands before the sink column. Tokens come from ``vocab`` values, so n-grams
    recur; the table's other cells (past each history, the sink row and column) hold noise."""
    history = rng.integers(0, vocab, (num_slots + 1, width + 1)).astype(np.int32)
    prompt_lens = rng.integers(1, width + 1, num_slots).astype(np.int32)  # unused slots: noise
    e = k + 1 if verify else 1
    slots = np.zeros(num_rows, dtype=np.int64)
    counts = np.zeros(num_rows, dtype=np.int32)
    seq_lens = np.zeros(num_rows, dtype=np.int32)
    emitted = rng.integers(0, vocab, (num_rows, e)).astype(np.int64)
    num_slots_ = np.zeros(num_rows, dtype=np.int32)
    num_accepted = np.zeros(num_rows, dtype=np.int64)
    free = list(rng.permutation(num_slots))
    kinds = []
    for b in range(num_rows):
        kind = KINDS[int(rng.choice(len(KINDS), p=KIND_ODDS))] if free else "padding"
        kinds.append(kind)
        if kind == "padding":
            slots[b] = 0 if rng.random() < 0.5 else rng.integers(num_slots)
            seq_lens[b] = rng.integers(0, width)
            if verify:
                num_slots_[b] = rng.integers(0, k + 1)
                num_accepted[b] = rng.integers(0, num_slots_[b] + 1)
            continue
        slots[b] = slot = free.pop()
        counts[b] = rng.integers(1, 5)
        if kind == "decode":
            prompt = int(rng.integers(1, width))
            seq = int(rng.integers(prompt, width))
            if verify:  # its tokens from first = seq - num_slots >= prompt on
                num_slots_[b] = rng.integers(0, min(k, seq - prompt) + 1)
                num_accepted[b] = rng.integers(0, num_slots_[b] + 1)
            if rng.random() < 0.6:  # the last few tokens and the emitted repeat a stretch
                first = seq - num_slots_[b]
                pre = min(3, first // 2)
                at = int(rng.integers(0, first - pre))
                stretch = history[slot, at : at + pre + e].copy()
                history[slot, first - pre : first] = stretch[:pre]
                emitted[b, : len(stretch) - pre] = stretch[pre:]
        elif kind == "final":
            prompt = seq = int(rng.integers(1, width))
        elif kind == "last":
            prompt = int(rng.integers(2, width + 1))
            seq = prompt - 1
        else:
            prompt = int(rng.integers(3, width + 1))
            seq = int(rng.integers(1, prompt - 1))
        if verify and kind != "decode":  # a prompt chunk: any counts, nothing to emit
            num_slots_[b] = rng.integers(0, min(k, seq) + 1)
            num_accepted[b] = rng.integers(0, num_slots_[b] + 1)
        prompt_lens[slot] = prompt
        seq_lens[b] = seq
    case = {
        "history": history,
        "out_tokens": np.full((num_slots + 1, max(k, 1) + 1), FILL, dtype=np.int64),
        "out_num": np.full(num_slots + 1, 99, dtype=np.int32),
        "slots": slots.astype(np.int32 if rng.random() < 0.5 else np.int64),
        "counts": counts,
        "seq_lens": seq_lens,
        "prompt_lens": prompt_lens,
        "emitted": emitted,
        "num_accepted": num_accepted if verify else None,
        "num_slots": num_slots_ if verify else None,
    }
    return case, kinds


def step_oracle(case, k, min_n, max_n):
    """The step row by row, on host lists, with ``propose``: (history, out_tokens, out_num)."""
    history = case["history"].copy()
    tokens, num = case["out_tokens"].copy(), case["out_num"].copy()
    sink = history.shape[0] - 1
    verify = case["num_slots"] is not None
    for b, slot in enumerate(case["slots"].tolist()):
        if case["counts"][b] == 0:  # padding: the sink gets no drafts
            num[sink] = 0
            continue
        prompt, seq = int(case["prompt_lens"][slot]), int(case["seq_lens"][b])
        first = seq - int(case["num_slots"][b]) if verify else seq
        emit = int(case["num_accepted"][b]) + 1 if verify else 1
        row = history[slot].tolist()
        if first >= prompt:  # past its prompt: append, draft from all of it
            row[first : first + emit] = case["emitted"][b, :emit].tolist()
            history[slot] = row
            drafts = propose(row[: first + emit], k, min_n, max_n)
        elif seq == prompt - 1:  # leaves one prompt token: drafts from the prompt
            drafts = propose(row[:prompt], k, min_n, max_n)
        else:
            drafts = []
        tokens[slot, : len(drafts)] = drafts
        num[slot] = len(drafts)
    return history, tokens, num


def run_step(fn, case, k, min_n, max_n, device=DEVICE):
    """``fn`` on torch copies of ``case`` (left as it was); returns (history, out_tokens,
    out_num) as numpy."""
    t = {name: None if a is None else torch.tensor(a, device=device) for name, a in case.items()}
    fn(**t, k=k, min_n=min_n, max_n=max_n)
    return tuple(t[name].cpu().numpy() for name in ("history", "out_tokens", "out_num"))


def num_drafted(out_num) -> int:
    """The slots a step gave drafts (those of no row keep 99; the sink gets none)."""
    return int(((out_num[:-1] > 0) & (out_num[:-1] != 99)).sum())


def assert_step_equal(got, want, msg=""):
    """Equal tables, the history's sink column aside (what it holds afterwards is unspecified)."""
    np.testing.assert_array_equal(got[0][:, :-1], want[0][:, :-1], err_msg=f"history {msg}")
    np.testing.assert_array_equal(got[2], want[2], err_msg=f"out_num {msg}")
    np.testing.assert_array_equal(got[1], want[1], err_msg=f"out_tokens {msg}")


@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"n{w[0]}-{w[1]}")
def test_step_reference_equals_the_oracle(window, verify):
    min_n, max_n = window
    drafted, kinds_seen = 0, []
    for seed in range(8):
        rng = np.random.default_rng([seed, int(verify), *window])
        k = int(rng.integers(1, 5))
        width = int(rng.integers(max_n + 3, 40))
        vocab = int(rng.choice([3, 4, 8]))
        case, kinds = step_case(rng, 10, width, int(rng.integers(4, 11)), k, verify, vocab)
        want = step_oracle(case, k, min_n, max_n)
        got = run_step(ngram_step_ref, case, k, min_n, max_n)
        assert_step_equal(got, want, f"seed {seed}")
        drafted += num_drafted(want[2])
        kinds_seen += kinds
    assert set(kinds_seen) == set(KINDS)
    writers = sum(kind in ("decode", "final") for kind in kinds_seen)
    assert drafted >= 12 and writers >= 8  # enough happened to test something


def test_step_reference_by_hand():
    """One verify row accepting 2 of its 3 drafts, one prompt chunk leaving one prompt token,
    and a padding row on the chunk's slot."""
    x = FILL
    history = np.zeros((4, 13), dtype=np.int32)  # 3 slots + the sink; 12 columns + the sink
    history[1, :6] = [4, 1, 2, 3, 4, 1]  # slot 1: prompt 4 1 2, then 3 4 1
    history[0, :7] = [5, 6, 5, 6, 7, 5, 6]  # slot 0: a prompt of 7
    case = {
        "history": history,
        "out_tokens": np.full((4, 3), x, dtype=np.int64),
        "out_num": np.full(4, 99, dtype=np.int32),
        "slots": np.array([1, 0, 0]),
        "counts": np.array([4, 3, 0], dtype=np.int32),
        # slot 1 verifies the drafts at 6, 7, 8 (its last token at 5): 9; slot 0 computed 6
        "seq_lens": np.array([9, 6, 0], dtype=np.int32),
        "prompt_lens": np.array([7, 3, 5], dtype=np.int32),
        "emitted": np.array([[2, 3, 4, 99], [8, 8, 8, 8], [1, 1, 1, 1]]),
        "num_accepted": np.array([2, 0, 0]),
        "num_slots": np.array([3, 0, 0], dtype=np.int32),
    }
    for fn in (ngram_step_ref, ngram_step_triton):
        got_history, tokens, num = run_step(fn, case, 3, 2, 3)
        # slot 1: 2 3 (accepted) and 4 (the bonus) at 6, 7, 8; 99 is not written
        assert got_history[1, :12].tolist() == [4, 1, 2, 3, 4, 1, 2, 3, 4, 0, 0, 0]
        assert (got_history[[0, 2, 3], :12] == history[[0, 2, 3], :12]).all()  # untouched
        # slot 1: "2 3 4" at 2 (n = 3), then 1 2 3; slot 0 (the whole prompt, its 8 not
        # written): no "7 5 6" earlier, "5 6" at 0 and 2 (5 is the suffix): after 2, 7 5 6;
        # slot 2 untouched; the sink (row 3): 0 from the padding row
        assert num.tolist() == [3, 3, 99, 0]
        assert tokens.tolist() == [[7, 5, 6], [1, 2, 3], [x, x, x], [x, x, x]]


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"n{w[0]}-{w[1]}")
def test_step_kernel_equals_the_reference(window, block):
    """Small tables (up to 8 slots of 64 tokens, batches of up to 6); block 16 scans a history
    in several steps. Plain and verify steps alternate."""
    min_n, max_n = window
    kernel = functools.partial(ngram_step_triton, block=block)
    drafted = 0
    for seed in range(6):
        rng = np.random.default_rng([seed, 11, *window])
        k = int(rng.integers(1, 5))
        num_slots, width = int(rng.integers(4, 9)), int(rng.integers(max_n + 3, 65))
        vocab = int(rng.choice([3, 4, 8]))
        case, _ = step_case(rng, num_slots, width, int(rng.integers(3, 7)), k, seed % 2 == 1, vocab)
        want = run_step(ngram_step_ref, case, k, min_n, max_n)
        got = run_step(kernel, case, k, min_n, max_n)
        assert_step_equal(got, want, f"seed {seed}")
        drafted += num_drafted(want[2])
    assert drafted >= 5


def test_step_dispatch_and_bad_arguments():
    case = {
        "history": np.array([[1, 2, 3, 1, 2, 0, 0], [0] * 7], dtype=np.int32),
        "out_tokens": np.full((2, 2), FILL, dtype=np.int64),
        "out_num": np.full(2, 99, dtype=np.int32),
        "slots": np.array([0]),
        "counts": np.array([1], dtype=np.int32),
        "seq_lens": np.array([4], dtype=np.int32),
        "prompt_lens": np.array([2], dtype=np.int32),
        "emitted": np.array([[2]]),  # 1 2 3 1 2 -> "1 2" at 0, then 3 1
        "num_accepted": None,
        "num_slots": None,
    }
    for use_triton in (False, True):
        fn = functools.partial(ngram_step, triton=use_triton)
        _, tokens, num = run_step(fn, case, 2, 1, 2)
        assert num.tolist() == [2, 99] and tokens.tolist() == [[3, 1], [FILL, FILL]]
    bad = [
        ({"emitted": np.array([[2, 3]])}, "a plain step emits one"),
        ({"num_accepted": np.array([0])}, "go together"),
        ({"prompt_lens": np.array([2, 2], dtype=np.int32)}, "prompt_lens has shape"),
        ({"counts": np.array([1, 1], dtype=np.int32)}, "counts has shape"),
    ]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            run_step(ngram_step_ref, {**case, **change}, 2, 1, 2)


# --------------------------------------------------------------------------------------------
# GPU: a real table

needs_cuda = pytest.mark.skipif(INTERPRET, reason="needs CUDA")


def real_batch(seed: int):
    rng = np.random.default_rng(seed)
    return random_batch(rng, 256, 4096, 64, 50, (2, 4), 6)


@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_equals_the_reference():
    args = (*real_batch(3), 4, 2, 4, 8)
    want = run(ngram_propose_ref, *args, device=torch.device("cuda"))
    got = run(ngram_propose_triton, *args, device=torch.device("cuda"))
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert (want[1] > 0).sum() > 16


@pytest.mark.gpu
@needs_cuda
def test_gpu_reference_equals_cpu():
    args = (*real_batch(4), 4, 2, 4, 8)
    want = run(ngram_propose_ref, *args, device=torch.device("cpu"))
    got = run(ngram_propose_ref, *args, device=torch.device("cuda"))
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
def test_gpu_step_kernel_equals_the_reference(verify):
    """256 slots of 2048 tokens, a batch of 64, k = 4."""
    rng = np.random.default_rng([5, int(verify)])
    case, _ = step_case(rng, 256, 2048, 64, 4, verify, 50)
    cuda = torch.device("cuda")
    want = run_step(ngram_step_ref, case, 4, 2, 4, device=cuda)
    got = run_step(ngram_step_triton, case, 4, 2, 4, device=cuda)
    assert_step_equal(got, want)
    assert num_drafted(want[2]) > 4
