"""Verdicts from samples (``report/verdict.py``) on distributions whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

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
