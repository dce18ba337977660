"""Padding a uniform decode batch's verifies to one k (CPU, torch path): every request of such a
step is scheduled for 1 + k tokens, its real drafts then ``PAD_DRAFT`` placeholders that are
never accepted, so the step has the shape of a FULL verify graph. Greedy tokens stay those of
plain decoding (k = 1..4, dynamic k, sync and async, chunked prefill, preemption); host and
device ``num_computed_tokens`` agree and nothing leaks after random accept/reject/abort/preempt
sequences; padding never schedules a position at or past ``max_model_len``; and a graph manager
with captured verify graphs (the fake backend) gives every such step a FULL verify replay."""

from __future__ import annotations

import pytest
from test_cudagraph_verify import VerifyBackend
from test_spec_decode import (
    MAX_TOKENS,
    assert_host_state_exact,
    assert_no_leaks,
    make_engine,
    random_traffic,
    repetitive_prompts,
    repetitive_request,
)
from test_spec_decode import ngram as device_ngram

from mrv2_prof.runner.config import DEVICE_DRAFT, PAD_DRAFT, RunnerConfig, SpecDecodeConfig
from mrv2_prof.runner.core.request import SamplingParams
from mrv2_prof.runner.core.scheduler import SchedulerOutput
from mrv2_prof.runner.engine import Engine
from mrv2_prof.runner.worker.cudagraph_manager import CudaGraphManager
from mrv2_prof.runner.worker.cudagraph_plan import plan_graphs


def ngram(k: int, **kw) -> SpecDecodeConfig:
    """Drafts on the host, whose placeholders the scheduler writes (``PAD_DRAFT``); dynamic k
    by its table alone."""
    return device_ngram(k, draft_on="host", adaptive=False, **kw)


def padded_engine(spec: SpecDecodeConfig, **runner) -> tuple[Engine, list[SchedulerOutput]]:
    """A CPU engine that pads as it would with FULL verify graphs of every k (any batch size),
    and the scheduler outputs it queued."""
    engine = make_engine(spec, **runner)
    engine.scheduler.spec.pad_capacity = {k: 1000 for k in range(1, spec.max_k + 1)}
    queued: list[SchedulerOutput] = []
    queue_step = engine.runner.queue_step

    def recording(so: SchedulerOutput):
        queued.append(so)
        return queue_step(so)

    engine.runner.queue_step = recording
    return engine, queued


def run(engine: Engine, max_tokens=MAX_TOKENS, **params) -> dict[str, list[int]]:
    prompts = repetitive_prompts(engine.vocab_size)
    reqs = {}
    for i, (rid, ids) in enumerate(prompts.items()):
        limit = max_tokens(i) if callable(max_tokens) else max_tokens
        reqs[rid] = engine.add_request(rid, ids, SamplingParams(max_tokens=limit, **params), i)
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # hands the last finished ids to the runner
    assert_no_leaks(engine)
    return {rid: r.output_token_ids for rid, r in reqs.items()}


def real(drafts: list[int]) -> int:
    return sum(t != PAD_DRAFT for t in drafts)


def padded_steps(queued: list[SchedulerOutput]) -> list[SchedulerOutput]:
    """The steps that carried placeholders, each checked: every running request of it has the
    shape 1 + k, its placeholders after its real drafts."""
    steps = []
    for so in queued:
        spec = so.scheduled_spec_decode_tokens
        if not any(PAD_DRAFT in d for d in spec.values()):
            continue
        (k,) = {len(d) for d in spec.values()}
        assert {so.num_scheduled_tokens[rid] for rid in spec} == {1 + k}, so.num_scheduled_tokens
        # every running request verifies; only a request admitted after them may not
        new = {d.req_id for d in so.scheduled_new_reqs}
        assert set(spec) | new == set(so.num_scheduled_tokens), so.num_scheduled_tokens
        for d in spec.values():
            assert d[real(d) :] == [PAD_DRAFT] * (k - real(d))  # placeholders come last
        steps.append(so)
    return steps


def assert_padding_happened(engine: Engine, queued: list[SchedulerOutput]) -> None:
    steps = padded_steps(queued)
    assert steps, "no step was padded"
    stats = engine.scheduler.spec.stats
    assert stats.num_padded_slots == sum(
        d.count(PAD_DRAFT) for so in steps for d in so.scheduled_spec_decode_tokens.values()
    )
    # a padded step whose requests drafted different numbers of tokens (the point of padding)
    mixed = [
        so for so in steps if len({real(d) for d in so.scheduled_spec_decode_tokens.values()}) > 1
    ]
    assert mixed, "no padded step mixed real draft counts"
    assert stats.num_accepted_tokens > 0
    # the counters count real drafts only: a placeholder is never a draft
    assert stats.num_draft_tokens == sum(
        real(d) for so in queued for d in so.scheduled_spec_decode_tokens.values()
    )


@pytest.fixture(scope="module")
def plain_tokens() -> dict[str, list[int]]:
    return run(make_engine(SpecDecodeConfig()))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_padded_greedy_tokens_equal_plain_decoding(plain_tokens, k, async_scheduling):
    engine, queued = padded_engine(
        ngram(k), async_scheduling=async_scheduling, max_num_reqs=16 if async_scheduling else 8
    )
    assert run(engine) == plain_tokens
    assert_padding_happened(engine, queued)
    assert engine.close() == []  # nothing fell back


def test_padded_greedy_tokens_equal_under_dynamic_k(plain_tokens):
    spec = ngram(4, dynamic_k=((2, 4), (4, 2)))  # 4 running: k = 2; 1-2 running: k = 4
    engine, queued = padded_engine(spec, enable_prefix_caching=True)
    assert run(engine) == plain_tokens
    assert_padding_happened(engine, queued)
    ks = {len(d) for so in padded_steps(queued) for d in so.scheduled_spec_decode_tokens.values()}
    assert ks == {2, 4}  # both of the k's dynamic_k chooses were padded to


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_padded_greedy_tokens_equal_with_chunked_prefill_and_preemption(
    plain_tokens, async_scheduling
):
    """A budget of 7 tokens chunks every prompt; 32 blocks of 4 force preemptions. Four decodes
    of 1 + 3 do not fit the budget: such steps fall back (not padded), or pad to a smaller k."""
    spec = ngram(3, dynamic_k=((1, 3), (3, 2), (8, 1)))
    engine, queued = padded_engine(
        spec, async_scheduling=async_scheduling, max_num_batched_tokens=7, num_kv_blocks=32
    )
    assert run(engine) == plain_tokens
    assert engine.scheduler.num_preemptions > 0
    assert padded_steps(queued)
    assert engine.scheduler.spec.stats.num_padded_slots > 0
    for so in queued:  # never more than the budget
        assert so.total_num_scheduled_tokens <= 7


def test_padding_never_reaches_past_max_model_len(plain_tokens):
    """Requests that end at ``max_model_len``: a step where some request has fewer than k
    positions left is not padded to k (a smaller k that fits, or none), and no scheduled
    position reaches ``max_model_len``; the tokens stay plain decoding's."""
    max_len = 60  # prompts of 17-26 tokens, max_tokens 100: every request stops at the length
    plain = run(make_engine(SpecDecodeConfig(), max_model_len=max_len), max_tokens=100)
    engine, queued = padded_engine(ngram(4, dynamic_k=((2, 4), (8, 2))), max_model_len=max_len)
    computed = {}

    def check(so: SchedulerOutput) -> None:
        for d in so.scheduled_new_reqs:
            computed[d.req_id] = d.num_computed_tokens
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for rid, n in so.num_scheduled_tokens.items():
            assert computed[rid] + n <= max_len, (rid, computed[rid], n)

    queue_step = engine.runner.queue_step
    engine.runner.queue_step = lambda so: (check(so), queue_step(so))[1]
    assert run(engine, max_tokens=100) == plain
    assert all(
        len(t) + len(p) == max_len
        for t, p in zip(plain.values(), repetitive_prompts(engine.vocab_size).values(), strict=True)
    )
    assert padded_steps(queued)
    stats = engine.scheduler.spec.stats
    assert stats.unpadded or stats.capped  # some step could not pad to its k
    assert any("max_model_len" in why for why in [*stats.unpadded, *stats.capped])
    (note,) = engine.close()
    assert note.startswith("runner.spec_decode: uniform decode steps: ") and "max_model_len" in note


def test_padding_past_max_tokens_emits_nothing_extra(plain_tokens):
    """Requests with fewer than 1 + k tokens left get fewer real drafts (or none) and
    placeholders up to k, past their ``max_tokens``; they stop exactly at it."""
    engine, queued = padded_engine(ngram(4))
    limits = [13, 17, 20, 9]
    out = run(engine, max_tokens=lambda i: limits[i])
    assert out == {rid: t[: limits[i]] for i, (rid, t) in enumerate(plain_tokens.items())}
    steps = padded_steps(queued)
    assert steps
    limit = dict(zip(plain_tokens, limits, strict=True))
    prompt_len = {
        rid: len(p)
        for rid, p in zip(plain_tokens, repetitive_prompts(engine.vocab_size).values(), strict=True)
    }
    past = 0  # padded slots whose position lies past the request's last allowed token
    for so in steps:
        cached = so.scheduled_cached_reqs
        for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            left = limit[rid] - (c + 1 - prompt_len[rid])  # tokens it may still emit
            past += max(0, so.num_scheduled_tokens[rid] - left)
    assert past > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_random_accept_reject_abort_preempt_with_padding_leave_exact_state(async_scheduling):
    """As the unpadded test: random prompts (some repetitive), random aborts, a tight KV cache
    and budget; after each step every running request's host ``num_computed_tokens`` is its
    length less one and equals the device's (sync); at the end no block or slot is held."""
    engine, queued = padded_engine(
        ngram(3, dynamic_k=((3, 3), (6, 2), (16, 1))),
        num_kv_blocks=20,
        max_model_len=64,
        max_num_batched_tokens=24,
        async_scheduling=async_scheduling,
        max_num_reqs=32,
    )
    # async: tokens in flight, the host is one step behind by design
    check = (lambda engine: None) if async_scheduling else assert_host_state_exact
    random_traffic(engine, 11, 150, 24, repetitive_request, check)
    assert engine.scheduler.num_preemptions > 0
    assert padded_steps(queued)
    assert engine.scheduler.spec.stats.num_padded_slots > 0
    assert_no_leaks(engine)
    assert engine.held_resources() == {"request_slots": 0, "slots_to_release": 0, "kv_blocks": 0}


@pytest.mark.parametrize("draft_on", ["host", "device"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_padded_uniform_decode_steps_dispatch_full_verify_graphs(
    plain_tokens, async_scheduling, draft_on
):
    """A graph manager planned for CUDA with the Triton kernels and captured with the fake
    backend decides each step of a CPU run beside the real (eager) one: every step of a
    uniform decode batch gets a FULL graph, a verify its FULL verify graph of the step's k
    (padded or not), and the reasons name k and the padded slots. With drafts on the device
    every verifying request of a uniform decode step has k ``DEVICE_DRAFT`` slots."""
    spec = device_ngram(4, dynamic_k=((2, 4), (4, 2)), draft_on=draft_on, adaptive=False)
    engine, queued = padded_engine(
        spec, async_scheduling=async_scheduling, max_num_reqs=16 if async_scheduling else 8
    )
    config = RunnerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=256,
        cudagraph_mode="full_and_piecewise",
        spec_decode=spec,
    )
    fake = CudaGraphManager(plan_graphs(config, "triton", is_cuda=True))
    fake.capture(VerifyBackend())
    assert fake.verify_capacity() == {2: 8, 4: 8}
    engine.scheduler.spec.pad_capacity = fake.verify_capacity()  # as the engine sets it on CUDA
    decisions = []
    dispatch = engine.runner.graphs.dispatch

    def both(batch, needs_hidden=False, verify=False, padded=0):
        so = queued[-1]
        decisions.append((so, fake.dispatch(batch, needs_hidden, verify, padded), padded))
        return dispatch(batch, needs_hidden, verify, padded)

    engine.runner.graphs.dispatch = both
    assert run(engine) == plain_tokens
    uniform_verifies = padded = 0
    for so, d, num_padded in decisions:
        spec_tokens = so.scheduled_spec_decode_tokens
        decode_batch = not so.scheduled_new_reqs and all(
            n == 1 + len(spec_tokens.get(rid, ())) for rid, n in so.num_scheduled_tokens.items()
        )
        if not decode_batch:  # a prefill or a mixed batch: no FULL graph, a reason naming k
            assert d.query_len == 1 and (not spec_tokens or "k" in d.reason), d.reason
            continue
        if not spec_tokens:
            assert (d.mode, d.query_len) == ("full", 1), d.reason
            continue
        ks = {len(t) for t in spec_tokens.values()}
        assert len(ks) == 1 and set(spec_tokens) == set(so.num_scheduled_tokens)  # one shape
        (k,) = ks
        assert (d.mode, d.query_len) == ("full", 1 + k), d.reason
        assert d.reason.startswith(f"uniform verify k={k}, ")
        assert num_padded == sum(t.count(PAD_DRAFT) for t in spec_tokens.values())
        if draft_on == "device":  # the host lays out k slots; the device knows the drafts
            assert all(t == [DEVICE_DRAFT] * k for t in spec_tokens.values())
        if num_padded:
            slots = k * so.num_reqs
            assert d.reason.endswith(f", {num_padded} of {slots} draft slots padded"), d.reason
            padded += 1
        uniform_verifies += 1
    assert uniform_verifies > 0 and (padded > 0 or draft_on == "device")
    assert engine.close() == []  # no uniform decode step fell back
