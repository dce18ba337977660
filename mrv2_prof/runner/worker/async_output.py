"""A step's output on its way to the host (MRV2 ``async_utils.py``), and the one designed wait.

``AsyncOutput.queue`` is called at the end of a queued step: it copies the sampled tokens (and
any logprobs) from the device into pinned host memory and records a CUDA event after the
copies; nothing waits. ``AsyncOutput.wait`` is the one place the runner is designed to block:
on that event, and then it reads the tokens.

The sampled tokens land in a ring of ``PINNED_RING_DEPTH`` pinned buffers, each with its own
event, so the copy of step N+1 never overwrites the buffer step N's tokens are still read from
(async scheduling keeps two steps in flight). Logprobs are rarer and variable in shape; they go
to fresh pinned buffers. A verify step's logprobs come per target row; a verifying request gets
one entry per emitted token (rows ``cu_rows[b]`` to ``cu_rows[b] + num_accepted[b]``). On the CPU
there is nothing to copy or wait for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mrv2_prof.probes import api as probes
from mrv2_prof.probes.api import Probe
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.prompt_logprobs import PromptLogprobsPlan, split_by_request
from mrv2_prof.runner.worker.sampler import SamplerOutput
from mrv2_prof.runner.worker.spec_decode.rejection_sampler import RejectionOutput
from mrv2_prof.runner.worker.staged_write import WriteStats
from mrv2_prof.runner.worker.uva import PINNED_RING_DEPTH

OUTPUT_WAIT_SITE = "mrv2_prof/runner/worker/async_output.py:AsyncOutput.wait"


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]  # batch order
    sampled_token_ids: list[int]
    # per batch row the sampled token's (token, lp), then the top-k; a verify step's verifying
    # row (one with draft slots): a list of those, one per emitted token
    logprobs: list[list[tuple[int, float]]] | None = None
    write_stats: dict[str, WriteStats] = field(default_factory=dict)
    output_wait_ns: int = 0  # host time spent waiting for the sampled tokens
    # req_id -> (first position, per position [(prompt token, lp), (top-1, lp), ...])
    prompt_logprobs: dict[str, tuple[int, list[list[tuple[int, float]]]]] | None = None
    # a verify step: per batch row the emitted tokens (accepted drafts, then one)
    spec_token_ids: list[list[int]] | None = None
    # a draft model's proposals: per batch row the k drafts for the request's next verify
    draft_token_ids: list[list[int]] | None = None
    # a verify step with drafts on the device: per batch row its real drafts (the rest of its
    # slots were placeholders)
    spec_num_drafts: list[int] | None = None


@dataclass
class PendingOutput:
    """A queued step whose sampled tokens the host has not read yet."""

    batch: InputBatch | None  # None: an empty step
    write_stats: dict[str, WriteStats]
    sampled: torch.Tensor | None = None  # [B]: the pinned host buffer on CUDA
    logprob_token_ids: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    num_logprobs: np.ndarray | None = None  # [B] requested per row
    prompt_plan: PromptLogprobsPlan | None = None
    prompt_ids: torch.Tensor | None = None  # [R, 1 + k] (host after the copy)
    prompt_lps: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None  # recorded after the copies (CUDA)
    verify_tokens: torch.Tensor | None = None  # [B, 1 + K] a verify step's output
    num_accepted: torch.Tensor | None = None  # [B]
    verify_rows: np.ndarray | None = None  # [B + 1] a verify step's cu_rows (host)
    draft_tokens: torch.Tensor | None = None  # [B, k] the draft model's proposals
    num_draft: torch.Tensor | None = None  # [B] a verify's real drafts, made on the device


class AsyncOutput:
    """The pinned ring and events the sampled tokens come back through, for one runner."""

    def __init__(self, max_num_reqs: int, is_cuda: bool, copies: CopyAudit, probe: Probe) -> None:
        self.is_cuda = is_cuda
        self.copies = copies
        self.probe = probe
        self._host_tokens = torch.zeros(
            (PINNED_RING_DEPTH, max_num_reqs), dtype=torch.int64, pin_memory=is_cuda
        )
        self._ready = [torch.cuda.Event() for _ in range(PINNED_RING_DEPTH)] if is_cuda else []
        self._next = 0
        self._rows: dict[tuple[int, int], torch.Tensor] = {}  # (ring slot, B) -> its view
        # the runner's stream, looked up once (``Event.record()`` looks it up on every call)
        self._stream = torch.cuda.current_stream() if is_cuda else None

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor copied into fresh pinned host memory (read after the step's event)."""
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.is_cuda)
        self.copies.copy_(out, t)
        return out

    def queue(
        self,
        batch: InputBatch,
        out: SamplerOutput,
        write_stats: dict[str, WriteStats],
        num_logprobs: np.ndarray | None = None,  # [B], when any row asked for logprobs
        prompt: tuple[PromptLogprobsPlan, tuple[torch.Tensor, torch.Tensor]] | None = None,
        verify: RejectionOutput | None = None,
        verify_rows: np.ndarray | None = None,  # [B + 1] the verify's cu_rows (host)
        drafts: torch.Tensor | None = None,  # [B, k] the draft model's proposals
        num_draft: torch.Tensor | None = None,  # [B] a verify's real drafts (device drafts)
    ) -> PendingOutput:
        """Queue the copies of a step's tokens, logprobs, prompt logprobs and a verify step's
        emitted tokens with their accepted counts, then the event."""
        pending = PendingOutput(batch, write_stats, num_logprobs=num_logprobs)
        pending.verify_rows = verify_rows
        if verify is not None:  # the accepted counts come back with the tokens
            pending.verify_tokens = self.to_host(verify.output_token_ids)
            pending.num_accepted = self.to_host(verify.num_accepted)
        if num_draft is not None:  # drafts on the device: the host learns their count here
            pending.num_draft = self.to_host(num_draft)
        if drafts is not None:  # the drafts come back with the tokens too
            pending.draft_tokens = self.to_host(drafts) if self.is_cuda else drafts
        if not self.is_cuda:
            pending.sampled = out.sampled_token_ids
            pending.logprob_token_ids, pending.logprobs = out.logprob_token_ids, out.logprobs
        else:
            i = self._next
            self._next = (i + 1) % PINNED_RING_DEPTH
            rows = self._rows.get((i, batch.num_reqs))
            if rows is None:  # a view per ring slot and batch size, made once (no slicing)
                rows = self._rows[(i, batch.num_reqs)] = self._host_tokens[i, : batch.num_reqs]
            pending.sampled = rows
            self.copies.copy_(pending.sampled, out.sampled_token_ids)
            if out.logprobs is not None:
                pending.logprob_token_ids = self.to_host(out.logprob_token_ids)
                pending.logprobs = self.to_host(out.logprobs)
            pending.ready = self._ready[i]
        if prompt is not None:
            pending.prompt_plan = prompt[0]
            pending.prompt_ids, pending.prompt_lps = (self.to_host(t) for t in prompt[1])
        # The step's last device mark, after every copy above. The ready event marks the same
        # point of the stream: the probe's event, when it recorded one, is waited on instead.
        end = self.probe.gpu_mark(probes.G_END)
        if pending.ready is not None:
            if end is not None:
                pending.ready = end
            else:
                pending.ready.record(self._stream)
        return pending

    def wait(self, pending: PendingOutput) -> ModelRunnerOutput:
        """The designed sync point: wait for a queued step's sampled tokens (and logprobs)."""
        batch = pending.batch
        if batch is None:
            return ModelRunnerOutput([], [], write_stats=pending.write_stats)
        if pending.ready is not None:  # the probe's deferred work while the device runs
            self.probe.before_wait(pending.ready)
        self.probe.begin(probes.OUTPUT_WAIT)
        t0 = time.perf_counter_ns()
        if pending.ready is not None:  # the one wait the runner is designed to make
            probes.wait_deliberately(pending.ready.synchronize)
        tokens = pending.sampled.tolist()
        spec_token_ids = accepted = None
        if pending.verify_tokens is not None:
            rows, accepted = pending.verify_tokens.tolist(), pending.num_accepted.tolist()
            spec_token_ids = [row[: 1 + n] for row, n in zip(rows, accepted, strict=True)]
        drafts = None if pending.draft_tokens is None else pending.draft_tokens.tolist()
        num_drafts = None if pending.num_draft is None else pending.num_draft.tolist()
        wait_ns = time.perf_counter_ns() - t0
        self.probe.end(probes.OUTPUT_WAIT)
        self.probe.sync("output_wait", OUTPUT_WAIT_SITE, wait_ns)
        logprobs = None
        if pending.logprobs is not None:
            counts = pending.num_logprobs
            ids_l, lp_l = pending.logprob_token_ids.tolist(), pending.logprobs.tolist()

            def entry(row: int, b: int) -> list[tuple[int, float]]:
                return list(
                    zip(ids_l[row][: 1 + counts[b]], lp_l[row][: 1 + counts[b]], strict=True)
                )

            cu = pending.verify_rows
            if cu is None:
                logprobs = [entry(b, b) for b in range(batch.num_reqs)]
            else:  # one row per request without draft slots; one per emitted token with them
                logprobs = [
                    entry(int(cu[b]), b)
                    if cu[b + 1] - cu[b] == 1
                    else [entry(int(cu[b]) + j, b) for j in range(1 + accepted[b])]
                    for b in range(batch.num_reqs)
                ]
        prompt_logprobs = None
        if pending.prompt_plan is not None:
            prompt_logprobs = split_by_request(
                pending.prompt_plan, pending.prompt_ids.tolist(), pending.prompt_lps.tolist()
            )
        return ModelRunnerOutput(
            batch.req_ids,
            tokens,
            logprobs,
            pending.write_stats,
            output_wait_ns=wait_ns,
            prompt_logprobs=prompt_logprobs,
            spec_token_ids=spec_token_ids,
            draft_token_ids=drafts,
            spec_num_drafts=num_drafts,
        )
