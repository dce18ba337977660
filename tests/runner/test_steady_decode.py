"""The steady decode step's columns against the requests they mirror, and the columnar update.

``tests/runner/test_host_path_trace.py`` holds the decisions against a recorded run; here, after
every ``schedule`` and every ``update_from_output`` of the wide randomized workloads, each
column the steady decode step keeps must equal what it mirrors in the requests and the KV
cache, the token rows the probe gets must be the requests' last tokens, and the columnar
update must be taken.
"""

from __future__ import annotations

import pytest
from host_path_trace import wide_scheduler_trace

from mrv2_prof.runner.core import steady_decode
from mrv2_prof.runner.core.scheduler import Scheduler


def _check_columns(sched: Scheduler) -> None:
    cols = sched._steady._cols
    if cols is None:
        return
    assert cols.reqs == sched.running
    kv = sched.kv
    for i, r in enumerate(cols.reqs):
        rid = r.request_id
        assert cols.ids[i] == rid
        assert cols.computed[i] == r.num_computed_tokens, rid
        assert cols.num_tokens[i] == len(r.all_token_ids), rid
        assert cols.pending[i] == r.num_output_placeholders, rid
        assert cols.capacity[i] == len(kv.req_to_blocks[rid]) * kv.block_size, rid
        assert cols.hashed[i] == len(kv.req_to_block_hashes.get(rid, ())), rid
        if kv.enable_caching:
            assert cols.next_full[i] == (cols.hashed[i] + 1) * kv.block_size, rid
        assert cols.limit[i] == min(
            len(r.prompt_token_ids) + r.sampling_params.max_tokens, sched.max_model_len
        )
    assert cols.below_prompt == sum(
        r.num_computed_tokens < len(r.prompt_token_ids) for r in cols.reqs
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("seed", [0, 3, 5, 7])
def test_the_columns_follow_the_requests_through_every_step(seed, mode, monkeypatch):
    monkeypatch.setattr(steady_decode, "COLUMNS_FROM", 1)
    counts = {"schedule": 0, "columnar update": 0, "update": 0, "no first token": 0}
    schedule, update = Scheduler.schedule, Scheduler.update_from_output
    columnar = steady_decode.SteadyDecode.update

    def checked_schedule(self, settle_later=False):
        out = schedule(self, settle_later)
        self.settle()  # the engine's settle once the step is queued (the trace defers it)
        counts["schedule"] += 1
        _check_columns(self)
        return out

    def checked_update(self, *args, **kwargs):
        updated = update(self, *args, **kwargs)
        counts["update"] += 1
        _check_columns(self)
        ids, indices, tokens, first = self.token_rows(updated)  # what the probe records
        assert list(ids) == [r.request_id for r in updated]
        assert list(indices) == [len(r.output_token_ids) - 1 for r in updated]
        assert first or 0 not in list(indices)  # "no first token" is never wrong
        counts["no first token"] += not first
        assert list(tokens) == [r.output_token_ids[-1] for r in updated]
        return updated

    def counted(self, *args, **kwargs):
        counts["columnar update"] += 1
        return columnar(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "schedule", checked_schedule)
    monkeypatch.setattr(Scheduler, "update_from_output", checked_update)
    monkeypatch.setattr(steady_decode.SteadyDecode, "update", counted)
    wide_scheduler_trace(seed, mode == "async")
    assert counts["update"] > 40
    assert counts["no first token"] > 0  # the columnar steps spare the probe its scan
    assert counts["columnar update"] >= 10  # steady steps took the columnar update


def test_a_few_requests_take_the_loop_and_many_the_columns():
    """The threshold: below ``COLUMNS_FROM`` running requests no columns are kept."""
    from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
    from mrv2_prof.runner.core.request import Request, SamplingParams

    for n, has_columns in ((steady_decode.COLUMNS_FROM - 1, False), (40, True)):
        sched = Scheduler(KVCacheManager(512, 4), 64, 4096, 256)
        for i in range(n):
            sched.add_request(Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=50)))
        so = sched.schedule()  # the prompts: the general loop
        sched.update_from_output(so, [7] * so.num_reqs)
        so = sched.schedule()  # one token each
        assert so.num_scheduled_tokens == dict.fromkeys((f"r{i}" for i in range(n)), 1)
        assert (sched._steady._cols is not None) is has_columns
        assert list(so.scheduled_cached_reqs.num_computed_tokens) == [3] * n
        updated = sched.update_from_output(so, list(range(n)))
        assert [r.output_token_ids for r in updated] == [[7, i] for i in range(n)]
        assert all(r.num_computed_tokens == 4 for r in updated)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_deferred_write_back_waits_for_settle_and_nothing_reads_past_it(async_scheduling):
    """``schedule(settle_later=True)`` on the columns leaves the requests' counters as they were
    until ``settle`` (the engine settles once the step is queued); the next update settles
    first, so the tokens land on the counters the step set."""
    from mrv2_prof.runner.core.kv_cache_manager import KVCacheManager
    from mrv2_prof.runner.core.request import Request, SamplingParams

    sched = Scheduler(KVCacheManager(512, 4), 64, 4096, 256, async_scheduling=async_scheduling)
    reqs = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=50)) for i in range(40)]
    for r in reqs:
        sched.add_request(r)
    so = sched.schedule()  # the prompts: the general loop
    sched.update_from_output(so, [7] * 40)
    placeholders = [r.num_output_placeholders for r in reqs]
    so = sched.schedule(settle_later=True)  # one token each, on the columns
    assert sched._steady._cols is not None
    assert [r.num_computed_tokens for r in reqs] == [3] * 40  # not yet written back
    assert [r.num_output_placeholders for r in reqs] == placeholders
    sched.settle()
    assert [r.num_computed_tokens for r in reqs] == [4] * 40
    assert [r.num_output_placeholders for r in reqs] == [p + async_scheduling for p in placeholders]
    if async_scheduling:  # the engine's order: the next step scheduled, then this one's tokens
        after = sched.schedule(settle_later=True)
        assert after.num_scheduled_tokens == dict.fromkeys((r.request_id for r in reqs), 1)
    updated = sched.update_from_output(so, list(range(40)))  # settles before it reads
    assert [r.num_computed_tokens for r in updated] == [4 + async_scheduling] * 40
    assert [r.output_token_ids for r in updated] == [[7, i] for i in range(40)]
