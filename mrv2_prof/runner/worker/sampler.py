"""Token sampling: Gumbel-max with a stateless per-request RNG (torch reference).

Corresponds to MRV2's Triton Gumbel sampler (``vllm/v1/worker/gpu/sample/``): temperature, top-k
and top-p are applied to the logits, and the token is ``argmax(logits + gumbel_noise)``, so no
probability tensor is normalised and nothing is drawn with ``multinomial``. The noise is a pure
function of ``(seed, position, token index)``: a request's samples do not depend on which other
requests share the batch, on its row, or on its persistent slot. Sampling state lives in per-slot
tensors reached through ``idx_mapping`` and is never expanded to the logits' shape.

The RNG uses only uint32 multiply, xor, shift and add (emulated here in int64 with
``& 0xFFFFFFFF``), so a Triton kernel can reproduce ``uniform_noise`` bit for bit. Everything is
plain torch on whatever device the inputs live on, with no host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
GREEDY_TEMPERATURE = 1e-5  # temperature below this samples greedily


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs: batch rows map to persistent request slots via ``idx_mapping``.

    ``all_greedy``, ``no_top_k`` and ``no_top_p`` are host-side facts known to whoever builds the
    batch; ``False`` is always correct, ``True`` lets ``sample`` skip work without a device read.
    """

    idx_mapping: torch.Tensor  # [B] int32: batch row -> request slot
    positions: torch.Tensor  # [B] int64 or int32: position of the token being sampled (RNG key)
    temperature: torch.Tensor  # [R] float32, < 1e-5 = greedy
    top_k: torch.Tensor  # [R] int32, 0 = off
    top_p: torch.Tensor  # [R] float32, 1.0 = off
    seeds: torch.Tensor  # [R] int64
    max_num_logprobs: int = 0  # top-k logprobs per row; 0 = no logprobs
    all_greedy: bool = False
    no_top_k: bool = False
    no_top_p: bool = False


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprob_token_ids: torch.Tensor | None  # [B, 1+K] int64: sampled token, then top-K by logit
    logprobs: torch.Tensor | None  # [B, 1+K] float32: log-softmax of the raw logits


def _pcg_hash(x: torch.Tensor) -> torch.Tensor:
    """PCG-RXS-M-XS output permutation of a uint32 (held in int64); a bijection on [0, 2^32)."""
    state = (x * 747796405 + 2891336453) & _MASK32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _MASK32
    return (word >> 22) ^ word


def random_bits(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """uint32 hash (in int64) of ``(seed, position, token)`` for every row and token: [B, V].

    The row key chains the seed's high and low 32 bits and the position's low 32 bits; each token
    then hashes its (hashed) index added to the key. For a fixed row the map from token to bits
    is a bijection, so no two tokens of a row share their 32 bits.
    """
    seeds = seeds.to(torch.int64)
    positions = positions.to(torch.int64)
    key = _pcg_hash((seeds >> 32) & _MASK32)
    key = _pcg_hash((key + (seeds & _MASK32)) & _MASK32)
    key = _pcg_hash((key + (positions & _MASK32)) & _MASK32)  # [B]
    tokens = _pcg_hash(torch.arange(vocab_size, device=seeds.device, dtype=torch.int64))  # [V]
    return _pcg_hash((key[:, None] + tokens[None, :]) & _MASK32)  # [B, V]


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform float32 noise in (0, 1) strictly, a pure function of (seed, position, token).

    Uses the top 23 bits ``m`` as ``(m + 0.5) * 2^-23``: every value of that grid, from 2^-24 to
    1 - 2^-24, is exact in float32 (a 24-bit grid's midpoints near 1 would round to 1.0), so any
    IEEE implementation produces the same bits.
    """
    m = random_bits(seeds, positions, vocab_size) >> 9  # [B, V], 23 bits
    return (m * 2 + 1).to(torch.float32) * 2.0**-24


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))`` [B, V] float32, in about [-2.8, 16.6]."""
    return -torch.log(-torch.log(uniform_noise(seeds, positions, vocab_size)))


def apply_top_k_top_p(
    logits: torch.Tensor,  # [B, V] float32, temperature already applied
    top_k: torch.Tensor | None,  # [B] int, <= 0 or >= V = off
    top_p: torch.Tensor | None,  # [B] float, >= 1.0 = off
) -> torch.Tensor:
    """Mask to -inf every token outside the top-k and then the top-p set of its row.

    Both masks are value thresholds: a token is kept when its logit is >= the k-th largest (so
    ties at the k-th value are all kept) and >= the logit of the last token of the nucleus. The
    nucleus is the smallest prefix of the sorted, top-k-masked distribution whose mass reaches
    ``p``, and always holds at least one token.
    """
    sorted_logits = logits.sort(dim=-1, descending=True).values  # [B, V]
    threshold = top_k_top_p_threshold_sorted(sorted_logits, top_k, top_p)
    return logits.masked_fill(logits < threshold, float("-inf"))


def top_k_top_p_threshold_sorted(
    sorted_logits: torch.Tensor,  # [B, V] float32, descending, temperature applied
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> torch.Tensor:  # [B, 1]
    """The value threshold of ``apply_top_k_top_p`` for each row (shared with the Triton path)."""
    vocab_size = sorted_logits.shape[1]
    threshold = sorted_logits[:, -1:]  # [B, 1]: keeps every token
    if top_k is not None:
        k = top_k.to(torch.int64)
        k = torch.where((k <= 0) | (k > vocab_size), vocab_size, k)
        threshold = sorted_logits.gather(1, (k - 1)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < threshold, float("-inf"))
    if top_p is not None:
        p = top_p.to(torch.float32)[:, None]  # [B, 1]
        cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [B, V]
        # Token j (sorted) is in the nucleus when the mass before it is still < p.
        num_kept = 1 + (cum_probs[:, :-1] < p).sum(dim=-1, keepdim=True)  # [B, 1]
        num_kept = torch.where(p >= 1.0, vocab_size, num_kept)
        threshold = torch.maximum(threshold, sorted_logits.gather(1, num_kept - 1))
    return threshold


def compute_topk_logprobs(
    logits: torch.Tensor,  # [B, V] raw logits
    num_logprobs: int,
    sampled_token_ids: torch.Tensor,  # [B] int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, 1+K] (sampled, then top-K by logit) and their log-softmax [B, 1+K].

    Only the gathered tokens get a logprob: one logsumexp per row, no [B, V] log_softmax.
    """
    topk_ids = torch.topk(logits, num_logprobs, dim=-1).indices  # [B, K], descending
    token_ids = torch.cat((sampled_token_ids[:, None], topk_ids), dim=1)  # [B, 1+K]
    lse = torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # [B, 1]
    logprobs = logits.float().gather(1, token_ids) - lse
    return token_ids, logprobs


def sample(logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
    """Sample one token per row of ``logits`` [B, V]; greedy and random rows in one call."""
    logits = logits.float()
    idx = meta.idx_mapping.to(torch.int64)
    greedy_ids = logits.argmax(dim=-1)  # [B]
    if meta.all_greedy:
        sampled = greedy_ids
    else:
        temperature = meta.temperature[idx]  # [B]
        is_greedy = temperature < GREEDY_TEMPERATURE
        scaled = logits / torch.where(is_greedy, 1.0, temperature)[:, None]
        if not (meta.no_top_k and meta.no_top_p):
            scaled = apply_top_k_top_p(
                scaled,
                None if meta.no_top_k else meta.top_k[idx],
                None if meta.no_top_p else meta.top_p[idx],
            )
        noise = gumbel_noise(meta.seeds[idx], meta.positions, logits.shape[1])
        random_ids = (scaled + noise).argmax(dim=-1)
        sampled = torch.where(is_greedy, greedy_ids, random_ids)

    if meta.max_num_logprobs <= 0:
        return SamplerOutput(sampled, None, None)
    token_ids, logprobs = compute_topk_logprobs(logits, meta.max_num_logprobs, sampled)
    return SamplerOutput(sampled, token_ids, logprobs)
