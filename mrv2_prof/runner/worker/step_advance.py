"""The device-side state advance after a step's sampling (torch reference).

After sampling, each request's slot gets the token it sampled (``last_sampled_tokens``, which
the next step's input prep reads on the device under async scheduling) and, with staged writes,
its ``num_computed_tokens`` advanced by the tokens the step computed for it (rolled back by the
rejected drafts of a verify step). Nothing goes through the host. ``advance_state_ref`` is the
torch form, two indexed writes; ``step_advance_triton`` does both in one launch.
"""

from __future__ import annotations

import torch


def advance_state_ref(
    last_sampled_tokens: torch.Tensor,  # [R] int64
    num_computed_tokens: torch.Tensor | None,  # [R] int32; None: not advanced (dense writes)
    idx_mapping: torch.Tensor,  # [B] int32, distinct slots
    sampled_token_ids: torch.Tensor,  # [B] int64
    advance: torch.Tensor | None,  # [B] int32: tokens computed per request this step
) -> None:
    last_sampled_tokens[idx_mapping] = sampled_token_ids
    if num_computed_tokens is not None:
        num_computed_tokens.index_add_(0, idx_mapping, advance)
