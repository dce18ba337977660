"""Persistent request state in fixed slots (MRV2 ``states.py``: ``RequestState``).

``max_num_reqs`` rows are allocated once. A request takes a free row when the runner first sees
it and keeps it until it finishes or is preempted (preemption is treated as finishing; resuming
re-adds the request as new). Step inputs are gathered from these rows through ``idx_mapping``;
the rows are never reordered.

Device-resident: prompt token ids (written once per request with a staged write),
``num_computed_tokens`` (staged write for a new request, then advanced on the device after each
step), the last sampled token. Small per-request sampling parameters live in unpinned CPU arrays;
when they change, a fresh pinned snapshot is sent (the CPU never writes memory that an
in-flight copy reads — no async barrier needed).

With ``uva`` (Triton kernels on CUDA) the prompt token ids live in a pinned host table that the
input-prep kernel reads in place, and the sampling parameters are written into the next of a
ring of pinned buffers that the sampler reads in place: nothing is copied for either.

A freed slot is reused only ``reuse_lag`` steps later: with async scheduling the step before
may still be running on the GPU and reading the slot's rows when the next step is prepared.
"""

from __future__ import annotations

import zlib
from collections import deque

import numpy as np
import torch

from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.staged_write import (
    ApplyFn,
    StagedWriteTensor,
    WriteStats,
    make_write_tensor,
)
from mrv2_prof.runner.worker.uva import PinnedRing, UvaTable

# the sampling parameters sent to the device as whole tables (with uva: pinned ring buffers)
PARAM_TABLES = ("temperature", "top_k", "top_p", "seeds")


def request_seed(engine_seed: int, req_id: str, seed: int | None) -> int:
    """A request's sampling seed: its own, or one derived from the engine seed and its id."""
    if seed is not None:
        return seed
    return (engine_seed << 32) ^ zlib.crc32(req_id.encode())


class RequestStates:
    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        device: torch.device,
        staged_writes: bool,
        apply_fn: ApplyFn | None = None,
        uva: bool = False,
        reuse_lag: int = 0,
        copies: CopyAudit | None = None,
    ) -> None:
        self.copies = copies if copies is not None else CopyAudit()
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.uva = uva
        self._free_slots = list(range(max_num_reqs - 1, -1, -1))
        # Slots freed in each of the last ``reuse_lag`` steps, newest last; not yet reusable.
        self._released: deque[list[int]] = deque([] for _ in range(reuse_lag))
        self.slot_of: dict[str, int] = {}

        if uva:
            self.prefill_token_ids = UvaTable((max_num_reqs, max_model_len), torch.int32)
        else:
            self.prefill_token_ids = StagedWriteTensor(
                (max_num_reqs, max_model_len), torch.int32, device, apply_fn, self.copies
            )
        self.num_prefill_tokens = StagedWriteTensor(
            (max_num_reqs,), torch.int32, device, apply_fn, self.copies
        )
        self.num_computed_tokens = make_write_tensor(
            (max_num_reqs,), torch.int32, device, staged_writes, apply_fn, self.copies
        )
        self.staged_writes = staged_writes
        self.last_sampled_tokens = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)

        # Sampling parameters: CPU arrays are the truth, device copies follow when dirty.
        self.temperature_np = np.zeros(max_num_reqs, dtype=np.float32)
        self.top_k_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.top_p_np = np.ones(max_num_reqs, dtype=np.float32)
        self.seeds_np = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_logprobs_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.temperature = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.top_p = torch.ones(max_num_reqs, dtype=torch.float32, device=device)
        self.seeds = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self._params_dirty = False
        self.params_version = 0  # counts the parameter sends (a copy of them knows it is stale)
        # slots whose request samples other than plainly (top-k, top-p or logprobs)
        self.special_slots: set[int] = set()
        if uva:
            self._param_rings = {
                name: PinnedRing(max_num_reqs, getattr(self, name).dtype, pin=True)
                for name in PARAM_TABLES
            }

    def param_table(self, name: str) -> torch.Tensor:
        """A sampling parameter's table (``temperature``, ``top_k``, ``top_p``, ``seeds``) where
        a step's sampler reads it: with ``uva`` a pinned ring buffer (read through UVA: a gather
        kernel), else the device table. The attribute of the same name holds the device table
        until the first send puts a ring buffer there: a warm-up reads this one instead, so that
        it launches the kernels a step launches."""
        return self._param_rings[name].buffers[0] if self.uva else getattr(self, name)

    def add_request(
        self,
        req_id: str,
        token_ids: list[int],
        num_computed_tokens: int,
        params: SamplingParams,
        seed: int,
    ) -> int:
        if not self._free_slots:
            raise RuntimeError(f"no free request slot (max_num_reqs={self.max_num_reqs})")
        slot = self._free_slots.pop()
        self.slot_of[req_id] = slot
        self.prefill_token_ids.stage_write(slot, 0, token_ids)
        self.num_prefill_tokens.stage_write(slot, 0, len(token_ids))
        self.num_computed_tokens.stage_write(slot, 0, num_computed_tokens)
        self.temperature_np[slot] = params.temperature
        self.top_k_np[slot] = params.top_k
        self.top_p_np[slot] = params.top_p
        self.seeds_np[slot] = seed
        self.num_logprobs_np[slot] = params.logprobs
        if params.top_k > 0 or params.top_p < 1.0 or params.logprobs > 0:
            self.special_slots.add(slot)
        self._params_dirty = True
        return slot

    def remove_request(self, req_id: str) -> int | None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self.special_slots.discard(slot)
            (self._released[-1] if self._released else self._free_slots).append(slot)
        return slot

    def begin_step(self) -> None:
        """A new step is being prepared: slots released ``reuse_lag`` steps ago become free."""
        if self._released:
            self._free_slots.extend(self._released.popleft())
            self._released.append([])

    def set_num_computed(self, slot: int, num_computed_tokens: int) -> None:
        """Dense mode only: the CPU copy is the truth and is re-sent every step."""
        self.num_computed_tokens.stage_write(slot, 0, num_computed_tokens)

    def apply_writes(self) -> dict[str, WriteStats]:
        """Send this step's staged writes and, if they changed, the sampling parameters."""
        stats = {}
        for name in ("prefill_token_ids", "num_prefill_tokens", "num_computed_tokens"):
            s = getattr(self, name).apply_write()
            if s is not None:
                stats[name] = s
        if self._params_dirty:
            for name in PARAM_TABLES:
                host = getattr(self, f"{name}_np")
                if self.uva:  # the sampler reads the new pinned buffer in place
                    buf, view = self._param_rings[name].next()
                    view[:] = host
                    setattr(self, name, buf)
                else:
                    out = getattr(self, name)
                    if out.device.type == "cpu":
                        out.copy_(torch.from_numpy(host))
                    else:
                        self.copies.copy_(out, torch.from_numpy(host).pin_memory())
            self._params_dirty = False
            self.params_version += 1
        return stats
