"""The Triton sampler against the torch reference ``sampler.sample``: same noise, same tokens.

Without CUDA the kernels run under the Triton interpreter at small sizes. Integer outputs (noise
bits, tokens, logprob ids) must be equal; logprob values within ``LOGPROB_ATOL`` (the kernel's
logsumexp sums in another order). The Gumbel noise is compared bit for bit on CUDA, where both
sides use libdevice ``logf``; the interpreter's numpy log may differ from torch's CPU log by one
ulp, so on CPU it is compared within 4e-6 (one ulp of each log, propagated). Real sizes on
CUDA: ``test_sampler_triton_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.gumbel_argmax_triton import gumbel_argmax
from mrv2_prof.runner.worker.sampler import gumbel_noise, sample, uniform_noise
from mrv2_prof.runner.worker.sampler_triton import (
    SPLIT_ARGMAX_MAX_ROWS,
    sample_triton,
    top_k_top_p_threshold,
)
from tests.runner.sampler_triton_cases import (
    DEVICE,
    LOGPROB_ATOL,
    MODES,
    check_against_reference,
    check_permutation_invariance,
    gumbel_noise_triton,
    make_meta,
    meta_for,
    mode_flags,
    mode_params,
    random_logits,
    uniform_noise_triton,
)

# --------------------------------------------------------------------------------------------
# Noise


def test_uniform_noise_is_the_reference_bit_for_bit():
    rng = np.random.default_rng(0)
    seeds = np.concatenate(
        [[0, 1, -1, 2**32, 2**32 - 1, 2**63 - 1, -(2**63)], rng.integers(-(2**63), 2**63, 13)]
    )
    positions = np.concatenate(
        [[0, 1, 2**31, 2**32 + 5, 2**32 - 1, 7, 0], rng.integers(0, 2**40, 13)]
    )
    seeds_t = torch.from_numpy(seeds.astype(np.int64)).to(DEVICE)
    positions_t = torch.from_numpy(positions.astype(np.int64)).to(DEVICE)
    for vocab_size in (1, 300, 2500):
        got = uniform_noise_triton(seeds_t, positions_t, vocab_size)
        want = uniform_noise(seeds_t, positions_t, vocab_size)
        assert got.dtype == torch.float32 and got.shape == (20, vocab_size)
        assert torch.equal(got, want), vocab_size


def test_gumbel_noise_matches_the_reference():
    rng = np.random.default_rng(1)
    seeds = torch.from_numpy(rng.integers(-(2**63), 2**63, 16, dtype=np.int64)).to(DEVICE)
    positions = torch.from_numpy(rng.integers(0, 2**20, 16)).to(DEVICE)
    got = gumbel_noise_triton(seeds, positions, 700)
    want = gumbel_noise(seeds, positions, 700)
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:  # numpy's float32 log vs torch's: each log within one ulp
        torch.testing.assert_close(got, want, atol=4e-6, rtol=0)


# --------------------------------------------------------------------------------------------
# Tokens


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("vocab_size", [1, 7, 600])
def test_tokens_equal_the_reference(mode: str, vocab_size: int):
    """Every parameter kind, with and without the host flags that skip inactive work."""
    rng = np.random.default_rng(MODES.index(mode) * 1000 + vocab_size)
    num_rows = 12
    logits = random_logits(rng, num_rows, vocab_size)
    params = mode_params(rng, mode, num_rows, vocab_size)
    positions = rng.integers(0, 10_000, num_rows)
    check_against_reference(logits, meta_for(params, positions, **mode_flags(mode)))
    check_against_reference(logits, meta_for(params, positions))  # no flags set


def test_random_rows_are_not_greedy():
    """The noise is applied: temperature rows at T=1 differ from argmax on some rows."""
    rng = np.random.default_rng(2)
    logits = random_logits(rng, 16, 64, scale=1.0)
    meta = make_meta([1.0] * 16, positions=range(16))
    out = check_against_reference(logits, meta)
    assert not torch.equal(out.sampled_token_ids, logits.argmax(dim=-1))


def test_ties_resolve_to_the_first_index():
    """Constant rows and rows of few distinct values: greedy picks the first maximum; top-k keeps
    every tie of the k-th value; splits holding equal maxima resolve to the earlier split."""
    rng = np.random.default_rng(3)
    num_rows, vocab_size = 10, 96
    values = rng.integers(0, 4, (num_rows, vocab_size)).astype(np.float32)
    values[:4] = 2.5  # constant rows
    logits = torch.from_numpy(values).to(DEVICE)
    for mode in ("greedy", "top_k", "mixed"):
        params = mode_params(rng, mode, num_rows, vocab_size)
        meta = meta_for(params, rng.integers(0, 100, num_rows), **mode_flags(mode))
        check_against_reference(logits, meta)
    greedy = make_meta([0.0] * num_rows, all_greedy=True, no_top_k=True, no_top_p=True)
    want = logits.argmax(dim=-1)
    assert torch.equal(want[:4].cpu(), torch.zeros(4, dtype=torch.int64))
    for split_size in (16, 32, 96):  # one block per split, several, a single split
        tokens, _ = gumbel_argmax(logits, greedy, block_size=16, split_size=split_size)
        assert torch.equal(tokens, want), split_size


@pytest.mark.parametrize("mode", ["greedy", "top_k_top_p", "mixed"])
def test_vocabulary_splits_and_blocks(mode: str):
    """Small blocks and splits reach the multi-block loop, a partial last block and a partial
    last split; the split reduction and the fused logsumexp give the reference's outputs."""
    rng = np.random.default_rng(4)
    num_rows, vocab_size = 4, 200
    logits = random_logits(rng, num_rows, vocab_size)
    logits[1, ::3] = float("-inf")  # a masked vocabulary
    params = mode_params(rng, mode, num_rows, vocab_size)
    meta = meta_for(params, rng.integers(0, 100, num_rows), **mode_flags(mode))
    want = sample(logits, meta).sampled_token_ids
    lse_want = torch.logsumexp(logits, dim=-1)
    for block_size, split_size in ((16, 48), (32, 32), (64, 256)):
        threshold = None
        if mode != "greedy":  # the thresholds sample_triton would pass
            idx = meta.idx_mapping.long()
            temperature = meta.temperature[idx]
            divisor = torch.where(temperature < 1e-5, 1.0, temperature)
            threshold = top_k_top_p_threshold(logits, divisor, meta.top_k[idx], meta.top_p[idx])
        tokens, lse = gumbel_argmax(
            logits, meta, threshold, with_lse=True, block_size=block_size, split_size=split_size
        )
        assert torch.equal(tokens, want), (block_size, split_size)
        torch.testing.assert_close(lse, lse_want, atol=LOGPROB_ATOL, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # -inf row
@pytest.mark.parametrize("mode", ["greedy", "mixed"])
def test_one_launch_reduction_equals_the_two_launch_form(mode: str):
    """The row's last split reduces it in the scan's launch: the same tokens and logsumexp as
    the scan + reduce launches, bit for bit, and every row's counter is back at 0 after it."""
    from mrv2_prof.runner.worker.gumbel_argmax_triton import WORKSPACE

    rng = np.random.default_rng(13)
    num_rows, vocab_size = 5, 300
    logits = random_logits(rng, num_rows, vocab_size)
    logits[2, :] = float("-inf")  # a row with no token: 0, as torch.argmax
    params = mode_params(rng, mode, num_rows, vocab_size)
    # no threshold passed: the reference without top-k / top-p is the one to compare against
    flags = dict(all_greedy=mode == "greedy", no_top_k=True, no_top_p=True)
    meta = meta_for(params, rng.integers(0, 100, num_rows), **flags)
    for split_size in (16, 48, 512):  # 19 splits, 7, one
        got = gumbel_argmax(logits, meta, with_lse=True, block_size=16, split_size=split_size)
        want = gumbel_argmax(
            logits, meta, with_lse=True, block_size=16, split_size=split_size, fused=False
        )
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), split_size
        assert got[0][2].item() == 0
        assert not WORKSPACE.buffers(logits.device)[-1].any()  # the counters
    assert torch.equal(got[0][[0, 1, 3, 4]], sample(logits, meta).sampled_token_ids[[0, 1, 3, 4]])


def test_split_partials_are_not_allocated_per_call():
    """The partials and counters are one workspace: a batch no larger than an earlier one
    reuses its buffers."""
    from mrv2_prof.runner.worker.gumbel_argmax_triton import WORKSPACE

    rng = np.random.default_rng(14)
    meta = make_meta([0.0] * 4, all_greedy=True, no_top_k=True, no_top_p=True)
    gumbel_argmax(random_logits(rng, 4, 200), meta, block_size=16, split_size=32)
    buffers = [t.data_ptr() for t in WORKSPACE.buffers(torch.device(DEVICE))]
    small = make_meta([0.0] * 2, all_greedy=True, no_top_k=True, no_top_p=True)
    for rows, meta_ in ((4, meta), (2, small), (4, meta)):
        logits = random_logits(rng, rows, 200)
        tokens, _ = gumbel_argmax(logits, meta_, block_size=16, split_size=32)
        assert torch.equal(tokens, logits.argmax(dim=-1))
        assert [t.data_ptr() for t in WORKSPACE.buffers(torch.device(DEVICE))] == buffers


def test_host_flags_and_slots():
    """all_greedy; top-k/top-p set per slot but skipped by the flags; idx_mapping into more slots
    than rows, in any order, with repeated slots at other positions."""
    rng = np.random.default_rng(5)
    num_rows, num_slots, vocab_size = 12, 40, 300
    logits = random_logits(rng, num_rows, vocab_size)
    params = mode_params(rng, "mixed", num_slots, vocab_size)
    idx_mapping = rng.permutation(num_slots)[:num_rows]
    idx_mapping[-3:] = idx_mapping[:3]
    positions = rng.integers(0, 2**33, num_rows)
    for flags in (
        {},
        dict(no_top_k=True),
        dict(no_top_p=True),
        dict(no_top_k=True, no_top_p=True),
        dict(all_greedy=True, no_top_k=True, no_top_p=True),
    ):
        meta = meta_for(params, positions, idx_mapping=idx_mapping.tolist(), **flags)
        check_against_reference(logits, meta)


def test_top_k_one_and_tiny_top_p_are_greedy():
    rng = np.random.default_rng(6)
    num_rows, vocab_size = 12, 400
    logits = random_logits(rng, num_rows, vocab_size, scale=1.0)
    temperature = rng.uniform(0.2, 3.0, num_rows).tolist()
    greedy = logits.argmax(dim=-1)
    for meta in (
        make_meta(temperature, top_k=[1] * num_rows, positions=range(num_rows)),
        make_meta(temperature, top_p=[1e-6] * num_rows, positions=range(num_rows)),
    ):
        assert torch.equal(check_against_reference(logits, meta).sampled_token_ids, greedy)


@pytest.mark.parametrize("num_rows", [1, SPLIT_ARGMAX_MAX_ROWS, SPLIT_ARGMAX_MAX_ROWS + 1])
def test_all_greedy_batches_of_a_few_rows_take_the_split_scan(num_rows, monkeypatch):
    """A batch-1 decode step's greedy token comes from the scan (the vocabulary split over the
    SMs), a larger all-greedy batch from one argmax; both are the first index of the maximum,
    from bfloat16 logits with ties."""
    import mrv2_prof.runner.worker.sampler_triton as sampler_triton

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return gumbel_argmax(*args, **kwargs)

    monkeypatch.setattr(sampler_triton, "gumbel_argmax", counting)
    rng = np.random.default_rng(8)
    logits = torch.from_numpy(rng.integers(0, 5, (num_rows, 3000)).astype(np.float32))
    logits = logits.to(DEVICE).to(torch.bfloat16)  # many ties of the maximum in each row
    meta = make_meta([0.0] * num_rows, all_greedy=True, no_top_k=True, no_top_p=True)
    out = sample_triton(logits, meta)
    assert torch.equal(out.sampled_token_ids, logits.float().argmax(dim=-1))
    assert len(calls) == (1 if num_rows <= SPLIT_ARGMAX_MAX_ROWS else 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(dtype: torch.dtype):
    """bf16/fp16 logits are read in their dtype; the reference converts them to float32 first.
    The top-k/top-p sort runs on the half-precision values (same order, same thresholds)."""
    rng = np.random.default_rng(7)
    num_rows, vocab_size = 16, 500
    logits = random_logits(rng, num_rows, vocab_size).to(dtype)
    params = mode_params(rng, "mixed", num_rows, vocab_size)
    meta = meta_for(params, rng.integers(0, 1000, num_rows), max_num_logprobs=4)
    check_against_reference(logits, meta)


def test_strided_logits_rows():
    """Logits rows inside a wider buffer (row stride > V) are read in place."""
    rng = np.random.default_rng(8)
    buffer = random_logits(rng, 12, 160)
    logits = buffer[:, :130]
    assert not logits.is_contiguous()
    params = mode_params(rng, "mixed", 12, 130)
    check_against_reference(logits, meta_for(params, range(12), max_num_logprobs=3))


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
def test_masked_vocabulary_rows():
    """-inf logits (a masked vocabulary) in some rows, and a row of only -inf, as the reference:
    such a row samples token 0 and its logprobs are NaN."""
    rng = np.random.default_rng(9)
    num_rows, vocab_size = 10, 120
    logits = random_logits(rng, num_rows, vocab_size)
    logits[:5, rng.permutation(vocab_size)[:100]] = float("-inf")
    logits[9] = float("-inf")
    params = mode_params(rng, "mixed", num_rows, vocab_size)
    params["temperature"][9] = 1.0
    out = check_against_reference(logits, meta_for(params, range(num_rows), max_num_logprobs=2))
    assert int(out.sampled_token_ids[9]) == 0


# --------------------------------------------------------------------------------------------
# Logprobs, batch independence


def test_logprobs_equal_the_reference():
    rng = np.random.default_rng(10)
    num_rows, vocab_size = 16, 900
    logits = random_logits(rng, num_rows, vocab_size)
    params = mode_params(rng, "mixed", num_rows, vocab_size)
    meta = meta_for(params, rng.integers(0, 1000, num_rows), max_num_logprobs=6)
    out = check_against_reference(logits, meta)
    assert out.logprob_token_ids.shape == (num_rows, 7)
    assert torch.equal(out.logprob_token_ids[:, 0], out.sampled_token_ids)
    want = torch.log_softmax(logits.double(), dim=-1).gather(1, out.logprob_token_ids)
    torch.testing.assert_close(out.logprobs.double(), want, atol=LOGPROB_ATOL, rtol=0)


def test_batch_order_independence():
    rng = np.random.default_rng(12)
    num_rows, vocab_size = 16, 250
    logits = random_logits(rng, num_rows, vocab_size)
    params = mode_params(rng, "mixed", num_rows, vocab_size)
    check_permutation_invariance(logits, params, rng.integers(0, 4096, num_rows))


def test_empty_batch_and_bad_inputs():
    meta = make_meta([], idx_mapping=[])
    out = sample_triton(torch.zeros(0, 10, device=DEVICE), meta)
    assert out.sampled_token_ids.shape == (0,)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample_triton(torch.zeros(10, device=DEVICE), make_meta([1.0]))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        sample_triton(torch.zeros(1, 10, dtype=torch.int32, device=DEVICE), make_meta([1.0]))
    with pytest.raises(ValueError, match="idx_mapping"):
        sample_triton(torch.zeros(2, 10, device=DEVICE), make_meta([1.0]))
