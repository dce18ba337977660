"""The load stage's thresholds over groups of repeats: the interval decides, not two numbers.

With a group on either side (``--repeats``), each threshold is judged on the percentile
bootstrap interval (95 %) of the change of the per-run medians (``report.verdict``), in the
threshold's terms: relative to the baseline for ``5%``, in the metric's unit for ``+10``. Signed
the worse way, an interval wholly within the limit passes, one wholly past it FAILs (a
regression), one that straddles it is *inconclusive*, and so is a side with fewer than
``MIN_RUNS`` runs. A relative limit on a baseline median of 0 is judged as ``+0``. With one run
a side the gate keeps its point check (``report.gate.evaluate``, then ``report.gate_one_run``).
"""

from __future__ import annotations

from collections.abc import Collection

from mrv2_prof.analysis.gate_metrics import LOWER, METRICS
from mrv2_prof.analysis.run_sides import Side
from mrv2_prof.report.compare import format_pct, metric_delta
from mrv2_prof.report.gate import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    GateResult,
    Threshold,
    asked,
    missing_result,
)
from mrv2_prof.report.metric_stats import RUNS_TEST
from mrv2_prof.report.verdict import median_difference_interval

MIN_RUNS = 3
_EPS = 1e-9


def _interval_text(name: str, low: float, high: float, relative: bool) -> str:
    if relative:
        return f"[{100 * low:+.1f}%, {100 * high:+.1f}%]"
    m = METRICS[name]
    return f"[{m.format_delta(low)}, {m.format_delta(high)}]"


def judge(t: Threshold, base: Side, cand: Side, *, explicit: bool, allow: bool) -> GateResult:
    name, m = t.metric, METRICS[t.metric]
    xa, xb = base.values(name), cand.values(name)
    d = metric_delta(name, base.value(name), cand.value(name))
    if not d.measured:
        return missing_result(t, d, base.as_run(), cand.as_run(), explicit, allow)
    runs = f"{len(xa)} vs {len(xb)} runs"
    if len(xa) < MIN_RUNS or len(xb) < MIN_RUNS:
        line = (
            f"{INCONCLUSIVE} {name}: {m.format(d.a)} -> {m.format(d.b)} ({runs}; at least "
            f"{MIN_RUNS} a side are needed)"
        )
        return GateResult(t, d, INCONCLUSIVE, line, None, RUNS_TEST)
    relative = t.relative and d.a != 0
    limit = t.limit if relative or not t.relative else 0.0
    _, low, high = median_difference_interval(xa, xb, relative=relative)
    sign = 1 if m.direction == LOWER else -1
    w_low, w_high = sorted((sign * low, sign * high))
    tol = _EPS * max(1.0, limit)
    if w_high <= limit + tol:
        status, cmp = PASS, "within"
    elif w_low > limit + tol:
        status, cmp = FAIL, "wholly past"
    else:
        status, cmp = INCONCLUSIVE, "straddles"
    change = format_pct(d.delta_pct, d.delta) if relative else m.format_delta(d.delta or 0)
    limit_text = t.describe() if relative or not t.relative else m.format_delta(0.0)
    line = (
        f"{status} {name}: {m.format(d.a)} -> {m.format(d.b)} (median of {runs}: {change}, "
        f"95% interval {_interval_text(name, low, high, relative)} {cmp} {limit_text})"
    )
    return GateResult(t, d, status, line, (low, high), RUNS_TEST, relative)


def evaluate_groups(
    thresholds: dict[str, Threshold],
    base: Side,
    cand: Side,
    *,
    explicit: bool | Collection[str],
    allow_missing: bool = False,
) -> list[GateResult]:
    """One result per threshold, in ``METRICS`` order; ``explicit`` as ``report.gate.evaluate``."""
    return [
        judge(thresholds[name], base, cand, explicit=asked(explicit, name), allow=allow_missing)
        for name in METRICS
        if name in thresholds
    ]
