"""``compare`` and ``gate`` as JSON: stable keys and a version (``SCHEMA_VERSION``).

The documents' schemas are held in ``docs/schemas/compare.schema.json`` and
``docs/schemas/gate.schema.json`` (JSON Schema, validated by the tests); keys may be added in a
later version, never renamed or repurposed.
"""

from __future__ import annotations

from typing import Any

from mrv2_prof.analysis.gate_metrics import METRICS
from mrv2_prof.analysis.run_sides import Side
from mrv2_prof.report.comparability import Comparability
from mrv2_prof.report.gate import GateResult
from mrv2_prof.report.gate_stages import GateReport
from mrv2_prof.report.metric_stats import MetricStat

SCHEMA_VERSION = 1


def side_json(side: Side) -> dict[str, Any]:
    run = side.as_run()
    return {
        "ref": side.ref,
        "run_id": run.run_id,
        "label": run.label,
        "status": run.status,
        "db": side.db,
        "group": side.group,
        "runs": side.run_ids,
    }


def comparability_json(comp: Comparability) -> dict[str, Any]:
    return {
        "comparable": not comp.blocking,
        "differences": [
            {
                "what": d.what,
                "key": d.key,
                "baseline": d.baseline if _plain(d.baseline) else repr(d.baseline),
                "candidate": d.candidate if _plain(d.candidate) else repr(d.candidate),
                "blocking": d.blocking,
                "run_id": d.run_id,
                "text": d.describe(),
            }
            for d in comp.differences
        ],
        "unchecked": list(comp.unchecked),
    }


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def stat_json(s: MetricStat) -> dict[str, Any]:
    v = s.stat
    return {
        "verdict": v.verdict,
        "delta": v.delta,
        "low": v.low,
        "high": v.high,
        "n_a": v.n_a,
        "n_b": v.n_b,
        "test": s.test,
        "reason": v.reason,
    }


def compare_document(
    a: Side, b: Side, stats: list[MetricStat], comp: Comparability, warnings: list[str]
) -> dict[str, Any]:
    return {
        "schema": "mrv2-prof.compare",
        "version": SCHEMA_VERSION,
        "a": side_json(a),
        "b": side_json(b),
        "metrics": [
            {
                "metric": s.name,
                "unit": METRICS[s.name].unit,
                "direction": METRICS[s.name].direction,
                "a": s.a,
                "b": s.b,
                "delta": s.delta,
                "delta_pct": s.delta_pct,
                "verdict": s.direction,
                "stat": stat_json(s),
            }
            for s in stats
        ],
        "comparability": comparability_json(comp),
        "warnings": warnings,
    }


def result_json(r: GateResult) -> dict[str, Any]:
    return {
        "metric": r.threshold.metric,
        "unit": METRICS[r.threshold.metric].unit,
        "threshold": r.threshold.describe(),
        "baseline": r.delta.a,
        "candidate": r.delta.b,
        "delta": r.delta.delta,
        "delta_pct": r.delta.delta_pct,
        "status": r.status.lower(),
        "message": r.message,
        "interval": list(r.interval) if r.interval is not None else None,
        "test": r.test,
        "interval_relative": r.relative_interval,
        "sample_verdict": r.sample_verdict,
    }


def gate_document(
    report: GateReport, verdict: str, passed: bool, warnings: list[str]
) -> dict[str, Any]:
    return {
        "schema": "mrv2-prof.gate",
        "version": SCHEMA_VERSION,
        "baseline": side_json(report.baseline),
        "candidate": side_json(report.candidate),
        "outcome": report.outcome,
        "exit_code": report.exit_code,
        "passed": passed,
        "verdict": verdict,
        "stages": [
            {"name": s.name, "status": s.status.lower(), "lines": list(s.lines)}
            for s in report.stages
        ],
        "results": [result_json(r) for r in report.results],
        "comparability": comparability_json(report.comparability),
        "warnings": warnings,
    }
