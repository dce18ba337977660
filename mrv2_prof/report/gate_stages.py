"""The gate in the migration guide's order: static, output contract, then load.

Equivalence before performance: (a) *static*, no note on the candidate; (b) *output contract*,
the stored tokens and finish reasons of the same seeded workload and the runs' leak counters
(``report.output_contract``); (c) *load*, the metrics against their thresholds
(``report.gate``: one run a side; ``report.gate_groups``: groups of repeats). The gate stops at
the first stage that fails unless ``all_stages``; a stage not run is ``not run``. Exit status:
0 pass, 1 a stage failed (a regression), 3 the load stage is inconclusive and nothing failed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from mrv2_prof.report.comparability import Comparability
from mrv2_prof.report.gate import INCONCLUSIVE, GateResult, Threshold, evaluate, exit_status
from mrv2_prof.report.gate_groups import evaluate_groups
from mrv2_prof.report.gate_metrics import METRICS
from mrv2_prof.report.metric_stats import distribution, metric_stat
from mrv2_prof.report.output_contract import (
    FAIL,
    PASS,
    StageResult,
    contract_stage,
    static_stage,
)
from mrv2_prof.report.run_sides import Side
from mrv2_prof.store import Store

NOT_RUN = "not run"
STAGES = ("static", "output contract", "load")
OUTCOMES = {0: "pass", 1: "regression", 3: "inconclusive"}


@dataclass(frozen=True)
class GateOptions:
    thresholds: dict[str, Threshold]
    explicit: bool  # the user chose the thresholds
    allow_missing: bool = False
    allow_notes: tuple[str, ...] = ()  # a note holding one of these passes the static stage
    allow_all_notes: bool = False
    all_stages: bool = False


@dataclass(frozen=True)
class GateReport:
    baseline: Side
    candidate: Side
    comparability: Comparability
    stages: list[StageResult]
    results: list[GateResult]  # the load stage's, empty when it did not run
    exit_code: int

    @property
    def outcome(self) -> str:
        return OUTCOMES[self.exit_code]


def load_stage(base: Side, cand: Side, options: GateOptions) -> tuple[StageResult, list]:
    if base.single and cand.single:
        results = evaluate(
            options.thresholds,
            base.runs[0],
            cand.runs[0],
            explicit=options.explicit,
            allow_missing=options.allow_missing,
        )
        results = [_with_samples(r, base, cand) for r in results]
        how = (
            "one run a side: thresholds on the two values (repeat the runs for an interval); "
            "latency percentiles also bootstrapped over requests (informational)"
        )
    else:
        results = evaluate_groups(
            options.thresholds,
            base,
            cand,
            explicit=options.explicit,
            allow_missing=options.allow_missing,
        )
        how = "groups: thresholds on the 95% bootstrap interval of the change of the medians"
    code = exit_status(results)
    status = {0: PASS, 1: FAIL, 3: INCONCLUSIVE}[code]
    lines = [how]
    for name in ("peak_kv_usage", "host_cpu_util"):  # shown even when not gated
        if name not in options.thresholds:
            m = METRICS[name]
            a, b = base.value(name), cand.value(name)
            lines.append(
                f"{name}: {m.format(a)} -> {m.format(b)} (not gated; --max-regression "
                f"{name}=5% gates it)"
            )
    return StageResult("load", status, lines), results


def _with_samples(r: GateResult, base: Side, cand: Side) -> GateResult:
    """A one-run result with its metric's per-request bootstrap interval and verdict, when the
    metric is a latency percentile (the point check still decides)."""
    if distribution(r.threshold.metric) is None or not r.delta.measured:
        return r
    s = metric_stat(r.threshold.metric, base, cand)
    if s.stat.low is None:
        return replace(r, test=s.test, sample_verdict=s.stat.verdict)
    return replace(
        r, interval=(s.stat.low, s.stat.high), test=s.test, sample_verdict=s.stat.verdict
    )


def run_gate(
    db_a: Path, db_b: Path, base: Side, cand: Side, comp: Comparability, options: GateOptions
) -> GateReport:
    stages = [
        static_stage(cand.facts, list(options.allow_notes), options.allow_all_notes, base.facts)
    ]
    results: list[GateResult] = []
    if stages[-1].status != FAIL or options.all_stages:
        with Store.open(db_a, read_only=True) as store_a:
            if Path(db_b).resolve() == Path(db_a).resolve():
                stages.append(contract_stage(store_a, base.facts[0], store_a, cand.facts))
            else:
                with Store.open(db_b, read_only=True) as store_b:
                    stages.append(contract_stage(store_a, base.facts[0], store_b, cand.facts))
    if stages[-1].status != FAIL or options.all_stages:
        stage, results = load_stage(base, cand, options)
        stages.append(stage)
    ran = {s.name for s in stages}
    stages += [StageResult(name, NOT_RUN, ["an earlier stage failed"]) for name in STAGES
               if name not in ran]  # fmt: skip
    statuses = [s.status for s in stages]
    code = 1 if FAIL in statuses else 3 if INCONCLUSIVE in statuses else 0
    return GateReport(base, cand, comp, stages, results, code)


def verdict_text(report: GateReport) -> str:
    """The gate's last line: ``gate: PASS (…)``, ``gate: FAIL (static stage)``, …"""
    from mrv2_prof.report.gate import verdict_line

    failed = [s.name for s in report.stages if s.status == FAIL and s.name != "load"]
    if not failed:
        return verdict_line(report.results)
    tail = ""
    if report.results:
        tail = "; load: " + verdict_line(report.results).removeprefix("gate: ")
    return f"gate: FAIL ({', '.join(f'{name} stage' for name in failed)}{tail})"
