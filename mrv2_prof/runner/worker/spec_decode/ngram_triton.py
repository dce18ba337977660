"""A step of n-gram drafts on the device in one Triton launch: ``ngram_device.ngram_step_ref``.

``ngram_step_triton`` runs one program per batch row: it first stores the row's emitted tokens
(masked, at most ``E``) into its slot's history, then, past a barrier that makes those stores
visible to all of the program's threads, works out the row's history length and searches it
(``_search_and_store``: ``ngram_device.ngram_propose_ref``'s search) into its target slot (the
sink for a padding row). A row's writes and reads touch its own slot's history only, and real
rows have distinct slots, so programs do not interact.

The search: for ``n`` from ``MAX_N`` down to ``MIN_N`` it holds the row's last ``n`` tokens as
scalars and scans the window starts of the slot's history ``BLOCK`` at a time, from the last
start with a token after it back towards 0, comparing each window's ``n`` tokens with them; the
scan stops at the first block with a match (its largest matching start is the right-most
occurrence), and once an ``n`` matched the shorter ones scan nothing. Then up to ``k`` tokens
after the occurrence (cut at the history's end) go into ``out_tokens[slot, :]`` and their count
into ``out_num[slot]``.

Cost: a row with no match at any ``n`` reads its whole history once per ``n`` (``n`` loads per
position, ``max_n - min_n + 1`` times; the loads after the first hit the cache), so a step costs
about ``(max_n - min_n + 1) * len`` window compares per row: O(B * L) work at worst, spread over
``B`` programs (a small batch with long histories uses few SMs). A row that matches stops at the
block of its right-most occurrence. The scan is latency-bound (one block after another per row),
hence wide blocks: on the H200, the search alone over 64 rows of 4096 tokens with no match at
any n in (2, 4) took ~11 µs (block 1024, 8 warps; 20 µs with blocks of 256, 14 µs with 4
warps), about the same for a batch of 8 or 256 rows; the torch reference took ~1.7 ms there (its
many small launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.spec_decode.ngram_device import check_step_args
from mrv2_prof.runner.worker.triton_launch import Launcher

BLOCK = 1024  # window starts compared per loop step (the scan is latency-bound: fewer, wider)


@triton.jit
def _search_and_store(
    row_ptr,  # the slot's history row
    length,  # int32 in [0, L]: the history's length (0: no match)
    out_ptr,  # the slot's out_tokens row
    num_ptr,  # the slot's out_num
    k,
    MIN_N: tl.constexpr,
    MAX_N: tl.constexpr,
    K_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The n-gram search over ``row_ptr[:length]`` and its drafts' stores (the module docstring)."""
    lanes = tl.arange(0, BLOCK)
    start = length * 0 - 1  # the match's start (-1: none yet)
    found_n = length * 0
    for n in tl.static_range(MAX_N, MIN_N - 1, -1):
        # starts 0 .. length - 1 - n have a token after the window; none once a longer n matched
        hi = tl.where(start < 0, length - n, 0)  # exclusive bound of the starts left to scan
        best = start * 0 - 1
        while hi > 0:
            starts = hi - BLOCK + lanes
            valid = starts >= 0
            hit = valid
            for j in tl.static_range(n):
                tok = tl.load(row_ptr + length - n + j)  # the suffix's j-th token (length > n)
                window = tl.load(row_ptr + starts + j, mask=valid, other=0)
                hit = hit & (window == tok)
            best = tl.max(tl.where(hit, starts, -1), axis=0)
            hi = tl.where(best >= 0, 0, hi - BLOCK)
        take = (start < 0) & (best >= 0)
        start = tl.where(take, best, start)
        found_n = tl.where(take, n, found_n)
    first = start + found_n  # the first draft's position
    num = tl.where(start >= 0, tl.minimum(length - first, k), 0)
    offs = tl.arange(0, K_BLOCK)
    mask = offs < num
    drafts = tl.load(row_ptr + first + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, drafts.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(num_ptr, num.to(num_ptr.dtype.element_ty))


# The per-step tensors are views at any offset (``counts`` sits behind ``idx_mapping`` in one
# buffer): specialised on their alignment they would compile a kernel per batch-size class on the
# step loop, after the warm-up.
@triton.jit(
    do_not_specialize=["k"],
    do_not_specialize_on_alignment=[
        "slots_ptr", "counts_ptr", "seq_lens_ptr", "prompt_lens_ptr", "emitted_ptr",
        "num_accepted_ptr", "num_slots_ptr",
    ],
)  # fmt: skip
def _ngram_step_kernel(
    history_ptr,  # [R + 1, L + 1] int32
    history_stride,
    out_tokens_ptr,  # [R + 1, K] int64
    out_tokens_stride,
    out_num_ptr,  # [R + 1] int32
    slots_ptr,  # [B] int: the row's slot
    counts_ptr,  # [B] int: tokens computed (0: padding)
    seq_lens_ptr,  # [B] int
    prompt_lens_ptr,  # [R] int
    emitted_ptr,  # [B, E] int64
    emitted_stride_b,
    emitted_stride_e,
    num_accepted_ptr,  # [B] int (VERIFY only)
    num_slots_ptr,  # [B] int (VERIFY only)
    num_cols,  # E
    sink,  # R
    seq_len,  # L + 1: the history's width
    k,
    VERIFY: tl.constexpr,
    E_BLOCK: tl.constexpr,
    MIN_N: tl.constexpr,
    MAX_N: tl.constexpr,
    K_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    real = tl.load(counts_ptr + b) > 0
    slot = tl.load(slots_ptr + b).to(tl.int64)
    seq = tl.load(seq_lens_ptr + b).to(tl.int32)
    if VERIFY:
        first = seq - tl.load(num_slots_ptr + b).to(tl.int32)
        num_emitted = tl.load(num_accepted_ptr + b).to(tl.int32) + 1
    else:  # one token each, at the position after the row's last
        first = seq
        num_emitted = seq * 0 + 1
    prompt = tl.load(prompt_lens_ptr + slot, mask=real, other=0).to(tl.int32)
    active = (first >= prompt) & real  # emitted past its prompt
    last = real & (seq == prompt - 1)  # a prompt chunk leaving one token: drafts from the prompt
    target = tl.where(real, slot, sink)  # padding rows: the sink row
    row_ptr = history_ptr + target * history_stride
    # the append: at most E tokens at first .. first + num_emitted - 1 (within the table)
    offs = tl.arange(0, E_BLOCK)
    cols = first + offs
    # (the mask from block comparisons only: the interpreter turns a bool scalar & a block to int)
    num_kept = tl.where(active, tl.minimum(num_emitted, num_cols), 0)
    keep = (offs < num_kept) & (cols >= 0) & (cols < seq_len)
    tokens = tl.load(emitted_ptr + b * emitted_stride_b + offs * emitted_stride_e, mask=keep)
    tl.store(row_ptr + cols, tokens.to(tl.int32), mask=keep)
    # the search reads what the stores above wrote (other threads of this program may hold them)
    tl.debug_barrier()
    length = tl.where(last, prompt, first + num_emitted)
    length = tl.minimum(tl.maximum(length, 0), seq_len)
    length = tl.where(active | last, length, 0)  # any other row: no match, out_num 0
    _search_and_store(
        row_ptr,
        length,
        out_tokens_ptr + target * out_tokens_stride,
        out_num_ptr + target,
        k,
        MIN_N,
        MAX_N,
        K_BLOCK,
        BLOCK,
    )


_step = Launcher(_ngram_step_kernel)


def ngram_step_triton(
    history: torch.Tensor,
    out_tokens: torch.Tensor,
    out_num: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seq_lens: torch.Tensor,
    prompt_lens: torch.Tensor,
    emitted: torch.Tensor,
    num_accepted: torch.Tensor | None,
    num_slots: torch.Tensor | None,
    k: int,
    min_n: int,
    max_n: int,
    *,
    block: int = BLOCK,
    num_warps: int = 8,
) -> None:
    """``ngram_step_ref`` in one launch (none for an empty batch): one program per batch row
    appends its tokens, then searches its slot's history; ``block``: the window starts compared
    per loop step (a power of two; the tests take small ones to scan several).
    The sink column is left as it was (the reference writes its masked tokens there)."""
    check_step_args(
        history, out_tokens, out_num, slots, counts, seq_lens, prompt_lens, emitted,
        num_accepted, num_slots, k, min_n, max_n,
    )  # fmt: skip
    num_rows = slots.shape[0]
    if num_rows == 0:
        return
    if history.stride(1) != 1 or out_tokens.stride(1) != 1 or out_num.stride(0) != 1:
        raise ValueError("history, out_tokens and out_num need unit stride along their rows")
    verify = num_slots is not None
    counts = counts.contiguous()
    _step(
        (num_rows,),
        history,
        history.stride(0),
        out_tokens,
        out_tokens.stride(0),
        out_num,
        slots.contiguous(),
        counts,
        seq_lens.contiguous(),
        prompt_lens.contiguous(),
        emitted,
        emitted.stride(0),
        emitted.stride(1),
        num_accepted.contiguous() if verify else counts,  # not read in a plain step
        num_slots.contiguous() if verify else counts,
        emitted.shape[1],
        history.shape[0] - 1,
        history.shape[1],
        k,
        VERIFY=verify,
        E_BLOCK=triton.next_power_of_2(emitted.shape[1]),
        MIN_N=min_n,
        MAX_N=max_n,
        K_BLOCK=triton.next_power_of_2(max(k, 1)),
        BLOCK=block,
        num_warps=num_warps,
    )
