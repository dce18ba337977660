"""Per metric, the baseline and candidate values, their change, and a verdict from the samples.

The samples (``report.verdict``'s percentile bootstrap, 95 % interval, ±2 % noise floor):

* **over runs** (a group on either side, ``--repeats``): one value per run of each side; the
  interval is that of the relative difference of the medians;
* **over requests** (one run a side): the latency percentiles are bootstrapped from the run's own
  distributions (TTFT and TPOT per completed request, the inter-token gaps for ITL), the
  statistic being the percentile itself (p50, p95, p99), under ``report.one_run_verdict``'s
  rule (equal values one sample, a non-zero interval, a change beyond the runs' own spread);
* anything else with one run a side has no distribution: ``inconclusive`` (repeat the runs).

``direction`` is the old, sample-free reading (better / worse / same by the sign of the change),
which ``compare`` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrv2_prof.analysis.gate_metrics import LOWER, METRICS
from mrv2_prof.analysis.run_sides import Side
from mrv2_prof.report.compare import metric_delta
from mrv2_prof.report.one_run_verdict import ONE_RUN, one_run_verdict
from mrv2_prof.report.verdict import INCONCLUSIVE, TEST_NAME, Verdict, verdict

RUNS_TEST = f"{TEST_NAME}, over runs"
REQUESTS_TEST = (
    "percentile bootstrap of the relative percentile difference, over one run's requests "
    "(equal values one sample)"
)
NO_TEST = "none: 1 run a side and no per-request distribution (repeat the runs)"
_QUANTILE = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True)
class MetricStat:
    name: str
    a: float | None  # the baseline's value (a group's median)
    b: float | None
    delta: float | None  # b - a
    delta_pct: float | None
    direction: str | None  # better | worse | same, by the sign alone (None: not measured)
    stat: Verdict  # better | worse | within noise | inconclusive, from the samples
    test: str  # the test behind ``stat``

    @property
    def shown(self) -> str:
        """The verdict as a table shows it: an inconclusive one-run verdict says why."""
        v = self.stat.verdict
        one_run = self.test != RUNS_TEST
        return f"{v} ({ONE_RUN})" if v == INCONCLUSIVE and one_run else v


def distribution(name: str) -> tuple[str, float] | None:
    """(sample kind, quantile) for a metric one run's own samples estimate, else None."""
    q, _, kind = name.partition("_")
    if q in _QUANTILE and kind in ("ttft", "tpot", "itl"):
        return kind, _QUANTILE[q]
    return None


def samples_for(name: str, a: Side, b: Side) -> tuple[list[float], list[float], str, float]:
    """The samples, the test's name and the quantile used for ``name`` between two sides."""
    if a.single and b.single and (dist := distribution(name)) is not None:
        kind, q = dist
        return a.samples.get(kind, []), b.samples.get(kind, []), REQUESTS_TEST, q
    if a.single and b.single:
        return [], [], NO_TEST, 0.5
    return a.values(name), b.values(name), RUNS_TEST, 0.5


def metric_stat(name: str, a: Side, b: Side, *, floor: float = 0.02) -> MetricStat:
    d = metric_delta(name, a.value(name), b.value(name))
    xa, xb, test, q = samples_for(name, a, b)
    lower = METRICS[name].direction == LOWER
    if test == NO_TEST:
        v = Verdict(INCONCLUSIVE, None, None, None, len(a.runs), len(b.runs), NO_TEST)
    elif test == REQUESTS_TEST:
        v = one_run_verdict(xa, xb, lower_is_better=lower, floor=floor, q=q)
    else:
        v = verdict(xa, xb, lower_is_better=lower, floor=floor, q=q)
    return MetricStat(name, d.a, d.b, d.delta, d.delta_pct, d.verdict, v, test)


def metric_stats(a: Side, b: Side, *, floor: float = 0.02) -> list[MetricStat]:
    """Every metric of ``METRICS``, in its order."""
    return [metric_stat(name, a, b, floor=floor) for name in METRICS]
