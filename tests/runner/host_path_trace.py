"""Per-step traces of seeded randomized workloads, to hold the host path against a recorded run.

A trace lists, for every step, what the scheduler decided (each scheduled request with its token
count, the new, preempted and finished ids) and what the host learned (each request that got a
token, with the token), then every request's output tokens. ``host_path_trace.json`` beside this
file was recorded from the code before its host path was vectorised; ``test_host_path_trace``
asserts the current code reproduces it step for step. Re-record (only when a change of decisions
is intended) with ``python tests/runner/host_path_trace.py``.

Three kinds of workload: the scheduler alone, fed tokens by a deterministic function of each
request's tokens so far (many seeds, cheap); the scheduler alone at wide batches (up to 96
running requests, sync and async, tokens one step late as the engine delivers them, stop
tokens, priorities), whose steps record the whole ``SchedulerOutput`` (blocks, computed tokens,
sampling ids); and the whole engine on ``llama-tiny`` on the CPU, sync and async, with greedy
and seeded sampling. All mix staggered arrivals, shared prefixes (prefix-cache hits), a token
budget below the prompts (chunked prefill), a KV pool small enough to preempt, and aborts at
random steps.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

FIXTURE = Path(__file__).with_name("host_path_trace.json")
SCHEDULER_SEEDS = range(8)
WIDE_SEEDS = range(10)
ENGINE_SEEDS = range(3)
VOCAB = 50


def _ids(ids) -> str:
    return ",".join(sorted(ids))


def _step_line(so, updated: list[tuple[str, int]]) -> str:
    """One step: scheduled rid:count in batch order | new | preempted | finished | rid:token."""
    return "|".join(
        (
            ",".join(f"{rid}:{n}" for rid, n in so.num_scheduled_tokens.items()),
            _ids(d.req_id for d in so.scheduled_new_reqs),
            _ids(so.preempted_req_ids),
            _ids(so.finished_req_ids),
            ",".join(f"{rid}:{t}" for rid, t in updated),
        )
    )


def _fake_token(tokens: list[int]) -> int:
    return zlib.crc32(bytes(str(tokens), "ascii")) % VOCAB


def _prompts(rng: random.Random, n: int, max_len: int, vocab: int, block: int) -> list[list[int]]:
    shared = [rng.randrange(vocab) for _ in range(3 * block)]
    prompts = []
    for _ in range(n):
        k = rng.randint(1, max_len)
        p = shared[:k] if rng.random() < 0.4 else []
        prompts.append(p + [rng.randrange(vocab) for _ in range(k - len(p))])
    return prompts


def scheduler_trace(seed: int) -> dict:
    """The scheduler alone (synchronous), on a fake model."""
    from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
    from mrv2_prof.runner.core.request import Request, SamplingParams
    from mrv2_prof.runner.core.scheduler import Scheduler

    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    max_model_len = rng.choice([24, 40, 64])
    num_blocks = -(-max_model_len // block_size) + rng.randint(0, 6)
    kv = KVCacheManager(num_blocks, block_size, enable_caching=True)
    sched = Scheduler(
        kv,
        max_num_seqs=rng.randint(1, 6),
        max_num_batched_tokens=rng.randint(1, 48),
        max_model_len=max_model_len,
    )
    prompts = _prompts(rng, rng.randint(4, 14), max_model_len // 2, VOCAB, block_size)
    requests = []
    arrivals = [rng.randint(0, 10) for _ in prompts]
    steps, aborted = [], []
    step = 0
    while step < 5000:
        for i, prompt in enumerate(prompts):
            if arrivals[i] == step:
                max_tokens = rng.randint(1, max_model_len - len(prompt))
                r = Request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens), float(i))
                requests.append(r)
                sched.add_request(r)
        if not sched.num_unfinished and step > max(arrivals):
            break
        so = sched.schedule()
        sampled = [
            _fake_token(sched.requests[rid].all_token_ids) for rid in so.num_scheduled_tokens
        ]
        updated = sched.update_from_output(so, sampled)
        steps.append(_step_line(so, [(r.request_id, r.output_token_ids[-1]) for r in updated]))
        if rng.random() < 0.05 and sched.requests:
            aborted.append(rng.choice(sorted(sched.requests)))
            sched.abort_request(aborted[-1])
        step += 1
    return {
        "steps": steps,
        "aborted": aborted,
        "outputs": {r.request_id: r.output_token_ids for r in requests},
        "cached": {r.request_id: r.num_cached_tokens for r in requests},
    }


def _full_step_line(so, updated) -> str:
    """One step with everything the runner reads of it: scheduled rid:count in batch order |
    new rid:computed:prompt:tokens:blocks | cached rid:computed:new blocks | sampling ids |
    preempted | finished | total | rid:token:finish reason."""
    new = ",".join(
        f"{d.req_id}:{d.num_computed_tokens}:{d.num_prompt_tokens}:{len(d.token_ids)}:"
        + "/".join(map(str, d.block_ids))
        for d in so.scheduled_new_reqs
    )
    cached = ",".join(
        f"{c.req_id}:{c.num_computed_tokens}:" + "/".join(map(str, c.new_block_ids))
        for c in so.scheduled_cached_reqs
    )
    return "|".join(
        (
            ",".join(f"{rid}:{n}" for rid, n in so.num_scheduled_tokens.items()),
            new,
            cached,
            _ids(so.sampling_req_ids),
            _ids(so.preempted_req_ids),
            _ids(so.finished_req_ids),
            str(so.total_num_scheduled_tokens),
            ",".join(f"{r.request_id}:{r.output_token_ids[-1]}:{r.finish_reason}" for r in updated),
        )
    )


def wide_scheduler_trace(seed: int, async_scheduling: bool) -> dict:
    """The scheduler alone at wide batches; with ``async_scheduling`` each step's tokens are
    applied after the next step is scheduled, as the engine does."""
    from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
    from mrv2_prof.runner.core.request import Request, SamplingParams
    from mrv2_prof.runner.core.scheduler import Scheduler

    rng = random.Random(1000 + seed)
    block_size = rng.choice([1, 4, 16])
    max_model_len = rng.choice([48, 96])
    num_reqs = rng.randint(40, 120)
    # from a pool far too small (preemption in decode steps) to one that holds everyone
    num_blocks = -(-max_model_len // block_size) * (4, 10, 24, 200)[seed % 4]
    kv = KVCacheManager(num_blocks, block_size, enable_caching=seed % 5 != 4)
    sched = Scheduler(
        kv,
        max_num_seqs=(96, 64, 32)[seed // 4 % 3],
        max_num_batched_tokens=(512, 128, 24)[seed % 3],
        max_model_len=max_model_len,
        async_scheduling=async_scheduling,
    )
    prompts = _prompts(rng, num_reqs, max_model_len // 3, VOCAB, block_size)
    arrivals = [rng.randint(0, 30) for _ in prompts]
    requests = []
    steps, aborted = [], []
    in_flight = None
    step = 0
    while step < 5000:
        for i, prompt in enumerate(prompts):
            if arrivals[i] == step:
                params = SamplingParams(
                    max_tokens=rng.randint(1, max_model_len - len(prompt)),
                    stop_token_ids=(rng.randrange(VOCAB),) if rng.random() < 0.3 else (),
                    ignore_eos=rng.random() < 0.5,
                )
                r = Request(
                    f"r{i}",
                    prompt,
                    params,
                    float(i),
                    priority=rng.choice([0, 0, 0, 1, -1]),
                    eos_token_ids=(3,),
                )
                requests.append(r)
                sched.add_request(r)
        if not sched.num_unfinished and in_flight is None and step > max(arrivals):
            break
        so = sched.schedule(settle_later=True)  # as the engine schedules and settles
        sched.settle()
        # a token per scheduled request, from its id and how far it is computed
        sampled = [
            zlib.crc32(f"{rid}:{sched.requests[rid].num_computed_tokens}".encode()) % VOCAB
            for rid in so.num_scheduled_tokens
        ]
        if async_scheduling:
            done, in_flight = in_flight, (so, sampled)
            if so.is_empty:
                in_flight = None
        else:
            done = (so, sampled)
        updated = sched.update_from_output(*done) if done is not None else []
        # the line's checksum: the fixture stays small; a mismatch names the step
        steps.append(f"{zlib.crc32(_full_step_line(so, updated).encode()):08x}")
        if rng.random() < 0.03 and sched.requests:
            aborted.append(rng.choice(sorted(sched.requests)))
            sched.abort_request(aborted[-1])
        step += 1
    kv.check_consistency()
    return {
        "preemptions": sched.num_preemptions,
        "steps": steps,
        "aborted": aborted,  # the outputs are in the steps' checksums
        "cached": {r.request_id: r.num_cached_tokens for r in requests},
        "finish": {r.request_id: r.finish_reason for r in requests},
    }


def engine_trace(seed: int, async_scheduling: bool) -> dict:
    """The whole engine on ``llama-tiny`` (CPU, torch kernels)."""
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.core.request import SamplingParams
    from mrv2_prof.runner.engine import Engine

    config = RunnerConfig(
        max_num_reqs=32,
        max_num_seqs=10,
        max_num_batched_tokens=40,
        max_model_len=128,
        block_size=4,
        num_kv_blocks=48,
        kernels="torch",
        async_scheduling=async_scheduling,
        uva=False,
        cudagraph_mode="none",
        device="cpu",
    )
    engine = Engine(config, ModelSpec(preset="llama-tiny", dtype="float32"))
    params = [
        SamplingParams(max_tokens=12, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=0.8, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=1.0, top_k=20, top_p=0.9),
        SamplingParams(max_tokens=6, temperature=0.7, top_p=0.5, logprobs=2, ignore_eos=True),
    ]
    rng = random.Random(100 + seed)
    prompts = _prompts(rng, 16, 60, engine.vocab_size, config.block_size)
    arrivals = {f"r{i}": rng.randint(0, 12) for i in range(len(prompts))}
    requests = {}
    steps, aborted = [], []
    step = 0
    while step < 2000:
        for i, prompt in enumerate(prompts):
            rid = f"r{i}"
            if arrivals[rid] == step:
                requests[rid] = engine.add_request(rid, prompt, params[i % 4], float(i))
        if not engine.has_unfinished_requests() and step > max(arrivals.values()):
            break
        res = engine.step()
        updated = [(r.request_id, r.output_token_ids[-1]) for r in res.updated]
        steps.append(_step_line(res.scheduler_output, updated))
        unfinished = sorted(r.request_id for r in engine.unfinished_requests())
        if rng.random() < 0.04 and unfinished:
            aborted.append(rng.choice(unfinished))
            engine.abort_request(aborted[-1])
        step += 1
    return {
        "preemptions": engine.scheduler.num_preemptions,
        "steps": steps,
        "aborted": aborted,
        "outputs": {rid: r.output_token_ids for rid, r in requests.items()},
        "cached": {rid: r.num_cached_tokens for rid, r in requests.items()},
    }


def record() -> dict:
    out = {f"scheduler-{s}": scheduler_trace(s) for s in SCHEDULER_SEEDS}
    for s in WIDE_SEEDS:
        for mode in ("sync", "async"):
            out[f"wide-{mode}-{s}"] = wide_scheduler_trace(s, mode == "async")
    for s in ENGINE_SEEDS:
        for mode in ("sync", "async"):
            out[f"engine-{mode}-{s}"] = engine_trace(s, mode == "async")
    return out


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record(), separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size // 1024} KB)")
