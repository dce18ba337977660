"""The runner baseline benchmark's workload: a seeded batch of requests straight through the
engine, without the harness (no probe, no store, no runner process), so that the numbers are the
runner's own. Returns plain numbers; the benchmark prints them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mrv2_prof.runner.config import ModelSpec, RunnerConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.engine import Engine


@dataclass(frozen=True)
class QuickstartWorkload:
    num_requests: int = 16
    prompt_len_min: int = 16
    prompt_len_max: int = 96
    output_len: int = 32
    temperature: float = 0.0
    seed: int = 0


@dataclass
class RunSummary:
    device: str
    dtype: str
    model_params: int
    num_kv_blocks: int
    num_requests: int
    steps: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    startup_s: float
    step_wall_ms_p50: float  # schedule + execute + update, including the wait for tokens
    step_host_ms_p50: float  # the same without the wait: host work per step
    step_host_ms_p90: float
    decode_step_wall_ms_p50: float  # steady decode steps only
    decode_step_host_ms_p50: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    num_preemptions: int
    prefix_cache_hit_tokens: int
    notes: list[str]


def run_workload(
    config: RunnerConfig,
    model: ModelSpec,
    workload: QuickstartWorkload,
    on_step: Callable[[int, int], None] | None = None,
) -> RunSummary:
    """Build the engine, submit every request at once, step until all finish."""
    t0 = time.perf_counter()
    engine = Engine(config, model)
    startup_s = time.perf_counter() - t0
    rng = np.random.default_rng(workload.seed)
    vocab = engine.vocab_size
    params = SamplingParams(
        temperature=workload.temperature, max_tokens=workload.output_len, ignore_eos=True
    )
    prompt_tokens = 0
    for i in range(workload.num_requests):
        n = int(rng.integers(workload.prompt_len_min, workload.prompt_len_max + 1))
        n = min(n, config.max_model_len - workload.output_len - 1)
        prompt_tokens += n
        engine.add_request(
            f"req-{i}", rng.integers(0, vocab, size=n).tolist(), params, arrival_time=float(i)
        )

    wall_ns, host_ns, decode_wall_ns, decode_host_ns = [], [], [], []
    output_tokens = 0
    t1 = time.perf_counter()
    while engine.has_unfinished_requests():
        res = engine.step()
        work_ns = res.host_ns - res.runner_output.output_wait_ns
        wall_ns.append(res.host_ns)
        host_ns.append(work_ns)
        so = res.scheduler_output
        if (
            so.num_reqs
            and so.total_num_scheduled_tokens == so.num_reqs
            and not so.scheduled_new_reqs
        ):
            decode_wall_ns.append(res.host_ns)
            decode_host_ns.append(work_ns)
        output_tokens += len(res.updated)
        if on_step is not None:
            on_step(output_tokens, workload.num_requests * workload.output_len)
    wall_s = time.perf_counter() - t1

    def pct(values: list[int], q: float) -> float:
        return float(np.percentile(np.asarray(values) / 1e6, q)) if values else 0.0

    info = engine.info
    return RunSummary(
        device=info.device,
        dtype=info.dtype,
        model_params=info.model_params,
        num_kv_blocks=info.num_kv_blocks,
        num_requests=workload.num_requests,
        steps=len(wall_ns),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        wall_s=wall_s,
        startup_s=startup_s,
        step_wall_ms_p50=pct(wall_ns, 50),
        step_host_ms_p50=pct(host_ns, 50),
        step_host_ms_p90=pct(host_ns, 90),
        decode_step_wall_ms_p50=pct(decode_wall_ns, 50),
        decode_step_host_ms_p50=pct(decode_host_ns, 50),
        output_tokens_per_s=output_tokens / wall_s if wall_s else 0.0,
        total_tokens_per_s=(output_tokens + prompt_tokens) / wall_s if wall_s else 0.0,
        num_preemptions=engine.scheduler.num_preemptions,
        prefix_cache_hit_tokens=engine.kv_cache_manager.prefix_cache_stats.num_hit_tokens,
        notes=list(info.notes),
    )
