"""The step timeline: CPU and GPU lanes of phase spans as horizontal bars, zoomable on time.

Each span is a thick WebGL line segment (``Scattergl``, one trace per phase, segments separated
by NaN), which stays responsive with tens of thousands of spans where SVG bars do not.

Lanes, top to bottom: ``CPU step`` (each step's ``step`` span), ``CPU phases`` (schedule,
prepare, forward, sample, output_wait, update, flush), ``GPU phases`` (prepare, forward, sample
in device time) and ``GPU step`` (``gpu_start_ns``..``gpu_end_ns``). A run with more steps than
``run_data.DETAIL_STEPS`` keeps every step's overall span in the two step lanes, but phase spans
only for a window of consecutive steps (``RunData.detail_window``); the figure says so and opens
on that window. Hover names the NVTX range, so a step can be found in an Nsight capture.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from mrv2_prof.analysis.run_data import RunData
from mrv2_prof.probes.api import PHASES
from mrv2_prof.probes.nvtx_ranges import NVTX_NAMES
from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure, why_no_gpu

LANES = {"CPU step": 3, "CPU phases": 2, "GPU phases": 1, "GPU step": 0}
LEAF_PHASES = tuple(p for p in PHASES if p not in ("step", "execute"))
PHASE_COLORS = {
    "schedule": "#4C78A8", "prepare": "#F58518", "forward": "#54A24B", "sample": "#B279A2",
    "output_wait": "#E45756", "update": "#72B7B2", "flush": "#9D755D", "draft": "#EECA3B",
}  # fmt: skip
STEP_COLOR = "#7F7F7F"
BAR_WIDTH_PX = 16


def segments(
    start_ns: np.ndarray, end_ns: np.ndarray, step: np.ndarray, t0_ns: int, lane: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (ms since ``t0_ns``), y and customdata ([step, duration ms]) of one line segment per
    span: points start, end, NaN (the x gap that separates segments). y (the lane, int8) and
    customdata (float32) are narrow types, which keeps the embedded JSON of a long run small."""
    n = len(start_ns)
    start_ms = (start_ns - t0_ns) / 1e6
    end_ms = (end_ns - t0_ns) / 1e6
    x = np.full(3 * n, np.nan)
    x[0::3], x[1::3] = start_ms, end_ms
    y = np.full(3 * n, lane, dtype=np.int8)
    custom = np.zeros((3 * n, 2), dtype=np.float32)
    for k in (0, 1):
        custom[k::3, 0] = step
        custom[k::3, 1] = end_ms - start_ms
    return x, y, custom


def _trace(label: str, nvtx: str, start, end, step, t0_ns: int, lane: int, color: str, **kw):
    x, y, custom = segments(start, end, step, t0_ns, lane)
    return go.Scattergl(
        x=x, y=y, customdata=custom, mode="lines", line={"width": BAR_WIDTH_PX, "color": color},
        connectgaps=False, name=label,
        hovertemplate=f"{label}<br>step %{{customdata[0]}}, %{{customdata[1]:.3f}} ms"
        f"<br>NVTX '{nvtx}'<extra></extra>",
        **kw,
    )  # fmt: skip


def _finite(*cols: np.ndarray) -> np.ndarray:
    return np.logical_and.reduce([~np.isnan(c.astype(np.float64)) for c in cols])


def timeline(data: RunData) -> Figure:
    title = "Step timeline: CPU and GPU lanes"
    s = data.steps
    if data.num_steps == 0:
        return NotMeasured("timeline", title, "the run has no steps")
    starts = s["cpu_start_ns"].astype(np.float64)
    if np.isnan(starts).all():  # rows written by hand or by an older writer without CPU times
        return NotMeasured("timeline", title, "no step has a CPU start time (steps.cpu_start_ns)")
    t0_ns = int(np.nanmin(starts))
    fig = go.Figure()
    fig.add_trace(_trace("CPU step", "step", s["cpu_start_ns"], s["cpu_end_ns"], s["step"],
                         t0_ns, LANES["CPU step"], STEP_COLOR))  # fmt: skip
    has_gpu = False
    for track, lane in (("cpu", LANES["CPU phases"]), ("gpu", LANES["GPU phases"])):
        spans = data.cpu_spans if track == "cpu" else data.gpu_spans
        for phase in LEAF_PHASES:
            sel = spans["name"] == phase
            if not sel.any():
                continue
            has_gpu |= track == "gpu"
            fig.add_trace(_trace(
                f"{phase} ({track.upper()})", NVTX_NAMES.get(phase, phase),
                spans["start_ns"][sel], spans["end_ns"][sel], spans["step"][sel], t0_ns, lane,
                PHASE_COLORS.get(phase, STEP_COLOR), legendgroup=phase,
            ))  # fmt: skip
    gpu = _finite(s["gpu_start_ns"], s["gpu_end_ns"])
    if gpu.any():
        has_gpu = True
        fig.add_trace(_trace(
            "GPU step", "step", s["gpu_start_ns"][gpu].astype(np.int64),
            s["gpu_end_ns"][gpu].astype(np.int64), s["step"][gpu], t0_ns, LANES["GPU step"],
            STEP_COLOR,
        ))  # fmt: skip
    notes = []
    if not has_gpu:
        notes.append(f"GPU lanes: not measured on this run: {why_no_gpu(data)}")
    window = data.detail_window
    if window is not None:
        in_window = (s["step"] >= window[0]) & (s["step"] <= window[1])
        notes.append(
            f"phase detail for steps {window[0]}–{window[1]} only ({int(in_window.sum()):,} of "
            f"{data.num_steps:,} steps; by default the window around the slowest step, "
            "mrv2-prof report --window A:B moves it); every step keeps its overall CPU and GPU "
            "span. The view opens on that window: double-click to see the whole run."
        )
        if in_window.any():
            lo = (np.nanmin(s["cpu_start_ns"][in_window].astype(np.float64)) - t0_ns) / 1e6
            hi = (np.nanmax(s["cpu_end_ns"][in_window].astype(np.float64)) - t0_ns) / 1e6
            fig.update_xaxes(range=[lo, hi])
    fig.update_layout(
        height=380, hovermode="closest", dragmode="zoom",
        xaxis_title="ms since step 0 started",
        yaxis={"tickvals": list(LANES.values()), "ticktext": list(LANES), "fixedrange": True,
               "range": [-0.6, 3.6]},
    )  # fmt: skip
    return new_figure(
        fig, "timeline", title, notes, t0_ns=t0_ns, num_steps=data.num_steps,
        detail_window=list(window) if window else None,
    )  # fmt: skip
