"""What the Triton sampler tests share: sampling metadata on the tests' device, per-mode
parameters and host flags, the comparison with the torch reference ``sampler.sample`` (tokens
and logprob ids equal, logprob values within ``LOGPROB_ATOL``), seeded logits, the kernels' RNG
as noise tables, and the batch-order check."""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.sampler import SamplerOutput, SamplingMetadata, sample
from mrv2_prof.runner.worker.sampler_rng_triton import gumbel, is_interpreted, row_key, uniform
from mrv2_prof.runner.worker.sampler_triton import sample_triton
from tests.runner.sampler_cases import make_meta as _make_meta

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOGPROB_ATOL = 2e-5
MODES = ("greedy", "temperature", "top_k", "top_p", "top_k_top_p", "mixed")


def make_meta(*args, device: str = DEVICE, **kwargs) -> SamplingMetadata:
    """``sampler_cases.make_meta`` on this module's device."""
    return _make_meta(*args, device=device, **kwargs)


def mode_params(rng: np.random.Generator, mode: str, num: int, vocab_size: int) -> dict:
    """Per-slot sampling parameters of one kind, or a mix of all kinds (``mixed``)."""
    kind = {m: i for i, m in enumerate(MODES[:-1])}
    kinds = rng.integers(0, 5, num) if mode == "mixed" else np.full(num, kind[mode])
    temperature = np.where(kinds == 0, 0.0, rng.uniform(0.3, 2.0, num))
    temperature[(kinds == 0) & (np.arange(num) % 3 == 1)] = 5e-6  # below the greedy threshold
    with_k, with_p = (kinds == 2) | (kinds == 4), (kinds == 3) | (kinds == 4)
    top_k = np.where(with_k, rng.integers(1, vocab_size // 10 + 2, num), 0)  # k may be V
    top_p = np.where(with_p, rng.uniform(0.05, 0.95, num), 1.0)
    seeds = rng.integers(-(2**63), 2**63, num, dtype=np.int64)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds)


def mode_flags(mode: str) -> dict:
    """The host flags a batch builder would set for a batch of this mode."""
    return dict(
        all_greedy=mode == "greedy",
        no_top_k=mode not in ("top_k", "top_k_top_p", "mixed"),
        no_top_p=mode not in ("top_p", "top_k_top_p", "mixed"),
    )


def meta_for(params: dict, positions, max_num_logprobs: int = 0, **kw) -> SamplingMetadata:
    return make_meta(
        **{name: values.tolist() for name, values in params.items()},
        positions=list(positions),
        max_num_logprobs=max_num_logprobs,
        **kw,
    )


def assert_same_output(got: SamplerOutput, want: SamplerOutput) -> None:
    """Tokens and logprob ids equal; logprob values within ``LOGPROB_ATOL``. On a token mismatch
    the first differing rows are named."""
    diff = torch.nonzero(got.sampled_token_ids != want.sampled_token_ids).flatten()[:8].tolist()
    assert not diff, (
        f"{len(diff)}+ rows differ, first rows {diff}: "
        f"{got.sampled_token_ids[diff].tolist()} != {want.sampled_token_ids[diff].tolist()}"
    )
    assert got.sampled_token_ids.dtype == torch.int64
    if want.logprobs is None:
        assert got.logprobs is None and got.logprob_token_ids is None
        return
    assert torch.equal(got.logprob_token_ids, want.logprob_token_ids)
    assert got.logprobs.dtype == torch.float32
    torch.testing.assert_close(
        got.logprobs, want.logprobs, atol=LOGPROB_ATOL, rtol=1e-6, equal_nan=True
    )


def check_against_reference(logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
    got = sample_triton(logits, meta)
    assert_same_output(got, sample(logits, meta))
    return got


def random_logits(rng, num_rows: int, vocab_size: int, scale: float = 3.0) -> torch.Tensor:
    logits = rng.normal(0, scale, (num_rows, vocab_size)).astype(np.float32)
    return torch.from_numpy(logits).to(DEVICE)


@triton.jit
def _noise_kernel(
    seeds_ptr,
    positions_ptr,
    out_ptr,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    GUMBEL: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """[B, V] uniform (or Gumbel) noise from the sampler's RNG, one row block per program."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    key = row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row))
    noise = gumbel(key, cols, PRECISE) if GUMBEL else uniform(key, cols)
    tl.store(out_ptr + row.to(tl.int64) * vocab_size + cols, noise, mask=cols < vocab_size)


def _noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, as_gumbel: bool):
    seeds = seeds.to(torch.int64).contiguous()
    positions = positions.to(torch.int64).contiguous()
    out = torch.empty(seeds.shape[0], vocab_size, dtype=torch.float32, device=seeds.device)
    block_size = min(1024, max(16, triton.next_power_of_2(vocab_size)))
    if out.numel():
        grid = (seeds.shape[0], triton.cdiv(vocab_size, block_size))
        _noise_kernel[grid](
            seeds,
            positions,
            out,
            vocab_size,
            BLOCK_SIZE=block_size,
            GUMBEL=as_gumbel,
            PRECISE=not is_interpreted(),
        )
    return out


def uniform_noise_triton(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int):
    """The kernels' uniform noise [B, V] float32: equals ``sampler.uniform_noise`` bit for bit."""
    return _noise(seeds, positions, vocab_size, as_gumbel=False)


def gumbel_noise_triton(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int):
    """The kernels' Gumbel noise [B, V] float32 (``sampler.gumbel_noise``; on CUDA bit for bit)."""
    return _noise(seeds, positions, vocab_size, as_gumbel=True)


def check_permutation_invariance(logits: torch.Tensor, params: dict, positions: np.ndarray):
    """Permuting the batch rows (with their idx_mapping and positions) permutes the tokens."""
    num_rows = logits.shape[0]
    idx_mapping = np.arange(num_rows)
    base = sample_triton(logits, meta_for(params, positions, idx_mapping=idx_mapping.tolist()))
    perm = np.random.default_rng(11).permutation(num_rows)
    meta = meta_for(params, positions[perm], idx_mapping=idx_mapping[perm].tolist())
    permuted = sample_triton(logits[torch.from_numpy(perm).to(logits.device)], meta)
    assert torch.equal(
        permuted.sampled_token_ids, base.sampled_token_ids[torch.from_numpy(perm).to(DEVICE)]
    )
