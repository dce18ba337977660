"""The report's figures: pure functions from ``RunData`` to Plotly figures (no I/O).

Each figure carries its id, notes and facts in ``layout.meta``; a figure whose data this run did
not record is a ``NotMeasured`` (id, title, why) instead of an empty chart
(``report.figure_meta``). Per-step series use ``Scattergl`` (WebGL) so that tens of thousands of
points stay responsive. The step timeline is in ``report.timeline``.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mrv2_prof.analysis.run_data import RunData
from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure, why_no_gpu

CDF_POINTS = 2000  # a latency CDF with more values is drawn through this many evenly spaced ranks
LONG_TAIL = 10.0  # a CDF whose largest value is this many times its median gets a log x axis
SYNC_SITES = 40  # sync-site bars shown (the rest are summed into one bar)
KIND_COLORS = {"output_wait": "#4C78A8", "implicit": "#E45756", "copy": "#F58518"}
MODE_COLORS = {"full": "#54A24B", "piecewise": "#EECA3B", "none": "#9D755D"}


def _all_nan(values: np.ndarray) -> bool:
    return len(values) == 0 or bool(np.all(np.isnan(values.astype(np.float64))))


def overlap(data: RunData) -> Figure:
    title = "Overlap per step (host prep hidden under GPU work)"
    s = data.steps
    if _all_nan(s["overlap_frac"]):
        return NotMeasured("overlap", title, why_no_gpu(data, "overlap and bubbles"))
    host = s["host_prep_ns"].astype(np.float64)
    hidden = s["hidden_prep_ns"].astype(np.float64)
    run_overlap = float(np.nansum(hidden) / np.nansum(host)) if np.nansum(host) > 0 else None
    fig = go.Figure(
        go.Scattergl(
            x=s["step"], y=s["overlap_frac"].astype(np.float64) * 100, mode="markers",
            marker={"size": 4}, name="overlap", customdata=np.stack([host, hidden], 1) / 1e6,
            hovertemplate="step %{x}: %{y:.1f} %<br>host prep %{customdata[0]:.3f} ms, "
            "hidden %{customdata[1]:.3f} ms<extra></extra>",
        )
    )  # fmt: skip
    notes = []
    if run_overlap is not None:
        fig.add_hline(y=run_overlap * 100, line_dash="dash", annotation_text="run overlap")
        notes.append(f"run overlap (hidden / host prep, all steps): {run_overlap:.1%}")
    fig.update_layout(xaxis_title="step", yaxis_title="overlap %", yaxis_range=[-2, 102])
    return new_figure(fig, "overlap", title, notes, run_overlap=run_overlap)


def bubbles(data: RunData) -> Figure:
    title = "GPU bubbles by class (idle time before each step)"
    s = data.steps
    bubble = s["bubble_ns"].astype(np.float64)
    if _all_nan(bubble):
        return NotMeasured("bubbles", title, why_no_gpu(data, "overlap and bubbles"))
    kinds = np.array(["unclassified" if k is None else k for k in s["bubble_kind"]], dtype=object)
    fig = make_subplots(
        rows=1, cols=2, column_widths=[0.75, 0.25],
        subplot_titles=("bubble before each step", "total by class"),
    )  # fmt: skip
    totals_ms = {}
    for kind in ("host_bound", "other", "unclassified"):
        sel = (kinds == kind) & ~np.isnan(bubble)
        if not sel.any():
            continue
        totals_ms[kind] = float(bubble[sel].sum() / 1e6)
        fig.add_trace(
            go.Scattergl(x=s["step"][sel], y=bubble[sel] / 1e6, mode="markers", name=kind,
                         legendgroup=kind, marker={"size": 4}),
            row=1, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Bar(x=[kind], y=[totals_ms[kind]], name=kind, legendgroup=kind, showlegend=False,
                   text=[f"{int(sel.sum())} steps"]),
            row=1, col=2,
        )  # fmt: skip
    starved = (
        s["starved_ns"].astype(np.float64) if "starved_ns" in s else np.full(len(bubble), np.nan)
    )
    has_starved = ~np.isnan(starved) & (starved > 0)
    if has_starved.any():
        totals_ms["starved"] = float(starved[has_starved].sum() / 1e6)
        fig.add_trace(
            go.Scattergl(x=s["step"][has_starved], y=starved[has_starved] / 1e6, mode="markers",
                         name="starved (inside the step)", legendgroup="starved",
                         marker={"size": 4, "symbol": "x"}),
            row=1, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Bar(x=["starved"], y=[totals_ms["starved"]], name="starved", legendgroup="starved",
                   showlegend=False, text=[f"{int(has_starved.sum())} steps"]),
            row=1, col=2,
        )  # fmt: skip
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="bubble ms", row=1, col=1)
    fig.update_yaxes(title_text="total ms", row=1, col=2)
    notes = [
        "host_bound: the GPU waited for the host to finish enqueueing the step",
        "starved: inside a step, the GPU waited for the host to enqueue the rest of a phase "
        "(host-bound too; exact in a kernel-trace window, else from the CUDA events)",
    ]
    num_perturbed = sum(bool(v) for v in s.get("perturbed", ()) if v is not None and v == v)
    if num_perturbed:
        notes.append(f"{num_perturbed} perturbed steps (traced or capturing) are shown here too")
    return new_figure(fig, "bubbles", title, notes, totals_ms=totals_ms)


def sync_sites(data: RunData) -> Figure:
    title = "Sync points by site"
    sy = data.syncs
    if len(sy["kind"]) == 0:
        return NotMeasured("sync_sites", title, "no sync points were recorded")
    labels = [
        f"{site} ({kind})" if site else f"({kind})"
        for kind, site in zip(sy["kind"], sy["site"], strict=True)
    ]
    counts, blocked_ms = sy["count"].astype(np.int64), sy["blocked_ns"].astype(np.float64) / 1e6
    kinds = list(sy["kind"])
    if len(labels) > SYNC_SITES:
        rest = slice(SYNC_SITES - 1, None)
        labels = labels[: SYNC_SITES - 1] + [f"{len(labels) - SYNC_SITES + 1} other sites"]
        counts = np.append(counts[: SYNC_SITES - 1], counts[rest].sum())
        blocked_ms = np.append(blocked_ms[: SYNC_SITES - 1], blocked_ms[rest].sum())
        kinds = kinds[: SYNC_SITES - 1] + ["other"]
    fig = go.Figure()
    for kind in dict.fromkeys(kinds):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        fig.add_trace(
            go.Bar(
                y=[labels[i] for i in idx], x=counts[idx], orientation="h", name=kind,
                customdata=blocked_ms[idx], marker_color=KIND_COLORS.get(kind),
                hovertemplate="%{y}<br>%{x} syncs, %{customdata:.3f} ms blocked<extra></extra>",
            )
        )  # fmt: skip
    fig.update_layout(
        xaxis_title="count", height=max(300, 120 + 22 * len(labels)),
        yaxis={"categoryorder": "array", "categoryarray": labels[::-1], "automargin": True},
    )  # fmt: skip
    notes = ["output_wait is the designed wait for sampled tokens; implicit syncs are hidden ones"]
    if "implicit" not in kinds:
        if not data.is_cuda:
            why = f"the run was on {data.device}; the sync finder needs CUDA"
        elif not data.probes.get("sync_finder", True):
            why = "probes.sync_finder was off"
        else:
            why = None
        notes.append(f"implicit syncs: not measured on this run: {why}" if why else
                     "implicit syncs: none found")  # fmt: skip
    return new_figure(fig, "sync_sites", title, notes)


def graph_modes(data: RunData) -> Figure:
    title = "CUDA graph mode per step"
    s = data.steps
    if data.num_steps == 0:
        return NotMeasured("graph_modes", title, "the run has no steps")
    modes = np.array(["?" if m is None else m for m in s["graph_mode"]], dtype=object)
    fig, counts = go.Figure(), {}
    for mode in ("full", "piecewise", "none", "?"):
        sel = modes == mode
        if sel.any():
            counts[mode] = int(sel.sum())
            fig.add_trace(go.Scattergl(
                x=s["step"][sel], y=s["num_tokens"][sel], mode="markers", marker={"size": 4},
                marker_color=MODE_COLORS.get(mode), name=f"{mode} ({counts[mode]:,} steps)",
                hovertemplate=f"step %{{x}}: {mode}, %{{y}} tokens<extra></extra>",
            ))  # fmt: skip
    fig.update_layout(xaxis_title="step", yaxis_title="tokens in the step")
    r = data.dispatch_reasons
    notes = [
        f"{m}: {n:,} steps — {why}"
        for m, why, n in zip(r["mode"], r["reason"], r["count"], strict=True)
    ]
    return new_figure(fig, "graph_modes", title, notes[:12], steps_per_mode=counts)


def graph_capture(data: RunData) -> Figure:
    title = "CUDA graph capture cost per key (replayed vs never replayed)"
    c = data.captures
    if len(c["key"]) == 0:
        r = data.dispatch_reasons
        why = f"no CUDA graphs were captured ({r['reason'][0]})" if len(r["reason"]) else (
            "no CUDA graphs were captured")  # fmt: skip
        return NotMeasured("graph_capture", title, why)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    used = c["replayed"]
    mem_mib = c["mem_bytes"].astype(np.float64) / 2**20
    for sel, name, color in ((used, "replayed", "#54A24B"), (~used, "never replayed", "#E45756")):
        if not sel.any():
            continue
        keys = list(c["key"][sel])
        fig.add_trace(go.Bar(x=keys, y=c["capture_s"][sel], name=name, marker_color=color,
                             legendgroup=name), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Bar(x=keys, y=mem_mib[sel], name=name, marker_color=color,
                             legendgroup=name, showlegend=False), row=2, col=1)  # fmt: skip
    fig.update_yaxes(title_text="capture s", row=1, col=1)
    fig.update_yaxes(title_text="pool MiB", row=2, col=1)
    fig.update_xaxes(categoryorder="array", categoryarray=list(c["key"]))
    unused_s = float(c["capture_s"][~used].sum())
    unused_bytes = int(c["mem_bytes"][~used].sum())
    total_s = float(c["capture_s"].sum())
    notes = [
        f"{len(used)} keys captured in {total_s:.3f} s; {int((~used).sum())} never replayed, "
        f"costing {unused_s:.3f} s and {unused_bytes / 2**20:.1f} MiB"
    ]
    first_use = c["step"] >= 0  # runner.piecewise_capture: first_use
    if first_use.any():
        lo, hi = int(c["step"][first_use].min()), int(c["step"][first_use].max())
        where = f"step {lo}" if lo == hi else f"steps {lo}-{hi}"
        notes.append(
            f"{int(first_use.sum())} of them captured on first use, inside {where}, in "
            f"{float(c['capture_s'][first_use].sum()):.3f} s (graph_captures.step)"
        )
    return new_figure(
        fig, "graph_capture", title, notes, capture_s=total_s, unused_capture_s=unused_s,
        unused_mem_bytes=unused_bytes, num_unused=int((~used).sum()),
    )  # fmt: skip


def staged_writes(data: RunData) -> Figure:
    title = "Staged writes: bytes moved vs a dense copy"
    t = data.staged_by_tensor
    if len(t["tensor"]) == 0:
        off = data.runner.get("staged_writes") is False
        why = "runner.staged_writes was off" if off else "no staged writes were recorded"
        return NotMeasured("staged_writes", title, why)
    fig = make_subplots(
        rows=1, cols=2, column_widths=[0.4, 0.6],
        subplot_titles=("total per tensor", "staged bytes per step"),
    )  # fmt: skip
    staged, dense = t["staged_bytes"].astype(np.int64), t["dense_bytes"].astype(np.int64)
    fig.add_trace(go.Bar(x=t["tensor"], y=staged, name="staged bytes"), row=1, col=1)
    fig.add_trace(go.Bar(x=t["tensor"], y=dense, name="dense copy bytes"), row=1, col=1)
    per_step = data.staged_by_step
    fig.add_trace(
        go.Scattergl(x=per_step["step"], y=per_step["staged_bytes"], mode="markers",
                     marker={"size": 4}, name="staged bytes per step"),
        row=1, col=2,
    )  # fmt: skip
    fig.update_yaxes(type="log", title_text="bytes", row=1, col=1)
    fig.update_yaxes(title_text="bytes", row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=2)
    ratio = staged.sum() / dense.sum() if dense.sum() else None
    notes = [f"staged / dense bytes: {ratio:.4f}"] if ratio is not None else []
    return new_figure(
        fig, "staged_writes", title, notes, staged_bytes=int(staged.sum()),
        dense_bytes=int(dense.sum()),
    )  # fmt: skip


def cdf_points(values: np.ndarray, max_points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the empirical CDF of sorted ``values``: y = rank / n; more than ``max_points``
    values are thinned to evenly spaced ranks, always keeping the first and the last."""
    n = len(values)
    ranks = np.arange(n) if n <= max_points else np.unique(np.linspace(0, n - 1, max_points))
    ranks = ranks.astype(np.int64)
    return values[ranks], (ranks + 1) / n


def latency_cdf(data: RunData) -> Figure:
    title = "Latency CDFs (completed requests)"
    lat = data.latencies_ms
    if all(len(v) == 0 for v in lat.values()):
        return NotMeasured("latency_cdf", title, "no request completed")
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{n} (ms)" for n in names.values()])
    counts, notes, log_x = {}, [], {}
    for i, (key, name) in enumerate(names.items()):
        row, col = divmod(i, 2)
        values = lat[key]
        counts[key] = len(values)
        if len(values) == 0:
            notes.append(f"{name}: not measured on this run: no values (e.g. 1-token outputs)")
            continue
        x, y = cdf_points(values)
        if len(values) > CDF_POINTS:
            notes.append(f"{name}: {len(values):,} values drawn through {len(x):,} ranks")
        fig.add_trace(
            go.Scattergl(x=x, y=y, mode="lines", line_shape="hv", name=name,
                         hovertemplate=f"{name} %{{x:.3f}} ms: %{{y:.1%}}<extra></extra>"),
            row=row + 1, col=col + 1,
        )  # fmt: skip
        log_x[key] = _long_tail(name, values, notes)
        if log_x[key]:
            fig.update_xaxes(type="log", row=row + 1, col=col + 1)
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    fig.update_layout(height=600, showlegend=False)
    return new_figure(fig, "latency_cdf", title, notes, counts=counts, log_x=log_x)


def _long_tail(name: str, values: np.ndarray, notes: list[str]) -> bool:
    """Whether a CDF's largest value is ``LONG_TAIL`` times its median (of the positive values)
    or more: then its x axis is logarithmic (a linear one crushes the body against the y axis),
    with a note saying so and how many values (zero gaps) a log axis cannot draw."""
    positive = values[values > 0]
    if len(positive) == 0:
        return False
    ratio = float(positive.max() / np.median(positive))
    if ratio < LONG_TAIL:
        return False
    notes.append(f"{name}: log x axis (the largest value is {ratio:,.0f}x the median)")
    zeros = len(values) - len(positive)
    if zeros:
        what = "1 value" if zeros == 1 else f"{zeros:,} values"
        notes.append(f"{name}: {what} of 0 ms not drawn on the log axis")
    return True


def nvml(data: RunData) -> Figure:
    title = "GPU telemetry (NVML)"
    g = data.gpu_samples
    if len(g.get("t_ns", ())) == 0:
        if not data.is_cuda:
            why = f"the run was on {data.device}; NVML needs an NVIDIA GPU"
        elif not data.probes.get("nvml_hz", 1):
            why = "probes.nvml_hz was 0"
        else:
            why = "no NVML samples were stored (see the run's notes)"
        return NotMeasured("nvml", title, why)
    t_s = (g["t_ns"].astype(np.int64) - data.started_ns) / 1e9
    series = (
        ("gpu_util", "utilisation %", 1.0), ("mem_used_bytes", "memory GiB", 1 / 2**30),
        ("power_w", "power W", 1.0), ("sm_clock_mhz", "SM clock MHz", 1.0),
    )  # fmt: skip
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04)
    for row, (col, label, scale) in enumerate(series, start=1):
        fig.add_trace(go.Scattergl(x=t_s, y=g[col].astype(np.float64) * scale, mode="lines",
                                   name=label), row=row, col=1)  # fmt: skip
        fig.update_yaxes(title_text=label, row=row, col=1)
    fig.update_xaxes(title_text="s since run start", row=4, col=1)
    fig.update_layout(height=700, showlegend=False)
    return new_figure(fig, "nvml", title, [], num_samples=len(t_s))
