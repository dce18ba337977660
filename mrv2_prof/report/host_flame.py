"""The host sampler's flame graph: a Plotly icicle of the sampled stacks, one branch per phase.

The root is every sample of the run; its children are the CPU phases the samples fell in (and
``idle``: between phases, ``startup``: before the first step); below a phase, each frame of the
stack, root first. A node's width is the wall time of the samples whose stack passes through
it (each sample stands for the time since the run's sample before it,
``analysis.host_samples.stack_seconds``), so a wide leaf is where host time went; its hover
gives the seconds, the share of the sampled time and the samples. The widths are whole
microseconds (each row's seconds rounded once), so that a node is exactly the sum of its
children, as Plotly's ``branchvalues="total"`` needs. Time and not counts: the
sampler is a thread and cannot sample while a C call holds the GIL (torch's import loading its
extension, a database write), so counts make a 0.4 s stall one sample's width.
"""

from __future__ import annotations

import plotly.graph_objects as go

from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure

FIG_ID = "host_flame"
TITLE = "Host time by phase (sampled)"
ROOT = "all samples"


def icicle_nodes(
    rows: list[tuple[str, str, float, int]],
) -> tuple[list[str], list[str], list[str], list[int], list[int]]:
    """``(ids, labels, parents, microseconds, samples)`` of the tree over ``(phase, stack,
    seconds, samples)`` rows; every node's microseconds and samples are the sums over the
    stacks below it (``branchvalues="total"``)."""
    values: dict[str, list[int]] = {ROOT: [0, 0]}
    labels, parents = {ROOT: ROOT}, {ROOT: ""}
    for phase, stack, seconds, n in rows:
        us = round(seconds * 1e6)
        path = [phase, *stack.split(";")] if stack else [phase]
        parent = ROOT
        for depth, label in enumerate(path):
            node = f"{parent}\x1f{label}" if depth else phase
            if node not in values:
                values[node], labels[node], parents[node] = [0, 0], label, parent
            values[node][0] += us
            values[node][1] += n
            parent = node
        values[ROOT][0] += us
        values[ROOT][1] += n
    ids = list(values)
    return (
        ids,
        [labels[i] for i in ids],
        [parents[i] for i in ids],
        [values[i][0] for i in ids],
        [values[i][1] for i in ids],
    )


def host_flame(rows: list[tuple[str, str, float, int]], sampling_hz: float) -> Figure:
    if not rows:
        why = (
            "probes.host_sampling_hz was 0"
            if not sampling_hz
            else "no host samples were stored (see the run's notes)"
        )
        return NotMeasured(FIG_ID, TITLE, why)
    ids, labels, parents, micros, samples = icicle_nodes(rows)
    fig = go.Figure(
        go.Icicle(
            ids=ids,
            labels=labels,
            parents=parents,
            values=micros,
            customdata=[[us / 1e6, n] for us, n in zip(micros, samples, strict=True)],
            branchvalues="total",
            hovertemplate="%{label}<br>%{customdata[0]:.3f} s (%{percentRoot:.1%}), "
            "%{customdata[1]} samples<extra></extra>",
            maxdepth=12,
        )
    )
    fig = new_figure(
        fig, FIG_ID, TITLE, [], num_samples=samples[0], sampled_s=micros[0] / 1e6,
        sampling_hz=sampling_hz,
    )  # fmt: skip
    fig.update_layout(height=700)
    return fig
