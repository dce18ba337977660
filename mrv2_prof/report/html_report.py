"""One self-contained HTML report (works offline): plotly.js inlined once (gzip-compressed,
``plotly_inline``), each figure's JSON in
its own ``<script type="application/json" class="mrv2-figure" data-fig-id=...>`` element, drawn
by one small script at the end. Returns the document as a string; the CLI writes it.

A run report opens with the run's findings, ranked (``mrv2_prof.analysis.findings``), then a header
(``store.metrics.run_summary``, the run's notes), a guide that says in
one sentence what each figure shows, the figures (or "not measured on this run: <why>"), and
the scenario YAML. A sweep report compares several runs on their headline metrics.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from mrv2_prof.analysis.energy import energy_rows
from mrv2_prof.analysis.finding_facts import FindingFacts, finding_facts
from mrv2_prof.analysis.findings import Finding, findings
from mrv2_prof.analysis.host_samples import stack_seconds
from mrv2_prof.analysis.metrics import Percentiles, RunSummary, run_summary
from mrv2_prof.analysis.rank_steps import rank_columns
from mrv2_prof.analysis.roofline import roofline_line
from mrv2_prof.analysis.run_data import DETAIL_STEPS, load_run_data
from mrv2_prof.analysis.sweep_runs import scenario_texts
from mrv2_prof.report import figures
from mrv2_prof.report.figure_meta import Figure, NotMeasured
from mrv2_prof.report.host_flame import host_flame
from mrv2_prof.report.kernel_table import kernel_table
from mrv2_prof.report.plotly_inline import boot_script, plotly_element
from mrv2_prof.report.ranks_panel import ranks_figure
from mrv2_prof.report.request_sample import requests_html
from mrv2_prof.report.roofline_figure import roofline_figure
from mrv2_prof.report.scheduler_panel import scheduler
from mrv2_prof.report.spec_figures import spec_decode, spec_steps
from mrv2_prof.report.sweep import Headline, headline, sweep_figure
from mrv2_prof.report.sweep_scenarios import page_heading
from mrv2_prof.report.sweep_tables import sweep_tables
from mrv2_prof.report.timeline import timeline
from mrv2_prof.store.db import Store
from mrv2_prof.views.format import format_ms, format_percent
from mrv2_prof.views.memory_line import memory_rows
from mrv2_prof.views.staged_writes import staged_writes_text

# figure id -> (heading, what it shows in one sentence), in page order
FIGURE_GUIDE = {
    "timeline": ("Step timeline", "Each step's CPU phases (schedule, prepare, forward, sample, "
                 "output_wait, update) and, on a GPU run, its device work on the same clock; drag "
                 "to zoom into single steps."),
    "scheduler": ("Scheduler", "Requests waiting and running, KV blocks in use against the "
                  "cache's size, preemptions per step and so far, and the prefix-cache hit rate "
                  "so far, step by step."),
    "overlap": ("Overlap per step", "The share of each step's host preparation that ran while "
                "the GPU was still busy with the previous step (async scheduling at work)."),
    "bubbles": ("GPU bubbles", "GPU idle time before each step, split into host-bound bubbles "
                "(the GPU waited for the host to enqueue) and other gaps."),
    "sync_sites": ("Sync sites", "Where the CPU waited for the GPU: the designed output wait, "
                   "implicit syncs found by the sync finder (file:line) and flagged copies."),
    "graph_modes": ("Graph mode per step", "Which CUDA graph mode each step ran (full, "
                    "piecewise or eager none) against its token count, with the reasons."),
    "graph_capture": ("Graph capture cost", "Start-up seconds and pool memory of each captured "
                      "graph key, split into keys a step replayed and keys never used."),
    "staged_writes": ("Staged writes", "Bytes the staged writes copied to the GPU, per tensor "
                      "and per step, against a dense copy of the whole tensor."),
    "latency_cdf": ("Latency CDFs", "Cumulative distributions of TTFT, TPOT, ITL and E2E over "
                    "completed requests (vLLM bench serve definitions)."),
    "nvml": ("GPU telemetry", "GPU utilisation, memory, power and SM clock sampled by NVML."),
    "spec_decode": ("Speculative decoding", "How often each draft position was accepted, how "
                    "many drafts each verify accepted, and the drafter's time against the "
                    "verify's."),
    "spec_steps": ("Speculative decoding per step", "Draft slots each step reserved and the "
                   "verifies gave back, requests that sat out, and dynamic k's decision: the k "
                   "chosen against its expected tokens over cost ratio (speculation pays above "
                   "1)."),
    "host_flame": ("Host time by phase (sampled)", "Where the runner's host time went: the "
                   "Python stacks the host sampler took, split by the CPU phase each fell in, "
                   "each standing for the wall time since the sample before it (a stall, "
                   "where a C call held the GIL, counts for the sample after it); click a "
                   "phase or frame to zoom."),
    "ranks": ("Tensor parallel", "Each rank's step time and its time in collectives, step "
              "by step (rank_steps); the notes give each rank's collective share."),
    "roofline": ("Roofline", "Each step at its FLOPs per byte and its achieved TFLOP/s under "
                 "the GPU's roof (HBM bandwidth x intensity, capped by the tensor-core peak); "
                 "a step's height under the roof is its fraction of it."),
    "kernel_ops": ("Kernels per op", "Each op of the model over the kernel-trace window, layers "
                   "summed: launches and device time per step, achieved TB/s and TFLOP/s from its "
                   "shapes' bytes and FLOPs, and its share of the binding roof."),
    "sweep": ("Sweep comparison", "The headline metrics of every run side by side, one bar "
              "(colour) per run."),
}  # fmt: skip
RUN_FIGURES = (
    timeline, scheduler, figures.overlap, figures.bubbles, figures.sync_sites, figures.graph_modes,
    figures.graph_capture, figures.staged_writes, figures.latency_cdf, figures.nvml,
    spec_decode, spec_steps,
)  # fmt: skip
PLOT_CONFIG = {"responsive": True, "displaylogo": False, "scrollZoom": True}

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.15em .8em;text-align:left;
border-bottom:1px solid #eee}th{background:#f6f6f6}td.num{text-align:right}
pre{background:#f6f6f6;padding:.8em;overflow:auto}.note{color:#8a6d00}
.not-measured{padding:1.5em;background:#fafafa;border:1px dashed #bbb;color:#555}
section.figure{margin:2em 0}.explain{color:#555;margin:.2em 0}
ol#findings li{margin:.3em 0}td.ran-as{color:#8a6d00}.where{color:#777}
.sev-2{color:#a01010}.sev-1{color:#8a6d00}td.text{max-width:36em;overflow-wrap:anywhere}
"""


def figure_json(fig: go.Figure) -> str:
    """The figure's JSON, safe inside a <script> element (every '<' escaped as \\u003c)."""
    return fig.to_json().replace("<", "\\u003c")


def _section(fig: Figure) -> str:
    fig_id = fig.fig_id if isinstance(fig, NotMeasured) else fig.layout.meta["id"]
    heading, explain = FIGURE_GUIDE[fig_id]
    parts = [f'<section class="figure" id="sec-{fig_id}"><h2>{html.escape(heading)}</h2>',
             f'<p class="explain">{html.escape(explain)}</p>']  # fmt: skip
    if isinstance(fig, NotMeasured):
        parts.append(
            f'<p class="not-measured" data-fig-id="{fig_id}">not measured on this run: '
            f"{html.escape(fig.why)}</p>"
        )
    else:
        parts.append(f'<div class="plot" id="plot-{fig_id}"></div>')
        parts.append(
            f'<script type="application/json" class="mrv2-figure" data-fig-id="{fig_id}">'
            f"{figure_json(fig)}</script>"
        )
        notes = fig.layout.meta.get("notes") or []
        if notes:
            items = "".join(f'<li class="note">{html.escape(n)}</li>' for n in notes)
            parts.append(f"<ul>{items}</ul>")
    parts.append("</section>")
    return "\n".join(parts)


def _page(title: str, body: list[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>",
        plotly_element(), "</head><body>", *body,
        f"<script>{boot_script(PLOT_CONFIG)}</script>", "</body></html>",
    ])  # fmt: skip


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _pct(p: Percentiles) -> str:
    if not p.count:
        return "not measured"
    return f"p50 {format_ms(p.p50)}, p90 {format_ms(p.p90)}, p99 {format_ms(p.p99)} (n={p.count})"


def _staged(s: RunSummary, facts: FindingFacts) -> str:
    runner = facts.scenario_as_run.get("runner")
    on = runner.get("staged_writes") if isinstance(runner, dict) else None
    return staged_writes_text(s.staged_bytes, s.dense_bytes, facts.staged_by_tensor, on)


def _summary_rows(s: RunSummary, facts: FindingFacts) -> list[tuple[str, str]]:
    info = s.info
    graphs = "-" if s.graph_hit_rate is None else f"{format_percent(s.graph_hit_rate)} hit"
    return [
        ("run", f"{s.run_id}  {s.label}"),
        ("status", s.status + (f" ({s.error})" if s.error else "")),
        ("device / dtype", f"{s.device} / {info.get('dtype', '?')}"),
        ("requests", f"{s.num_requests} ({s.num_completed} completed, {s.num_aborted} aborted, "
                     f"{s.num_unfinished} unfinished)"),
        ("steps", f"{s.steps:,}"),
        ("tokens", f"{s.prompt_tokens:,} prompt, {s.output_tokens:,} output"),
        ("duration", f"{s.duration_s:,.2f} s (first arrival to last finish)"),
        ("throughput", f"{s.requests_per_s:,.2f} req/s, {s.output_tokens_per_s:,.1f} tok/s"),
        ("TTFT", _pct(s.ttft_ms)), ("TPOT", _pct(s.tpot_ms)), ("ITL", _pct(s.itl_ms)),
        ("E2E", _pct(s.e2e_ms)),
        ("staged writes", _staged(s, facts)),
        ("sync points", f"{s.num_syncs:,} waits, {s.sync_blocked_ms:,.1f} ms blocked"),
        ("CUDA graphs", graphs),
        ("roofline", roofline_line(s.roofline) if s.roofline else "-"),
        *energy_rows(s.energy),
        *memory_rows(info),
        *_measurement_rows(s),
    ]  # fmt: skip


def _measurement_rows(s: RunSummary) -> list[tuple[str, str]]:
    """Starved time, the perturbed steps left out, and the run's environment."""
    from mrv2_prof.views.environment import environment_line

    rows = []
    if s.starved_ms is not None:
        rows.append(("GPU starved", f"{s.starved_ms:,.1f} ms inside steps waiting for the host"))
    if s.perturbed_steps:
        rows.append(("perturbed", f"{s.perturbed_steps} steps (traced or capturing) left out of "
                                  "overlap, bubbles, syncs and ITL"))  # fmt: skip
    env = environment_line(s.environment)
    if env:
        rows.append(("environment", env))
    return rows


def findings_html(found: list[Finding]) -> str:
    """The ranked findings as an ordered list (``ol#findings``), each with where to look."""
    if not found:
        return '<h2>Findings</h2><p id="findings">Nothing stands out: no rule fired.</p>'
    items = "".join(
        f'<li class="finding sev-{f.severity}" data-rule="{html.escape(f.rule)}">'
        f'{html.escape(f.text)}<br><span class="where">look at: {html.escape(f.where)}</span></li>'
        for f in found
    )
    return f'<h2>Findings</h2><ol id="findings">{items}</ol>'


def _guide(fig_ids: list[str]) -> str:
    items = "".join(
        f'<li><a href="#sec-{i}">{html.escape(FIGURE_GUIDE[i][0])}</a>: '
        f"{html.escape(FIGURE_GUIDE[i][1])}</li>"
        for i in fig_ids
    )
    return f"<h2>Figures</h2><ul>{items}</ul>"


def render_run_report(
    store: Store,
    run_id: str,
    *,
    detail_steps: int = DETAIL_STEPS,
    detail_window: tuple[int, int] | None = None,
) -> str:
    """The HTML report of one run (``run_id`` exact; resolve user input with ``resolve_run``)."""
    summary = run_summary(store, run_id)
    facts = finding_facts(store, run_id, include_perturbed=summary.includes_perturbed)
    data = load_run_data(store, run_id, detail_steps=detail_steps, detail_window=detail_window)
    figs = [make(data) for make in RUN_FIGURES]
    figs.append(host_flame(stack_seconds(store, run_id), data.probes.get("host_sampling_hz", 0)))
    figs.append(roofline_figure(summary.roofline))
    figs.append(kernel_table(facts.kernel_roofline))
    if summary.tensor_parallel is not None:  # only a tensor-parallel run has rank rows
        figs.append(ranks_figure(rank_columns(store, run_id)))
    notes = "".join(
        f'<p class="note">note: {html.escape(n)}</p>' for n in data.info.get("notes", [])
    )
    body = [
        f"<h1>mrv2-prof report: {html.escape(data.label)} ({html.escape(run_id)})</h1>",
        findings_html(findings(summary, facts)),
        _table(_summary_rows(summary, facts)), notes, requests_html(store, run_id),
        _guide([f.fig_id if isinstance(f, NotMeasured) else f.layout.meta["id"] for f in figs]),
        *(_section(f) for f in figs),
        "<h2>Scenario</h2>",
        f'<pre id="scenario">{html.escape(data.scenario_yaml)}</pre>',
    ]  # fmt: skip
    return _page(f"mrv2-prof {run_id}", body)


def render_sweep_report(store: Store, run_ids: list[str]) -> str:
    """One page comparing ``run_ids`` (exact ids) on the headline metrics."""
    return render_sweep_page(*sweep_parts(store, run_ids))


def sweep_parts(store: Store, run_ids: list[str]) -> tuple[list[Headline], list[str]]:
    """The headline metrics and the scenario as run of each of ``run_ids``, read from
    ``store`` (a report over two databases gathers them from each)."""
    runs = [headline(store, rid) for rid in run_ids]
    yamls = [scenario_texts(store, rid)[2] or "" for rid in run_ids]
    return runs, yamls


def render_sweep_page(runs: list[Headline], yamls: list[str]) -> str:
    """The comparison page of ``runs`` and their scenarios."""
    scenarios = [
        f"<details><summary>{html.escape(r.run_id)}</summary>"
        f"<pre>{html.escape(yaml_text)}</pre></details>"
        for r, yaml_text in zip(runs, yamls, strict=True)
    ]
    title, note = page_heading(runs)
    note_html = f'<p class="note" id="scenarios-differ">note: {html.escape(note)}</p>'
    body = [
        f"<h1>mrv2-prof {html.escape(title)}</h1>", note_html if note else "", sweep_tables(runs),
        _guide(["sweep"]), _section(sweep_figure(runs)), "<h2>Scenarios</h2>", *scenarios,
    ]  # fmt: skip
    return _page(f"mrv2-prof {title}", body)
