"""Comparing the runs of a sweep: their headline metrics, one bar chart.

Which runs form a sweep is ``analysis.sweep_runs.sweep_members``; any list of runs can be
compared with ``headline`` and ``sweep_figure``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mrv2_prof.analysis.metrics import RunSummary, run_summary
from mrv2_prof.analysis.sweep_runs import scenario_texts
from mrv2_prof.report.figure_meta import new_figure
from mrv2_prof.store.db import Store
from mrv2_prof.views.downgrades import Downgrade, stored_runner_downgrades

# (key, title, unit): the order of the sweep figure's panels
HEADLINE_METRICS = (
    ("output_tokens_per_s", "output tokens/s", "tok/s"),
    ("requests_per_s", "requests/s", "req/s"),
    ("ttft_p50_ms", "TTFT p50", "ms"), ("ttft_p99_ms", "TTFT p99", "ms"),
    ("tpot_p50_ms", "TPOT p50", "ms"), ("tpot_p99_ms", "TPOT p99", "ms"),
    ("itl_p50_ms", "ITL p50", "ms"), ("itl_p99_ms", "ITL p99", "ms"),
    ("e2e_p50_ms", "E2E p50", "ms"), ("e2e_p99_ms", "E2E p99", "ms"),
    ("overlap_pct", "overlap", "%"), ("bubble_ms", "GPU bubbles", "ms"),
    ("num_syncs", "sync points", "count"), ("graph_hit_pct", "graph hit rate", "%"),
    ("capture_s", "graph capture", "s"), ("staged_dense_ratio", "staged / dense bytes", "ratio"),
    ("peak_mem_gib", "peak GPU memory (NVML)", "GiB"),
)  # fmt: skip


@dataclass(frozen=True)
class Headline:
    run_id: str
    label: str
    status: str
    combo: dict[str, Any]
    values: dict[str, float | None]  # keyed like HEADLINE_METRICS; None = not measured
    downgrades: tuple[Downgrade, ...] = ()  # what the runner did not run as asked
    why: dict[str, str] = field(default_factory=dict)  # why a value is None, by metric key
    # the scenario as given (runs.scenario_given_yaml), else as run (a run stored without it)
    given_yaml: str = ""

    @property
    def short_label(self) -> str:
        """The matrix values (``cudagraph_mode=full, async_scheduling=false``) or the label."""
        if not self.combo:
            return self.label
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={json.dumps(v)}" for k, v in self.combo.items())

    @property
    def ran_as(self) -> str:
        """``ran kernels triton→torch, uva true→false``, or "" when the run ran as asked."""
        return f"ran {', '.join(d.short for d in self.downgrades)}" if self.downgrades else ""

    @property
    def legend_label(self) -> str:
        """The run id, its matrix values and, when downgraded, what it ran instead."""
        ran = f" [{self.ran_as}]" if self.ran_as else ""
        return f"{self.run_id} {self.short_label}{ran}"


def _why_not_measured(s: RunSummary, values: dict[str, float | None]) -> dict[str, str]:
    """A reason for each metric this run did not measure (the sweep figure shows it)."""
    on_cpu = not (s.device or "").startswith("cuda")
    where = f"a {s.device} run" if on_cpu else "probes.cuda_events off"
    graphs = "no CUDA graphs captured" + (f" ({where})" if on_cpu else "")
    reasons = {
        "overlap_pct": f"no GPU timeline ({where})", "bubble_ms": f"no GPU timeline ({where})",
        "graph_hit_pct": graphs, "capture_s": graphs,
        "peak_mem_gib": "no NVML samples" + (f" ({where})" if on_cpu else ""),
        "staged_dense_ratio": "no staged writes recorded",
    }  # fmt: skip
    return {k: reasons.get(k, "no values") for k, v in values.items() if v is None}


def headline(store: Store, run_id: str) -> Headline:
    """The headline metrics of one run, from ``run_summary``."""
    s = run_summary(store, run_id)
    peak_mem = s.peak_gpu_mem_bytes
    combo_json, given_yaml, as_run_yaml = scenario_texts(store, run_id)
    graphs = s.info.get("num_graphs", 0)
    values = {
        "output_tokens_per_s": s.output_tokens_per_s,
        "requests_per_s": s.requests_per_s,
        **{
            f"{name}_{p}_ms": getattr(getattr(s, f"{name}_ms"), p)
            for name in ("ttft", "tpot", "itl", "e2e")
            for p in ("p50", "p99")
        },
        "overlap_pct": 100 * s.overlap if s.overlap is not None else None,
        "bubble_ms": s.bubble_ms,
        "num_syncs": s.num_syncs,
        "graph_hit_pct": None if not graphs or s.graph_hit_rate is None else 100 * s.graph_hit_rate,
        "capture_s": s.info.get("capture_s") if graphs else None,
        "staged_dense_ratio": s.staged_bytes / s.dense_bytes if s.dense_bytes else None,
        "peak_mem_gib": peak_mem / 2**30 if peak_mem is not None else None,
    }
    downgrades = tuple(stored_runner_downgrades(given_yaml, as_run_yaml))
    return Headline(
        run_id, s.label or run_id, s.status, json.loads(combo_json) if combo_json else {}, values,
        downgrades, _why_not_measured(s, values), given_yaml or as_run_yaml or "",
    )  # fmt: skip


def sweep_figure(runs: list[Headline]) -> go.Figure:
    """One bar panel per headline metric, one colour per run (legend: run id and its matrix
    values); a metric no run measured says so in its panel."""
    cols = 4
    rows = -(-len(HEADLINE_METRICS) // cols)
    titles = [f"{title} ({unit})" for _, title, unit in HEADLINE_METRICS]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.07)
    for n, run in enumerate(runs):
        for i, (key, _, _) in enumerate(HEADLINE_METRICS):
            value = run.values.get(key)
            fig.add_trace(
                go.Bar(
                    x=[run.run_id], y=[value], name=run.legend_label,
                    legendgroup=run.run_id, showlegend=i == 0, marker_color=_color(n),
                    hovertemplate=f"{run.short_label}<br>%{{y:,.4~r}}<extra>{run.run_id}</extra>",
                ),
                row=i // cols + 1, col=i % cols + 1,
            )  # fmt: skip
    not_measured = {}
    for i, (key, _, _) in enumerate(HEADLINE_METRICS):
        if all(r.values.get(key) is None for r in runs):
            why = "; ".join(dict.fromkeys(r.why.get(key, "no values") for r in runs))
            not_measured[key] = why
            fig.add_annotation(
                text=f"not measured:<br>{why}", showarrow=False, xref="x domain" if i == 0 else
                f"x{i + 1} domain", yref="y domain" if i == 0 else f"y{i + 1} domain",
                x=0.5, y=0.5,
            )  # fmt: skip
            fig.update_xaxes(visible=False, row=i // cols + 1, col=i % cols + 1)
            fig.update_yaxes(visible=False, row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(height=260 * rows, legend={"orientation": "h", "y": -0.05})
    # axes and hover: thousands separators, never 3.8e+4 (hover: d3's ",.4~r")
    fig.update_yaxes(exponentformat="none", separatethousands=True)
    table = {r.run_id: r.values for r in runs}
    notes = [f"{r.run_id} {r.ran_as}" for r in runs if r.ran_as]
    return new_figure(
        fig, "sweep", f"Sweep: {len(runs)} runs compared", notes, values=table,
        downgrades={r.run_id: [d.short for d in r.downgrades] for r in runs},
        not_measured=not_measured,
    )  # fmt: skip


_PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B",
            "#9D755D", "#FF9DA6", "#BAB0AC")  # fmt: skip


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]
