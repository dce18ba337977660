"""The verify step on the runner's side (MRV2's speculative path through the model runner).

A verifying request is scheduled for ``1 + s`` tokens: its last token, then its ``s`` draft
slots: its real drafts, then any ``PAD_DRAFT`` placeholders the scheduler padded it with up to
the step's k (so that every request of a uniform decode batch has the same shape and the step
replays a FULL verify graph). ``Verifier.prepare`` packs the step's draft layout into one pinned
buffer and sends it in one copy: where each real draft goes in ``input_ids``, the logits rows to
compute (every row of a verifying request, the last row of the others), the rejection sampler's
``cu_rows``, ``num_draft`` (real drafts), ``num_slots`` and padded draft ids. ``apply`` writes the
drafts into the batch's inputs (the input-prep kernel filled those positions with the last
sampled token, which a placeholder keeps: a valid token whose KV is written and then rolled
back) and points the batch's ``logits_indices`` at the verify rows. ``sample`` runs the rejection
sampler (the torch reference, or the Triton kernels with ``kernels: triton``) over every row; it
compares only real drafts, so a placeholder is never accepted, and a request without drafts gets
the token the plain sampler would give it. ``advance`` then moves the device state on: the last
emitted token becomes ``last_sampled_tokens`` and ``num_computed_tokens`` advances by the
scheduled tokens less the rejected and padded slots, so the GPU stays authoritative and nothing
is read back here; the accepted counts reach the host with the tokens (``AsyncOutput``).
With drafts on the device (``DEVICE_DRAFT`` slots, spec_decode/device_drafts.py) the host knows
only each request's slot count: ``prepare`` lays out every slot and ``DeviceDrafts.apply`` fills
the drafts, their real counts and the input ids on the device.
``row_logprobs`` gives every row the top-k logprobs of the token it emitted (the plain sampler's
``compute_topk_logprobs`` over that row's target logits), for requests that ask for logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mrv2_prof.runner.config import DEVICE_DRAFT, PAD_DRAFT
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.sampler import SamplingMetadata, compute_topk_logprobs
from mrv2_prof.runner.worker.spec_decode.rejection_sampler import (
    DraftBatch,
    RejectionOutput,
    rejection_sample,
)
from mrv2_prof.runner.worker.uva import PinnedRing


@dataclass
class VerifyInputs:
    """One verify step's layout on the device (views into the verifier's buffer)."""

    draft_index: torch.Tensor  # [D] int64: token index of each draft in the batch
    # [D] int64: the drafts; with drafts on the device, each slot's flat index into them [B, K]
    draft_tokens: torch.Tensor
    logits_indices: torch.Tensor  # [R] int64, R = B + S (S: every draft slot)
    drafts: DraftBatch  # cu_rows [B + 1], num_draft [B], draft_token_ids [B, K], num_slots [B]
    num_draft_np: np.ndarray  # [B] host copy (the scheduler's counts of real drafts; 0 on device)
    cu_rows_np: np.ndarray  # [B + 1] host copy
    num_padded: int  # placeholder slots in the step


def _capacity(max_num_reqs: int, max_k: int) -> int:
    b, d = max_num_reqs, max_num_reqs * max_k
    rows = b + d  # at most 1 + K target rows a request
    return 2 * d + rows + (b + 1) + b + d + b + 2 * rows + 9  # + one pad per part (alignment)


class Verifier:
    def __init__(
        self, max_num_reqs: int, max_k: int, device: torch.device, copies: CopyAudit, triton: bool
    ) -> None:
        self.max_k = max_k
        self.device = device
        self.copies = copies
        self.triton = triton
        size = _capacity(max_num_reqs, max_k)
        self._ring = PinnedRing(size, torch.int64, pin=device.type == "cuda")
        self._dev = torch.zeros(size, dtype=torch.int64, device=device)

    def prepare(
        self,
        req_ids: list[str],
        query_start_loc_np: np.ndarray,  # [B + 1]
        spec_tokens: dict[str, list[int]],
    ) -> VerifyInputs:
        num_reqs, max_k = len(req_ids), self.max_k
        drafts = [spec_tokens.get(rid, ()) for rid in req_ids]
        num_slots = np.fromiter(map(len, drafts), dtype=np.int64, count=num_reqs)
        # drafts on the device: every slot is written from the device's drafts (DeviceDrafts)
        on_device = any(d and d[0] == DEVICE_DRAFT for d in drafts)
        pads = [d.count(PAD_DRAFT) if d else 0 for d in drafts]  # placeholders follow the drafts
        num_draft = num_slots - np.asarray(pads, dtype=np.int64)
        if on_device:
            num_draft = num_slots  # every slot is laid out; the device knows the real count
        d_total = int(num_draft.sum())
        ends = query_start_loc_np[1:].astype(np.int64)  # [B]
        cu_rows = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(1 + num_slots, out=cu_rows[1:])
        # A verifying request's rows are its last 1 + s tokens (all of its scheduled tokens).
        row_req = np.repeat(np.arange(num_reqs), 1 + num_slots)  # [R]
        row_j = np.arange(len(row_req)) - cu_rows[row_req]
        logits_indices = ends[row_req] - 1 - num_slots[row_req] + row_j
        draft_rows = row_j < num_draft[row_req]  # rows that verify a real draft
        draft_index = logits_indices[draft_rows] + 1  # each draft is the token after its row
        padded = np.zeros((num_reqs, max_k), dtype=np.int64)
        if on_device:  # each slot's flat index into the device's drafts [B, K]
            flat = row_req[draft_rows] * max_k + row_j[draft_rows]
            num_draft = np.zeros(num_reqs, dtype=np.int64)  # filled on the device
        else:
            flat = [t for d in drafts for t in d if t != PAD_DRAFT]
            if d_total:
                padded[row_req[draft_rows], row_j[draft_rows]] = flat

        num_rows = len(row_req)
        parts = (draft_index, flat, logits_indices, cu_rows, num_draft, padded.ravel(), num_slots,
                 row_req, row_j)  # fmt: skip
        sizes = [d_total, d_total, num_rows, num_reqs + 1, num_reqs, num_reqs * max_k, num_reqs]
        sizes += [num_rows, num_rows]
        host, view = self._ring.next()
        # Each part starts 16-byte aligned (an even int64 offset): triton specialises a pointer
        # on its alignment, so unaligned parts would compile a kernel per layout on the loop.
        starts = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum((np.asarray(sizes[:-1]) + 1) // 2 * 2, out=starts[1:])
        for part, a, n in zip(parts, starts, sizes, strict=True):
            view[a : a + n] = part
        used = int(starts[-1] + sizes[-1])
        dev = self._dev[:used]
        self.copies.copy_(dev, host[:used])
        v = [dev[a : a + n] for a, n in zip(starts, sizes, strict=True)]
        return VerifyInputs(
            draft_index=v[0],
            draft_tokens=v[1],
            logits_indices=v[2],
            drafts=DraftBatch(
                cu_rows=v[3].to(torch.int32),
                num_draft=v[4].to(torch.int32),
                draft_token_ids=v[5].view(num_reqs, max_k),
                num_slots=v[6].to(torch.int32),
                row_req=v[7],
                row_j=v[8],
            ),
            num_draft_np=num_draft,
            cu_rows_np=cu_rows,
            num_padded=sum(pads),
        )

    @staticmethod
    def apply(batch: InputBatch, inputs: VerifyInputs) -> None:
        """The drafts into the batch's input ids; the batch's logits rows become the verify's."""
        batch.input_ids.index_copy_(0, inputs.draft_index, inputs.draft_tokens)
        batch.logits_indices = inputs.logits_indices

    def sample(
        self, logits: torch.Tensor, inputs: VerifyInputs, meta: SamplingMetadata
    ) -> RejectionOutput:
        """Rejection sampling over every row; ``meta.positions`` is each request's first row's
        position (its sequence length less its drafts)."""
        if self.triton:
            from mrv2_prof.runner.worker.spec_decode.rejection_sampler_triton import (
                rejection_sample_triton,
            )

            return rejection_sample_triton(logits, inputs.drafts, meta)
        return rejection_sample(logits, inputs.drafts, meta)

    @staticmethod
    def last_tokens(out: RejectionOutput) -> torch.Tensor:
        """[B] int64: each request's last emitted token (the next step's input)."""
        return out.output_token_ids.gather(1, out.num_accepted.long()[:, None])[:, 0]

    @staticmethod
    def row_logprobs(
        logits: torch.Tensor, inputs: VerifyInputs, out: RejectionOutput, num_logprobs: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and logprobs [R, 1 + num_logprobs] of every row: the token the row emitted
        (row j of a request emits its j-th output token; rows past the emitted ones get token
        0, never read), then the row's top-k, as the plain sampler computes them."""
        cu = inputs.drafts.cu_rows.long()
        rows = torch.arange(logits.shape[0], device=logits.device)
        request = torch.searchsorted(cu[1:], rows, right=True)
        tokens = out.output_token_ids[request, rows - cu[request]].clamp(min=0)
        return compute_topk_logprobs(logits, num_logprobs, tokens)
