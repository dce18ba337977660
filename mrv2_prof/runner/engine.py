"""The engine step loop (V1 engine shape): ``schedule() → execute_model() → update_from_output()``.

Owns the scheduler, the KV cache manager and the model runner; requests enter with
``add_request`` and can be aborted at any time. This is the synchronous loop: each step waits for
its sampled tokens before the next is scheduled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.kv_cache_manager import KVCacheManager
from mrv2_prof.runner.model_runner import ModelRunner, ModelRunnerOutput
from mrv2_prof.runner.request import Request, SamplingParams
from mrv2_prof.runner.scheduler import Scheduler, SchedulerOutput


@dataclass
class StepResult:
    step: int
    scheduler_output: SchedulerOutput
    runner_output: ModelRunnerOutput
    updated: list[Request]  # requests that received a token this step
    finished: list[Request] = field(default_factory=list)
    host_ns: int = 0  # schedule + execute + update, host wall time


class Engine:
    def __init__(self, config: RunnerConfig, model_spec: ModelSpec) -> None:
        self.config = config
        self.runner = ModelRunner(config, model_spec)
        num_blocks = self.runner.initialize_kv_cache()
        self.kv_cache_manager = KVCacheManager(
            num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
        )
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
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            priority=priority,
            eos_token_ids=self.eos_token_ids,
        )
        self.scheduler.add_request(request)
        return request

    def abort_request(self, request_id: str) -> bool:
        return self.scheduler.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def step(self) -> StepResult:
        t0 = time.perf_counter_ns()
        so = self.scheduler.schedule()
        out = self.runner.execute_model(so)
        updated = self.scheduler.update_from_output(so, out.sampled_token_ids, out.logprobs)
        result = StepResult(
            step=self.step_index,
            scheduler_output=so,
            runner_output=out,
            updated=updated,
            finished=[r for r in updated if r.is_finished],
            host_ns=time.perf_counter_ns() - t0,
        )
        self.step_index += 1
        return result

    def generate(
        self, prompts: dict[str, list[int]], sampling_params: SamplingParams | None = None
    ) -> dict[str, Request]:
        """Run a batch of prompts to completion; returns the finished requests by id."""
        requests = {
            rid: self.add_request(rid, ids, sampling_params, arrival_time=float(i))
            for i, (rid, ids) in enumerate(prompts.items())
        }
        while self.has_unfinished_requests():
            self.step()
        return requests
