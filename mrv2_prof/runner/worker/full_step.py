"""A FULL decode step with its input build, sampling and state advance on the graph side.

With ``runner.full_step_graph`` (the default) a uniform decode step that a FULL graph holds
does not build its inputs, sample or advance the request state with launches of its own:

* **inputs graph** (``inputs_body``): the step's new block-table entries (``apply_appends``:
  ``n | (slot, column, block) x n`` from the same static buffer, n read on the device), then
  the input-prep kernel, reading the step's ``idx_mapping`` and per-row counts from one static
  buffer (``step_dev``, padded to the capture size: a padding row has count 0 and slot 0), then
  the FULL forward pass into the static logits. A padding row writes a token of its own that
  writes no KV (``pad_empty``), so the replay needs no fill. A step whose block-table writes
  are not single entries (a new request's row) applies them with the staged-write launch first.
* **sample graph** (``sample_body``): the Gumbel-max scan over the static logits (plain
  sampling: temperature and seed per request, greedy rows by temperature, no top-k / top-p, no
  logprobs) and the state advance, which skips the padding rows. It runs only when every row of
  the step samples plainly; any other step replays the inputs graph and samples eagerly.

The host then makes one pinned copy of the padded ``idx_mapping | counts`` and the block-table
entries and launches one or two graphs, where the eager step made three kernel launches and the
copy, and a fourth launch and copy when a request crossed into a new KV block. The sampler
reads its own device copies of ``temperature`` and ``seeds``, refreshed when the request
states' parameters change (their UVA buffers rotate, a graph keeps pointers). What the probe
sees: the device ``forward`` span of such a step also holds the input build and the new
block-table entries (its ``prepare`` span holds the other staged writes and the step's copy),
and ``sample`` holds the sampler and the state advance as before.
"""

from __future__ import annotations

import numpy as np
import torch

from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.input_buffers import InputBuffers
from mrv2_prof.runner.worker.kernel_set import KernelSet
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.sampler import SamplingMetadata
from mrv2_prof.runner.worker.step_inputs import HostStep
from mrv2_prof.runner.worker.uva import PinnedRing


class FullStep:
    """The static step buffer, the sampler's parameter copies and the graph bodies of one runner
    (CUDA, Triton kernels)."""

    def __init__(
        self,
        max_size: int,
        kernels: KernelSet,
        req_states: RequestStates,
        table: torch.Tensor,  # the block tables' device rows [R, max_blocks]
        inputs: InputBuffers,
        block_size: int,
        staged_writes: bool,
        copies: CopyAudit,
        pin: bool = True,
    ) -> None:
        rs = req_states
        dev = rs.last_sampled_tokens.device
        self.kernels, self.rs, self.table, self.inputs = kernels, rs, table, inputs
        self.block_size, self.staged_writes, self.copies = block_size, staged_writes, copies
        # idx_mapping [size] | counts [size] | ... | at APPENDS (16-byte aligned, the same for
        # every size): n | (slot, column, block) x n, n <= size
        self.appends_at = -(-2 * max_size // 4) * 4
        length = self.appends_at + 1 + 3 * max_size
        self.step_dev = torch.zeros(length, dtype=torch.int32, device=dev)
        self._ring = PinnedRing(length, torch.int32, pin=pin)
        self.appends = self.step_dev[self.appends_at :]
        self.steps_with_appends = 0  # FULL steps whose block-table entries the graph wrote
        kernels.apply_appends(table, self.appends, max_size)  # compiled here, not in a capture
        # views made once per shape (a torch slice costs the step microseconds): per (size, n)
        # the device buffer up to the end of size's entries, idx[:n] and counts[:n]; per (ring
        # buffer, size) the host buffer's same span
        self._dev_views: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        self._host_views: dict[tuple[int, int], torch.Tensor] = {}
        n = rs.max_num_reqs
        self.temperature = torch.zeros(n, dtype=torch.float32, device=dev)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=dev)
        self.params_seen = -1
        self.sampled: dict[int, torch.Tensor] = {}  # capture size -> the sample graph's tokens

    def _step(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx_mapping, counts) of capture size ``size``: views of the static step buffer."""
        return self.step_dev[:size], self.step_dev[size : 2 * size]

    # ---- graph bodies (captured by cudagraph_runner.GraphRunner) --------------------------------
    def inputs_body(self, size: int) -> None:
        """Input prep over ``size`` rows of the static step buffer, into the input buffers."""
        idx, counts = self._step(size)
        rs = self.rs
        self.kernels.apply_appends(self.table, self.appends, size)
        self.kernels.prepare_inputs(
            idx,
            counts,
            size,
            rs.num_computed_tokens.gpu,
            rs.num_prefill_tokens.gpu,
            rs.prefill_token_ids.gpu,
            rs.last_sampled_tokens,
            self.table,
            self.block_size,
            out=self.inputs.views(size, size, block_table=True),
            pad_empty=True,
        )

    def sample_body(self, size: int, logits: torch.Tensor) -> None:
        """Plain sampling of ``logits`` [size, V] and the state advance of the real rows."""
        idx, counts = self._step(size)
        rs = self.rs
        meta = SamplingMetadata(
            idx_mapping=idx,
            positions=self.inputs.seq_lens[:size],
            temperature=self.temperature,
            top_k=rs.top_k,  # unread: no top-k / top-p
            top_p=rs.top_p,
            seeds=self.seeds,
            all_greedy=False,  # greedy rows go by their temperature
            no_top_k=True,
            no_top_p=True,
        )
        sampled = self.kernels.sample(logits, meta).sampled_token_ids
        done = rs.num_computed_tokens.gpu if self.staged_writes else None
        self.kernels.advance_state(
            rs.last_sampled_tokens,
            done,
            idx,
            sampled,
            counts if done is not None else None,
            counts,
        )
        self.sampled[size] = sampled

    def clear(self, size: int) -> None:
        """Every row of ``size`` padding: what a body sees before and during its capture."""
        self.step_dev.zero_()

    # ---- the step (host side) --------------------------------------------------------------
    def plain(self, idx_np: np.ndarray) -> bool:
        """Every row samples plainly (no top-k / top-p, no logprobs): the sample graph holds it."""
        rs = self.rs
        if not rs.special_slots:
            return True
        return not any(int(s) in rs.special_slots for s in idx_np)

    def upload(self, size: int, host: HostStep, appends: list[int]) -> InputBatch:
        """Copy the padded ``idx_mapping | counts`` of a step of ``n <= size`` one-token rows and
        its block-table ``appends`` (``slot, column, block`` triples, at most ``size``) into the
        static step buffer; the batch over the input buffers the inputs graph writes."""
        n = host.num_reqs
        buf, view = self._ring.next()
        view[:n] = host.idx_mapping_np
        view[n:size] = 0
        view[size : size + n] = 1
        view[size + n : 2 * size] = 0
        at = self.appends_at
        view[at] = len(appends) // 3
        if appends:
            view[at + 1 : at + 1 + len(appends)] = appends
            self.steps_with_appends += 1
        length = at + 1 + 3 * size
        src = self._host_views.get((id(buf), size))
        if src is None:
            src = self._host_views[(id(buf), size)] = buf[:length]
        views = self._dev_views.get((size, n))
        if views is None:
            idx, counts = self._step(size)
            views = self._dev_views[(size, n)] = (self.step_dev[:length], idx[:n], counts[:n])
        self.copies.copy_(views[0], src)
        rs = self.rs
        if rs.params_version != self.params_seen:  # new requests: the sampler's copies
            self.copies.copy_(self.temperature, rs.temperature)
            self.copies.copy_(self.seeds, rs.seeds)
            self.params_seen = rs.params_version
        return host.batch(views[1], views[2], self.inputs.views(n, n, block_table=True))
