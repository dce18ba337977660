"""Two runs side by side: every gate metric with its change, marked better or worse.

``compare`` pairs two ``RunMetrics`` (from one run database or two); ``compare_table`` renders
the pairs as a rich table. The CLI prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text

from mrv2_prof.analysis.gate_metrics import LOWER, METRICS, RunMetrics, gate_metrics
from mrv2_prof.report.one_run_verdict import ONE_RUN, RULE
from mrv2_prof.store import Store
from mrv2_prof.views.safe_text import plain

BETTER, WORSE, SAME = "better", "worse", "same"
_STYLE = {BETTER: "green", WORSE: "red", SAME: "", None: "dim"}
_STAT_STYLE = {BETTER: "green", WORSE: "red", "inconclusive": "yellow"}


@dataclass(frozen=True)
class MetricDelta:
    """One metric of run A and run B; the change fields are None unless both were measured."""

    name: str
    a: float | None
    b: float | None
    delta: float | None  # b - a, in the metric's unit
    delta_pct: float | None  # 100 * (b - a) / |a|; None when a is 0 (or not measured)
    verdict: str | None  # better | worse | same, by the metric's direction

    @property
    def measured(self) -> bool:
        return self.delta is not None


def load_runs(db_a: Path, ref_a: str, db_b: Path, ref_b: str) -> tuple[RunMetrics, RunMetrics]:
    """The gate metrics of run ``ref_a`` in ``db_a`` and ``ref_b`` in ``db_b`` (may be one file).

    Refs are what a user types (``latest``, an id or a unique prefix); raises ``StoreError``.
    """
    with Store.open(db_a, read_only=True) as store_a:
        a = gate_metrics(store_a, store_a.resolve_run(ref_a))
        if Path(db_b).resolve() == Path(db_a).resolve():
            return a, gate_metrics(store_a, store_a.resolve_run(ref_b))
    with Store.open(db_b, read_only=True) as store_b:
        return a, gate_metrics(store_b, store_b.resolve_run(ref_b))


def metric_delta(name: str, a: float | None, b: float | None) -> MetricDelta:
    if a is None or b is None:
        return MetricDelta(name, a, b, None, None, None)
    delta = b - a
    pct = 100 * delta / abs(a) if a != 0 else (0.0 if delta == 0 else None)
    if delta == 0:
        verdict = SAME
    else:
        worse = delta > 0 if METRICS[name].direction == LOWER else delta < 0
        verdict = WORSE if worse else BETTER
    return MetricDelta(name, a, b, delta, pct, verdict)


def compare(a: RunMetrics, b: RunMetrics) -> list[MetricDelta]:
    """Every metric of ``METRICS``, in its order, with B's change against A."""
    return [metric_delta(name, a.values[name], b.values[name]) for name in METRICS]


def format_pct(pct: float | None, delta: float | None) -> str:
    if delta is None:
        return "-"
    if pct is None:
        return "from 0"
    return f"{pct:+.1f}%"


def run_title(tag: str, run: RunMetrics, db: str) -> str:
    status = run.status + (f": {run.error}" if run.error else "")
    return f"{tag} = {run.run_id}  {run.label or ''}  [{status}]  ({db})"


def titles(*lines: str) -> Text:
    """Plain text for a table title (labels hold brackets that rich would read as markup)."""
    return Text("\n".join(plain(line) for line in lines))


def compare_table(
    a: RunMetrics, b: RunMetrics, db_a: str, db_b: str, stats: list | None = None
) -> Table:
    """The table; with ``stats`` (``report.metric_stats``) also each metric's interval and
    verdict from the samples, and the tests named in the caption."""
    caption = "lower is better except where marked (higher); '-' = not measured"
    if stats:
        tests = "; ".join(sorted({s.test for s in stats}))
        caption += f"\nverdict: 95% interval, ±2% noise floor; tests: {tests}"
        if any(s.stat.reason.startswith(ONE_RUN) for s in stats):
            caption += f"\n{RULE}"
    t = Table(
        title=titles(run_title("A", a, db_a), run_title("B", b, db_b)),
        title_justify="left",
        caption=Text(caption),
        caption_justify="left",
    )
    t.add_column("metric")
    for col in ("A", "B", "delta", "delta %"):
        t.add_column(col, justify="right")
    t.add_column("")
    if stats:
        t.add_column("interval", justify="right")
        t.add_column("verdict")
    by_name = {s.name: s for s in stats or []}
    for d in compare(a, b):
        m = METRICS[d.name]
        name = d.name + (" (higher)" if m.direction != LOWER else "")
        style = _STYLE[d.verdict]
        cells = [
            name,
            m.format(d.a),
            m.format(d.b),
            Text(m.format_delta(d.delta) if d.delta is not None else "-", style=style),
            Text(format_pct(d.delta_pct, d.delta), style=style),
            Text(d.verdict or "not measured", style=style),
        ]
        if stats:
            v = by_name[d.name].stat
            interval = "-" if v.low is None else f"[{100 * v.low:+.1f}%, {100 * v.high:+.1f}%]"
            shown = by_name[d.name].shown
            cells += [interval, Text(shown, style=_STAT_STYLE.get(v.verdict, ""))]
        t.add_row(*cells)
    return t
