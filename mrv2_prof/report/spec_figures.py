"""Speculative decoding's report figure: acceptance per position, the accepted-length histogram
and the draft / verify time split (``store.spec_metrics``, vLLM's meanings)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure
from mrv2_prof.report.run_data import RunData


def spec_decode(data: RunData) -> Figure:
    title = "Speculative decoding: acceptance per position, accepted lengths, draft vs verify"
    d = data.spec
    if d is None:
        why = "no drafts were verified (runner.spec_decode.method none, or nothing matched)"
        return NotMeasured("spec_decode", title, why)
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=(
            "acceptance rate per position", "accepted drafts per verify", "draft vs verify ms",
        ),
    )  # fmt: skip
    positions = list(range(1, len(d.acceptance_per_position) + 1))
    fig.add_trace(
        go.Bar(x=positions, y=[100 * r for r in d.acceptance_per_position], name="accepted %",
               hovertemplate="position %{x}: %{y:.1f} % of drafts<extra></extra>"),
        row=1, col=1,
    )  # fmt: skip
    fig.add_trace(
        go.Bar(x=list(range(len(d.accepted_length_counts))), y=d.accepted_length_counts,
               name="verifies", hovertemplate="%{x} accepted: %{y} verifies<extra></extra>"),
        row=1, col=2,
    )  # fmt: skip
    fig.add_trace(
        go.Bar(x=[f"draft ({d.draft_track})", f"verify ({d.verify_track})"],
               y=[d.draft_ms, d.verify_ms], name="ms",
               hovertemplate="%{x}: %{y:.2f} ms<extra></extra>"),
        row=1, col=3,
    )  # fmt: skip
    fig.update_xaxes(title_text="draft position", row=1, col=1)
    fig.update_yaxes(title_text="% of drafts", range=[0, 102], row=1, col=1)
    fig.update_xaxes(title_text="accepted drafts", row=1, col=2)
    fig.update_yaxes(title_text="verifies", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=1, col=3)
    fig.update_layout(showlegend=False)
    share = "-" if d.draft_time_share is None else f"{d.draft_time_share:.1%}"
    notes = [
        f"{d.num_drafts:,} drafts, {d.num_accepted_tokens:,} of {d.num_draft_tokens:,} drafted "
        f"tokens accepted ({d.acceptance_rate:.1%}); mean acceptance length "
        f"{d.mean_acceptance_length:.2f} tokens per verify",
        f"draft time share {share} (draft / (draft + verify); draft: the draft phase, "
        f"{d.draft_track} track; verify: the forward and sample phases of the steps that "
        f"verified, {d.verify_track} track; on the gpu track busy time, each span less the "
        "time the device waited in it for the host)",
    ]
    return new_figure(
        fig, "spec_decode", title, notes,
        mean_acceptance_length=d.mean_acceptance_length, draft_time_share=d.draft_time_share,
    )  # fmt: skip
