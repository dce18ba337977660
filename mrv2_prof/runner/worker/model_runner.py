"""The model runner (MRV2 ``model_runner.py``): persistent state in, one forward + sample out.

``queue_step`` applies the scheduler's diff to the fixed request slots (staged writes), builds
the step's inputs on the device through ``idx_mapping``, runs the model and the sampler, advances
the device-side state, and queues the copy of the sampled tokens to the host (``AsyncOutput``);
nothing in it waits for the GPU. ``wait_output`` is the one defined place where the host waits
for them. With async scheduling the engine queues step N+1 before it waits for step N, and step
N's tokens reach step N+1's inputs on the GPU (``last_sampled_tokens``).

The step's pieces live in modules of their own: the host arrays and the device-side input build
(``step_inputs.py``), sampling and the verify step's glue (``step_sampling.py``), the state
advance (``step_advance.py``). Start-up (KV cache, warm-up, CUDA graphs) lives in ``startup.py``;
its dummy runs come in through ``run_dummy``, which runs the same forward pass and sampler
without touching any request state or the probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from time import perf_counter_ns

import numpy as np
import torch

from mrv2_prof.probes import api as probes
from mrv2_prof.probes.api import G_FORWARD, G_PREPARE, G_SAMPLE, Probe
from mrv2_prof.runner.config import DTYPES, ConfigError, ModelSpec, RunnerConfig
from mrv2_prof.runner.core.scheduler import SchedulerOutput
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.parallel.tensor_parallel import TPGroup
from mrv2_prof.runner.parallel.tp_workers import close_tensor_parallel, start_tensor_parallel
from mrv2_prof.runner.runtime_info import RuntimeInfo
from mrv2_prof.runner.worker.async_output import AsyncOutput, ModelRunnerOutput, PendingOutput
from mrv2_prof.runner.worker.block_table import BlockTables
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.cudagraph_manager import BatchDescriptor, CudaGraphManager
from mrv2_prof.runner.worker.cudagraph_plan import FULL, NONE, PIECEWISE, plan_graphs
from mrv2_prof.runner.worker.cudagraph_runner import GraphRunner
from mrv2_prof.runner.worker.full_step import FullStep
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.input_buffers import InputBuffers
from mrv2_prof.runner.worker.kernel_paths import (
    apply_kernel_paths,
    fused_mlp_too_wide,
    resolved_paths,
)
from mrv2_prof.runner.worker.kernel_set import resolve_kernels
from mrv2_prof.runner.worker.prompt_logprobs import compute_planned, plan_prompt_logprobs
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.sampler import SamplerOutput
from mrv2_prof.runner.worker.spec_decode.device_drafts import make_device_drafts
from mrv2_prof.runner.worker.spec_decode.draft_runner import make_drafter
from mrv2_prof.runner.worker.spec_decode.rejection_sampler import RejectionOutput
from mrv2_prof.runner.worker.spec_decode.verify import Verifier, VerifyInputs
from mrv2_prof.runner.worker.step_advance import advance_step
from mrv2_prof.runner.worker.step_inputs import HostStep, StepInputs
from mrv2_prof.runner.worker.step_sampling import prepare_verify, sample_step
from mrv2_prof.runner.worker.step_states import update_states
from mrv2_prof.runner.worker.switches import unsupported_switches


class ModelRunner:
    def __init__(
        self,
        config: RunnerConfig,
        model_spec: ModelSpec,
        probe: Probe | None = None,
        tp: TPGroup | None = None,  # a worker rank's group (rank 0 starts the workers itself)
        rank_runner: Callable | None = None,  # rank 0: how a worker rank builds its runner
    ) -> None:
        self.config = config
        self.probe = probe if probe is not None else Probe()
        self.copies = CopyAudit(self.probe)  # every host<->device copy of a step goes through it
        self.device = config.resolve_device()
        self.is_cuda = self.device.type == "cuda"
        dtype_name = model_spec.dtype or ("bfloat16" if self.is_cuda else "float32")
        self.dtype = DTYPES[dtype_name]
        self.info = RuntimeInfo(device=str(self.device), dtype=dtype_name)
        self.graph_mode_of_last_step = "none"
        self.kernels, kernels_note = resolve_kernels(config.kernels, self.is_cuda)
        self._check_switches(kernels_note)
        self.graphs = CudaGraphManager(plan_graphs(config, self.kernels.name, self.is_cuda))
        self.info.notes.extend(self.graphs.plan.notes)
        self.graph_runner: GraphRunner | None = None  # after the capture (startup.py)
        # req_id -> (top-k, prompt token ids) of the requests that asked for prompt logprobs
        self.prompt_logprob_requests: dict[str, tuple[int, np.ndarray]] = {}

        t0 = time.perf_counter()
        self.model, self.model_args = load_model(
            model_spec,
            self.device,
            self.dtype,
            kernels=self.kernels.model,
        )
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        self.info.weight_load_s = time.perf_counter() - t0
        # the decode paths this run takes (auto resolved: decode_gemv by the model's width),
        # recorded in the as-run scenario; the kernels read them at each call, none before now
        self.kernel_paths = resolved_paths(
            self.config, self.kernels.name, self.is_cuda, self.model_args.hidden_size
        )
        if self.kernels.name == "triton":
            apply_kernel_paths(self.kernel_paths)
            hidden, gemv = self.model_args.hidden_size, self.kernel_paths["decode_gemv"]
            if too_wide := fused_mlp_too_wide(self.config, gemv, hidden):
                if self.config.strict:
                    raise ConfigError(f"{too_wide} (strict: true)")
                self.info.notes.append(too_wide)
        self.info.model_params = sum(p.numel() for p in self.model.parameters())
        # max_model_len: auto is the model's own length (vLLM's default); an explicit one wins
        config = self.config = config.for_model(self.model_args.max_position_embeddings)
        if config.max_model_len > self.model_args.max_position_embeddings:
            raise ConfigError(
                f"runner.max_model_len: {config.max_model_len} exceeds the model's "
                f"max_position_embeddings {self.model_args.max_position_embeddings}"
            )
        self._tp_step = 0  # steps sent to the other ranks
        start_tensor_parallel(self, model_spec, tp, rank_runner)  # N > 1: rank 0 starts them

        apply = self.kernels.apply_writes
        self.req_states = RequestStates(
            config.max_num_reqs,
            config.max_model_len,
            self.device,
            config.staged_writes,
            apply,
            uva=self.uva,
            reuse_lag=1 if config.async_scheduling else 0,
            copies=self.copies,
        )
        self.block_tables = BlockTables(
            config.max_num_reqs,
            config.max_num_blocks_per_req,
            self.device,
            config.staged_writes,
            apply,
            self.copies,
        )
        self.kv_caches: list[torch.Tensor] | None = None  # allocated at start-up
        # The step's device inputs, built in place every step and read by the captured graphs.
        plan = self.graphs.plan
        self.inputs = InputBuffers.allocate(
            max((config.max_num_batched_tokens, *plan.full_sizes, *plan.piecewise_sizes)),
            max((config.max_num_reqs, *plan.full_sizes)),
            config.max_num_blocks_per_req,
            self.device,
        )
        n = config.max_num_reqs
        self.step_inputs = StepInputs(
            n,
            self.device,
            self.is_cuda,
            self.copies,
            self.req_states,
            self.block_tables,
            self.inputs,
            config.block_size,
        )
        self.output = AsyncOutput(n, self.is_cuda, self.copies, self.probe)
        spec = config.spec_decode
        self.verifier = (  # speculative decoding's verify step (spec_decode/verify.py)
            Verifier(n, spec.max_k, self.device, self.copies, self.kernels.name == "triton")
            if spec.enabled
            else None
        )
        self.drafter = make_drafter(self, model_spec)  # method draft_model (draft_runner.py)
        # drafts made and kept on the device (spec_decode/device_drafts.py), or None: the host's
        self.device_drafts = make_device_drafts(self)

    def _check_switches(self, kernels_note: str | None) -> None:
        """Switches this build cannot honour are recorded (or, with ``strict``, refused)."""
        c = self.config
        if c.device == "auto" and not self.is_cuda:
            self.info.notes.append("runner.device: auto found no CUDA device; running on the CPU")
        unsupported = unsupported_switches(c, self.kernels.name, kernels_note, self.is_cuda)
        self.uva = c.uva and self.kernels.name == "triton"
        if unsupported and c.strict:
            raise ConfigError(f"{unsupported[0]} (strict: true)")
        self.info.notes.extend(unsupported)

    def close(self) -> list[str]:
        """Stop the worker ranks of a tensor-parallel runner (rank 0); the notes this adds."""
        drafts = self.drafter.notes if self.drafter is not None else []  # draft graph misses
        return close_tensor_parallel(self) + drafts

    # ---- one step ------------------------------------------------------------------------------
    def queue_step(self, so: SchedulerOutput) -> PendingOutput:
        """Queue the step's GPU work; nothing here waits for the GPU. Rank 0 of a
        tensor-parallel runner first sends the step to the other ranks."""
        if self.tp_workers is None:
            return self._queue_step(so)
        t0, c0 = perf_counter_ns(), self.tp.comm_ns[0]
        self.tp_workers.send_step(so)
        pending = self._queue_step(so)
        comm = self.tp.comm_ns[0] - c0
        self.probe.rank_step(0, self._tp_step, t0, perf_counter_ns(), comm)
        self._tp_step += 1
        return pending

    def _queue_step(self, so: SchedulerOutput) -> PendingOutput:
        """One step in phases, the probe's at their boundaries: prepare (the scheduler's diff,
        then the inputs by the FULL-graph path or the general one), forward, sample, then the
        state advance, the next drafts and the output's copy."""
        p = self.probe
        p.begin(probes.PREPARE)
        write_stats, fs = self._apply_diff(so)
        if so.is_empty:
            p.end(probes.PREPARE)
            return PendingOutput(None, write_stats)
        assert self.kv_caches is not None, "start_up() before queue_step()"
        verify = None
        if fs is not None and not so.scheduled_spec_decode_tokens:  # full_step.py
            batch, plan, d = self._full_graph_path(so, fs, write_stats)
            p.switch(probes.PREPARE, probes.FORWARD)  # dispatched already: the graph follows
        else:
            batch = self._prepare_inputs(so)
            verify, plan = self._general_path(so, batch)
            p.end(probes.PREPARE)
            d = self._dispatch(batch, plan, verify, fs)
            p.begin(probes.FORWARD)
        logits, prompt = self._forward_phase(batch, d, plan)
        p.switch(probes.FORWARD, probes.SAMPLE)
        p.gpu_mark(G_SAMPLE)
        out, num_logprobs, rejection, in_graph = self._sample_phase(batch, logits, d, fs, verify)
        p.end(probes.SAMPLE)
        advance = batch.num_scheduled_tokens  # in_graph: the sample graph advanced the state
        if not in_graph:
            advance = advance_step(
                self.kernels, self.req_states, batch, out.sampled_token_ids, verify, rejection,
                self.config.staged_writes,
            )  # fmt: skip
        drafts = self._draft_phase(batch, out, verify, rejection, advance)
        return self._queue_output(
            batch, out, write_stats, num_logprobs, prompt, rejection, verify, drafts
        )

    def _apply_diff(self, so: SchedulerOutput) -> tuple[dict, FullStep | None]:
        """Prepare, first part: the scheduler's diff into the request slots and its staged
        writes, the block tables' too unless the FULL-graph path writes them. Returns the write
        stats and the FULL step's graph side (None: not captured)."""
        self.graph_mode_of_last_step = "none"  # an empty step runs nothing
        self.req_states.begin_step()
        self._update_states(so)
        if not so.is_empty:
            self.probe.gpu_mark(G_PREPARE)  # the step's first GPU work (the staged writes) follows
        write_stats = self.req_states.apply_writes()
        fs = self.graph_runner.full_step if self.graph_runner is not None else None
        if so.is_empty or fs is None or so.scheduled_spec_decode_tokens:
            self._apply_block_table(write_stats)
        return write_stats, fs

    def _full_graph_path(self, so: SchedulerOutput, fs: FullStep, write_stats: dict):
        """Prepare, FULL-graph path (no drafts, the full step captured): the host arrays, the
        dispatch, the block-table entries (the inputs graph writes single ones), the inputs built
        by the graph (a FULL key) or on the device. Returns the batch, plan and dispatch."""
        host = self.step_inputs.host(so)
        plan = self._plan_prompt_logprobs(host)
        shape = BatchDescriptor.of(host.num_scheduled_tokens_np, host.num_tokens)
        d = self.graphs.dispatch(shape, needs_hidden=plan is not None)
        taken = self.block_tables.take_appends(d.key) if d.mode == FULL else None
        if taken is None:  # not single entries, or no FULL graph: the staged-write launch
            self._apply_block_table(write_stats)
        else:  # the inputs graph writes the new entries
            if taken[1] is not None:
                write_stats["block_table"] = taken[1]
            self._record_writes(write_stats)
        if d.mode == FULL:  # the graph builds the inputs
            batch = fs.upload(d.key, host, taken[0] if taken is not None else [])
        else:
            batch = self.step_inputs.device(host, self.kernels)
        return batch, plan, d

    def _general_path(self, so: SchedulerOutput, batch: InputBatch):
        """Prepare, general path, after ``_prepare_inputs``: a verify step's drafts, the device's
        lengths where the host's may run ahead. Returns the verify inputs and the logprobs plan."""
        verify = None
        if so.scheduled_spec_decode_tokens:
            verify = prepare_verify(
                self.verifier, self.drafter, batch, so, self.req_states, self.device_drafts
            )
        if self._device_lengths:  # the host's lengths may run ahead of the device's
            batch.seq_lens_np = batch.seq_lens.cpu().numpy()
        return verify, self._plan_prompt_logprobs(batch)

    def _dispatch(self, batch: InputBatch, plan, verify: VerifyInputs | None, fs):
        """The general path's graph dispatch, between the prepare and forward phases."""
        d = self.graphs.dispatch(
            BatchDescriptor.of(batch.num_scheduled_tokens_np),
            needs_hidden=plan is not None,
            verify=verify is not None,
            padded=verify.num_padded if verify is not None else 0,
        )
        # a step with drafts never dispatches to a FULL decode graph, which would read the
        # full step's buffer, not these inputs
        assert fs is None or d.mode != FULL or d.query_len > 1, d
        return d

    def _forward_phase(self, batch: InputBatch, d, plan):
        """The dispatch recorded, the forward pass (eager or a graph), the prompt logprobs.
        Returns the logits and the prompt logprobs (None: none asked for)."""
        p = self.probe
        if d.capture_first:  # a PIECEWISE size captured by the first step that needs it
            r = self.graphs.capture_first_use(self.graph_runner, d)
            p.graph_capture(r.key, r.mode, r.num_tokens, r.capture_s, r.mem_bytes)  # its step
        p.graph_dispatch(d.num_tokens, d.padded_tokens, d.requested, d.mode, d.hit, d.reason)
        self.graph_mode_of_last_step = d.mode
        p.gpu_mark(G_FORWARD)
        hidden, logits = self._forward(batch, self.kv_caches, d.mode, d.key, d.query_len)
        if d.hit:
            self.graphs.count_replay(d)
        if plan is None:
            return logits, None
        logits_of, copies = self.model.compute_logits, self.copies
        return logits, (plan, compute_planned(plan, hidden, logits_of, copies, self.device))

    def _sample_phase(self, batch: InputBatch, logits, d, fs, verify: VerifyInputs | None):
        """The sample graph for a plain FULL decode (full_step.py), else the (rejection) sampler.
        Returns the output, the most logprobs a row asked for, the rejection, the graph's use."""
        full_decode = fs is not None and d.mode == FULL and d.query_len == 1
        if full_decode and fs.plain(batch.idx_mapping_np):
            out = SamplerOutput(self.graph_runner.replay_sample(d.key, batch.num_reqs), None, None)
            return out, 0, None, True
        out, num_logprobs, rejection = self._sample(batch, logits, verify)
        return out, num_logprobs, rejection, False

    def _draft_phase(self, batch, out, verify, rejection, advance):
        """The next step's drafts: the draft model's k steps from each request's new length,
        kept on the device (None to the host) or handed to the host."""
        rs, drafts = self.req_states, None
        if self.drafter is not None:
            start = batch.seq_lens - batch.num_scheduled_tokens + advance
            drafts = self.drafter.run(batch, rs, out.sampled_token_ids, start)
        dd = self.device_drafts
        if dd is None:
            return drafts
        if rejection is None:
            dd.after_step(batch, rs, out.sampled_token_ids, None, None, dd.spec.max_k, drafts)
        else:
            dd.after_step(
                batch, rs, rejection.output_token_ids, rejection.num_accepted,
                verify.drafts.num_slots, dd.spec.max_k, drafts,
            )  # fmt: skip
        return None  # never to the host

    def _queue_output(
        self, batch, out, write_stats, num_logprobs, prompt, rejection, verify, drafts
    ) -> PendingOutput:
        """The output's copy to the host, queued; ``queue`` marks G_END after the copies and
        waits on the probe's event for it."""
        rs, dd = self.req_states, self.device_drafts
        per_row = rs.num_logprobs_np[batch.idx_mapping_np] if num_logprobs > 0 else None
        rows = verify.cu_rows_np if verify is not None else None
        num_draft = verify.drafts.num_draft if verify is not None and dd is not None else None
        return self.output.queue(
            batch, out, write_stats, per_row, prompt, rejection, rows, drafts, num_draft
        )

    def wait_output(self, pending: PendingOutput) -> ModelRunnerOutput:
        """The designed sync point: wait for a queued step's sampled tokens (and logprobs)."""
        out = self.output.wait(pending)
        if self.tp_digest is not None:
            self.tp_digest.add(out.sampled_token_ids)
        return out

    def run_dummy(self, batch: InputBatch, kv_caches: list[torch.Tensor] | None) -> None:
        """Start-up work: an eager forward pass and sampling over a dummy batch (``kv_caches``
        None: attention without a cache). Writes no request state, reports nothing, waits for
        nothing."""
        _, logits = self._forward(batch, kv_caches)
        out, _, _ = self._sample(batch, logits)
        rejection = None
        if self.verifier is not None:  # the rejection sampler's kernels too, one row each
            spec = self.verifier.prepare(batch.req_ids, batch.query_start_loc_np, {})
            _, _, rejection = self._sample(batch, logits, spec)
        if self.drafter is not None:
            self.drafter.run_dummy(batch)
        dd = self.device_drafts
        if dd is not None:  # the device drafter's kernels, plain and verify (rows no request holds)
            k = dd.spec.max_k
            dd.after_step(batch, self.req_states, out.sampled_token_ids, None, None, k)
            dd.after_step(
                batch, self.req_states, rejection.output_token_ids, rejection.num_accepted,
                spec.drafts.num_slots, k,
            )  # fmt: skip

    def _forward(
        self,
        batch: InputBatch,
        kv_caches: list[torch.Tensor] | None,
        mode: str = NONE,
        key: int | None = None,
        query_len: int = 1,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Hidden states [T, H] (None after a FULL replay, which keeps only the logits) and
        the logits [B, V] of the batch's last tokens: eagerly, or through a captured graph."""
        if mode == FULL and query_len > 1:  # a verify: every token's logits
            return None, self.graph_runner.replay_verify(key, query_len, batch)
        if mode == FULL:
            return None, self.graph_runner.replay_full(key, batch)
        meta = batch.attn_metadata(self.config.block_size)
        if mode == PIECEWISE:
            hidden = self.graph_runner.run_piecewise(key, batch, meta)
        else:
            hidden = self.model(batch.input_ids, batch.positions, kv_caches, meta)  # [T, H]
        return hidden, self.model.logits(hidden[batch.logits_indices])  # [B, V]

    def _sample(
        self, batch: InputBatch, logits: torch.Tensor, verify: VerifyInputs | None = None
    ) -> tuple[SamplerOutput, int, RejectionOutput | None]:
        """One token per row (``step_sampling.py``), and the most logprobs any row asked for;
        a verify step (``verify``) rejection-samples its rows instead."""
        return sample_step(self.kernels, self.verifier, self.req_states, batch, logits, verify)

    def _apply_block_table(self, write_stats: dict) -> None:
        """The block tables' staged writes (one copy and launch), then the step's write stats
        to the probe."""
        bt = self.block_tables.apply_write()
        if bt is not None:
            write_stats["block_table"] = bt
        self._record_writes(write_stats)

    def _record_writes(self, write_stats: dict) -> None:
        for name, ws in write_stats.items():
            self.probe.staged_write(name, ws.rows, ws.elements, ws.staged_bytes, ws.dense_bytes)

    def _update_states(self, so: SchedulerOutput) -> None:
        update_states(self, so)  # step_states.py

    def _plan_prompt_logprobs(self, batch: InputBatch | HostStep):
        """The prompt logprobs this step computes (None: none), from its host arrays."""
        if not self.prompt_logprob_requests:
            return None
        return plan_prompt_logprobs(
            batch.req_ids, batch.query_start_loc_np, batch.seq_lens_np, self.prompt_logprob_requests
        )

    def _prepare_inputs(self, so: SchedulerOutput) -> InputBatch:
        return self.step_inputs.prepare(so, self.kernels)  # step_inputs.py
