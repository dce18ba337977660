"""Verdicts from samples (``report/verdict.py``) on distributions whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from mrv2_prof.report.one_run_verdict import clustered_quantiles, one_run_verdict
from mrv2_prof.report.verdict import (
    BETTER,
    INCONCLUSIVE,
    NOISE,
    WORSE,
    median_difference_interval,
    verdict,
)


def normal(mean: float, sd: float, n: int, seed: int) -> list[float]:
    return np.random.default_rng(seed).normal(mean, sd, n).tolist()


def test_a_clear_regression_and_a_clear_improvement():
    base = normal(10.0, 0.2, 40, 1)
    slower = normal(11.0, 0.2, 40, 2)  # +10 % on a latency
    v = verdict(base, slower, lower_is_better=True)
    assert v.verdict == WORSE and 0.08 < v.delta < 0.12 and v.low > 0.02
    assert verdict(base, slower, lower_is_better=False).verdict == BETTER  # a throughput rising
    assert verdict(slower, base, lower_is_better=True).verdict == BETTER


def test_a_difference_inside_the_noise_floor():
    base = normal(100.0, 0.5, 60, 3)
    same = normal(100.3, 0.5, 60, 4)  # +0.3 %, tight
    v = verdict(base, same, lower_is_better=True)
    assert v.verdict == NOISE and abs(v.delta) < 0.01 and v.low >= -0.02 and v.high <= 0.02


def test_too_few_samples_and_wide_intervals_are_inconclusive():
    assert verdict([1.0, 1.1], [2.0, 2.1, 2.2], lower_is_better=True).verdict == INCONCLUSIVE
    noisy = verdict(normal(10, 3, 5, 5), normal(10.5, 3, 5, 6), lower_is_better=True)
    assert noisy.verdict == INCONCLUSIVE and noisy.low < 0.02 < noisy.high
    zero = verdict([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], lower_is_better=True)
    assert zero.verdict == INCONCLUSIVE and "median is 0" in zero.reason
    assert verdict([1.0, None, 2.0, 3.0], [1.0, 2.0, 3.0], lower_is_better=True).n_a == 3


def test_the_interval_against_a_hand_worked_case():
    """Constant samples: every resample has the same medians, so the interval is the point."""
    delta, low, high = median_difference_interval([4.0] * 5, [5.0] * 7)
    assert (
        delta == pytest.approx(0.25) and low == pytest.approx(0.25) and high == pytest.approx(0.25)
    )
    # the relative difference is the medians', not the means'
    delta, _, _ = median_difference_interval([1.0, 2.0, 100.0], [2.0, 3.0, 4.0])
    assert delta == pytest.approx(0.5)


def test_the_verdict_is_reproducible():
    a, b = normal(10, 1, 20, 7), normal(10.4, 1, 20, 8)
    assert verdict(a, b, lower_is_better=True) == verdict(a, b, lower_is_better=True)


def test_one_run_equal_values_are_one_measurement():
    """16 requests served in lockstep: one TTFT each side, whatever the difference."""
    v = one_run_verdict([5.0] * 16, [6.0] * 16, lower_is_better=True)
    assert v.verdict == INCONCLUSIVE and v.low is None
    assert v.reason.startswith("1 run a side: 1 and 1 distinct values in 16 and 16 samples")
    # allowed one distinct value, the interval is [+20%, +20%]: zero width, still inconclusive
    v = one_run_verdict([5.0] * 16, [6.0] * 16, lower_is_better=True, min_distinct=1)
    assert v.verdict == INCONCLUSIVE and v.low == pytest.approx(0.2) == v.high
    assert "has zero width" in v.reason


def test_the_bootstrap_draws_groups_of_equal_values():
    """[10, 10, 10, 20]: two groups. A resample draws two groups: (10, 10) -> six 10s, median 10;
    (10, 20) or (20, 10) -> 10 10 10 20, median 10; (20, 20) -> 20 20, median 20. So a quarter
    of the resampled medians are 20, the rest 10 (a plain bootstrap of the four values gives 20
    only with 3+ of 4 draws on it: 13/256 = 5 %)."""
    medians = clustered_quantiles(np.array([10.0, 10, 10, 20]), 0.5, 4000, np.random.default_rng(0))
    assert set(medians.tolist()) == {10.0, 20.0}
    assert np.mean(medians == 20.0) == pytest.approx(0.25, abs=0.03)
    # the p95 of (10, 20): 10 10 10 20 at position 0.95 * 3 = 2.85 -> 10 + 0.85 * 10 = 18.5
    p95 = clustered_quantiles(np.array([10.0, 10, 10, 20]), 0.95, 4000, np.random.default_rng(0))
    assert set(np.round(p95, 9).tolist()) == {10.0, 18.5, 20.0}


def test_one_run_a_shift_must_exceed_the_runs_spread():
    tight = normal(100.0, 1.0, 200, 11)
    v = one_run_verdict(tight, [x * 1.1 for x in tight], lower_is_better=True)
    assert v.verdict == WORSE and "exceeds the runs' interquartile range" in v.reason
    # +10 ms on samples whose interquartile range is ~27 ms: the interval is past the floor,
    # but one busier run could show as much
    wide = normal(100.0, 20.0, 200, 12)
    v = one_run_verdict(wide, [x + 10 for x in wide], lower_is_better=True)
    assert v.verdict == INCONCLUSIVE and v.low > 0.02
    assert "is within the runs' interquartile range" in v.reason
