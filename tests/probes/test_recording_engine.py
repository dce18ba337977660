"""The recording probe on a real engine on the CPU: what it records matches the scheduler, the
requests and the tokens, its spans nest within each step, draining mid-run loses nothing, and
recording does not change the tokens."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mrv2_prof.probes.api import Probe
from mrv2_prof.probes.recording import RecordingProbe
from tests.probes.test_api import SITE, col, rows

# ---- an engine on the CPU -----------------------------------------------------------------------
PROMPT_LENS = [3, 40, 9, 70, 1, 17]  # 40, 70 and 17 exceed the token budget: chunked prefill
MAX_TOKENS = 8
BUDGET = 16


def make_engine(probe: Probe | None = None):
    from mrv2_prof.runner.config import ModelSpec, RunnerConfig
    from mrv2_prof.runner.engine import Engine

    config = RunnerConfig(
        device="cpu",
        kernels="torch",
        async_scheduling=False,
        uva=False,
        cudagraph_mode="none",
        max_num_reqs=16,
        max_num_seqs=8,
        max_num_batched_tokens=BUDGET,
        max_model_len=128,
        block_size=4,
        num_kv_blocks=256,
    )
    return Engine(config, ModelSpec(preset="llama-tiny"), probe)


def add_prompts(engine) -> dict:
    from mrv2_prof.runner.core.request import SamplingParams

    rng = random.Random(0)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return {
        f"r{i}": engine.add_request(
            f"r{i}", [rng.randrange(engine.vocab_size) for _ in range(n)], params, 0.5 * i
        )
        for i, n in enumerate(PROMPT_LENS)
    }


def run_engine(probe: Probe | None, drain_every: int = 0):
    """Run to completion plus one empty step. Returns the engine, its requests, the step results,
    (num_waiting, num_running, kv blocks used) after each step, and the drained tables
    concatenated over every drain (``None`` without a RecordingProbe)."""
    engine = make_engine(probe)
    reqs = add_prompts(engine)
    results, states, drains = [], [], []

    def step() -> None:
        results.append(engine.step())
        states.append((engine.num_waiting, engine.num_running, engine.num_kv_blocks_used))
        if drain_every and len(results) % drain_every == 0:
            drains.append(probe.drain())

    while engine.has_unfinished_requests():
        step()
    step()  # empty: hands the last finished ids to the runner
    tables = None
    if isinstance(probe, RecordingProbe):
        drains.append(probe.drain())
        tables = {
            table: {k: np.concatenate([d[table][k] for d in drains]) for k in cols}
            for table, cols in drains[0].items()
        }
    return engine, reqs, results, states, tables


@pytest.fixture(scope="module")
def recorded():
    return run_engine(RecordingProbe())


def spans_of(tables) -> dict[int, dict[str, tuple[int, int]]]:
    """step → {phase name: (start_ns, end_ns)}; each name must occur once per step."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for step, name, start, end in rows(tables, "spans", ["step", "name", "start_ns", "end_ns"]):
        assert name not in out.setdefault(step, {}), (step, name)
        out[step][name] = (start, end)
    return out


def test_engine_steps_match_the_scheduler(recorded):
    _, reqs, results, states, t = recorded
    n = len(results)
    assert results[-1].scheduler_output.is_empty  # the extra step at the end
    assert [r.step for r in results] == col(t, "steps", "step") == list(range(n))
    scheduled = [r.scheduler_output for r in results]
    assert col(t, "steps", "num_tokens") == [so.total_num_scheduled_tokens for so in scheduled]
    assert col(t, "steps", "num_reqs") == [so.num_reqs for so in scheduled]
    assert rows(t, "steps", ["num_waiting", "num_running", "kv_used_blocks"]) == states
    assert col(t, "steps", "num_preempted") == [0] * n
    assert col(t, "steps", "output_wait_ns") == [r.runner_output.output_wait_ns for r in results]
    assert col(t, "steps", "graph_mode") == ["none"] * n

    # prefill vs decode, from our own count of each request's computed tokens
    computed = dict.fromkeys(reqs, 0)
    prompt_done_at: dict[str, int] = {}
    want_prefill, want_decode = [], []
    for step, so in enumerate(scheduled):
        assert all(d.num_computed_tokens == 0 for d in so.scheduled_new_reqs)  # no cache hits
        decode = 0
        for rid, k in so.num_scheduled_tokens.items():
            prompt_len = reqs[rid].num_prompt_tokens
            if k == 1 and computed[rid] >= prompt_len:
                decode += 1
                assert prompt_done_at[rid] < step
            computed[rid] += k
            if computed[rid] >= prompt_len:
                prompt_done_at.setdefault(rid, step)
        want_decode.append(decode)
        want_prefill.append(so.total_num_scheduled_tokens - decode)
    assert col(t, "steps", "num_prefill_tokens") == want_prefill
    assert col(t, "steps", "num_decode_tokens") == want_decode
    assert any(p and d for p, d in zip(want_prefill, want_decode, strict=True))  # mixed steps
    assert max(col(t, "steps", "num_tokens")) == BUDGET  # chunked: the budget was the limit

    # the step span is the steps row, and lies within the engine's own host time
    spans = spans_of(t)
    step_rows = rows(t, "steps", ["cpu_start_ns", "cpu_end_ns"])
    for res, (start, end) in zip(results, step_rows, strict=True):
        assert spans[res.step]["step"] == (start, end)
        assert 0 < end - start <= res.host_ns


def test_engine_tokens_and_requests_match_the_requests(recorded):
    engine, reqs, results, _, t = recorded
    want, seen = [], dict.fromkeys(reqs, 0)
    for res in results:
        for r in res.updated:
            idx = seen[r.request_id]
            seen[r.request_id] += 1
            want.append((res.step, r.request_id, idx, r.output_token_ids[idx]))
    assert rows(t, "tokens", ["req_id", "idx", "token_id"]) == [w[1:] for w in want]
    for rid, r in reqs.items():
        assert [tok for _, q, _, tok in want if q == rid] == r.output_token_ids
        assert len(r.output_token_ids) == MAX_TOKENS
    step_rows = rows(t, "steps", ["cpu_start_ns", "cpu_end_ns"])
    for (step, *_), t_ns in zip(want, col(t, "tokens", "t_ns"), strict=True):
        assert step_rows[step][0] <= t_ns <= step_rows[step][1]

    first, last = {}, {}
    for rid, t_ns in rows(t, "tokens", ["req_id", "t_ns"]):
        first.setdefault(rid, t_ns)
        last[rid] = t_ns
    finished = [r.request_id for res in results for r in res.finished]
    assert col(t, "requests", "req_id") == finished and sorted(finished) == sorted(reqs)
    assert rows(t, "requests") == [
        (
            rid,
            round(reqs[rid].arrival_time * 1e9),
            first[rid],
            last[rid],  # finished when its last token was known
            reqs[rid].num_prompt_tokens,
            MAX_TOKENS,
            0,
            "length",
            0,
        )
        for rid in finished
    ]
    assert engine.probe.unfinished() == []


def test_engine_spans_nest_within_each_step(recorded):
    _, _, results, _, t = recorded
    assert set(col(t, "spans", "track")) == {"cpu"}
    spans = spans_of(t)
    device_work = {"forward", "sample", "output_wait"}
    for res in results:
        s = spans[res.step]
        empty = res.scheduler_output.is_empty
        host_work = {"step", "schedule", "execute", "prepare", "update"}
        want = host_work if empty else host_work | device_work
        assert set(s) == want, res.step
        assert all(start <= end for start, end in s.values())

        def inside(inner: str, outer: str, s=s) -> bool:
            return s[outer][0] <= s[inner][0] and s[inner][1] <= s[outer][1]

        def before(a: str, b: str, s=s) -> bool:
            return s[a][1] <= s[b][0]

        assert all(inside(name, "step") for name in set(s))
        assert before("schedule", "execute") and before("execute", "update")
        queued = {"prepare", "forward", "sample"}
        assert all(inside(name, "execute") for name in set(s) & queued)
        if not empty:
            assert before("prepare", "forward") and before("forward", "sample")
            # the wait for the tokens comes after the step is queued, before they are applied
            assert before("execute", "output_wait") and before("output_wait", "update")


def test_engine_syncs_staged_writes_and_graph_dispatch(recorded):
    _, _, results, _, t = recorded
    non_empty = [r for r in results if not r.scheduler_output.is_empty]
    assert len(non_empty) == len(results) - 1
    assert rows(t, "syncs", ["step", "kind", "site", "blocked_ns"]) == [
        (r.step, "output_wait", SITE, r.runner_output.output_wait_ns) for r in non_empty
    ]
    step_rows = rows(t, "steps", ["cpu_start_ns", "cpu_end_ns"])
    for step, t_ns in rows(t, "syncs", ["step", "t_ns"]):
        assert step_rows[step][0] <= t_ns <= step_rows[step][1]

    assert rows(t, "graph_dispatch") == [
        (r.step, n, n, "none", "none", False, "mode none requested")
        for r in non_empty
        for n in [r.scheduler_output.total_num_scheduled_tokens]
    ]

    want = [
        (r.step, name, ws.rows, ws.elements, ws.staged_bytes, ws.dense_bytes)
        for r in results
        for name, ws in r.runner_output.write_stats.items()
    ]
    assert want and rows(t, "staged_writes") == want
    assert "block_table" in col(t, "staged_writes", "tensor")
    assert all(s <= d for s, d in rows(t, "staged_writes", ["staged_bytes", "dense_bytes"]))
    assert "graph_captures" not in t


def test_draining_mid_run_loses_nothing(recorded):
    """The harness drains about once a second: the drains together equal one drain, apart from
    timestamps (requests arrive before one drain and get tokens or finish after it)."""
    _, _, results, _, once = recorded
    _, _, results2, _, often = run_engine(RecordingProbe(), drain_every=2)
    assert len(results2) == len(results)
    timeless = {
        "steps": ["step", "num_tokens", "num_prefill_tokens", "num_reqs", "kv_used_blocks"],
        "spans": ["step", "name"],
        "tokens": ["req_id", "idx", "token_id"],
        "requests": ["req_id", "arrival_ns", "prompt_tokens", "output_tokens", "finish_reason"],
        "staged_writes": ["step", "tensor", "rows", "staged_bytes"],
        "graph_dispatch": ["step", "num_tokens", "reason"],
        "syncs": ["step", "kind", "site"],
    }
    for table, names in timeless.items():
        assert rows(often, table, names) == rows(once, table, names), table
    first_ns = dict(rows(often, "tokens", ["req_id", "t_ns"])[::-1])  # idx 0 written last
    assert rows(often, "requests", ["req_id", "first_token_ns"]) == [
        (rid, first_ns[rid]) for rid in col(often, "requests", "req_id")
    ]


def test_probes_do_not_change_the_tokens(recorded):
    _, reqs, _, _, _ = recorded
    engine, plain, _, _, _ = run_engine(None)
    assert type(engine.probe) is Probe and engine.runner.probe is engine.probe
    assert {rid: r.output_token_ids for rid, r in plain.items()} == {
        rid: r.output_token_ids for rid, r in reqs.items()
    }


def test_aborted_and_interrupted_requests():
    p = RecordingProbe()
    engine = make_engine(p)
    reqs = add_prompts(engine)
    for _ in range(3):
        engine.step()
    assert sorted(p.unfinished()) == sorted(engine.scheduler.requests)
    waiting = [e[3].request_id for e in engine.scheduler.waiting]
    running = [r.request_id for r in engine.scheduler.running if r.num_output_tokens]
    assert waiting and running
    assert engine.abort_request(waiting[-1]) and engine.abort_request(running[0])
    assert sorted(p.unfinished()) == sorted(engine.scheduler.requests)
    while engine.has_unfinished_requests():
        engine.step()
    t = p.drain()
    assert p.unfinished() == []
    names = ["req_id", "arrival_ns", "first_token_ns", "output_tokens", "finish_reason"]
    got = {row[0]: row[1:] for row in rows(t, "requests", names)}
    assert set(got) == set(reqs)
    never_ran = reqs[waiting[-1]]
    assert got[never_ran.request_id] == (round(never_ran.arrival_time * 1e9), -1, 0, "abort")
    arrival, first_ns, output, reason = got[running[0]]
    assert reason == "abort" and output == reqs[running[0]].num_output_tokens > 0
    tokens = col(t, "tokens", "req_id")
    assert first_ns == col(t, "tokens", "t_ns")[tokens.index(running[0])]
    assert all(tokens.count(rid) == r.num_output_tokens for rid, r in reqs.items())
