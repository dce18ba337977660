"""Tests of the Gumbel-max sampler and its stateless RNG against independently computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrv2_prof.runner.worker.sampler import (
    SamplingMetadata,
    apply_top_k_top_p,
    gumbel_noise,
    random_bits,
    sample,
    uniform_noise,
)

# --------------------------------------------------------------------------------------------
# Independent helpers


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
