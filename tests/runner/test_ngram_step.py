"""A whole step of device n-gram drafts (``ngram_device.ngram_step_ref`` and its Triton kernel
``ngram_triton.ngram_step_triton``): the history appends, then the drafts. The reference against
a host oracle built on ``propose``, the kernel against the reference (under the interpreter
without CUDA). The ``gpu`` test uses a real table (256 slots of 2048 tokens, batch 64)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from mrv2_prof.runner.core.ngram_proposer import propose
from mrv2_prof.runner.worker.spec_decode.ngram_device import ngram_step, ngram_step_ref
from mrv2_prof.runner.worker.spec_decode.ngram_triton import ngram_step_triton
from tests.runner.ngram_tables import DEVICE, FILL, WINDOWS, needs_cuda

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
