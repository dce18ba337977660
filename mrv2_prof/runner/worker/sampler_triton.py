"""Triton sampler: a drop-in for ``sampler.sample`` that returns the same tokens.

Corresponds to MRV2's Triton sampler (``vllm/v1/worker/gpu/sample/``). The token of each row
comes from one Gumbel-max scan of its logits (``gumbel_argmax_triton``), with the noise computed
in-kernel from ``(seed, position, token)`` by the reference's own hash (``sampler_rng_triton``).

top-k / top-p are value thresholds (see ``sampler.apply_top_k_top_p``). The threshold of each row
is computed here with the reference's own torch ops (sort, softmax, cumsum) so that it is
identical, float32 rounding included, and the scan drops ``logit / T < threshold``. Sorting the
raw logits in their own dtype and dividing the sorted values by T gives the reference's sorted
``logits / T`` exactly, since division by T > 0 is monotone.

Top-k logprobs: the row's logsumexp comes from the same scan; the top-K ids come from
``torch.topk`` on the float32 logits (the reference's call, so ids match exactly).

Nothing here reads device data on the host: shapes depend only on the batch and the host flags.
"""

from __future__ import annotations

import torch

from mrv2_prof.runner.worker.gumbel_argmax_triton import gumbel_argmax
from mrv2_prof.runner.worker.sampler import (
    GREEDY_TEMPERATURE,
    SamplerOutput,
    SamplingMetadata,
    top_k_top_p_threshold_sorted,
)
from mrv2_prof.runner.worker.uva import take

SPLIT_ARGMAX_MAX_ROWS = 4  # all-greedy batches up to this size take the split scan, not argmax


def _check_inputs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"logits must be float32, bfloat16 or float16, not {logits.dtype}")
    num_rows = logits.shape[0]
    if meta.idx_mapping.shape != (num_rows,) or meta.positions.shape != (num_rows,):
        raise ValueError("idx_mapping and positions must be [B] for logits [B, V]")
    if meta.temperature.dtype != torch.float32 or meta.seeds.dtype != torch.int64:
        raise TypeError("temperature must be float32 and seeds int64")
    per_row = (meta.idx_mapping, meta.positions, meta.temperature, meta.seeds)
    if not all(t.is_contiguous() for t in per_row):
        raise ValueError("idx_mapping, positions, temperature and seeds must be contiguous")
    return logits if logits.stride(1) == 1 else logits.contiguous()


def top_k_top_p_threshold(
    logits: torch.Tensor,  # [B, V] raw logits, any float dtype
    divisor: torch.Tensor,  # [B] float32: the temperature, 1.0 for greedy rows
    top_k: torch.Tensor | None,  # [B] int, <= 0 or >= V = off
    top_p: torch.Tensor | None,  # [B] float, >= 1.0 = off
) -> torch.Tensor:
    """[B] float32 thresholds ``t`` with ``apply_top_k_top_p(logits / divisor)`` equal to masking
    ``logits / divisor < t``: the reference's own ops on the same values, minus the [B, V] mask."""
    sorted_logits = logits.sort(dim=-1, descending=True).values.float().div_(divisor[:, None])
    threshold = top_k_top_p_threshold_sorted(sorted_logits, top_k, top_p)
    return threshold[:, 0].contiguous()


def sample_triton(logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
    """``sampler.sample`` with one Gumbel-max launch: the same tokens, no [B, V] intermediates
    besides the top-k / top-p sort (only when the host flags allow those masks).

    An all-greedy batch of more than ``SPLIT_ARGMAX_MAX_ROWS`` rows without logprobs is one
    ``argmax``: it costs the host one launch where the scan costs two (0.03 ms against 0.07 ms of
    launch at V = 128k on an H200, benchmarks/RESULTS.md). A batch of a few rows takes the scan,
    which splits each row over the SMs: torch's argmax reduces a single 128k row in one block
    (36 us of device time in a batch-1 decode step of llama-1b on the H200), which a GPU-bound
    batch-1 step pays in full."""
    logits = _check_inputs(logits, meta)
    few_rows = logits.shape[0] <= SPLIT_ARGMAX_MAX_ROWS
    if meta.all_greedy and meta.max_num_logprobs <= 0 and not few_rows:
        return SamplerOutput(logits.argmax(dim=-1), None, None)
    threshold = None
    if not meta.all_greedy and not (meta.no_top_k and meta.no_top_p):
        idx = meta.idx_mapping
        temperature = take(meta.temperature, idx)  # the parameters may be UVA (pinned host)
        divisor = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature)
        threshold = top_k_top_p_threshold(
            logits,
            divisor,
            None if meta.no_top_k else take(meta.top_k, idx),
            None if meta.no_top_p else take(meta.top_p, idx),
        )
    num_logprobs = meta.max_num_logprobs
    sampled, lse = gumbel_argmax(logits, meta, threshold, with_lse=num_logprobs > 0)
    if num_logprobs <= 0:
        return SamplerOutput(sampled, None, None)
    logits_f32 = logits.float()
    topk_ids = torch.topk(logits_f32, num_logprobs, dim=-1).indices  # [B, K]
    token_ids = torch.cat((sampled[:, None], topk_ids), dim=1)  # [B, 1+K]
    return SamplerOutput(sampled, token_ids, logits_f32.gather(1, token_ids) - lse[:, None])
