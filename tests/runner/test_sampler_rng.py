"""The sampler's stateless RNG against independently computed values: the uint32 hash bit for
bit, the noise's range and determinism, and the uniformity of its bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.sampler import gumbel_noise, random_bits, uniform_noise
from tests.runner.sampler_cases import chi2_quantile, pearson_chi2


def pcg_hash_np(x: np.ndarray) -> np.ndarray:
    """The PCG-RXS-M-XS hash in native numpy uint32 (wrapping) arithmetic."""
    x = x.astype(np.uint32)
    state = x * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def uniform_noise_np(seeds: np.ndarray, positions: np.ndarray, vocab_size: int) -> np.ndarray:
    seeds_u64 = seeds.astype(np.int64).view(np.uint64)
    key = pcg_hash_np((seeds_u64 >> np.uint64(32)).astype(np.uint32))
    key = pcg_hash_np(key + (seeds_u64 & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    key = pcg_hash_np(key + (positions.astype(np.int64).view(np.uint64)).astype(np.uint32))
    tokens = pcg_hash_np(np.arange(vocab_size, dtype=np.uint32))
    bits = pcg_hash_np(key[:, None] + tokens[None, :])
    return ((bits >> np.uint32(9)).astype(np.float64) + 0.5) / 2.0**23


# --------------------------------------------------------------------------------------------
# RNG


def test_chi2_quantile_matches_tables():
    # Published 0.999 critical values of chi-square (NIST/SEMATECH handbook table).
    assert chi2_quantile(0.999, 1) == pytest.approx(10.828, abs=2e-3)
    assert chi2_quantile(0.999, 7) == pytest.approx(24.322, abs=2e-3)
    assert chi2_quantile(0.999, 10) == pytest.approx(29.588, abs=2e-3)
    assert chi2_quantile(0.999, 60) == pytest.approx(99.607, abs=2e-3)


def test_uniform_noise_is_the_uint32_hash_bit_for_bit():
    """The int64 emulation equals native wrapping uint32 arithmetic (what a Triton kernel does)."""
    rng = np.random.default_rng(0)
    seeds = np.concatenate(
        [[0, 1, -1, 2**32, 2**63 - 1, -(2**63)], rng.integers(-(2**63), 2**63, 58)]
    )
    positions = np.concatenate([[0, 1, 2**31, 2**32 + 5, 7, 0], rng.integers(0, 2**40, 58)])
    got = uniform_noise(torch.from_numpy(seeds), torch.from_numpy(positions), 300)
    assert got.dtype == torch.float32 and got.shape == (64, 300)
    want = uniform_noise_np(seeds, positions, 300)
    assert np.array_equal(got.numpy().astype(np.float64), want)


def test_noise_range_and_determinism():
    seeds = torch.arange(-50, 50, dtype=torch.int64) * 7919
    positions = torch.arange(100, dtype=torch.int64)
    u = uniform_noise(seeds, positions, 2048)
    assert bool(((u > 0) & (u < 1)).all())
    assert float(u.min()) < 1e-3 and float(u.max()) > 1 - 1e-3
    assert torch.equal(u, uniform_noise(seeds, positions, 2048))
    g = gumbel_noise(seeds, positions, 2048)
    assert bool(torch.isfinite(g).all())
    # Gumbel(0, 1): mean = Euler-Mascheroni constant, variance = pi^2 / 6.
    assert float(g.double().mean()) == pytest.approx(0.5772, abs=0.01)
    assert float(g.double().var()) == pytest.approx(np.pi**2 / 6, abs=0.02)


def test_noise_is_a_function_of_seed_position_token_only():
    seeds = torch.tensor([3, 3, 3, 3 + 2**32, -3, 4], dtype=torch.int64)
    positions = torch.tensor([10, 11, 10 + 2**32, 10, 10, 10], dtype=torch.int64)
    u = uniform_noise(seeds, positions, 500)
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    assert torch.equal(uniform_noise(seeds[perm], positions[perm], 500), u[perm])
    assert torch.equal(uniform_noise(seeds, positions, 37), u[:, :37])
    # Positions are keyed by their low 32 bits (rows 0 and 2); every other pair of keys differs.
    assert torch.equal(u[0], u[2])
    for a, b in [(0, 1), (0, 3), (0, 4), (0, 5), (1, 3), (3, 4)]:
        assert float((u[a] == u[b]).float().mean()) < 0.01, (a, b)
    bits = random_bits(seeds, positions, 500)
    assert all(row.unique().numel() == 500 for row in bits)  # a bijection within a row


@pytest.mark.parametrize("pairing", ["high_bits", "low_bits", "token_pairs", "position_pairs"])
def test_rng_bits_are_uniform(pairing: str):
    """Pearson chi-square over 64 cells (63 dof) below its 0.999 quantile, 262k draws."""
    num_rows, vocab_size = 64, 4096
    seeds = torch.full((num_rows,), 12345, dtype=torch.int64)
    positions = torch.arange(num_rows, dtype=torch.int64)
    m = random_bits(seeds, positions, vocab_size) >> 9  # the 23 bits used by uniform_noise
    if pairing == "high_bits":
        cells = m >> 17
    elif pairing == "low_bits":
        cells = m & 63
    elif pairing == "token_pairs":  # (token t, token t+1) of a row, 3 high bits each
        cells = (m[:, 0::2] >> 20) * 8 + (m[:, 1::2] >> 20)
    else:  # (position p, position p+1) at the same token
        cells = (m[0::2] >> 20) * 8 + (m[1::2] >> 20)
    counts = np.bincount(cells.flatten().numpy(), minlength=64).astype(np.float64)
    expected = np.full(64, counts.sum() / 64)
    assert pearson_chi2(counts, expected) < chi2_quantile(0.999, 63)
