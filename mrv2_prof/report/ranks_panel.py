"""The report's tensor-parallel panel (``rank_steps``): each rank's step time and its time in
collectives, step by step, one line per rank; ``comm_share`` per rank is the sum of its
collective time over the sum of its step time (as in ``analysis.rank_steps``)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mrv2_prof.analysis.rank_steps import Ranks
from mrv2_prof.report.figure_meta import Figure, new_figure

TITLE = "Tensor parallel: each rank's step time and its time in collectives"


def ranks_figure(ranks: Ranks) -> Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    share = {}
    for rank, c in ranks.items():
        fig.add_trace(go.Scattergl(x=c["step"], y=c["step_ms"], mode="lines",
                                   name=f"rank {rank} step"), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scattergl(x=c["step"], y=c["comm_ms"], mode="lines",
                                   name=f"rank {rank} collectives"), row=2, col=1)  # fmt: skip
        total = float(c["step_ms"].sum())
        share[str(rank)] = float(c["comm_ms"].sum()) / total if total > 0 else None
    fig.update_yaxes(title_text="step ms", row=1, col=1)
    fig.update_yaxes(title_text="collectives ms", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(height=500)
    notes = [
        f"rank {r}: collectives {100 * v:.0f}% of its step time"
        for r, v in share.items()
        if v is not None
    ]
    return new_figure(fig, "ranks", TITLE, notes, comm_share=share, ranks=len(ranks))
