"""Speculative decoding's report figures: acceptance per position, the accepted-length histogram
and the draft / verify time split (``store.spec_metrics``, vLLM's meanings); and per step, the
draft slots reserved and reclaimed, the requests that sat out and dynamic k's decision (the
``steps.spec_*`` columns)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mrv2_prof.analysis.run_data import RunData
from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure


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


def _step_column(data: RunData, name: str) -> np.ndarray:
    values = data.steps.get(name)
    if values is None:
        return np.full(data.num_steps, np.nan)
    return values.astype(np.float64)


def spec_steps(data: RunData) -> Figure:
    title = "Speculative decoding per step: draft slots and dynamic k"
    step = data.steps["step"]
    reserved, reclaimed = _step_column(data, "spec_reserved"), _step_column(data, "spec_reclaimed")
    sat_out, k = _step_column(data, "spec_sat_out"), _step_column(data, "spec_k")
    expected = _step_column(data, "spec_expected_tokens")
    cost = _step_column(data, "spec_cost_ratio")
    decided = ~np.isnan(expected) & ~np.isnan(cost) & (cost > 0)
    slots = np.nansum(reserved) + np.nansum(reclaimed) + np.nansum(sat_out)
    if slots == 0 and not decided.any():
        why = (
            "no step reserved draft slots or made a dynamic-k decision "
            "(runner.spec_decode.method none, or a run stored before these columns)"
        )
        return NotMeasured("spec_steps", title, why)
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
        specs=[[{}], [{"secondary_y": True}]],
        subplot_titles=("draft slots per step", "dynamic k: k chosen, expected tokens / cost"),
    )  # fmt: skip
    for name, values in (("reserved", reserved), ("reclaimed", reclaimed)):
        fig.add_trace(
            go.Scattergl(x=step, y=values, mode="lines", name=f"slots {name}",
                         hovertemplate=f"step %{{x}}: %{{y:.0f}} slots {name}<extra></extra>"),
            row=1, col=1,
        )  # fmt: skip
    if np.nansum(sat_out) > 0:
        fig.add_trace(
            go.Scattergl(x=step, y=sat_out, mode="markers", name="requests sat out",
                         marker={"size": 4, "symbol": "x"},
                         hovertemplate="step %{x}: %{y:.0f} requests sat out<extra></extra>"),
            row=1, col=1,
        )  # fmt: skip
    fig.add_trace(
        go.Scattergl(x=step, y=k, mode="lines", name="k chosen", line={"shape": "hv"},
                     hovertemplate="step %{x}: k %{y:.0f}<extra></extra>"),
        row=2, col=1,
    )  # fmt: skip
    if decided.any():
        pays = expected[decided] / cost[decided]
        fig.add_trace(
            go.Scattergl(
                x=step[decided], y=pays, mode="markers", name="expected tokens / cost ratio",
                marker={"size": 4}, customdata=np.stack([expected[decided], cost[decided]], 1),
                hovertemplate="step %{x}: %{y:.2f} (%{customdata[0]:.2f} tokens / "
                "%{customdata[1]:.2f}× time)<extra></extra>",
            ),
            row=2, col=1, secondary_y=True,
        )  # fmt: skip
        fig.add_hline(y=1, line_dash="dash", row=2, col=1, secondary_y=True,
                      annotation_text="pays above")  # fmt: skip
    fig.update_yaxes(title_text="slots / requests", row=1, col=1)
    fig.update_yaxes(title_text="k", row=2, col=1)
    fig.update_yaxes(title_text="expected tokens / cost", row=2, col=1, secondary_y=True)
    fig.update_xaxes(title_text="step", row=2, col=1)
    notes = _spec_step_notes(data)
    return new_figure(
        fig, "spec_steps", title, notes,
        reserved_slots=float(np.nansum(reserved)), reclaimed_slots=float(np.nansum(reclaimed)),
        sat_out_requests=float(np.nansum(sat_out)), decided_steps=int(decided.sum()),
    )  # fmt: skip


def _spec_step_notes(data: RunData) -> list[str]:
    d = data.spec
    notes = [
        "reserved: draft slots scheduled in the batch queued in the step (KV slots and token "
        "budget); reclaimed: slots the verifies read in the step gave back (rejected drafts and "
        "placeholders); sat out: requests that waited a step because drafting is on the host",
        "dynamic k: the step's k (0: speculation off) and, where it decided, the tokens a "
        "verifying request is expected to emit at its best k over that k's step-time ratio to a "
        "plain decode; speculation pays above 1",
    ]
    if d is None or d.reserved_slots is None:
        return notes
    share = "-" if d.reclaimed_share is None else f"{d.reclaimed_share:.1%}"
    notes.append(
        f"{d.reserved_slots:,} slots reserved, {d.reclaimed_slots or 0:,} reclaimed ({share}); "
        f"{d.sat_out_requests or 0:,} requests sat out in {d.sat_out_steps or 0:,} steps; "
        f"k = 0 in {d.k_off_steps:,} of {d.decided_steps:,} steps decided"
    )
    return notes
