"""CUDA graphs: the mix of chosen modes, the replay hit rate and why the rest fell back."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Label, Static

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import NO_VALUE, format_count, format_percent, format_share
from mrv2_prof.views.snapshot import Snapshot


class GraphPanel(Panel):
    KEY, NAME, TITLE = "6", "graphs", "CUDA graphs"

    def compose(self) -> ComposeResult:
        yield ValueRow("hit rate", "graph-hit-rate")
        yield ValueRow("dispatches", "num-dispatches")
        yield Static(NO_VALUE, id="graph-modes", classes="list", markup=False)
        yield Label("top fallback reasons", classes="subhead")
        yield Static(NO_VALUE, id="graph-reasons", classes="list", markup=False)

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        total = sum(n for _, n in s.graph_mode_counts)
        self.set_value("graph-hit-rate", format_percent(s.graph_hit_rate))
        self.set_value("num-dispatches", format_count(total) if total else NO_VALUE)
        modes = [
            f"{mode:<10} {format_count(n)} ({format_share(n, total)})"
            for mode, n in s.graph_mode_counts
        ]
        self.set_lines("graph-modes", modes or [NO_VALUE])
        reasons = [f"{format_count(n)}  {reason}" for reason, n in s.top_fallback_reasons]
        self.set_lines("graph-reasons", reasons or [NO_VALUE])
