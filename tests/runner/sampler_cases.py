"""What the sampler tests share, computed independently of the sampler: chi-square quantiles and
Pearson's statistic, the set top-k then top-p may keep (by its definition), sampling metadata
with one slot per row, and seeded mixed sampling parameters."""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.runner.worker.sampler import SamplingMetadata


def chi2_quantile(q: float, dof: int) -> float:
    """Quantile of chi-square(dof) by bisection on its CDF, the regularised gamma P(dof/2, x/2)."""
    lo, hi = 0.0, dof + 100.0 * (dof**0.5 + 1.0)
    k = torch.tensor(dof / 2.0, dtype=torch.float64)
    for _ in range(200):
        mid = (lo + hi) / 2.0
        cdf = torch.special.gammainc(k, torch.tensor(mid / 2.0, dtype=torch.float64)).item()
        lo, hi = (mid, hi) if cdf < q else (lo, mid)
    return (lo + hi) / 2.0


def pearson_chi2(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def allowed_tokens(scaled: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Boolean [V] of the tokens top-k then top-p may keep, from float32 ``logits / T``.

    The top-k cut compares the same float32 values the sampler sees (so it is exact, ties at the
    k-th value included); the nucleus is computed in float64 by its definition: the fewest most
    likely tokens whose probability mass reaches ``top_p``.
    """
    vocab_size = scaled.shape[0]
    keep = np.ones(vocab_size, dtype=bool)
    if 0 < top_k < vocab_size:
        keep &= scaled >= np.sort(scaled)[::-1][top_k - 1]
    if top_p < 1.0:
        kept = np.sort(scaled[keep].astype(np.float64))[::-1]
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        mass = np.cumsum(probs)
        num_kept = int(np.argmax(mass >= top_p)) + 1 if mass[-1] >= top_p else kept.size
        keep &= scaled >= kept[num_kept - 1]
    return keep


def make_meta(
    temperature,
    top_k=None,
    top_p=None,
    seeds=None,
    positions=None,
    idx_mapping=None,
    max_num_logprobs: int = 0,
    device: str = "cpu",
    **flags,
) -> SamplingMetadata:
    """Metadata with one slot per row (slot i = row i) unless ``idx_mapping`` is given."""
    num_slots = len(temperature)
    if idx_mapping is None:
        idx_mapping = range(num_slots)
    num_rows = len(idx_mapping)
    return SamplingMetadata(
        idx_mapping=torch.tensor(list(idx_mapping), dtype=torch.int32, device=device),
        positions=torch.tensor(
            list(positions) if positions is not None else [0] * num_rows,
            dtype=torch.int64,
            device=device,
        ),
        temperature=torch.tensor(list(temperature), dtype=torch.float32, device=device),
        top_k=torch.tensor(
            list(top_k) if top_k is not None else [0] * num_slots, dtype=torch.int32, device=device
        ),
        top_p=torch.tensor(
            list(top_p) if top_p is not None else [1.0] * num_slots,
            dtype=torch.float32,
            device=device,
        ),
        seeds=torch.tensor(
            list(seeds) if seeds is not None else range(num_slots), dtype=torch.int64, device=device
        ),
        max_num_logprobs=max_num_logprobs,
        **flags,
    )


def random_params(rng: np.random.Generator, num: int, vocab_size: int) -> dict:
    """Mixed sampling parameters: greedy, pure temperature, top-k, top-p and both."""
    kind = rng.integers(0, 5, num)
    temperature = np.where(kind == 0, 0.0, rng.uniform(0.3, 2.0, num))
    top_k = np.where((kind == 2) | (kind == 4), rng.integers(1, vocab_size // 2, num), 0)
    top_p = np.where((kind == 3) | (kind == 4), rng.uniform(0.05, 0.95, num), 1.0)
    seeds = rng.integers(-(2**62), 2**62, num)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds)
