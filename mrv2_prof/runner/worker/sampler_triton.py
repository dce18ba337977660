"""Triton Gumbel-max sampler: a drop-in for ``sampler.sample`` that returns the same tokens.

Corresponds to MRV2's Triton sampler (``vllm/v1/worker/gpu/sample/``). One launch scans
the logits once and takes, per row, ``argmax(logits / T + gumbel)`` (or ``argmax(logits)`` for a
greedy row), with the noise computed in-kernel from ``(seed, position, token)`` by the same uint32
PCG hash as ``sampler.uniform_noise``. No softmax, noise or masked copy of the logits is written;
sampling parameters are read per row through ``idx_mapping``. The vocabulary of a row is split
over several programs when the batch alone cannot fill the GPU; a second, tiny kernel reduces the
per-split (max, first index) pairs in vocabulary order, so ties resolve to the first index of the
maximum, as ``torch.argmax`` does.

top-k / top-p are value thresholds (see ``sampler.apply_top_k_top_p``). The threshold of each row
is computed with the reference's own torch ops (sort, softmax, cumsum) so that it is identical,
float32 rounding included, and the kernel drops ``logit / T < threshold`` inside its scan. Sorting
the raw logits in their own dtype and dividing the sorted values by T gives the reference's sorted
``logits / T`` exactly, since division by T > 0 is monotone.

Top-k logprobs: the row's logsumexp is accumulated in the same scan (online, per lane), the top-K
ids come from ``torch.topk`` on the float32 logits (the reference's call, so ids match exactly).

Nothing here reads device data on the host: shapes depend only on the batch and the host flags.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.sampler import (
    GREEDY_TEMPERATURE,
    SamplerOutput,
    SamplingMetadata,
    top_k_top_p_threshold_sorted,
)
from mrv2_prof.runner.worker.uva import take

try:
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older layouts
    from triton.language.extra.cuda import libdevice

_BLOCK_SIZE = 1024  # logits per program per loop step
_MIN_SPLIT_BLOCKS = 2  # a vocabulary split scans at least this many blocks
_PROGRAMS_PER_SM = 4  # split the vocabulary until the grid has about this many programs per SM
_NO_TOKEN = tl.constexpr(2**31 - 1)  # index of a split whose logits are all -inf
_GREEDY_TEMPERATURE = tl.constexpr(GREEDY_TEMPERATURE)
_LSE_FLOOR = tl.constexpr(-1e38)  # finite start of a running max: no -inf - -inf in logsumexp


# --------------------------------------------------------------------------------------------
# RNG (bit-exact with sampler.random_bits / uniform_noise)


@triton.jit
def _pcg_hash(x):
    """PCG-RXS-M-XS on uint32: the same permutation as ``sampler._pcg_hash``."""
    state = x * 747796405 + 2891336453
    word = ((state >> ((state >> 28) + 4)) ^ state) * 277803737
    return (word >> 22) ^ word


@triton.jit
def _row_key(seed, position):
    """uint32 key of a row from its int64 seed (high, then low word) and position (low word)."""
    key = _pcg_hash((seed >> 32).to(tl.uint32))
    key = _pcg_hash(key + seed.to(tl.uint32))
    return _pcg_hash(key + position.to(tl.uint32))


@triton.jit
def _uniform(key, cols):
    """float32 noise in (0, 1) of tokens ``cols``: ``(m + 0.5) * 2^-23``, m = the top 23 bits."""
    bits = _pcg_hash(key + _pcg_hash(cols.to(tl.uint32)))
    return ((bits >> 9) * 2 + 1).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _log(x, PRECISE: tl.constexpr):
    """Natural log; ``PRECISE`` uses libdevice ``logf``, the function ``torch.log`` runs on CUDA."""
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _gumbel(key, cols, PRECISE: tl.constexpr):
    return -_log(-_log(_uniform(key, cols), PRECISE), PRECISE)


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
    """[B, V] uniform (or Gumbel) noise, one row block per program; for tests and debugging."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    key = _row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row))
    noise = _gumbel(key, cols, PRECISE) if GUMBEL else _uniform(key, cols)
    tl.store(out_ptr + row.to(tl.int64) * vocab_size + cols, noise, mask=cols < vocab_size)


# --------------------------------------------------------------------------------------------
# Gumbel-max scan


@triton.jit
def _scan_split(
    row_ptr,
    split_start,
    split_size,
    vocab_size,
    temperature,
    key,
    threshold,
    BLOCK_SIZE: tl.constexpr,
    NOISE: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    LOGPROBS: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """(max, first index of the max) of one vocabulary split, and its (max, sum exp) of raw logits.

    Each lane keeps its own running maximum (strict ``>``: its earlier token wins a tie) and one
    cross-lane reduction at the end picks the smallest index among the lanes holding the maximum.
    """
    offs = tl.arange(0, BLOCK_SIZE)
    best_val = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_SIZE], _NO_TOKEN, tl.int32)
    lse_max = tl.full([BLOCK_SIZE], _LSE_FLOOR, tl.float32)
    lse_sum = tl.zeros([BLOCK_SIZE], tl.float32)
    for start in range(0, split_size, BLOCK_SIZE):
        cols = split_start + start + offs
        x = tl.load(row_ptr + cols, mask=cols < vocab_size, other=float("-inf")).to(tl.float32)
        if NOISE:
            value = tl.math.div_rn(x, temperature)  # IEEE division, as torch's ``logits / T``
            if HAS_THRESHOLD:
                value = tl.where(value < threshold, float("-inf"), value)
            value = value + _gumbel(key, cols, PRECISE)
        else:
            value = x
        better = value > best_val
        best_val = tl.where(better, value, best_val)
        best_idx = tl.where(better, cols, best_idx)
        if LOGPROBS:  # online logsumexp with one exp per logit
            e = tl.exp(-tl.abs(x - lse_max))  # exp of the smaller minus the larger
            lse_sum = tl.where(x > lse_max, lse_sum * e + 1.0, lse_sum + e)
            lse_max = tl.maximum(lse_max, x)
    split_val = tl.max(best_val, axis=0)
    split_idx = tl.min(tl.where(best_val == split_val, best_idx, _NO_TOKEN), axis=0)
    split_lse_max = tl.max(lse_max, axis=0)  # dead code without LOGPROBS (stores are skipped)
    split_lse_sum = tl.sum(lse_sum * tl.exp(lse_max - split_lse_max), axis=0)
    return split_val, split_idx, split_lse_max, split_lse_sum


# Values that change from step to step are not specialised on: a new value must
# never trigger a compile in the middle of a run.
@triton.jit(do_not_specialize=["split_size", "num_splits"])
def _gumbel_argmax_kernel(
    logits_ptr,
    logits_row_stride,
    idx_mapping_ptr,
    positions_ptr,
    temperature_ptr,
    seeds_ptr,
    threshold_ptr,
    split_val_ptr,
    split_idx_ptr,
    split_lse_max_ptr,
    split_lse_sum_ptr,
    vocab_size,
    split_size,
    num_splits,
    BLOCK_SIZE: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    LOGPROBS: tl.constexpr,
    PRECISE: tl.constexpr,
):
    """Program (row, split): scan ``split_size`` logits of one row; write the split's partials."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_row_stride
    split_start = split * split_size
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    temperature = tl.load(temperature_ptr + slot)
    key = _row_key(tl.load(seeds_ptr + slot), tl.load(positions_ptr + row))
    threshold = float("-inf")
    if HAS_THRESHOLD:
        threshold = tl.load(threshold_ptr + row)
    greedy = True if ALL_GREEDY else temperature < _GREEDY_TEMPERATURE
    if greedy:
        val, idx, lse_max, lse_sum = _scan_split(
            row_ptr,
            split_start,
            split_size,
            vocab_size,
            temperature,
            key,
            threshold,
            BLOCK_SIZE,
            False,
            HAS_THRESHOLD,
            LOGPROBS,
            PRECISE,
        )
    else:
        val, idx, lse_max, lse_sum = _scan_split(
            row_ptr,
            split_start,
            split_size,
            vocab_size,
            temperature,
            key,
            threshold,
            BLOCK_SIZE,
            True,
            HAS_THRESHOLD,
            LOGPROBS,
            PRECISE,
        )
    out = row * num_splits + split
    tl.store(split_val_ptr + out, val)
    tl.store(split_idx_ptr + out, idx)
    if LOGPROBS:
        tl.store(split_lse_max_ptr + out, lse_max)
        tl.store(split_lse_sum_ptr + out, lse_sum)


# Values that change from step to step are not specialised on: a new value must
# never trigger a compile in the middle of a run.
@triton.jit(do_not_specialize=["num_splits"])
def _reduce_splits_kernel(
    split_val_ptr,
    split_idx_ptr,
    split_lse_max_ptr,
    split_lse_sum_ptr,
    sampled_ptr,
    lse_ptr,
    num_splits,
    BLOCK_SPLITS: tl.constexpr,
    LOGPROBS: tl.constexpr,
):
    """Per row: the token of the best split (the first on ties) and the row's logsumexp."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_SPLITS)
    mask = offs < num_splits
    base = row * num_splits
    vals = tl.load(split_val_ptr + base + offs, mask=mask, other=float("-inf"))
    idxs = tl.load(split_idx_ptr + base + offs, mask=mask, other=_NO_TOKEN)
    best = tl.max(vals, axis=0)
    token = tl.min(tl.where(vals == best, idxs, _NO_TOKEN), axis=0)
    token = tl.where(token == _NO_TOKEN, 0, token)  # every logit -inf: torch.argmax gives 0
    tl.store(sampled_ptr + row, token.to(tl.int64))
    if LOGPROBS:
        maxes = tl.load(split_lse_max_ptr + base + offs, mask=mask, other=_LSE_FLOOR)
        sums = tl.load(split_lse_sum_ptr + base + offs, mask=mask, other=0.0)
        row_max = tl.max(maxes, axis=0)
        total = tl.sum(sums * tl.exp(maxes - row_max), axis=0)
        tl.store(lse_ptr + row, row_max + tl.log(total))  # every logit -inf: log(0) = -inf


# --------------------------------------------------------------------------------------------
# Host side


def _is_interpreted() -> bool:
    """True under ``TRITON_INTERPRET=1`` (decided by triton when the kernels were decorated)."""
    return type(_gumbel_argmax_kernel).__name__ == "InterpretedFunction"


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_size(num_rows: int, vocab_size: int, block_size: int, device: torch.device) -> int:
    """Logits per split: a multiple of ``block_size``, at least ``_MIN_SPLIT_BLOCKS`` blocks, and
    as many splits as give the grid about ``_PROGRAMS_PER_SM`` programs per SM (rounded to the
    nearest count, so that the grid stays within about one wave of resident programs)."""
    num_blocks = triton.cdiv(vocab_size, block_size)
    programs = _PROGRAMS_PER_SM * _num_sms(device)
    want_splits = (programs + num_rows // 2) // max(num_rows, 1)
    num_splits = max(1, min(want_splits, num_blocks // _MIN_SPLIT_BLOCKS))
    return triton.cdiv(num_blocks, num_splits) * block_size


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


def gumbel_argmax(
    logits: torch.Tensor,  # [B, V], unit stride along V
    meta: SamplingMetadata,
    threshold: torch.Tensor | None = None,  # [B] float32: drop logit / T below it
    with_lse: bool = False,
    block_size: int = _BLOCK_SIZE,
    split_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled token ids [B] int64 and, with ``with_lse``, the rows' logsumexp [B] float32.

    ``block_size`` and ``split_size`` (a multiple of it) exist so tests can reach every path at
    small sizes; by default the vocabulary is split to fill the device.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    block_size = min(block_size, max(16, triton.next_power_of_2(vocab_size)))
    if split_size is None:
        split_size = _split_size(num_rows, vocab_size, block_size, device)
    if split_size % block_size:
        raise ValueError(f"split_size {split_size} is not a multiple of block_size {block_size}")
    num_splits = triton.cdiv(vocab_size, split_size)
    sampled = torch.empty(num_rows, dtype=torch.int64, device=device)
    lse = torch.empty(num_rows, dtype=torch.float32, device=device) if with_lse else None
    if num_rows == 0:
        return sampled, lse
    split_val = torch.empty(num_rows, num_splits, dtype=torch.float32, device=device)
    split_idx = torch.empty(num_rows, num_splits, dtype=torch.int32, device=device)
    split_lse = torch.empty(
        2 if with_lse else 0, num_rows, num_splits, dtype=torch.float32, device=device
    )
    split_lse_max, split_lse_sum = (split_lse[0], split_lse[1]) if with_lse else (split_val,) * 2
    _gumbel_argmax_kernel[(num_rows, num_splits)](
        logits,
        logits.stride(0),
        meta.idx_mapping,
        meta.positions,
        meta.temperature,
        meta.seeds,
        threshold if threshold is not None else split_val,  # unread without HAS_THRESHOLD
        split_val,
        split_idx,
        split_lse_max,
        split_lse_sum,
        vocab_size,
        split_size,
        num_splits,
        BLOCK_SIZE=block_size,
        ALL_GREEDY=meta.all_greedy,
        HAS_THRESHOLD=threshold is not None,
        LOGPROBS=with_lse,
        PRECISE=not _is_interpreted(),
        num_warps=4,
    )
    _reduce_splits_kernel[(num_rows,)](
        split_val,
        split_idx,
        split_lse_max,
        split_lse_sum,
        sampled,
        lse if lse is not None else split_val,
        num_splits,
        BLOCK_SPLITS=max(16, triton.next_power_of_2(num_splits)),
        LOGPROBS=with_lse,
        num_warps=1,
    )
    return sampled, lse


def sample_triton(logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
    """``sampler.sample`` with one Gumbel-max launch: the same tokens, no [B, V] intermediates
    besides the top-k / top-p sort (only when the host flags allow those masks).

    An all-greedy batch without logprobs is one ``argmax``: torch's reduction measured 0.03 ms
    against the kernel's 0.07 ms at V = 128k on an H200 (benchmarks/RESULTS.md)."""
    logits = _check_inputs(logits, meta)
    if meta.all_greedy and meta.max_num_logprobs <= 0:
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


def _noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, gumbel: bool):
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
            GUMBEL=gumbel,
            PRECISE=not _is_interpreted(),
        )
    return out


def uniform_noise_triton(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int):
    """The kernel's uniform noise [B, V] float32: equals ``sampler.uniform_noise`` bit for bit."""
    return _noise(seeds, positions, vocab_size, gumbel=False)


def gumbel_noise_triton(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int):
    """The kernel's Gumbel noise [B, V] float32 (``sampler.gumbel_noise``; on CUDA bit for bit)."""
    return _noise(seeds, positions, vocab_size, gumbel=True)
