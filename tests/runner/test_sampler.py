"""Tests of the Gumbel-max sampler against independently computed values: draw frequencies,
top-k / top-p sets, logprobs, greedy rows, batch invariance. Its RNG: ``test_sampler_rng.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.sampler import (
    SamplingMetadata,
    apply_top_k_top_p,
    gumbel_noise,
    sample,
    uniform_noise,
)
from tests.runner.sampler_cases import (
    allowed_tokens,
    chi2_quantile,
    make_meta,
    pearson_chi2,
    random_params,
)

# --------------------------------------------------------------------------------------------
# Distribution


LOGITS_8 = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 1.2, 0.7], dtype=np.float32)


def sample_many(logits: np.ndarray, num: int, **params) -> np.ndarray:
    """``num`` draws for one request: 4 slots (seeds) x ``num / 4`` positions."""
    num_slots = 4
    meta = make_meta(
        **{name: [value] * num_slots for name, value in params.items()},
        seeds=[11, 2**40 + 3, -99, 123456789],
        idx_mapping=[i % num_slots for i in range(num)],
        positions=[i // num_slots for i in range(num)],
    )
    batch = torch.from_numpy(logits).expand(num, -1).contiguous()
    return sample(batch, meta).sampled_token_ids.numpy()


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_gumbel_max_frequencies_match_softmax(temperature: float):
    """32768 draws over 8 tokens: Pearson chi-square vs softmax(logits / T) < 0.999 quantile (7
    dof, about 24.3). The same counts against softmax(logits) (T = 1) must fail that bound, which
    shows the test can tell temperatures apart."""
    num = 32768
    tokens = sample_many(LOGITS_8, num, temperature=temperature)
    counts = np.bincount(tokens, minlength=8).astype(np.float64)
    bound = chi2_quantile(0.999, 7)
    assert pearson_chi2(counts, num * softmax64(LOGITS_8 / temperature)) < bound
    assert pearson_chi2(counts, num * softmax64(LOGITS_8)) > bound


def test_top_k_top_p_frequencies_match_renormalised_softmax():
    """top_k=5 then top_p=0.8 at T=1: draws stay in the allowed set, and their frequencies match
    the softmax renormalised over it (Pearson chi-square < 0.999 quantile, |set| - 1 dof)."""
    num = 32768
    tokens = sample_many(LOGITS_8, num, temperature=1.0, top_k=5, top_p=0.8)
    allowed = allowed_tokens(LOGITS_8, 5, 0.8)
    assert 2 <= allowed.sum() < 5  # top-p cuts inside the top 5
    counts = np.bincount(tokens, minlength=8).astype(np.float64)
    assert counts[~allowed].sum() == 0
    probs = softmax64(np.where(allowed, LOGITS_8, -np.inf))
    stat = pearson_chi2(counts[allowed], num * probs[allowed])
    assert stat < chi2_quantile(0.999, int(allowed.sum()) - 1)


# --------------------------------------------------------------------------------------------
# top-k / top-p


def check_allowed_sets(logits: torch.Tensor, params: dict, num_positions: int, device: str):
    """Sample every request at ``num_positions`` positions; check masks and draws row by row.

    The kept set of ``apply_top_k_top_p`` must lie between the reference sets for p - 1e-4 and
    p + 1e-4 (the slack covers float32 vs float64 cumulative sums), and every draw in the latter.
    """
    num_reqs, vocab_size = logits.shape
    temperature = params["temperature"]
    scaled = (
        logits.cpu()
        / torch.tensor(np.where(temperature == 0, 1.0, temperature), dtype=torch.float32)[:, None]
    ).numpy()
    random_rows = np.flatnonzero(temperature > 0)
    top_k = torch.tensor(params["top_k"][random_rows], device=device)
    top_p = torch.tensor(params["top_p"][random_rows], dtype=torch.float32, device=device)
    kept = apply_top_k_top_p(torch.from_numpy(scaled[random_rows]).to(device), top_k, top_p)
    kept = torch.isfinite(kept).cpu().numpy()

    meta = make_meta(
        **{name: values.tolist() for name, values in params.items()},
        idx_mapping=[i % num_reqs for i in range(num_reqs * num_positions)],
        positions=[1000 + i // num_reqs for i in range(num_reqs * num_positions)],
        device=device,
    )
    tokens = sample(logits.repeat(num_positions, 1), meta).sampled_token_ids
    tokens = tokens.cpu().numpy().reshape(num_positions, num_reqs)
    greedy = logits.argmax(dim=-1).cpu().numpy()
    for row in range(num_reqs):
        if temperature[row] == 0:
            assert (tokens[:, row] == greedy[row]).all()
            continue
        k, p = int(params["top_k"][row]), float(params["top_p"][row])
        upper = allowed_tokens(scaled[row], k, min(p + 1e-4, 1.0) if p < 1 else 1.0)
        lower = allowed_tokens(scaled[row], k, max(p - 1e-4, 0.0) if p < 1 else 1.0)
        mask = kept[np.searchsorted(random_rows, row)]
        assert (mask <= upper).all() and (lower <= mask).all(), (row, k, p)
        assert upper[tokens[:, row]].all(), (row, k, p)


def test_top_k_top_p_never_leave_the_allowed_set():
    rng = np.random.default_rng(1)
    num_reqs, vocab_size = 64, 50
    logits = torch.from_numpy(rng.normal(0, 2.0, (num_reqs, vocab_size)).astype(np.float32))
    check_allowed_sets(logits, random_params(rng, num_reqs, vocab_size), 40, "cpu")


def test_top_k_keeps_ties_at_the_kth_value():
    rng = np.random.default_rng(2)
    num_reqs, vocab_size = 32, 40
    logits = torch.from_numpy(rng.integers(0, 5, (num_reqs, vocab_size)).astype(np.float32))
    top_k = rng.integers(1, vocab_size, num_reqs)
    kept = torch.isfinite(apply_top_k_top_p(logits, torch.from_numpy(top_k), None)).numpy()
    for row in range(num_reqs):
        kth = np.sort(logits[row].numpy())[::-1][top_k[row] - 1]
        assert (kept[row] == (logits[row].numpy() >= kth)).all()
    params = dict(
        temperature=np.full(num_reqs, 1.0),
        top_k=top_k,
        top_p=np.full(num_reqs, 1.0),
        seeds=np.arange(num_reqs),
    )
    check_allowed_sets(logits, params, 20, "cpu")


def test_top_k_one_and_tiny_top_p_are_greedy():
    rng = np.random.default_rng(3)
    num_reqs, vocab_size = 128, 1000
    logits = torch.from_numpy(rng.normal(0, 1.0, (num_reqs, vocab_size)).astype(np.float32))
    temperature = rng.uniform(0.2, 3.0, num_reqs).tolist()
    greedy = logits.argmax(dim=-1)
    positions = rng.integers(0, 10_000, num_reqs).tolist()
    top_k_one = make_meta(temperature, top_k=[1] * num_reqs, positions=positions)
    assert torch.equal(sample(logits, top_k_one).sampled_token_ids, greedy)
    tiny_top_p = make_meta(temperature, top_p=[1e-6] * num_reqs, positions=positions)
    assert torch.equal(sample(logits, tiny_top_p).sampled_token_ids, greedy)
    # Without them the same rows are not all greedy.
    plain = make_meta(temperature, positions=positions)
    assert not torch.equal(sample(logits, plain).sampled_token_ids, greedy)


# --------------------------------------------------------------------------------------------
# Logprobs, greedy rows, batch invariance


def check_logprobs(logits: torch.Tensor, meta: SamplingMetadata):
    out = sample(logits, meta)
    num_logprobs = meta.max_num_logprobs
    assert out.logprob_token_ids.shape == (logits.shape[0], 1 + num_logprobs)
    assert out.logprobs.dtype == torch.float32
    assert torch.equal(out.logprob_token_ids[:, 0], out.sampled_token_ids)
    # The top-K ids are distinct and their logits are the K largest, in order (ties may swap ids).
    raw = logits.cpu().numpy()
    topk_ids = out.logprob_token_ids[:, 1:].cpu().numpy()
    assert all(np.unique(row).size == num_logprobs for row in topk_ids)
    want_values = -np.sort(-raw, axis=1)[:, :num_logprobs]
    assert np.array_equal(np.take_along_axis(raw, topk_ids, axis=1), want_values)
    want = torch.log_softmax(logits.double(), dim=-1).gather(1, out.logprob_token_ids)
    torch.testing.assert_close(out.logprobs.double(), want, atol=1e-5, rtol=0)


def test_logprobs_are_raw_log_softmax_at_returned_ids():
    rng = np.random.default_rng(4)
    num_reqs, vocab_size = 48, 3000
    logits = torch.from_numpy(rng.normal(0, 3.0, (num_reqs, vocab_size)).astype(np.float32))
    params = random_params(rng, num_reqs, vocab_size)
    meta = make_meta(**{k: v.tolist() for k, v in params.items()}, max_num_logprobs=5)
    check_logprobs(logits, meta)
    no_logprobs = make_meta(**{k: v.tolist() for k, v in params.items()})
    out = sample(logits, no_logprobs)
    assert out.logprob_token_ids is None and out.logprobs is None


def test_greedy_rows_mixed_with_random_rows():
    rng = np.random.default_rng(5)
    num_reqs, vocab_size = 64, 500
    logits = torch.from_numpy(rng.normal(0, 1.0, (num_reqs, vocab_size)).astype(np.float32))
    temperature = np.where(np.arange(num_reqs) % 2 == 0, 0.0, 1.0)
    temperature[::8] = 1e-6  # below the greedy threshold
    out = sample(logits, make_meta(temperature.tolist(), positions=range(num_reqs)))
    greedy = logits.argmax(dim=-1)
    is_greedy = torch.from_numpy(temperature < 1e-5)
    assert torch.equal(out.sampled_token_ids[is_greedy], greedy[is_greedy])
    assert not torch.equal(out.sampled_token_ids[~is_greedy], greedy[~is_greedy])
    all_greedy = make_meta([0.0] * num_reqs, all_greedy=True, no_top_k=True, no_top_p=True)
    assert torch.equal(sample(logits, all_greedy).sampled_token_ids, greedy)


def test_host_flags_skip_only_inactive_work():
    rng = np.random.default_rng(6)
    num_reqs, vocab_size = 32, 200
    logits = torch.from_numpy(rng.normal(0, 1.0, (num_reqs, vocab_size)).astype(np.float32))
    temperature = rng.uniform(0.5, 1.5, num_reqs).tolist()
    positions = range(num_reqs)
    full = sample(logits, make_meta(temperature, positions=positions))
    fast = sample(logits, make_meta(temperature, positions=positions, no_top_k=True, no_top_p=True))
    assert torch.equal(full.sampled_token_ids, fast.sampled_token_ids)


def batch_invariance(logits: torch.Tensor, params: dict, positions: np.ndarray, device: str):
    """A request's token is the same alone, in a shuffled batch, among others, in another slot."""
    num_reqs, vocab_size = logits.shape

    def run(rows: np.ndarray, slot_of_req: np.ndarray, num_slots: int, extra: int = 0):
        slot_params = {name: np.zeros(num_slots, dtype=v.dtype) for name, v in params.items()}
        slot_params["top_p"][:] = 1.0
        for name, values in params.items():
            slot_params[name][slot_of_req] = values
        idx_mapping = slot_of_req[rows].tolist()
        batch_positions = positions[rows].tolist()
        batch_logits = logits[torch.from_numpy(rows).to(device)]
        if extra:  # unrelated requests in the free slots, before the real ones
            free = np.setdiff1d(np.arange(num_slots), slot_of_req)[:extra]
            slot_params["temperature"][free] = 1.0
            slot_params["seeds"][free] = free * 31
            idx_mapping = free.tolist() + idx_mapping
            batch_positions = [5] * extra + batch_positions
            noise_logits = torch.randn(
                extra, vocab_size, generator=torch.Generator().manual_seed(0)
            )
            batch_logits = torch.cat([noise_logits.to(device), batch_logits])
        meta = make_meta(
            **{name: values.tolist() for name, values in slot_params.items()},
            idx_mapping=idx_mapping,
            positions=batch_positions,
            device=device,
        )
        return sample(batch_logits, meta).sampled_token_ids.cpu().numpy()[extra:]

    identity = np.arange(num_reqs)
    alone = np.array([run(np.array([r]), identity, num_reqs)[0] for r in range(num_reqs)])
    assert np.array_equal(run(identity, identity, num_reqs), alone)
    perm = np.random.default_rng(7).permutation(num_reqs)
    assert np.array_equal(run(perm, identity, num_reqs), alone[perm])
    slots = np.random.default_rng(8).permutation(3 * num_reqs)[:num_reqs]
    assert np.array_equal(run(perm, slots, 3 * num_reqs, extra=num_reqs), alone[perm])


def test_same_seed_and_position_give_the_same_token_in_any_batch():
    rng = np.random.default_rng(9)
    num_reqs, vocab_size = 24, 300
    logits = torch.from_numpy(rng.normal(0, 2.0, (num_reqs, vocab_size)).astype(np.float32))
    params = random_params(rng, num_reqs, vocab_size)
    batch_invariance(logits, params, rng.integers(0, 4096, num_reqs), "cpu")


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_at_real_size():
    """B=256, V=128256 on CUDA: the uniform noise equals the CPU's bit for bit, Gumbel noise within
    1e-5, and masks, draws, greedy rows, logprobs and batch invariance pass the CPU checks.
    Tokens may differ from the CPU's on at most 1% of rows (float32 reductions differ)."""
    rng = np.random.default_rng(10)
    num_reqs, vocab_size = 256, 128256
    seeds = torch.from_numpy(rng.integers(-(2**63), 2**63, num_reqs))
    positions = torch.from_numpy(rng.integers(0, 2**20, num_reqs))
    u_cpu = uniform_noise(seeds, positions, vocab_size)
    u_cuda = uniform_noise(seeds.cuda(), positions.cuda(), vocab_size)
    assert torch.equal(u_cuda.cpu(), u_cpu)
    g_cuda = gumbel_noise(seeds.cuda(), positions.cuda(), vocab_size).cpu()
    torch.testing.assert_close(
        g_cuda, gumbel_noise(seeds, positions, vocab_size), atol=1e-5, rtol=0
    )
    del u_cpu, u_cuda, g_cuda

    logits = torch.from_numpy(rng.normal(0, 3.0, (num_reqs, vocab_size)).astype(np.float32))
    params = random_params(rng, num_reqs, vocab_size)
    params["top_k"] = np.where(params["top_k"] > 0, rng.choice([1, 50, 1000], num_reqs), 0)
    check_allowed_sets(logits.cuda(), params, 2, "cuda")
    meta_args = {k: v.tolist() for k, v in params.items()}
    meta_args["positions"] = positions.tolist()
    meta_cuda = make_meta(**meta_args, max_num_logprobs=20, device="cuda")
    check_logprobs(logits.cuda(), meta_cuda)
    tokens_cuda = sample(logits.cuda(), meta_cuda).sampled_token_ids.cpu()
    tokens_cpu = sample(logits, make_meta(**meta_args, max_num_logprobs=20)).sampled_token_ids
    assert float((tokens_cuda != tokens_cpu).float().mean()) <= 0.01
    small = slice(0, 16)
    batch_invariance(
        logits[small].cuda(),
        {k: v[small] for k, v in params.items()},
        positions.numpy()[small],
        "cuda",
    )
