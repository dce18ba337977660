"""The report's kernel table: per op of the model over the kernel-trace window, its launches and
device time per step, the bytes and FLOPs its shapes imply, what it achieved and its share of
the binding roof (``analysis/kernel_roofline.py``), most device time first; the ops far from
their roof as a note (the same as the finding)."""

from __future__ import annotations

import plotly.graph_objects as go

from mrv2_prof.analysis.kernel_roofline import KernelRoofline, OpRow, far_from_roof, op_line
from mrv2_prof.report.figure_meta import Figure, NotMeasured, new_figure
from mrv2_prof.views.format import format_bytes

FIG_ID = "kernel_ops"
TITLE = "Kernels per op: the kernel-trace window against the roofline"
HEADER = ("op", "launches / step", "µs / step", "share of time", "bytes / step", "TB/s",
          "TFLOP/s", "% of roof")  # fmt: skip


def _cells(r: OpRow) -> tuple[str, ...]:
    costed = r.bytes_per_s is not None
    roof = f"{100 * r.fraction:.0f} % ({r.bound})" if r.fraction is not None else "-"
    return (
        r.op, f"{r.launches:.1f}", f"{r.us:,.1f}", f"{100 * r.share:.1f} %",
        format_bytes(int(r.bytes)) if costed else "-",
        f"{r.bytes_per_s / 1e12:.2f}" if costed else "-",
        f"{r.flops_per_s / 1e12:.3g}" if costed else "-", roof,
    )  # fmt: skip


def kernel_table(table: KernelRoofline | None) -> Figure:
    if table is None or table.why:
        return NotMeasured(FIG_ID, TITLE, table.why if table else "no kernel table computed")
    cells = [_cells(r) for r in table.rows]
    fig = go.Figure(
        go.Table(
            header={"values": list(HEADER), "align": "left"},
            cells={"values": [list(col) for col in zip(*cells, strict=True)],
                   "align": ["left"] + ["right"] * (len(HEADER) - 1)},
        )
    )  # fmt: skip
    fig.update_layout(height=120 + 28 * len(cells))
    notes = [f"{table.steps} steps, {table.tokens_per_step:.3g} tokens per step"]
    notes += [f"far from the roof: {op_line(r)}" for r in far_from_roof(table)]
    return new_figure(fig, FIG_ID, TITLE, notes + table.notes, ops=[r.op for r in table.rows])
