"""Scheduler and KV-cache invariants after every step of randomized workloads.

The model is replaced by a deterministic function of each request's tokens so far, so a request's
output cannot depend on batching, chunking or preemption; any difference is a scheduler bug.
"""

import random
import zlib

import pytest

from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
from mrv2_prof.runner.core.request import Request, RequestStatus, SamplingParams
from mrv2_prof.runner.core.scheduler import Scheduler

VOCAB = 50


def fake_token(tokens: list[int]) -> int:
    return zlib.crc32(bytes(str(tokens), "ascii")) % VOCAB


def run_workload(
    seed, num_blocks, block_size, max_num_seqs, budget, max_model_len, abort_p=0.0, prompts=None
):
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size, enable_caching=True)
    sched = Scheduler(
        kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len
    )
    if prompts is None:
        shared = [rng.randrange(VOCAB) for _ in range(3 * block_size)]
        prompts = []
        for _ in range(rng.randint(4, 14)):
            n = rng.randint(1, max_model_len // 2)
            p = shared[:n] if rng.random() < 0.4 else []
            prompts.append(p + [rng.randrange(VOCAB) for _ in range(n - len(p))] or [1])
    requests = []
    for i, prompt in enumerate(prompts):
        max_tokens = random.Random(seed * 1000 + i).randint(1, max_model_len - len(prompt))
        r = Request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens), arrival_time=i)
        requests.append(r)
        sched.add_request(r)
    # The runner's view of slots: which requests it holds.
    runner_reqs: set[str] = set()
    steps = 0
    while sched.num_unfinished:
        steps += 1
        assert steps < 10_000, "no progress"
        so = sched.schedule()
        # -- invariants of the schedule itself
        assert so.total_num_scheduled_tokens <= budget
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())
        assert len(sched.running) <= max_num_seqs
        runner_reqs -= so.finished_req_ids
        for d in so.scheduled_new_reqs:
            assert d.req_id not in runner_reqs, "new request already holds a slot"
            runner_reqs.add(d.req_id)
            assert kv.get_block_ids(d.req_id) == d.block_ids
        for d in so.scheduled_cached_reqs:
            assert d.req_id in runner_reqs, "cached request without a slot"
        for rid, n in so.num_scheduled_tokens.items():
            r = sched.requests[rid]
            assert n >= 1
            assert r.num_computed_tokens <= r.num_tokens  # after the schedule's own update
            assert len(kv.get_block_ids(rid)) * block_size >= r.num_computed_tokens
        kv.check_consistency()
        sampled = []
        for rid in so.num_scheduled_tokens:
            r = sched.requests[rid]
            sampled.append(fake_token(r.all_token_ids))
        sched.update_from_output(so, sampled)
        kv.check_consistency()
        if abort_p and rng.random() < abort_p and sched.requests:
            sched.abort_request(rng.choice(sorted(sched.requests)))
            kv.check_consistency()
    so = sched.schedule()  # delivers the last finished ids to the runner
    runner_reqs -= so.finished_req_ids
    assert so.is_empty
    assert not runner_reqs, f"slots leaked: {runner_reqs}"
    assert kv.num_free_blocks == num_blocks, "blocks leaked"
    kv.check_consistency()
    return requests, sched


def expected_output(r: Request) -> list[int]:
    tokens = list(r.prompt_token_ids)
    for _ in range(r.sampling_params.max_tokens):
        tokens.append(fake_token(tokens))
    return tokens[r.num_prompt_tokens :]


@pytest.mark.parametrize("seed", range(25))
def test_randomized_invariants_and_outputs(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    max_model_len = rng.choice([24, 40, 64])
    # Small pools force preemption; the pool still holds one request of max_model_len.
    num_blocks = -(-max_model_len // block_size) + rng.randint(0, 6)
    requests, sched = run_workload(
        seed,
        num_blocks,
        block_size,
        max_num_seqs=rng.randint(1, 6),
        budget=rng.randint(1, 48),
        max_model_len=max_model_len,
    )
    for r in requests:
        assert r.status in (RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_STOPPED)
        assert r.output_token_ids == expected_output(r), f"{r.request_id} diverged"


def test_preemption_happens_and_preempted_requests_finish_identically():
    prompts = [[i % VOCAB] * 10 + [j for j in range(i, i + 6)] for i in range(6)]
    requests, sched = run_workload(
        3, num_blocks=12, block_size=4, max_num_seqs=6, budget=64, max_model_len=40, prompts=prompts
    )
    assert sched.num_preemptions > 0
    assert any(r.num_preemptions for r in requests)
    for r in requests:
        assert r.output_token_ids == expected_output(r)


@pytest.mark.parametrize("seed", range(8))
def test_aborts_at_random_points_leak_nothing(seed):
    requests, _ = run_workload(
        seed, num_blocks=20, block_size=4, max_num_seqs=4, budget=16, max_model_len=40, abort_p=0.15
    )
    for r in requests:
        assert r.is_finished
        if r.status is not RequestStatus.FINISHED_ABORTED:
            assert r.output_token_ids == expected_output(r)


def test_chunked_prefill_respects_budget_by_hand():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=10, max_model_len=64)
    a = Request("a", list(range(23)), SamplingParams(max_tokens=2), arrival_time=0)
    b = Request("b", list(range(30, 35)), SamplingParams(max_tokens=2), arrival_time=1)
    sched.add_request(a)
    sched.add_request(b)
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 10}  # budget spent on a's first chunk
    sched.update_from_output(so, [7])
    assert a.output_token_ids == []  # a partial prefill samples nothing
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 10}  # RUNNING first: a continues
    sched.update_from_output(so, [7])
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 3, "b": 5}  # a finishes its prompt, b admitted
    sched.update_from_output(so, [7, 8])
    assert a.output_token_ids == [7] and b.output_token_ids == [8]
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 1}  # both decode


def test_no_waiting_admission_in_a_step_that_preempted():
    kv = KVCacheManager(4, 4)  # 16 token slots
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16)
    a = Request("a", list(range(8)), SamplingParams(max_tokens=8), arrival_time=0)
    b = Request("b", list(range(20, 28)), SamplingParams(max_tokens=8), arrival_time=1)
    sched.add_request(a)
    sched.add_request(b)
    so = sched.schedule()
    assert set(so.num_scheduled_tokens) == {"a", "b"}  # 2 blocks each: pool full
    sched.update_from_output(so, [1, 2])
    c = Request("c", [40], SamplingParams(max_tokens=1), arrival_time=2)
    sched.add_request(c)
    so = sched.schedule()
    # a needs a third block: b (lowest priority: latest arrival) is preempted, c waits
    assert so.preempted_req_ids == {"b"}
    assert "b" in so.finished_req_ids
    assert set(so.num_scheduled_tokens) == {"a"}
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert not so.scheduled_new_reqs


def test_priority_decides_the_victim():
    kv = KVCacheManager(4, 4)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16)
    a = Request("a", list(range(8)), SamplingParams(max_tokens=8), arrival_time=0, priority=5)
    b = Request("b", list(range(20, 28)), SamplingParams(max_tokens=8), arrival_time=1)
    sched.add_request(a)
    sched.add_request(b)
    so = sched.schedule()
    assert list(so.num_scheduled_tokens) == ["b", "a"]  # b has the better priority
    sched.update_from_output(so, [1, 2])
    so = sched.schedule()
    assert so.preempted_req_ids == {"a"}


def test_prompt_too_long_is_refused():
    sched = Scheduler(
        KVCacheManager(8, 4), max_num_seqs=4, max_num_batched_tokens=8, max_model_len=16
    )
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(Request("x", list(range(16)), SamplingParams()))


def test_max_model_len_stops_a_request():
    kv = KVCacheManager(16, 4)
    sched = Scheduler(kv, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=12)
    r = Request("r", list(range(9)), SamplingParams(max_tokens=100))
    sched.add_request(r)
    while sched.num_unfinished:
        so = sched.schedule()
        sched.update_from_output(so, [5] * so.num_reqs)
    assert r.num_tokens == 12 and r.output_token_ids == [5, 5, 5]
    assert r.finish_reason == "length"


def test_stop_token_ids_and_eos():
    kv = KVCacheManager(16, 4)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32)
    a = Request("a", [1, 2], SamplingParams(max_tokens=10, stop_token_ids=(7,)))
    b = Request("b", [3, 4], SamplingParams(max_tokens=10), eos_token_ids=(7,))
    c = Request("c", [5, 6], SamplingParams(max_tokens=3, ignore_eos=True), eos_token_ids=(7,))
    for r in (a, b, c):
        sched.add_request(r)
    while sched.num_unfinished:
        so = sched.schedule()
        sched.update_from_output(so, [7] * so.num_reqs)
    assert a.output_token_ids == [7] and a.finish_reason == "stop"
    assert b.output_token_ids == [7] and b.finish_reason == "stop"
    assert c.output_token_ids == [7, 7, 7] and c.finish_reason == "length"
