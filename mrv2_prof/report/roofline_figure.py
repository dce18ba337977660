"""The report's roofline chart: each step a point at its arithmetic intensity (FLOPs per byte
it must move) and its achieved TFLOP/s, decode and prefill steps apart, under the roof
min(bandwidth x intensity, tensor-core peak) of the run's GPU (``analysis/roofline.py``). A point
on the roof ran at the machine's limit; its height under the roof is the step's fraction."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from mrv2_prof.analysis.roofline import Roofline, roofline_line
from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure

TITLE = "Roofline: each step's achieved throughput against the machine's limits"


def roofline_figure(roof: Roofline | None) -> Figure:
    if roof is None or roof.per_step is None:
        why = roof.note if roof is not None else "no roofline"
        return NotMeasured("roofline", TITLE, why.removeprefix("no roofline: "))
    s = roof.per_step
    intensity = s.flops / s.bytes
    fig = go.Figure()
    for kind, mask in (("decode", s.decode), ("prefill", ~s.decode)):
        if mask.any():
            fig.add_trace(
                go.Scattergl(
                    x=intensity[mask], y=s.flops_per_s[mask] / 1e12, mode="markers", name=kind,
                    customdata=np.stack([s.step[mask], 100 * s.fraction[mask]], axis=-1),
                    hovertemplate="step %{customdata[0]}: %{customdata[1]:.0f}% of the roof"
                    "<br>%{x:.3g} FLOP/byte, %{y:.3g} TFLOP/s<extra></extra>",
                )
            )  # fmt: skip
    bandwidth = roof.peaks["hbm_read_bytes_per_s"]
    peak = roof.peaks.get("tensor_flops_per_s")
    lo, hi = float(intensity.min()) / 2, float(intensity.max()) * 2
    if peak:
        hi = max(hi, 2 * peak / bandwidth)
    x = np.geomspace(max(lo, 1e-3), hi, 200)
    y = bandwidth * x if not peak else np.minimum(bandwidth * x, peak)
    fig.add_trace(go.Scatter(x=x, y=y / 1e12, mode="lines", name="roof", line={"color": "#444"}))
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved)")
    fig.update_yaxes(type="log", title_text="achieved TFLOP/s")
    fig.update_layout(height=450)
    notes = [roofline_line(roof)] + ([roof.note] if roof.note else [])
    return new_figure(fig, "roofline", TITLE, notes, steps=len(s.step))
