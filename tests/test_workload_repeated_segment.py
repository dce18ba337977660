"""``workload.repeated_segment_len``: repetitive prompts for the n-gram drafter."""

from __future__ import annotations

import pytest

from mrv2_prof.scenario import ScenarioError
from mrv2_prof.scenario.schema import Scenario
from mrv2_prof.workload import build_workload

BASE = {"num_requests": 12, "prompt_len": {"dist": "uniform", "min": 3, "max": 40}}


def build(**workload):
    s = Scenario.from_data({"name": "x", "workload": {**BASE, **workload}}, "s.yaml")
    return build_workload(s.workload, seed=5, vocab_size=32000, max_model_len=4096)


def test_each_prompt_repeats_its_own_segment():
    plain, reps = build(), build(repeated_segment_len=4)
    segments = set()
    for a, b in zip(plain, reps, strict=True):
        p, q = a.prompt_token_ids, b.prompt_token_ids
        assert len(q) == len(p)  # the lengths are the drawn ones
        assert q[:4] == p[:4]  # the segment is the first drawn tokens
        assert all(q[i] == q[i % 4] for i in range(len(q)))  # then repeats cyclically
        segments.add(q[:4])
    assert len(segments) == len(plain)  # each request its own segment
    assert [r.max_tokens for r in reps] == [r.max_tokens for r in plain]


def test_after_a_shared_prefix_only_the_own_tokens_repeat():
    reqs = build(repeated_segment_len=3, shared_prefix={"groups": 2, "len": 5})
    plain = build(shared_prefix={"groups": 2, "len": 5})
    for r, p in zip(reqs, plain, strict=True):
        q = r.prompt_token_ids
        assert q[:5] == p.prompt_token_ids[:5]
        own = q[5:]
        assert all(own[i] == own[i % 3] for i in range(len(own)))


@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_bad_segment_lengths_are_refused_naming_the_field(value):
    with pytest.raises(ScenarioError, match=r"workload\.repeated_segment_len: "):
        build(repeated_segment_len=value)
