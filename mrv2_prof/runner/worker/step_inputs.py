"""A step's inputs from the scheduler output (MRV2 ``model_runner.prepare_inputs``).

The host builds only the small per-step arrays (``idx_mapping``, the tokens scheduled per request,
the computed counts and ``query_start_loc``), in the next of two preallocated sets: a batch's
arrays live until its tokens are read, one step later with async scheduling. ``idx_mapping`` and
the counts go to the device in one small transfer, through a ring of pinned buffers into one
device buffer (no allocation, and the CPU never rewrites a buffer a copy may read); the rest of
the batch is built on the device from the request slots and block tables, into the runner's
persistent ``InputBuffers``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from mrv2_prof.runner.core.scheduler import SchedulerOutput
from mrv2_prof.runner.worker.block_table import BlockTables
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.input_buffers import InputBuffers
from mrv2_prof.runner.worker.kernel_set import KernelSet
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.uva import PinnedRing


class StepInputs:
    def __init__(
        self,
        max_num_reqs: int,
        device: torch.device,
        pin: bool,
        copies: CopyAudit,
        req_states: RequestStates,
        block_tables: BlockTables,
        inputs: InputBuffers,
        block_size: int,
    ) -> None:
        n = max_num_reqs
        self._step_ring = PinnedRing(2 * n, torch.int32, pin=pin)
        self._step_dev = torch.zeros(2 * n, dtype=torch.int32, device=device)
        # idx_mapping | counts | computed | query_start_loc on the host, two sets in turn
        self._host_arrays = [
            [np.zeros(n + (k == 3), dtype=np.int32) for k in range(4)] for _ in range(2)
        ]
        self._host_set = 0
        self._arange = np.arange(n + 1, dtype=np.int32)
        self.copies = copies
        self.req_states = req_states
        self.block_tables = block_tables
        self.inputs = inputs
        self.block_size = block_size

    def host(self, so: SchedulerOutput) -> HostStep:
        """The step's host arrays, in the next of the two sets."""
        rs = self.req_states
        req_ids = list(so.num_scheduled_tokens)
        num_reqs, num_tokens = len(req_ids), so.total_num_scheduled_tokens
        self._host_set ^= 1
        idx_np, counts_np, computed_np, qsl_np = (a[:n] for a, n in zip(
            self._host_arrays[self._host_set], (num_reqs, num_reqs, num_reqs, num_reqs + 1),
            strict=True,
        ))  # fmt: skip
        idx_np[:] = list(map(rs.slot_of.__getitem__, req_ids))
        cached = so.scheduled_cached_reqs
        if num_tokens == num_reqs:  # one token each
            counts_np[:] = 1
        else:
            counts_np[:] = list(so.num_scheduled_tokens.values())
        if len(cached) == num_reqs:  # batch order is the cached requests' order
            computed_np[:] = cached.num_computed_tokens
        else:
            computed = {d.req_id: d.num_computed_tokens for d in so.scheduled_new_reqs}
            computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
            computed_np[:] = list(map(computed.__getitem__, req_ids))
        if num_tokens == num_reqs:  # 0, 1, ..., B and computed + 1 (no reduction on the path)
            qsl_np[:] = self._arange[: num_reqs + 1]
            np.add(computed_np, 1, out=computed_np)  # in place: the sequence lengths
        else:
            qsl_np[0] = 0
            np.cumsum(counts_np, out=qsl_np[1:])
            np.add(computed_np, counts_np, out=computed_np)
        return HostStep(req_ids, num_reqs, num_tokens, idx_np, counts_np, qsl_np, computed_np)

    def prepare(self, so: SchedulerOutput, kernels: KernelSet) -> InputBatch:
        """The step's ``InputBatch``; ``kernels`` builds its device part."""
        return self.device(self.host(so), kernels)

    def device(self, host: HostStep, kernels: KernelSet) -> InputBatch:
        """The device part of a step from its host arrays: one small copy, one input build."""
        rs, num_reqs, num_tokens = self.req_states, host.num_reqs, host.num_tokens
        buf, view = self._step_ring.next()  # one small transfer
        view[:num_reqs] = host.idx_mapping_np
        view[num_reqs : 2 * num_reqs] = host.num_scheduled_tokens_np
        step = self._step_dev[: 2 * num_reqs]
        self.copies.copy_(step, buf[: 2 * num_reqs])
        idx_mapping, counts = step[:num_reqs], step[num_reqs:]
        inputs = kernels.prepare_inputs(
            idx_mapping,
            counts,
            num_tokens,
            rs.num_computed_tokens.gpu,
            rs.num_prefill_tokens.gpu,
            rs.prefill_token_ids.gpu,
            rs.last_sampled_tokens,
            self.block_tables.table.gpu,
            self.block_size,
            out=self.inputs.views(num_tokens, num_reqs, block_table=True),  # + the table rows
        )
        return host.batch(idx_mapping, counts, inputs)


@dataclass
class HostStep:
    """A step's host arrays (``seq_lens_np`` = computed + scheduled, per row)."""

    req_ids: list[str]
    num_reqs: int
    num_tokens: int
    idx_mapping_np: np.ndarray  # the InputBatch's names: either serves a host-side reader
    num_scheduled_tokens_np: np.ndarray
    query_start_loc_np: np.ndarray
    seq_lens_np: np.ndarray

    @classmethod
    def of(cls, batch: InputBatch) -> HostStep:
        """The host arrays of a built batch."""
        return cls(**{f.name: getattr(batch, f.name) for f in fields(cls)})

    def batch(
        self, idx_mapping: torch.Tensor, counts: torch.Tensor, inputs: dict[str, torch.Tensor]
    ) -> InputBatch:
        """The ``InputBatch`` over the step's device tensors."""
        return InputBatch(
            req_ids=self.req_ids,
            num_reqs=self.num_reqs,
            num_tokens=self.num_tokens,
            idx_mapping_np=self.idx_mapping_np,
            num_scheduled_tokens_np=self.num_scheduled_tokens_np,
            query_start_loc_np=self.query_start_loc_np,
            seq_lens_np=self.seq_lens_np,
            idx_mapping=idx_mapping,
            num_scheduled_tokens=counts,
            **inputs,
        )
