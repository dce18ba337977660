"""What every report figure carries: ``layout.meta = {"id": <figure id>, "notes": [...], ...facts}``
(so the HTML page and the tests find it by id), one template, and ``NotMeasured`` (id, title,
why) in place of a figure whose data the run did not record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from mrv2_prof.analysis.run_data import RunData

TEMPLATE = "plotly_white"


@dataclass(frozen=True)
class NotMeasured:
    """A figure this run has no data for, and why (shown as text in its place)."""

    fig_id: str
    title: str
    why: str


Figure = go.Figure | NotMeasured


def new_figure(fig: go.Figure, fig_id: str, title: str, notes: list[str], **facts: Any):
    fig.update_layout(
        title=title, template=TEMPLATE, meta={"id": fig_id, "notes": notes, **facts},
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
    )  # fmt: skip
    return fig


def why_no_gpu(data: RunData, what: str = "GPU times") -> str:
    if not data.is_cuda:
        return f"the run was on {data.device}; {what} need a CUDA device and probes.cuda_events"
    if not data.probes.get("cuda_events", True):
        return "probes.cuda_events was off"
    return f"no {what} were stored (see the run's notes)"
