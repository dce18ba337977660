"""The load stage's thresholds with one run a side: the two values, then the evidence.

The point check (``report.gate.evaluate``) compares the two runs' values. A value within its limit
passes. A value past it is a regression only when one run a side can tell it from run-to-run
noise:

* a metric that counts events (errors, aborts, preemptions, syncs, KV blocks, drafts: not
  ``Metric.timed``) FAILs on the two values: a new error is no noise;
* a latency percentile is *inconclusive*, with its per-request verdict and interval
  (``report.one_run_verdict``) as the evidence: even an interval wholly past the limit is over
  one run's requests, and two identical runs on a busy 2-core host differ that much (a second
  quickstart's p50 ITL +41 %, interval [+36.8 %, +45.7 %]), so only repeated runs FAIL it;
* any other timed metric (throughput, start-up, capture, memory, overlap, …) has one value a run
  and no spread to judge it by: *inconclusive*.

An inconclusive metric makes the gate exit 3 when nothing failed: repeat the runs
(``run --repeats 3``) for the interval over runs (``report.gate_groups``).
"""

from __future__ import annotations

from dataclasses import replace

from mrv2_prof.analysis.gate_metrics import LOWER, METRICS
from mrv2_prof.analysis.run_sides import Side
from mrv2_prof.report.gate import FAIL, INCONCLUSIVE, GateResult
from mrv2_prof.report.metric_stats import distribution, metric_stat
from mrv2_prof.report.one_run_verdict import ONE_RUN
from mrv2_prof.report.verdict import WORSE

REPEAT = "repeat the runs (run --repeats 3) to decide"
_PREFIX = f"{ONE_RUN}: "
_EPS = 1e-9


def _unsure(r: GateResult, why: str) -> GateResult:
    """``r`` (a point check's FAIL) made inconclusive: ``why`` the one run cannot decide."""
    body = r.message.removeprefix(f"{FAIL} ")
    message = f"{INCONCLUSIVE} {body} but {_PREFIX}{why.removeprefix(_PREFIX)}; {REPEAT}"
    return replace(r, status=INCONCLUSIVE, message=message)


def _past_limit(r: GateResult, low: float, high: float) -> bool:
    """The whole relative interval ``[low, high]`` lies past ``r``'s limit, the worse way."""
    t, d = r.threshold, r.delta
    sign = 1 if METRICS[t.metric].direction == LOWER else -1
    worst_low = min(sign * low, sign * high)  # the interval's least worsening
    if not t.relative:
        assert d.a is not None
        worst_low *= abs(d.a)  # in the metric's unit
    return worst_low > t.limit + _EPS * max(1.0, t.limit)


def judge_one_run(r: GateResult, base: Side, cand: Side) -> GateResult:
    """``r`` (the point check's result) with the per-request samples' interval and verdict, and
    a crossing the evidence does not carry made inconclusive (see the module docstring)."""
    name = r.threshold.metric
    s = None
    if distribution(name) is not None and r.delta.measured:
        s = metric_stat(name, base, cand)
        interval = None if s.stat.low is None else (s.stat.low, s.stat.high)
        r = replace(r, interval=interval, test=s.test, sample_verdict=s.stat.verdict)
    if r.status != FAIL or not r.delta.measured or not METRICS[name].timed:
        return r
    if s is None:
        return _unsure(r, "one value a run, no spread to tell it from noise")
    v = s.stat
    if v.verdict != WORSE:
        return _unsure(r, f"requests' samples: {v.reason.removeprefix(_PREFIX)}")
    assert v.low is not None and v.high is not None
    if not _past_limit(r, v.low, v.high):
        bounds = f"[{100 * v.low:+.1f}%, {100 * v.high:+.1f}%]"
        return _unsure(r, f"the requests' 95% interval {bounds} reaches the limit")
    bounds = f"[{100 * v.low:+.1f}%, {100 * v.high:+.1f}%]"
    # the interval is over one run's requests: it cannot tell a slower run from a slower host
    # (two identical runs on a busy 2-core host differ this much), so only repeats decide
    return _unsure(r, f"the requests' 95% interval {bounds} is wholly past the limit, but one "
                      "run cannot tell a slower run from a busier host")  # fmt: skip
