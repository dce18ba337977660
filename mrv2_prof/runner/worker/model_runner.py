"""The model runner (MRV2 ``model_runner.py``): persistent state in, one forward + sample out.

``queue_step`` applies the scheduler's diff to the fixed request slots (staged writes), builds
the step's inputs on the device through ``idx_mapping``, runs the model and the sampler, advances
the device-side state, and queues the copy of the sampled tokens into a pinned buffer followed
by a CUDA event; nothing in it waits for the GPU. ``wait_output`` is the one defined place where
the host waits: on that event, then it reads the tokens. ``execute_model`` is the two in a row
(the synchronous step); with async scheduling the engine queues step N+1 before it waits for
step N, and step N's tokens reach step N+1's inputs on the GPU (``last_sampled_tokens``).

A dummy batch goes through the same ``execute_model`` without touching any request state;
profiling and warm-up use it.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from mrv2_prof.probes import api as probes
from mrv2_prof.probes.api import G_END, G_FORWARD, G_PREPARE, G_SAMPLE, Probe
from mrv2_prof.runner.config import DTYPES, ConfigError, ModelSpec, RunnerConfig, RuntimeInfo
from mrv2_prof.runner.core.scheduler import SchedulerOutput
from mrv2_prof.runner.model import kv_cache_bytes_per_block, kv_cache_shape
from mrv2_prof.runner.model.loader import load_model
from mrv2_prof.runner.worker.block_table import BlockTables
from mrv2_prof.runner.worker.copy_audit import CopyAudit
from mrv2_prof.runner.worker.cudagraph_manager import (
    FULL,
    PIECEWISE,
    BatchDescriptor,
    CudaGraphManager,
    GraphRunner,
    plan_graphs,
)
from mrv2_prof.runner.worker.input_batch import InputBatch
from mrv2_prof.runner.worker.kernel_set import resolve_kernels
from mrv2_prof.runner.worker.prompt_logprobs import (
    PromptLogprobsPlan,
    compute_prompt_logprobs,
    plan_prompt_logprobs,
    split_by_request,
)
from mrv2_prof.runner.worker.request_states import RequestStates
from mrv2_prof.runner.worker.sampler import GREEDY_TEMPERATURE, SamplingMetadata
from mrv2_prof.runner.worker.staged_write import WriteStats
from mrv2_prof.runner.worker.uva import PINNED_RING_DEPTH, PinnedRing


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]  # batch order
    sampled_token_ids: list[int]
    logprobs: list[list[tuple[int, float]]] | None = None
    write_stats: dict[str, WriteStats] = field(default_factory=dict)
    output_wait_ns: int = 0  # host time spent waiting for the sampled tokens
    # req_id -> (first position, per position [(prompt token, lp), (top-1, lp), ...])
    prompt_logprobs: dict[str, tuple[int, list[list[tuple[int, float]]]]] | None = None


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
    dummy: bool = False


_NO_PROBE = Probe()  # dummy runs are start-up work, not steps
_OUTPUT_WAIT_SITE = "mrv2_prof/runner/worker/model_runner.py:ModelRunner.wait_output"


def request_seed(engine_seed: int, req_id: str, seed: int | None) -> int:
    """A request's sampling seed: its own, or one derived from the engine seed and its id."""
    if seed is not None:
        return seed
    return (engine_seed << 32) ^ zlib.crc32(req_id.encode())


def unsupported_switches(config: RunnerConfig, kernels: str, kernels_note: str | None) -> list[str]:
    """The runner switches (besides CUDA graphs, see ``plan_graphs``) that cannot be honoured
    with the ``kernels`` in use; ``kernels_note`` says why those differ from the request."""
    unsupported = [kernels_note] if kernels_note else []
    # Only a Triton kernel can dereference pinned host memory; the torch ops cannot.
    if config.uva and kernels != "triton":
        unsupported.append(
            "runner.uva: needs the Triton kernels on a CUDA device; prompt tokens and "
            "sampling parameters are copied to the device"
        )
    return unsupported


def check_strict(config: RunnerConfig) -> None:
    """What the runner would refuse under ``strict``, checked without building it (the CLI
    runs this before it writes anything)."""
    if not config.strict:
        return
    is_cuda = config.device != "cpu" and torch.cuda.is_available()
    kernels, note = resolve_kernels(config.kernels, is_cuda)
    unsupported = unsupported_switches(config, kernels.name, note)
    if unsupported:
        raise ConfigError(f"{unsupported[0]} (strict: true)")
    plan_graphs(config, kernels.name, is_cuda)


class ModelRunner:
    def __init__(
        self, config: RunnerConfig, model_spec: ModelSpec, probe: Probe | None = None
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
        self._graph_runner: GraphRunner | None = None
        # req_id -> (top-k, prompt token ids) of the requests that asked for prompt logprobs
        self._prompt_logprobs: dict[str, tuple[int, np.ndarray]] = {}

        t0 = time.perf_counter()
        self.model, self.model_args = load_model(
            model_spec,
            self.device,
            self.dtype,
            write_kv=self.kernels.write_kv,
            attend=self.kernels.attend,
        )
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        self.info.weight_load_s = time.perf_counter() - t0
        self.info.model_params = sum(p.numel() for p in self.model.parameters())
        if config.max_model_len > self.model_args.max_position_embeddings:
            raise ConfigError(
                f"runner.max_model_len: {config.max_model_len} exceeds the model's "
                f"max_position_embeddings {self.model_args.max_position_embeddings}"
            )

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
        self.kv_caches: list[torch.Tensor] | None = None
        # Per-step arrays (idx_mapping | counts) go through a ring of pinned buffers into one
        # device buffer: no allocation, and the CPU never rewrites a buffer a copy may read.
        n = config.max_num_reqs
        self._step_ring = PinnedRing(2 * n, torch.int32, pin=self.is_cuda)
        self._step_dev = torch.zeros(2 * n, dtype=torch.int32, device=self.device)
        # The one place sampled tokens come back: pinned buffers and events, one per step in
        # flight, so step N+1's copy never lands in the buffer step N's tokens are read from.
        self._host_tokens = torch.zeros(
            (PINNED_RING_DEPTH, n), dtype=torch.int64, pin_memory=self.is_cuda
        )
        self._output_ready = (
            [torch.cuda.Event() for _ in range(PINNED_RING_DEPTH)] if self.is_cuda else []
        )
        self._next_output = 0

    def _check_switches(self, kernels_note: str | None) -> None:
        """Switches this build cannot honour are recorded (or, with ``strict``, refused)."""
        c = self.config
        if c.device == "auto" and not self.is_cuda:
            self.info.notes.append("runner.device: auto found no CUDA device; running on the CPU")
        unsupported = unsupported_switches(c, self.kernels.name, kernels_note)
        self.uva = c.uva and self.kernels.name == "triton"
        if unsupported and c.strict:
            raise ConfigError(f"{unsupported[0]} (strict: true)")
        self.info.notes.extend(unsupported)

    # ---- KV cache ------------------------------------------------------------------------------
    def initialize_kv_cache(self) -> int:
        """Allocate the paged KV cache: an explicit block count, or what fits in GPU memory
        after a profiling run. Returns the number of blocks."""
        c = self.config
        per_block = kv_cache_bytes_per_block(self.model_args, c.block_size, self.dtype)
        if c.num_kv_blocks is not None:
            num_blocks = c.num_kv_blocks
        elif not self.is_cuda:
            raise ConfigError(
                "runner.num_kv_blocks: 'auto' sizes the cache from GPU memory; give a number on CPU"
            )
        else:
            num_blocks = self._profile_num_blocks(per_block)
        if num_blocks * c.block_size < c.max_model_len:
            raise ConfigError(
                f"runner.num_kv_blocks: {num_blocks} blocks of {c.block_size} tokens cannot hold "
                f"one request of max_model_len {c.max_model_len}"
            )
        t0 = time.perf_counter()
        shape = kv_cache_shape(self.model_args, num_blocks, c.block_size)
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.model_args.num_hidden_layers)
        ]
        self.info.kv_alloc_s = time.perf_counter() - t0
        self.info.num_kv_blocks = num_blocks
        self.info.kv_cache_bytes = num_blocks * per_block
        return num_blocks

    def _profile_num_blocks(self, per_block: int) -> int:
        c = self.config
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        self.profile_run()
        torch.cuda.synchronize(self.device)
        self.info.profile_run_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        non_torch = (total - free) - torch.cuda.memory_reserved(self.device)
        self.info.peak_activation_bytes = peak
        available = int(total * c.gpu_memory_utilization) - peak - max(non_torch, 0)
        num_blocks = available // per_block
        if num_blocks < 1:
            raise ConfigError(
                f"runner.gpu_memory_utilization: {c.gpu_memory_utilization} leaves no memory for "
                f"the KV cache (peak use {peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)"
            )
        return int(num_blocks)

    def profile_run(self) -> None:
        """Peak activation memory: the longest prefill chunk, and the widest sampling batch."""
        c = self.config
        self.dummy_run(min(c.max_num_batched_tokens, c.max_model_len - 1), 1)
        num_reqs = min(c.max_num_seqs, c.max_num_batched_tokens)
        self.dummy_run(num_reqs, num_reqs)

    def dummy_run(self, num_tokens: int, num_reqs: int, with_kv_cache: bool = False) -> None:
        """An empty forward pass and sampling; ``with_kv_cache`` attends through the real cache
        (every slot is -1, so nothing is written) to compile the kernels on the way."""
        counts = [num_tokens // num_reqs + (i < num_tokens % num_reqs) for i in range(num_reqs)]
        out = SchedulerOutput(
            [], [], {f"dummy-{i}": n for i, n in enumerate(counts)}, num_tokens, set()
        )
        self.execute_model(out, dummy=True, dummy_kv_cache=with_kv_cache)

    def warm_up(self) -> None:
        """Compile the Triton kernels for decode- and prefill-shaped batches before the first
        step, so no step of the run pays a compile. Changes no request state."""
        if self.kernels.name != "triton" or self.kv_caches is None:
            return
        c = self.config
        t0 = time.perf_counter()
        num_reqs = min(c.max_num_seqs, 8)
        self.dummy_run(num_reqs, num_reqs, with_kv_cache=True)
        self.dummy_run(min(c.max_num_batched_tokens, c.max_model_len - 1, 256), 1, True)
        # Input prep and the staged-write apply are not part of a dummy run: call them on
        # scratch outputs (they read persistent state, write only what they return / scratch).
        one = torch.ones(1, dtype=torch.int32, device=self.device)
        rs = self.req_states
        self.kernels.prepare_inputs(
            one * 0,
            one,
            1,
            rs.num_computed_tokens.gpu,
            rs.num_prefill_tokens.gpu,
            rs.prefill_token_ids.gpu,
            rs.last_sampled_tokens,
            self.block_tables.table.gpu,
            c.block_size,
        )
        scratch = torch.zeros((1, 2), dtype=torch.int32, device=self.device)
        packed = torch.tensor([0, 0, 1, 0, 7], dtype=torch.int32, device=self.device)
        self.kernels.apply_writes(scratch, packed, 1, 1)
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        self.info.warmup_s = time.perf_counter() - t0

    def capture_graphs(self) -> None:
        """Capture the planned CUDA graphs (after the KV cache and the warm-up); each capture
        is reported to the probe with its seconds and pool memory."""
        plan = self.graphs.plan
        if not (plan.full_sizes or plan.piecewise_sizes):
            return
        assert self.kv_caches is not None, "initialize_kv_cache() before capture_graphs()"
        self._graph_runner = GraphRunner(
            self.model,
            self.kv_caches,
            self.config.block_size,
            self.config.max_num_blocks_per_req,
            plan,
        )
        p = self.probe
        self.info.capture_s = self.graphs.capture(
            self._graph_runner,
            lambda r: p.graph_capture(r.key, r.mode, r.num_tokens, r.capture_s, r.mem_bytes),
        )
        self.info.graph_memory_bytes = sum(r.mem_bytes for r in self.graphs.captures)
        self.info.num_graphs = len(self.graphs.captures)

    # ---- one step ------------------------------------------------------------------------------
    def execute_model(
        self, so: SchedulerOutput, dummy: bool = False, dummy_kv_cache: bool = False
    ) -> ModelRunnerOutput:
        """One synchronous step: queue it, then wait for its sampled tokens."""
        return self.wait_output(self.queue_step(so, dummy, dummy_kv_cache))

    def queue_step(
        self, so: SchedulerOutput, dummy: bool = False, dummy_kv_cache: bool = False
    ) -> PendingOutput:
        """Queue the step's GPU work; nothing here waits for the GPU."""
        p = self.probe if not dummy else _NO_PROBE
        if dummy:
            kv_caches = self.kv_caches if dummy_kv_cache else None
            batch, write_stats = self._dummy_batch(so), {}
        else:
            p.begin(probes.PREPARE)
            self.graph_mode_of_last_step = "none"  # an empty step runs nothing
            self.req_states.begin_step()
            self._update_states(so)
            if not so.is_empty:
                p.gpu_mark(G_PREPARE)  # the step's first GPU work (the staged writes) follows
            write_stats = self.req_states.apply_writes()
            bt = self.block_tables.apply_write()
            if bt is not None:
                write_stats["block_table"] = bt
            for name, ws in write_stats.items():
                p.staged_write(name, ws.rows, ws.elements, ws.staged_bytes, ws.dense_bytes)
            if so.is_empty:
                p.end(probes.PREPARE)
                return PendingOutput(None, write_stats)
            batch, kv_caches = self._prepare_inputs(so), self.kv_caches
            assert kv_caches is not None, "initialize_kv_cache() before execute_model()"
            plan = None
            if self._prompt_logprobs:
                plan = plan_prompt_logprobs(
                    batch.req_ids,
                    batch.query_start_loc_np,
                    batch.seq_lens_np,
                    self._prompt_logprobs,
                )
            p.end(probes.PREPARE)
            d = self.graphs.dispatch(
                BatchDescriptor.of(batch.num_scheduled_tokens_np), needs_hidden=plan is not None
            )
            p.graph_dispatch(d.num_tokens, d.padded_tokens, d.requested, d.mode, d.hit, d.reason)
            self.graph_mode_of_last_step = d.mode

        p.begin(probes.FORWARD)
        p.gpu_mark(G_FORWARD)
        meta = batch.attn_metadata(self.config.block_size)
        if dummy or d.mode not in (FULL, PIECEWISE):
            hidden = self.model(batch.input_ids, batch.positions, kv_caches, meta)  # [T, H]
            logits = self.model.compute_logits(hidden[batch.logits_indices])  # [B, V]
        elif d.mode == FULL:
            logits = self._graph_runner.replay_full(d.key, batch)
        else:
            hidden = self._graph_runner.run_piecewise(d.key, batch, meta)
            logits = self.model.compute_logits(hidden[batch.logits_indices])
        if not dummy and d.hit:
            self.graphs.count_replay(d)
        prompt_out = None
        if not dummy and plan is not None:
            rows, targets = (
                self.copies.to_device(torch.from_numpy(a), self.device)
                for a in (plan.rows, plan.targets)
            )
            prompt_out = compute_prompt_logprobs(
                self.model.compute_logits, hidden, rows, targets, plan.num_top
            )
        p.end(probes.FORWARD)
        p.begin(probes.SAMPLE)
        p.gpu_mark(G_SAMPLE)
        rs = self.req_states
        idx = batch.idx_mapping_np
        num_logprobs = int(rs.num_logprobs_np[idx].max())
        meta = SamplingMetadata(
            idx_mapping=batch.idx_mapping,
            positions=batch.seq_lens.long(),
            temperature=rs.temperature,
            top_k=rs.top_k,
            top_p=rs.top_p,
            seeds=rs.seeds,
            max_num_logprobs=num_logprobs,
            # host-side shortcuts, read from the CPU copies of the parameters (no device read)
            all_greedy=bool((rs.temperature_np[idx] < GREEDY_TEMPERATURE).all()),
            no_top_k=not bool((rs.top_k_np[idx] > 0).any()),
            no_top_p=bool((rs.top_p_np[idx] >= 1.0).all()),
        )
        out = self.kernels.sample(logits, meta)
        p.end(probes.SAMPLE)
        if dummy:
            return PendingOutput(batch, {}, dummy=True)

        # Advance device-side state; the next step reads it without a host round trip.
        slots = batch.idx_mapping.long()
        rs.last_sampled_tokens[slots] = out.sampled_token_ids
        if self.config.staged_writes:
            rs.num_computed_tokens.gpu.index_add_(0, slots, batch.num_scheduled_tokens)
        pending = self._queue_output(batch, out, write_stats, num_logprobs)
        if prompt_out is not None:
            pending.prompt_plan = plan
            pending.prompt_ids, pending.prompt_lps = (self._to_host(t) for t in prompt_out)
            if pending.ready is not None:
                pending.ready.record()  # after these copies too
        p.gpu_mark(G_END)
        return pending

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor copied into fresh pinned host memory (read after the step's event)."""
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.is_cuda)
        self.copies.copy_(out, t)
        return out

    def _update_states(self, so: SchedulerOutput) -> None:
        rs = self.req_states
        for req_id in so.finished_req_ids:
            rs.remove_request(req_id)
            self._prompt_logprobs.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            k = new.sampling_params.prompt_logprobs
            if k is not None:
                prompt = np.asarray(new.token_ids[: new.num_prompt_tokens], dtype=np.int64)
                self._prompt_logprobs[new.req_id] = (k, prompt)
            seed = request_seed(self.config.seed, new.req_id, new.sampling_params.seed)
            slot = rs.add_request(
                new.req_id, new.token_ids, new.num_computed_tokens, new.sampling_params, seed
            )
            self.block_tables.set_row(slot, new.block_ids)
        for cached in so.scheduled_cached_reqs:
            slot = rs.slot_of[cached.req_id]
            self.block_tables.append(slot, cached.new_block_ids)
            if not self.config.staged_writes:
                rs.set_num_computed(slot, cached.num_computed_tokens)

    def _prepare_inputs(self, so: SchedulerOutput) -> InputBatch:
        rs = self.req_states
        req_ids = list(so.num_scheduled_tokens)
        num_reqs, num_tokens = len(req_ids), so.total_num_scheduled_tokens
        idx_np = np.fromiter((rs.slot_of[r] for r in req_ids), dtype=np.int32, count=num_reqs)
        counts_np = np.fromiter(so.num_scheduled_tokens.values(), dtype=np.int32, count=num_reqs)
        computed = {d.req_id: d.num_computed_tokens for d in so.scheduled_new_reqs}
        computed.update((d.req_id, d.num_computed_tokens) for d in so.scheduled_cached_reqs)
        computed_np = np.fromiter((computed[r] for r in req_ids), dtype=np.int32, count=num_reqs)
        qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(counts_np, out=qsl_np[1:])

        host, view = self._step_ring.next()  # one small transfer
        view[:num_reqs] = idx_np
        view[num_reqs : 2 * num_reqs] = counts_np
        step = self._step_dev[: 2 * num_reqs]
        self.copies.copy_(step, host[: 2 * num_reqs])
        idx_mapping, counts = step[:num_reqs], step[num_reqs:]
        inputs = self.kernels.prepare_inputs(
            idx_mapping,
            counts,
            num_tokens,
            rs.num_computed_tokens.gpu,
            rs.num_prefill_tokens.gpu,
            rs.prefill_token_ids.gpu,
            rs.last_sampled_tokens,
            self.block_tables.table.gpu,
            self.config.block_size,
        )
        return InputBatch(
            req_ids=req_ids,
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            idx_mapping_np=idx_np,
            num_scheduled_tokens_np=counts_np,
            query_start_loc_np=qsl_np,
            seq_lens_np=computed_np + counts_np,
            idx_mapping=idx_mapping,
            num_scheduled_tokens=counts,
            block_table=self.block_tables.gather(idx_mapping),
            **inputs,
        )

    def _dummy_batch(self, so: SchedulerOutput) -> InputBatch:
        """A batch of fresh prefills over slots 0..B-1 that reads, but never writes, state."""
        counts_np = np.fromiter(so.num_scheduled_tokens.values(), dtype=np.int32)
        num_reqs, num_tokens = len(counts_np), int(counts_np.sum())
        qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(counts_np, out=qsl_np[1:])
        idx_np = (np.arange(num_reqs) % self.config.max_num_reqs).astype(np.int32)
        positions = np.concatenate([np.arange(n) for n in counts_np])
        dev = self.device

        def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dtype)

        idx_mapping = t(idx_np, torch.int32)
        return InputBatch(
            req_ids=list(so.num_scheduled_tokens),
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            idx_mapping_np=idx_np,
            num_scheduled_tokens_np=counts_np,
            query_start_loc_np=qsl_np,
            seq_lens_np=counts_np.copy(),
            idx_mapping=idx_mapping,
            num_scheduled_tokens=t(counts_np, torch.int32),
            input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=dev),
            positions=t(positions, torch.int64),
            query_start_loc=t(qsl_np, torch.int32),
            seq_lens=t(counts_np, torch.int32),
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            logits_indices=t(qsl_np[1:] - 1, torch.int64),
            block_table=self.block_tables.gather(idx_mapping),
        )

    def _queue_output(
        self, batch: InputBatch, out, write_stats: dict[str, WriteStats], num_logprobs: int
    ) -> PendingOutput:
        """Queue the copy of the sampled tokens (and logprobs) to the host, then an event."""
        pending = PendingOutput(batch, write_stats)
        if num_logprobs > 0:
            pending.num_logprobs = self.req_states.num_logprobs_np[batch.idx_mapping_np]
        if not self.is_cuda:
            pending.sampled = out.sampled_token_ids
            pending.logprob_token_ids, pending.logprobs = out.logprob_token_ids, out.logprobs
            return pending
        i = self._next_output
        self._next_output = (i + 1) % PINNED_RING_DEPTH
        pending.sampled = self._host_tokens[i, : batch.num_reqs]
        self.copies.copy_(pending.sampled, out.sampled_token_ids)
        if out.logprobs is not None:
            pending.logprob_token_ids = self._to_host(out.logprob_token_ids)
            pending.logprobs = self._to_host(out.logprobs)
        pending.ready = self._output_ready[i]
        pending.ready.record()
        return pending

    def wait_output(self, pending: PendingOutput) -> ModelRunnerOutput:
        """The designed sync point: wait for a queued step's sampled tokens (and logprobs)."""
        batch = pending.batch
        if batch is None:
            return ModelRunnerOutput([], [], write_stats=pending.write_stats)
        if pending.dummy:
            return ModelRunnerOutput(batch.req_ids, [])
        self.probe.begin(probes.OUTPUT_WAIT)
        t0 = time.perf_counter_ns()
        if pending.ready is not None:  # the one wait the runner is designed to make
            probes.wait_deliberately(pending.ready.synchronize)
        tokens = pending.sampled.tolist()
        wait_ns = time.perf_counter_ns() - t0
        self.probe.end(probes.OUTPUT_WAIT)
        self.probe.sync("output_wait", _OUTPUT_WAIT_SITE, wait_ns)
        logprobs = None
        if pending.logprobs is not None:
            counts = pending.num_logprobs
            ids_l, lp_l = pending.logprob_token_ids.tolist(), pending.logprobs.tolist()
            logprobs = [
                list(zip(ids_l[b][: 1 + counts[b]], lp_l[b][: 1 + counts[b]], strict=True))
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
        )
