"""The host path reproduces a run recorded before it was vectorised: the same scheduler decisions
in every step and the same tokens, on seeded randomized workloads (the scheduler alone, narrow
and at wide batches sync and async, and the engine on ``llama-tiny`` sync and async), with
preemption, aborts, chunked prefill, prefix hits and stop tokens.
"""

from __future__ import annotations

import json

import pytest
from host_path_trace import (
    ENGINE_SEEDS,
    FIXTURE,
    SCHEDULER_SEEDS,
    WIDE_SEEDS,
    engine_trace,
    scheduler_trace,
    wide_scheduler_trace,
)

RECORDED = json.loads(FIXTURE.read_text())
# the traces whose steps are lines (the wide ones keep each line's checksum)
LINES = {k: v for k, v in RECORDED.items() if not k.startswith("wide-")}


def assert_same_trace(got: dict, want: dict) -> None:
    for i, (g, w) in enumerate(zip(got["steps"], want["steps"], strict=False)):
        assert g == w, f"step {i}: got {g!r}, recorded {w!r}"
    assert len(got["steps"]) == len(want["steps"])
    assert got == want


def test_the_recorded_workloads_cover_what_they_claim():
    """Preemptions, prefix hits, chunked prefills and aborts all occur in the recording."""
    steps = [s.split("|") for v in LINES.values() for s in v["steps"]]
    assert any(s[2] for s in steps), "no preemption"
    assert any(c > 0 for v in LINES.values() for c in v["cached"].values()), "no prefix hit"
    assert any(int(x.split(":")[1]) > 1 for s in steps for x in s[0].split(",") if x)
    aborted = [(k, rid) for k, v in LINES.items() for rid in v["aborted"]]
    assert any(k.startswith("engine-async") for k, _ in aborted), "no abort in an async run"
    running_when_aborted = [
        rid for k, rid in aborted if RECORDED[k]["outputs"][rid] and k.startswith("engine")
    ]
    assert running_when_aborted, "no abort of a request that had begun decoding"


@pytest.fixture(params=["loop below 32", "columns always"])
def columns_from(request, monkeypatch):
    """The steady decode step by its loop for a few requests (the default threshold), or by
    its columns at every batch size: both must decide as recorded."""
    from mrv2_prof.runner.core import steady_decode

    if request.param == "columns always":
        monkeypatch.setattr(steady_decode, "COLUMNS_FROM", 1)
    return steady_decode.COLUMNS_FROM


@pytest.mark.parametrize("seed", SCHEDULER_SEEDS)
def test_scheduler_reproduces_the_recorded_run(seed, columns_from):
    assert_same_trace(scheduler_trace(seed), RECORDED[f"scheduler-{seed}"])


def test_the_wide_workloads_cover_what_they_claim():
    """Wide decode batches, preemptions and stops, in both modes."""
    for mode in ("sync", "async"):
        wide = [RECORDED[f"wide-{mode}-{s}"] for s in WIDE_SEEDS]
        assert sum(t["preemptions"] > 0 for t in wide) >= 3
        assert any(r == "stop" for t in wide for r in t["finish"].values())
        assert any(r == "abort" for t in wide for r in t["finish"].values())
        assert sum(c > 0 for t in wide for c in t["cached"].values()) > 50


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("seed", WIDE_SEEDS)
def test_wide_batches_reproduce_the_recorded_run(seed, mode, columns_from):
    assert_same_trace(wide_scheduler_trace(seed, mode == "async"), RECORDED[f"wide-{mode}-{seed}"])


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("seed", ENGINE_SEEDS)
def test_engine_reproduces_the_recorded_run(seed, mode, columns_from):
    assert_same_trace(engine_trace(seed, mode == "async"), RECORDED[f"engine-{mode}-{seed}"])


def test_is_finished_is_true_for_the_three_finished_statuses_only():
    from mrv2_prof.runner.core.request import RequestStatus as S

    finished = {S.FINISHED_STOPPED, S.FINISHED_LENGTH, S.FINISHED_ABORTED}
    assert {s for s in S if s.is_finished} == finished


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_prompt_tokens_the_scheduler_counts_are_the_engines_count(mode, monkeypatch):
    """Where the steady decode pass counts a step's prompt tokens, the count is the one the
    engine makes from the requests: a token that is not the decode of one new token after
    the prompt (a prefix hit can leave one prompt token to compute)."""
    from mrv2_prof.runner.core.scheduler import Scheduler

    counted = []
    schedule = Scheduler.schedule

    def checked(self, settle_later=False):
        so = schedule(self, settle_later)
        self.settle()  # the requests as the step leaves them
        if so.num_prefill_tokens is not None:
            reqs = self.requests
            want = sum(
                n
                for rid, n in so.num_scheduled_tokens.items()
                if n != 1 or reqs[rid].num_computed_tokens - 1 < reqs[rid].num_prompt_tokens
            )
            assert so.num_prefill_tokens == want
            counted.append(want)
        return so

    monkeypatch.setattr(Scheduler, "schedule", checked)
    engine_trace(0, mode == "async")
    assert len(counted) > 5  # the decode pass counted, and was checked, in several steps
