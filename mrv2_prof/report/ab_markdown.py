"""``compare`` and ``gate`` as GitHub markdown, to paste into a pull request: a table of metric,
baseline, candidate, Δ, interval and verdict, the gate's stages, and the comparability notes."""

from __future__ import annotations

from mrv2_prof.analysis.gate_metrics import METRICS
from mrv2_prof.analysis.run_sides import Side
from mrv2_prof.report.comparability import Comparability
from mrv2_prof.report.compare import format_pct
from mrv2_prof.report.gate_stages import GateReport
from mrv2_prof.report.metric_stats import MetricStat
from mrv2_prof.report.one_run_verdict import ONE_RUN, RULE
from mrv2_prof.views.safe_text import plain

HEADER = ("metric", "baseline", "candidate", "Δ", "interval", "verdict")


def cell(text: object) -> str:
    """One table cell: one line, a pipe escaped, backticks dropped (no code spans)."""
    return plain(str(text)).replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def _interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "-"
    return f"[{100 * low:+.1f}%, {100 * high:+.1f}%]"


def _side(side: Side) -> str:
    run = side.as_run()
    return f"{cell(run.run_id)} ({cell(run.label or '')}, {cell(side.db)})"


def comparability_lines(comp: Comparability) -> list[str]:
    lines = ["", "**Comparability**", ""]
    if not comp.differences and not comp.unchecked:
        lines.append("- scenario as run, model, device, torch, GPU, driver and host: the same")
    for d in comp.differences:
        lines.append(f"- {'**differs**' if d.blocking else 'note'}: {cell(d.describe())}")
    lines += [f"- not checked: {cell(u)}" for u in comp.unchecked]
    return lines


def compare_markdown(a: Side, b: Side, stats: list[MetricStat], comp: Comparability) -> str:
    rows = []
    for s in stats:
        m = METRICS[s.name]
        rows.append(
            (
                s.name + (" (higher)" if m.direction != "lower" else ""),
                m.format(s.a),
                m.format(s.b),
                format_pct(s.delta_pct, s.delta),
                _interval(s.stat.low, s.stat.high),
                s.shown,
            )
        )
    tests = sorted({s.test for s in stats})
    lines = [f"### mrv2-prof compare: {_side(a)} → {_side(b)}", "", *table(HEADER, rows)]
    lines += ["", "Tests: " + "; ".join(cell(t) for t in tests) + ". Noise floor ±2%."]
    if any(s.stat.reason.startswith(ONE_RUN) for s in stats):
        lines[-1] += f" {cell(RULE)}."
    return "\n".join([*lines, *comparability_lines(comp)]) + "\n"


def gate_markdown(report: GateReport, verdict: str) -> str:
    lines = [
        f"### mrv2-prof gate: **{report.outcome.upper()}**",
        "",
        f"baseline {_side(report.baseline)}, candidate {_side(report.candidate)}",
    ]
    for stage in report.stages:
        lines += ["", f"#### {stage.name}: {stage.status}", ""]
        lines += [f"- {cell(line)}" for line in stage.lines]
        if stage.name == "load" and report.results:
            rows = []
            for r in report.results:
                m, d = METRICS[r.threshold.metric], r.delta
                interval = "-"
                if r.interval is not None:
                    relative = r.relative_interval
                    low, high = r.interval
                    interval = (
                        _interval(low, high)
                        if relative
                        else f"[{m.format_delta(low)}, {m.format_delta(high)}]"
                    )
                rows.append(
                    (
                        m.name,
                        m.format(d.a),
                        m.format(d.b),
                        format_pct(d.delta_pct, d.delta),
                        interval,
                        r.status + (f" (requests: {r.sample_verdict})" if r.sample_verdict else ""),
                        r.threshold.describe(),
                    )
                )
            lines += ["", *table((*HEADER, "limit"), rows)]
    lines += comparability_lines(report.comparability)
    lines += ["", f"`{cell(verdict)}`"]
    return "\n".join(lines) + "\n"
