"""The engine step loop (V1 engine shape): ``schedule()``, the runner's ``queue_step()`` and
``wait_output()``, ``update_from_output()``.

Owns the scheduler, the KV cache manager and the model runner; requests enter with
``add_request`` and can be aborted at any time. Every step, token and request lifecycle event is
reported to the probe (``probes.api``); the default probe records nothing.

Synchronous (``async_scheduling: false``): step N is scheduled, queued, waited for and its tokens
applied before step N+1 is scheduled. Async: step N+1 is scheduled and queued *before* the host
waits for step N's tokens, so the CPU's scheduling and input preparation overlap the GPU's
work; step N+1 reads step N's tokens on the GPU. Step record N then holds step N's batch and the
tokens of step N-1, and a request that finished in step N-1 may have computed one extra token in
step N, which is discarded. The greedy and seeded tokens are the same in both modes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mrv2_prof.probes import api as probes
from mrv2_prof.probes.api import Probe
from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.adaptive_k import AdaptiveK
from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
from mrv2_prof.runner.core.request import Request, SamplingParams
from mrv2_prof.runner.core.scheduler import Scheduler, SchedulerOutput
from mrv2_prof.runner.core.spec_scheduling import SpecScheduling
from mrv2_prof.runner.worker.async_output import ModelRunnerOutput, PendingOutput
from mrv2_prof.runner.worker.compile_watch import CompileWatch
from mrv2_prof.runner.worker.model_runner import ModelRunner
from mrv2_prof.runner.worker.staged_write import WriteStats
from mrv2_prof.runner.worker.startup import rank_runner, start_up


@dataclass
class StepResult:
    step: int
    scheduler_output: SchedulerOutput  # the batch queued in this step
    runner_output: ModelRunnerOutput  # the tokens read in this step (the step before, if async)
    updated: list[Request]  # requests that received a token this step
    finished: list[Request] = field(default_factory=list)
    write_stats: dict[str, WriteStats] = field(default_factory=dict)  # queued in this step
    host_ns: int = 0  # schedule + execute + update, host wall time


class Engine:
    def __init__(
        self, config: RunnerConfig, model_spec: ModelSpec, probe: Probe | None = None
    ) -> None:
        self.probe = probe if probe is not None else Probe()
        # Triton compiles to the probe, start-up's too (step -1); late ones refused under strict
        self.compiles = CompileWatch(self.probe, config.strict).attach()
        self.runner = ModelRunner(config, model_spec, self.probe, rank_runner=rank_runner)
        config = self.config = self.runner.config  # max_model_len resolved against the model
        num_blocks = start_up(self.runner)  # KV cache, warm-up, CUDA graphs
        self.compiles.warm()
        if self.compiles.note and self.runner.is_cuda:  # a triton too old for its JIT hooks
            self.runner.info.notes.append(self.compiles.note)
        self.kv_cache_manager = KVCacheManager(
            num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            async_scheduling=config.async_scheduling,
            spec=(  # verifies are padded to one k where FULL verify graphs were captured
                SpecScheduling(
                    config.spec_decode,
                    config.async_scheduling,
                    self.runner.graphs.verify_capacity(),
                    on_device=self.runner.device_drafts is not None,
                )
                if config.spec_decode.enabled
                else None
            ),
        )
        # dynamic k that never loses (core/adaptive_k.py): the ks a step may take are those
        # with FULL verify graphs, else every k up to the most the config allows
        spec = config.spec_decode
        self.adaptive = AdaptiveK(spec.max_k) if spec.is_adaptive else None
        self._adaptive_ks = sorted(self.runner.graphs.verify_capacity()) or list(
            range(1, spec.max_k + 1)
        )
        self._timed: tuple[int, int, int] | None = None  # (batch, k, start ns) of a decode step
        # Async: the step queued last, whose tokens the host has not read yet.
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None
        self.vocab_size = self.runner.model_args.vocab_size
        self.eos_token_ids = tuple(self.runner.model_args.eos_token_ids)
        self.step_index = 0

    @property
    def info(self):
        return self.runner.info

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> Request:
        """Queue a request. ``arrival_time`` is in seconds on the ``perf_counter`` clock."""
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"request {request_id}: token id {bad[0]} outside the vocabulary "
                f"[0, {self.vocab_size})"
            )
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=sampling_params or SamplingParams(),
            arrival_time=time.perf_counter() if arrival_time is None else arrival_time,
            priority=priority,
            eos_token_ids=self.eos_token_ids,
        )
        self.scheduler.add_request(request)
        self.probe.request_arrival(
            request_id, round(request.arrival_time * 1e9), len(prompt_token_ids)
        )
        return request

    def abort_request(self, request_id: str) -> bool:
        request = self.scheduler.requests.get(request_id)
        if not self.scheduler.abort_request(request_id):
            return False
        self._record_finish(request, time.perf_counter_ns())
        return True

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_kv_blocks_used(self) -> int:
        pool = self.kv_cache_manager.block_pool
        return pool.num_blocks - pool.num_free_blocks

    def held_resources(self) -> dict[str, int]:
        """The leak counters a run stores at its end: request slots held by no live request
        and not awaiting release (the slots of requests finished in the last step are released
        by the next schedule: ``slots_to_release``), and KV blocks in use. With every request
        finished or aborted, ``request_slots`` and ``kv_blocks`` must be 0."""
        to_release = self.scheduler.finished_ids_to_send
        held = [r for r in self.runner.req_states.slot_of if r not in self.scheduler.requests]
        return {
            "request_slots": sum(r not in to_release for r in held),
            "slots_to_release": sum(r in to_release for r in held),
            "kv_blocks": self.num_kv_blocks_used,
        }

    def unfinished_requests(self) -> list[Request]:
        """Requests added and not finished (waiting, running or preempted), in arrival order."""
        return [r for r in self.scheduler.requests.values() if not r.is_finished]

    def graph_usage(self) -> dict[str, float | int]:
        """Captured CUDA graph keys against replayed ones (empty when nothing was captured)."""
        graphs, gr = self.runner.graphs, self.runner.graph_runner
        usage = graphs.usage() if graphs.captures else {}
        if gr is not None and gr.full_step is not None:  # FULL steps that sampled in a graph
            usage["sample_graph_replays"] = gr.sample_replays
        return usage

    def close(self) -> list[str]:
        """Release what the engine started besides this process (a tensor-parallel runner's
        worker ranks); the notes this adds to the run."""
        self.compiles.detach()
        notes = self.runner.close()
        if self.scheduler.spec is not None:
            notes = notes + self.scheduler.spec.notes()
        return notes

    def has_unfinished_requests(self) -> bool:
        """Requests not finished yet, or a step whose tokens are still to be read."""
        return self.scheduler.num_unfinished > 0 or self._in_flight is not None

    def step(self) -> StepResult:
        """One step in phases, the probe's at their boundaries: draft (speculative decoding),
        schedule, execute (the step queued on the runner), the tokens read (of the step before
        under async scheduling, else of this one), update, and the step recorded."""
        p = self.probe
        t0 = time.perf_counter_ns()
        p.step_begin(self.step_index)
        spec = self.scheduler.spec
        if spec is not None:
            p.begin(probes.DRAFT)
            if self.adaptive is not None:
                self._adapt_k(spec, t0)
            spec.draft(self.scheduler.running, self.config.max_model_len)
            p.end(probes.DRAFT)
        p.begin(probes.SCHEDULE)
        so = self._schedule(spec, t0)
        p.switch(probes.SCHEDULE, probes.EXECUTE)
        pending = self.runner.queue_step(so)
        p.end(probes.EXECUTE)
        self.scheduler.settle()  # the requests' counters, while the device runs the step
        num_prefill = self._num_prefill_tokens(so) if p.enabled else 0
        done, out = self._read_output(so, pending)
        before = self._verify_lengths(done, out)
        p.begin(probes.UPDATE)
        finishes = self.scheduler.num_finishes
        updated = self._update(done, out)
        p.end(probes.UPDATE)
        finished = self._after_update(spec, out, updated, finishes)
        if spec is not None:
            self._record_spec_step(spec)
        if p.enabled:
            self._record_step(so, out, updated, finished, before, num_prefill)
        result = StepResult(
            self.step_index, so, out, updated, finished, pending.write_stats,
            host_ns=time.perf_counter_ns() - t0,
        )  # fmt: skip
        if self.compiles.late is not None:  # strict: a compile after warm-up fails the run
            self.compiles.check(self.step_index)
        self.step_index += 1
        return result

    def _schedule(self, spec: SpecScheduling | None, t0: int) -> SchedulerOutput:
        """The step's schedule (settled once the step is queued); under dynamic k a decode-only
        step is timed to the next one's start."""
        so = self.scheduler.schedule(settle_later=True)
        if self.adaptive is not None:
            decode = not so.scheduled_new_reqs and so.num_reqs > 0
            reserved = spec.num_reserved
            k = reserved // so.num_reqs if decode else -1
            if decode and so.total_num_scheduled_tokens == so.num_reqs * (1 + k):
                self._timed = (so.num_reqs, k, t0)
        return so

    def _read_output(
        self, so: SchedulerOutput, pending: PendingOutput
    ) -> tuple[tuple[SchedulerOutput, PendingOutput] | None, ModelRunnerOutput]:
        """The step whose tokens are read now, and its tokens: this one, or under async
        scheduling the one before (this one runs meanwhile; None: none was in flight)."""
        if not self.config.async_scheduling:
            done = (so, pending)
        else:
            done, self._in_flight = self._in_flight, (so, pending)
            if pending.batch is None:  # nothing queued: nothing to overlap with
                self._in_flight = None
        out = self.runner.wait_output(done[1]) if done is not None else ModelRunnerOutput([], [])
        return done, out

    def _verify_lengths(self, done, out: ModelRunnerOutput) -> dict[str, int]:
        """A verify step: the output lengths of its verifying requests before the update."""
        before = {}
        if out.spec_token_ids is not None:
            requests = self.scheduler.requests
            for rid in done[0].scheduled_spec_decode_tokens:
                if rid in requests:
                    before[rid] = requests[rid].num_output_tokens
        return before

    def _update(self, done, out: ModelRunnerOutput) -> list[Request]:
        """The requests updated from the tokens read (they received a token)."""
        if done is None:
            return []
        return self.scheduler.update_from_output(
            done[0],
            out.sampled_token_ids,
            out.logprobs,
            out.prompt_logprobs,
            out.spec_token_ids,
            out.spec_num_drafts,
        )

    def _after_update(
        self, spec: SpecScheduling | None, out, updated: list[Request], finishes: int
    ) -> list[Request]:
        """The draft model's proposals handed to the scheduler; the requests that finished
        (only a step in which a request finished has any to look for)."""
        if spec is not None and out.draft_token_ids is not None:
            spec.take_model_drafts(out.req_ids, out.draft_token_ids, updated)
        if self.scheduler.num_finishes == finishes:
            return []
        return [r for r in updated if r.is_finished]

    def _record_spec_step(self, spec: SpecScheduling) -> None:
        """Speculative decoding's figures of the step, dynamic k's observations first."""
        reclaimed, outcomes = spec.num_reclaimed, spec.outcomes
        verifies = spec.take_verifies()
        adaptive = self.adaptive
        if adaptive is not None:
            adaptive.observe_verifies(outcomes)
        # real drafts, not placeholders (known only with the tokens when on the device)
        drafted = sum(v[1] for v in verifies) if spec.on_device else spec.num_drafted
        self.probe.spec_step(
            spec.k,
            drafted,
            verifies,
            reserved=spec.num_reserved,
            reclaimed=reclaimed,
            sat_out=spec.num_sat_out,
            expected_tokens=adaptive.expected_tokens if adaptive is not None else None,
            cost_ratio=adaptive.cost_ratio if adaptive is not None else None,
        )

    def _record_step(self, so, out, updated, finished, before, num_prefill: int) -> None:
        """The step's tokens, finishes and figures, to an enabled probe."""
        p = self.probe
        t_ns = time.perf_counter_ns()  # the tokens are known to the host from here on
        if updated and out.spec_token_ids is not None:
            self._record_spec_tokens(updated, before, t_ns)
        elif updated:
            ids, indices, tokens, first = self.scheduler.token_rows(updated)
            p.step_tokens(ids, indices, t_ns, tokens, first)
        for r in finished:
            self._record_finish(r, t_ns)
        p.step_end(
            so.num_reqs,
            so.total_num_scheduled_tokens,
            num_prefill,
            self.num_waiting,
            self.num_running,
            self.num_kv_blocks_used,
            len(so.preempted_req_ids),
            out.output_wait_ns,
            self.runner.graph_mode_of_last_step,
            *so.attention_extent(),
        )

    def _adapt_k(self, spec: SpecScheduling, t0: int) -> None:
        """Dynamic k's decision for the step about to be drafted (core/adaptive_k.py), after
        the time of the decode step before it."""
        adaptive = self.adaptive
        if self._timed is not None:
            batch, k, start = self._timed
            adaptive.observe_time(batch, k, t0 - start)
            self._timed = None
        running = len(self.scheduler.running)
        table_k = spec.config.k_for(running)
        spec.max_k = adaptive.choose(running, table_k, self._adaptive_ks)

    def _record_spec_tokens(
        self, updated: list[Request], before: dict[str, int], t_ns: int
    ) -> None:
        """A verify step's tokens: every token a request received (``before``: the output
        lengths of the verifying requests before the update), not only its last."""
        ids, indices, tokens = [], [], []
        for r in updated:
            n_out = len(r.output_token_ids)
            for i in range(before.get(r.request_id, n_out - 1), n_out):
                ids.append(r.request_id)
                indices.append(i)
                tokens.append(r.output_token_ids[i])
        self.probe.step_tokens(ids, indices, t_ns, tokens)

    def _num_prefill_tokens(self, so: SchedulerOutput) -> int:
        """Tokens of this step that are not a decode (one new token after the prompt): the
        schedule's count, else read from the (settled) requests."""
        if so.num_prefill_tokens is not None:
            return so.num_prefill_tokens
        requests, verifies = self.scheduler.requests, so.scheduled_spec_decode_tokens
        num_prefill = 0
        for rid, n in so.num_scheduled_tokens.items():
            r = requests[rid]
            if rid in verifies:  # its last token and its draft slots: a decode
                continue
            if n != 1 or r.num_computed_tokens - 1 < r.num_prompt_tokens:
                num_prefill += n
        return num_prefill

    def _record_finish(self, r: Request, t_ns: int) -> None:
        self.probe.request_finish(
            r.request_id,
            t_ns,
            r.num_output_tokens,
            r.num_preemptions,
            r.finish_reason,
            r.num_cached_tokens,
        )
