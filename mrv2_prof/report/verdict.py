"""A verdict per metric from samples of a baseline and a candidate: better, worse, within noise or
inconclusive.

The difference is the candidate's median against the baseline's, relative to the baseline
(``(median_b - median_a) / |median_a|``). Its uncertainty is a percentile bootstrap: both sample
sets are resampled with replacement ``resamples`` times (a seeded generator, so a verdict is
reproducible) and the interval holds the central ``level`` of the resampled differences. The
samples are whatever the comparison has: one value per run of a group of repeats, or the
per-request / per-step values of a single run (ITL gaps, TPOT per request).

With ``floor`` the noise floor (2 % by default: differences this small are not called):

* **within noise**: the whole interval lies inside ``[-floor, +floor]``;
* **worse** / **better**: the whole interval lies beyond the floor on the worse / better side
  (the metric's direction: up is worse for latencies, down for throughput);
* **inconclusive**: anything else (the interval straddles the floor), and any side with fewer
  than ``min_samples`` samples, or a baseline median of 0 (no relative difference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BETTER, WORSE, NOISE, INCONCLUSIVE = "better", "worse", "within noise", "inconclusive"
TEST_NAME = "percentile bootstrap of the relative median difference"
Samples = Sequence[float]  # one side's samples; None and non-finite values are dropped


@dataclass(frozen=True)
class Bootstrap:
    """The keywords ``verdict`` and ``one_run_verdict`` both take beside the metric's direction
    and the least samples a side: the quantile compared (0.5: the median), the noise floor, the
    interval's level, the bootstrap's resamples and its generator's seed. A keyword that is none
    of these is a ``TypeError``."""

    q: float = 0.5
    floor: float = 0.02
    level: float = 0.95
    resamples: int = 2000
    seed: int = 0


def finite(samples: Samples) -> np.ndarray:
    """The samples that are finite numbers (None, NaN and infinities dropped), as float64."""
    return np.asarray([x for x in samples if x is not None and np.isfinite(x)], dtype=np.float64)


def worse_positive(low: float, high: float, lower_is_better: bool) -> tuple[float, float]:
    """The interval ``[low, high]`` of a difference in "worse is positive" terms (the metric's
    direction: up is worse for latencies, down for throughput), sorted."""
    worse_sign = 1 if lower_is_better else -1  # the sign of a worsening difference
    w_low, w_high = sorted((worse_sign * low, worse_sign * high))
    return w_low, w_high


@dataclass(frozen=True)
class Verdict:
    verdict: str
    delta: float | None  # relative median difference, candidate vs baseline
    low: float | None  # the interval
    high: float | None
    n_a: int
    n_b: int
    reason: str  # one line: how the verdict follows from the numbers

    def describe(self) -> str:
        if self.delta is None:
            return f"{self.verdict}: {self.reason}"
        return (
            f"{self.verdict}: {100 * self.delta:+.1f}% "
            f"[{100 * self.low:+.1f}%, {100 * self.high:+.1f}%] ({self.reason})"
        )


def median_difference_interval(
    a: Sequence[float],
    b: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    q: float = 0.5,
    relative: bool = True,
) -> tuple[float, float, float]:
    """(relative median difference, interval low, interval high) of ``b`` against ``a``.

    ``q`` picks another quantile than the median (0.99: the p99 of per-request samples);
    ``relative=False`` gives the difference in the samples' unit instead of a fraction."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    base = float(np.quantile(xa, q))
    if relative and (base == 0 or not np.isfinite(base)):
        raise ValueError("the baseline median is 0 or not finite: no relative difference")
    rng = np.random.default_rng(seed)
    med_a = np.quantile(xa[rng.integers(0, len(xa), (resamples, len(xa)))], q, axis=1)
    med_b = np.quantile(xb[rng.integers(0, len(xb), (resamples, len(xb)))], q, axis=1)
    if relative:
        ok = med_a != 0
        diffs = (med_b[ok] - med_a[ok]) / np.abs(med_a[ok])
    else:
        diffs = med_b - med_a
    tail = (1 - level) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    point = float(np.quantile(xb, q)) - base
    return (point / abs(base) if relative else point), float(low), float(high)


def verdict(
    a: Samples, b: Samples, *, lower_is_better: bool, min_samples: int = 3, **settings: float
) -> Verdict:
    """The verdict on ``b`` (candidate) against ``a`` (baseline); see the module docstring.
    ``settings``: ``Bootstrap``'s keywords."""
    s = Bootstrap(**settings)
    floor = s.floor
    xa, xb = finite(a), finite(b)
    if len(xa) < min_samples or len(xb) < min_samples:
        reason = f"{len(xa)} and {len(xb)} samples; at least {min_samples} a side are needed"
        return Verdict(INCONCLUSIVE, None, None, None, len(xa), len(xb), reason)
    try:
        delta, low, high = median_difference_interval(
            xa, xb, level=s.level, resamples=s.resamples, seed=s.seed, q=s.q
        )
    except ValueError as exc:
        return Verdict(INCONCLUSIVE, None, None, None, len(xa), len(xb), str(exc))
    w_low, w_high = worse_positive(low, high, lower_is_better)
    pct = f"{100 * s.level:g}% interval"
    if -floor <= w_low and w_high <= floor:
        v, why = NOISE, f"the {pct} is inside the ±{100 * floor:g}% noise floor"
    elif w_low > floor:
        v, why = WORSE, f"the whole {pct} is past the {100 * floor:g}% floor, the worse way"
    elif w_high < -floor:
        v, why = BETTER, f"the whole {pct} is past the {100 * floor:g}% floor, the better way"
    else:
        v, why = INCONCLUSIVE, f"the {pct} straddles the ±{100 * floor:g}% noise floor"
    return Verdict(v, delta, low, high, len(xa), len(xb), why)
