"""The host sampler's flame graph: a Plotly icicle of the sampled stacks, one branch per phase.

The root is every sample of the run; its children are the CPU phases the samples fell in (and
``idle``: between phases); below a phase, each frame of the stack, root first. A node's width
is the samples whose stack passes through it, so a wide leaf is where host time went.
"""

from __future__ import annotations

import plotly.graph_objects as go

from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure

FIG_ID = "host_flame"
TITLE = "Host samples by phase"
ROOT = "all samples"


def icicle_nodes(
    rows: list[tuple[str, str, int]],
) -> tuple[list[str], list[str], list[str], list[int]]:
    """``(ids, labels, parents, values)`` of the tree over ``(phase, stack, samples)`` rows;
    every node's value is the sum over the stacks below it (``branchvalues="total"``)."""
    values: dict[str, int] = {ROOT: 0}
    labels, parents = {ROOT: ROOT}, {ROOT: ""}
    for phase, stack, n in rows:
        values[ROOT] += n
        node, parent = phase, ROOT
        path = [phase, *stack.split(";")] if stack else [phase]
        for depth, label in enumerate(path):
            node = f"{parent}\x1f{label}" if depth else phase
            if node not in values:
                values[node], labels[node], parents[node] = 0, label, parent
            values[node] += n
            parent = node
    ids = list(values)
    return ids, [labels[i] for i in ids], [parents[i] for i in ids], [values[i] for i in ids]


def host_flame(rows: list[tuple[str, str, int]], sampling_hz: float) -> Figure:
    if not rows:
        why = (
            "probes.host_sampling_hz was 0"
            if not sampling_hz
            else "no host samples were stored (see the run's notes)"
        )
        return NotMeasured(FIG_ID, TITLE, why)
    ids, labels, parents, values = icicle_nodes(rows)
    fig = go.Figure(
        go.Icicle(
            ids=ids,
            labels=labels,
            parents=parents,
            values=values,
            branchvalues="total",
            hovertemplate="%{label}<br>%{value} samples (%{percentRoot:.1%})<extra></extra>",
            maxdepth=12,
        )
    )
    fig = new_figure(fig, FIG_ID, TITLE, [], num_samples=values[0], sampling_hz=sampling_hz)
    fig.update_layout(height=700)
    return fig
