"""The device-side state advance after a step's sampling (torch reference).

After sampling, each request's slot gets the token it sampled (``last_sampled_tokens``, which
the next step's input prep reads on the device under async scheduling) and, with staged writes,
its ``num_computed_tokens`` advanced by the tokens the step computed for it (rolled back by the
rejected drafts of a verify step). Nothing goes through the host. ``advance_state_ref`` is the
torch form, two indexed writes; ``step_advance_triton`` does both in one launch.
``advance_step`` is the model runner's call of it, with the verify step's roll-back. Given
``counts``, rows with count 0 (a FULL decode graph's padding) write nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the kernel set imports this module
    from mrv2_prof.runner.worker.input_batch import InputBatch
    from mrv2_prof.runner.worker.kernel_set import KernelSet
    from mrv2_prof.runner.worker.request_states import RequestStates
    from mrv2_prof.runner.worker.spec_decode.rejection_sampler import RejectionOutput
    from mrv2_prof.runner.worker.spec_decode.verify import VerifyInputs


def advance_state_ref(
    last_sampled_tokens: torch.Tensor,  # [R] int64
    num_computed_tokens: torch.Tensor | None,  # [R] int32; None: not advanced (dense writes)
    idx_mapping: torch.Tensor,  # [B] int32, distinct slots
    sampled_token_ids: torch.Tensor,  # [B] int64
    advance: torch.Tensor | None,  # [B] int32: tokens computed per request this step
    counts: torch.Tensor | None = None,  # [B]: a row with count 0 is padding, not written
) -> None:
    if counts is not None:  # a FULL decode graph's padded batch: only its real rows
        keep = counts != 0
        idx_mapping, sampled_token_ids = idx_mapping[keep], sampled_token_ids[keep]
        advance = advance[keep] if advance is not None else None
    last_sampled_tokens[idx_mapping] = sampled_token_ids
    if num_computed_tokens is not None:
        num_computed_tokens.index_add_(0, idx_mapping, advance)


def advance_step(
    kernels: KernelSet,
    rs: RequestStates,
    batch: InputBatch,
    sampled_token_ids: torch.Tensor,  # [B] int64
    verify: VerifyInputs | None,
    rejection: RejectionOutput | None,
    staged_writes: bool,
) -> torch.Tensor:
    """Advance the slots of ``batch`` after its sampling; the next step reads them without a host
    round trip. Returns the tokens computed per request ([B] int32)."""
    advance = batch.num_scheduled_tokens
    if rejection is not None:  # rolled back by the rejected and padded, on the device
        advance = advance - verify.drafts.num_slots + rejection.num_accepted
    done = rs.num_computed_tokens.gpu if staged_writes else None
    # int32 slot indices: no conversion kernel; one launch with the Triton kernels
    kernels.advance_state(
        rs.last_sampled_tokens,
        done,
        batch.idx_mapping,
        sampled_token_ids,
        advance if done is not None else None,
    )
    return advance
