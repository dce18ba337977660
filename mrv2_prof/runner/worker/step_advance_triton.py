"""The state advance after sampling in one Triton launch (``step_advance.advance_state_ref``).

One program per ``BLOCK`` batch rows: each row writes its sampled token into its slot's
``last_sampled_tokens`` and, when given, adds its advance to the slot's ``num_computed_tokens``
(the slots of a batch are distinct, so no two programs touch one slot). It replaces the two
indexed torch writes (an ``index_put_`` and an ``index_add_``, each a launch and a tensor
iterator on the host) and goes through the cached launcher.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mrv2_prof.runner.worker.triton_launch import Launcher

BLOCK = 128


# advance and counts are views at a batch-size-dependent offset: not specialised on alignment,
# so a batch size the warm-up did not see compiles nothing on the step loop
@triton.jit(
    do_not_specialize=["num_rows"],
    do_not_specialize_on_alignment=["advance_ptr", "counts_ptr"],
)
def _advance_kernel(
    last_sampled_ptr,  # [R] int64
    num_computed_ptr,  # [R] int32 (ADVANCE)
    idx_mapping_ptr,  # [B]
    sampled_ptr,  # [B] int64
    advance_ptr,  # [B] (ADVANCE)
    counts_ptr,  # [B] (SKIP_EMPTY): a row with count 0 is padding and writes nothing
    num_rows,
    ADVANCE: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < num_rows
    if SKIP_EMPTY:
        mask = mask & (tl.load(counts_ptr + rows, mask=mask, other=0) != 0)
    slots = tl.load(idx_mapping_ptr + rows, mask=mask, other=0).to(tl.int64)
    tokens = tl.load(sampled_ptr + rows, mask=mask)
    tl.store(last_sampled_ptr + slots, tokens.to(last_sampled_ptr.dtype.element_ty), mask=mask)
    if ADVANCE:
        done = tl.load(num_computed_ptr + slots, mask=mask)
        step = tl.load(advance_ptr + rows, mask=mask, other=0)
        tl.store(num_computed_ptr + slots, (done + step).to(done.dtype), mask=mask)


_advance = Launcher(_advance_kernel)


def advance_state_triton(
    last_sampled_tokens: torch.Tensor,
    num_computed_tokens: torch.Tensor | None,
    idx_mapping: torch.Tensor,
    sampled_token_ids: torch.Tensor,
    advance: torch.Tensor | None,
    counts: torch.Tensor | None = None,
) -> None:
    """``advance_state_ref`` in one launch (none for an empty batch)."""
    num_rows = idx_mapping.shape[0]
    if sampled_token_ids.shape != (num_rows,):
        raise ValueError(
            f"sampled_token_ids has shape {tuple(sampled_token_ids.shape)}, expected ({num_rows},)"
        )
    if (num_computed_tokens is None) != (advance is None):
        raise ValueError("num_computed_tokens and advance go together")
    if advance is not None and advance.shape != (num_rows,):
        raise ValueError(f"advance has shape {tuple(advance.shape)}, expected ({num_rows},)")
    if counts is not None and counts.shape != (num_rows,):
        raise ValueError(f"counts has shape {tuple(counts.shape)}, expected ({num_rows},)")
    if num_rows == 0:
        return
    # rows are read at unit stride (a verify step's last tokens may be a strided view)
    idx_mapping, sampled_token_ids = idx_mapping.contiguous(), sampled_token_ids.contiguous()
    with_advance = advance is not None
    if with_advance:
        advance = advance.contiguous()
    _advance(
        (triton.cdiv(num_rows, BLOCK),),
        last_sampled_tokens,
        num_computed_tokens if with_advance else last_sampled_tokens,  # unread without ADVANCE
        idx_mapping,
        sampled_token_ids,
        advance if with_advance else idx_mapping,
        counts.contiguous() if counts is not None else idx_mapping,  # unread without SKIP_EMPTY
        num_rows,
        ADVANCE=with_advance,
        SKIP_EMPTY=counts is not None,
        BLOCK=BLOCK,
    )
