"""The verdict on a latency percentile with one run a side, from each run's own samples (TTFT and
TPOT per completed request, the inter-token gaps).

One run's samples measure the spread *within* that run. Whatever moves a whole run (a busier
host, a clock, a neighbour) moves all its samples together, and no resampling of them can see
it. So, with one run a side, the verdict is **better** or **worse** only when all of these hold:

1. each side has at least ``min_distinct`` (3) distinct values. Equal values are one
   measurement: requests that got their first token (or a token) from the same engine step have
   the same TTFT (or gap) to the nanosecond, and 16 requests served in lockstep are one sample,
   not 16. The bootstrap resamples these groups of equal values, each keeping its count;
2. the percentile bootstrap's interval (95 %, 2000 seeded resamples) of the relative
   difference of the percentile has non-zero width: a zero-width interval means the samples
   cannot move the statistic, not that it is exact;
3. the whole interval lies past the ±2 % noise floor, on the worse (or better) side;
4. the change of the percentile, in ms, is larger than the within-run spread: the larger of the
   two runs' interquartile ranges (p75 - p25 of their samples). A shift smaller than a run's
   own step-to-step variation is what one busier run can show.

**Within noise**: 1 and 2 hold and the whole interval lies inside the floor. Anything else is
**inconclusive**, its reason starting "1 run a side"; repeated runs (``run --repeats 3``) give
the verdict over runs (``report.verdict.verdict``).
"""

from __future__ import annotations

import numpy as np

from mrv2_prof.report.verdict import (
    BETTER,
    INCONCLUSIVE,
    NOISE,
    WORSE,
    Bootstrap,
    Samples,
    Verdict,
    finite,
    worse_positive,
)

ONE_RUN = "1 run a side"
RULE = (
    "1 run a side: better/worse needs 3+ distinct values a side, an interval of non-zero width "
    "wholly past the floor, and a change larger than the runs' interquartile range (repeat the "
    "runs, run --repeats 3, for a verdict over runs)"
)
_CELLS = 2_000_000  # resamples x distinct values held at once


def clustered_quantiles(
    x: np.ndarray, q: float, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """The ``q`` quantile (numpy's linear method) of ``resamples`` bootstrap resamples of ``x``
    that draw its groups of equal values with replacement, each group with its count."""
    values, counts = np.unique(x, return_counts=True)
    k = len(values)
    out = np.empty(resamples)
    chunk = max(1, min(resamples, _CELLS // k))
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        picks = rng.integers(0, k, (n, k)) + (np.arange(n) * k)[:, None]
        drawn = np.bincount(picks.ravel(), minlength=n * k).reshape(n, k)
        cum = np.cumsum(drawn * counts, axis=1)  # the resample, sorted, as cumulative counts
        total = cum[:, -1]
        pos = q * (total - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, total - 1)
        # per row, the first group whose cumulative count passes a position: one search over
        # the rows laid end to end (each row offset past the previous one's total)
        offset = np.arange(n, dtype=np.int64) * (int(total.max()) + 1)
        flat = (cum + offset[:, None]).ravel()
        first = np.arange(n, dtype=np.int64) * k
        at_lo = values[np.searchsorted(flat, lo + offset, side="right") - first]
        at_hi = values[np.searchsorted(flat, hi + offset, side="right") - first]
        out[start : start + n] = at_lo + (pos - lo) * (at_hi - at_lo)
    return out


def _iqr(x: np.ndarray) -> float:
    p25, p75 = np.quantile(x, [0.25, 0.75])
    return float(p75 - p25)


def one_run_verdict(
    a: Samples, b: Samples, *, lower_is_better: bool, min_distinct: int = 3, **settings: float
) -> Verdict:
    """The verdict on the ``q`` quantile of ``b`` (the candidate run's samples) against ``a``'s;
    see the module docstring for the rule. ``settings``: ``verdict.Bootstrap``'s keywords."""
    s = Bootstrap(**settings)
    q, floor, level = s.q, s.floor, s.level
    xa, xb = finite(a), finite(b)
    n_a, n_b = len(xa), len(xb)
    d_a, d_b = len(np.unique(xa)), len(np.unique(xb))
    if d_a < min_distinct or d_b < min_distinct:
        why = (
            f"{ONE_RUN}: {d_a} and {d_b} distinct values in {n_a} and {n_b} samples (equal values "
            f"come from one step: one measurement); {min_distinct} a side are needed"
        )
        return Verdict(INCONCLUSIVE, None, None, None, n_a, n_b, why)
    qa, qb = float(np.quantile(xa, q)), float(np.quantile(xb, q))
    if qa == 0:
        why = f"{ONE_RUN}: the baseline's value is 0: no relative difference"
        return Verdict(INCONCLUSIVE, None, None, None, n_a, n_b, why)
    rng = np.random.default_rng(s.seed)
    ra = clustered_quantiles(xa, q, s.resamples, rng)
    rb = clustered_quantiles(xb, q, s.resamples, rng)
    ok = ra != 0
    diffs = (rb[ok] - ra[ok]) / np.abs(ra[ok])
    tail = (1 - level) / 2
    low, high = (float(v) for v in np.quantile(diffs, [tail, 1 - tail]))
    delta = (qb - qa) / abs(qa)
    pct = f"{100 * level:g}% interval"
    if high - low <= 1e-12 * max(1.0, abs(low)):
        why = f"{ONE_RUN}: the {pct} has zero width (the samples do not move the value)"
        return Verdict(INCONCLUSIVE, delta, low, high, n_a, n_b, why)
    w_low, w_high = worse_positive(low, high, lower_is_better)
    floor_text = f"±{100 * floor:g}% floor"
    if -floor <= w_low and w_high <= floor:
        return Verdict(NOISE, delta, low, high, n_a, n_b, f"the {pct} is inside the {floor_text}")
    if floor >= w_low and w_high >= -floor:
        why = f"{ONE_RUN}: the {pct} straddles the {floor_text}"
        return Verdict(INCONCLUSIVE, delta, low, high, n_a, n_b, why)
    way = "worse" if w_low > floor else "better"
    spread = max(_iqr(xa), _iqr(xb))
    change = f"the change ({abs(qb - qa):.3g} ms)"
    iqr = f"the runs' interquartile range ({spread:.3g} ms)"
    if abs(qb - qa) <= spread:
        why = f"{ONE_RUN}: the {pct} is past the {floor_text}, but {change} is within {iqr}"
        return Verdict(INCONCLUSIVE, delta, low, high, n_a, n_b, why)
    why = f"{ONE_RUN}: the {pct} is past the {floor_text} the {way} way and {change} exceeds {iqr}"
    return Verdict(WORSE if way == "worse" else BETTER, delta, low, high, n_a, n_b, why)
