"""Gumbel-max in Triton: per row, ``argmax(logits / T + gumbel)`` in one scan of the logits.

A greedy row takes ``argmax(logits)``. The noise is computed in-kernel (``sampler_rng_triton``);
no softmax, noise or masked copy of the logits is written, and sampling parameters are read per
row through ``idx_mapping``. The vocabulary of a row is split over several programs when the
batch alone cannot fill the GPU; the per-split (max, first index) pairs are reduced in
vocabulary order, so ties resolve to the first index of the maximum, as ``torch.argmax`` does.
A top-k / top-p threshold per row (``sampler_triton``) drops
``logit / T < threshold`` inside the scan. With ``with_lse`` the row's logsumexp is accumulated
in the same scan (online, per lane).

The reduction runs in the same launch: each program writes its split's partials, then counts
itself done on the row's counter (one atomic, acquire-release at GPU scope, after a barrier of
the program's threads); the program that finds itself the row's last reads every split's
partials (bypassing L1), writes the token and resets the counter to 0 for the next launch. So a
step samples with one launch, graph-capturable, with no per-step memset. ``fused=False`` keeps
the two-launch form (scan, then a tiny reduce kernel), which the tests hold it equal to. The
partials and the counters live in a per-device workspace reused by every launch on the stream.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.model.kernel_workspace import KernelWorkspace
from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE, SamplingMetadata
from mrv2_prof.runner.worker.sampler_rng_triton import gumbel, is_interpreted, row_key
from mrv2_prof.runner.worker.triton_launch import Launcher

_BLOCK_SIZE = 1024  # logits per program per loop step
_MIN_SPLIT_BLOCKS = 2  # a vocabulary split scans at least this many blocks
_PROGRAMS_PER_SM = 4  # split the vocabulary until the grid has about this many programs per SM
_NO_TOKEN = tl.constexpr(2**31 - 1)  # index of a split whose logits are all -inf
_GREEDY_TEMPERATURE = tl.constexpr(GREEDY_TEMPERATURE)
_LSE_FLOOR = tl.constexpr(-1e38)  # finite start of a running max: no -inf - -inf in logsumexp
FUSED_REDUCE = True  # the default of ``gumbel_argmax(fused=...)``: one launch per sampling


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
            value = value + gumbel(key, cols, PRECISE)
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
    counter_ptr,  # [B] int32, zero between launches (FUSED)
    sampled_ptr,  # [B] int64 (FUSED)
    lse_ptr,  # [B] float32 (FUSED and LOGPROBS)
    vocab_size,
    split_size,
    num_splits,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    LOGPROBS: tl.constexpr,
    PRECISE: tl.constexpr,
    FUSED: tl.constexpr,
):
    """Program (row, split): scan ``split_size`` logits of one row; write the split's partials;
    with ``FUSED``, the row's last program to finish also reduces the row."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_row_stride
    split_start = split * split_size
    slot = tl.load(idx_mapping_ptr + row).to(tl.int64)
    temperature = tl.load(temperature_ptr + slot)
    key = row_key(tl.load(seeds_ptr + slot), tl.load(positions_ptr + row))
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
    if FUSED:
        tl.debug_barrier()  # every thread's partial stores before the release below
        done = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if done == num_splits - 1:  # the row's last split: every partial is visible
            _reduce_row(
                split_val_ptr,
                split_idx_ptr,
                split_lse_max_ptr,
                split_lse_sum_ptr,
                sampled_ptr,
                lse_ptr,
                row,
                num_splits,
                BLOCK_SPLITS,
                LOGPROBS,
                ".cg",
            )
            tl.store(counter_ptr + row, 0)  # ready for the next launch


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
    _reduce_row(
        split_val_ptr,
        split_idx_ptr,
        split_lse_max_ptr,
        split_lse_sum_ptr,
        sampled_ptr,
        lse_ptr,
        tl.program_id(0),
        num_splits,
        BLOCK_SPLITS,
        LOGPROBS,
        "",
    )


@triton.jit
def _reduce_row(
    split_val_ptr,
    split_idx_ptr,
    split_lse_max_ptr,
    split_lse_sum_ptr,
    sampled_ptr,
    lse_ptr,
    row,
    num_splits,
    BLOCK_SPLITS: tl.constexpr,
    LOGPROBS: tl.constexpr,
    CACHE: tl.constexpr,
):
    """The token of the row's best split (the first on ties) and the row's logsumexp."""
    offs = tl.arange(0, BLOCK_SPLITS)
    mask = offs < num_splits
    base = row * num_splits
    vals = tl.load(
        split_val_ptr + base + offs, mask=mask, other=float("-inf"), cache_modifier=CACHE
    )
    idxs = tl.load(split_idx_ptr + base + offs, mask=mask, other=_NO_TOKEN, cache_modifier=CACHE)
    best = tl.max(vals, axis=0)
    token = tl.min(tl.where(vals == best, idxs, _NO_TOKEN), axis=0)
    token = tl.where(token == _NO_TOKEN, 0, token)  # every logit -inf: torch.argmax gives 0
    tl.store(sampled_ptr + row, token.to(tl.int64))
    if LOGPROBS:
        maxes = tl.load(
            split_lse_max_ptr + base + offs, mask=mask, other=_LSE_FLOOR, cache_modifier=CACHE
        )
        sums = tl.load(split_lse_sum_ptr + base + offs, mask=mask, other=0.0, cache_modifier=CACHE)
        row_max = tl.max(maxes, axis=0)
        total = tl.sum(sums * tl.exp(maxes - row_max), axis=0)
        tl.store(lse_ptr + row, row_max + tl.log(total))  # every logit -inf: log(0) = -inf


_scan = Launcher(_gumbel_argmax_kernel)
_reduce = Launcher(_reduce_splits_kernel)


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=256)
def _split_size(num_rows: int, vocab_size: int, block_size: int, device: torch.device) -> int:
    """Logits per split: a multiple of ``block_size``, at least ``_MIN_SPLIT_BLOCKS`` blocks, and
    as many splits as give the grid about ``_PROGRAMS_PER_SM`` programs per SM (rounded to the
    nearest count, so that the grid stays within about one wave of resident programs)."""
    num_blocks = triton.cdiv(vocab_size, block_size)
    programs = _PROGRAMS_PER_SM * _num_sms(device)
    want_splits = (programs + num_rows // 2) // max(num_rows, 1)
    num_splits = max(1, min(want_splits, num_blocks // _MIN_SPLIT_BLOCKS))
    return triton.cdiv(num_blocks, num_splits) * block_size


def make_workspace(device: torch.device, cells: int, rows: int) -> tuple[torch.Tensor, ...]:
    """The split partials (value | logsumexp max | sum, float32; index, int32), ``cells`` of
    each rounded up to a multiple of 4, and the rows' counters (int32 zeros): the partials'
    three views are 16-byte aligned whatever the size, as triton specialises a pointer on that
    and a size's alignment must not pick another compile."""
    cells = -(-cells // 4) * 4
    partials = torch.empty(3, cells, dtype=torch.float32, device=device)
    index = torch.empty(cells, dtype=torch.int32, device=device)
    counter = torch.zeros(rows, dtype=torch.int32, device=device)
    # value | logsumexp max | sum, each read as [B, num_splits]; split once, not per call
    return (*partials.unbind(0), index, counter)


WORKSPACE = KernelWorkspace(
    "the sampler's workspace", "sample a batch of this size eagerly", make_workspace
)


def gumbel_argmax(
    logits: torch.Tensor,  # [B, V], unit stride along V
    meta: SamplingMetadata,
    threshold: torch.Tensor | None = None,  # [B] float32: drop logit / T below it
    with_lse: bool = False,
    block_size: int = _BLOCK_SIZE,
    split_size: int | None = None,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled token ids [B] int64 and, with ``with_lse``, the rows' logsumexp [B] float32.

    ``block_size`` and ``split_size`` (a multiple of it) exist so tests can reach every path at
    small sizes; by default the vocabulary is split to fill the device. ``fused`` (default
    ``FUSED_REDUCE``): one launch (the row's last split reduces it); otherwise a scan launch and
    a reduce launch.
    """
    if fused is None:
        fused = FUSED_REDUCE
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
    split_val, split_lse_max, split_lse_sum, split_idx, counter = WORKSPACE.get(
        device, num_rows * num_splits, num_rows
    )
    lse_out = lse if lse is not None else split_val  # unread without LOGPROBS
    # one value for every row count (masked lanes past num_splits): no variant per batch size
    most_splits = max(num_splits, triton.cdiv(vocab_size, block_size) // _MIN_SPLIT_BLOCKS)
    block_splits = max(16, triton.next_power_of_2(most_splits))
    _scan(
        (num_rows, num_splits),
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
        counter,
        sampled,
        lse_out,
        vocab_size,
        split_size,
        num_splits,
        BLOCK_SIZE=block_size,
        BLOCK_SPLITS=block_splits,
        ALL_GREEDY=meta.all_greedy,
        HAS_THRESHOLD=threshold is not None,
        LOGPROBS=with_lse,
        PRECISE=not is_interpreted(),
        FUSED=fused,
        num_warps=4,
    )
    if not fused:
        _reduce(
            (num_rows,),
            split_val,
            split_idx,
            split_lse_max,
            split_lse_sum,
            sampled,
            lse_out,
            num_splits,
            BLOCK_SPLITS=block_splits,
            LOGPROBS=with_lse,
            num_warps=1,
        )
    return sampled, lse
