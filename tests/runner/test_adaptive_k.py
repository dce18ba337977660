"""Dynamic k that never loses (core/adaptive_k.py): the expected tokens per verifying request
from the acceptance per position, hand-worked; the step times per batch-size bucket and k; the
decision (every k measured first, then the k whose tokens beat its cost, else 0 with a probe
step every PROBE_EVERY); and an adaptive engine's greedy tokens equal plain decoding's."""

from __future__ import annotations

import pytest
from test_spec_decode import long_run, ngram

from mrv2_prof.runner.config import SpecDecodeConfig
from mrv2_prof.runner.core.adaptive_k import DECAY, PROBE_EVERY, WARMUP, AdaptiveK, bucket


def test_expected_tokens_from_the_acceptance_per_position():
    a = AdaptiveK(max_k=4)
    # three verifies of 3 slots: accepted 3, 1 and 0 drafts; one of 1 slot, accepted 1
    a.observe_verifies([(3, 3), (3, 1), (3, 0), (1, 1)])
    # position 1: 4 slots, 3 accepted; 2: 3 slots, 1 accepted; 3: 3 slots, 1 accepted
    assert a.expected(0) == 1.0
    assert a.expected(1) == pytest.approx(1 + 3 / 4)
    assert a.expected(3) == pytest.approx(1 + 3 / 4 + 1 / 3 + 1 / 3)
    assert a.expected(4) == a.expected(3)  # nothing seen at position 4 counts nothing
    # a later batch of observations decays the earlier ones by DECAY per observation
    a.observe_verifies([(1, 0)])
    assert a.slots[1] == pytest.approx(4 * DECAY + 1)
    assert a.accepted[1] == pytest.approx(3 * DECAY)


def test_step_times_are_kept_per_batch_size_bucket_and_k():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]
    a = AdaptiveK(max_k=2)
    a.observe_time(5, 2, 50_000)  # a key's first step (first-use costs) is not counted
    assert (8, 2) not in a.times
    for ns in (100, 200, 300):  # the first WARMUP observations: their plain mean
        a.observe_time(5, 2, ns)
    assert a.times[(8, 2)] == (pytest.approx(200.0), 3)
    a.observe_time(7, 2, 400)
    assert a.times[(8, 2)] == (pytest.approx(250.0), 4)
    a.observe_time(6, 2, 1250)  # past WARMUP: an exponential mean
    assert a.times[(8, 2)][0] == pytest.approx(250.0 + (1 - DECAY) * 1000)


def measured(a: AdaptiveK, batch: int, times: dict[int, int]) -> None:
    for k, ns in times.items():
        for _ in range(WARMUP + 1):  # the first is not counted
            a.observe_time(batch, k, ns)


def test_every_k_is_measured_before_a_decision():
    a = AdaptiveK(max_k=4)
    seen = []
    for _ in range(3 * (WARMUP + 1)):
        k = a.choose(8, 4, [2, 4])
        seen.append(k)
        a.observe_time(8, k, 1000)
    assert seen == [2] * (WARMUP + 1) + [4] * (WARMUP + 1) + [0] * (WARMUP + 1)
    assert a.expected_tokens is None  # no decision yet: nothing to record
    assert a.choose(8, 0, [2, 4]) == 0  # the table says no drafts at this size


def test_speculation_on_where_it_pays_off_where_it_does_not():
    a = AdaptiveK(max_k=4)
    measured(a, 8, {0: 1000, 2: 1300, 4: 1600})
    a.observe_verifies([(4, 4)] * 10)  # every draft accepted: 3 tokens at k 2, 5 at k 4
    assert a.choose(8, 4, [2, 4]) == 4  # 5 / 1.6 beats 3 / 1.3
    assert a.expected_tokens == pytest.approx(5.0) and a.cost_ratio == pytest.approx(1.6)
    assert a.choose(8, 2, [2, 4]) == 2  # the table caps k at 2 for this batch
    b = AdaptiveK(max_k=4)
    measured(b, 8, {0: 1000, 2: 1300, 4: 1600})
    b.observe_verifies([(4, 0)] * 10)  # nothing accepted: 1 token at 1.3x the cost
    ks = [b.choose(8, 4, [2, 4]) for _ in range(PROBE_EVERY)]
    assert ks[:-1] == [0] * (PROBE_EVERY - 1)  # off ...
    assert ks[-1] in (2, 4)  # ... but one step in PROBE_EVERY keeps measuring
    assert b.num_off == PROBE_EVERY - 1
    assert b.expected_tokens == pytest.approx(1.0) and b.cost_ratio == pytest.approx(1.3)
    # the break-even: 1 + 0.3 accepted per verify at k 2 against 1.3x the time: not more
    c = AdaptiveK(max_k=2)
    measured(c, 8, {0: 1000, 2: 1300})
    c.observe_verifies([(2, 1)] * 3 + [(2, 0)] * 7)
    assert c.expected(2) == pytest.approx(1.3)
    assert c.choose(8, 2, [2]) == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_adaptive_engine_tokens_equal_plain_decoding(async_scheduling):
    """Whatever k the measurements choose step by step, greedy tokens are plain decoding's,
    and each decision after the warm-up records its inputs."""
    plain = long_run(SpecDecodeConfig(), async_scheduling)[0]
    spec = ngram(4, dynamic_k=((8, 4),))
    assert spec.is_adaptive and not ngram(4, dynamic_k=((8, 4),), adaptive=False).is_adaptive
    tokens, _, sat_out, engine = long_run(spec, async_scheduling)
    assert tokens == plain and sat_out == 0
    assert engine.adaptive is not None and engine.adaptive.times  # step times were measured
