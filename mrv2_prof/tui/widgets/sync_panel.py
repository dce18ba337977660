"""Sync points: how often the host waited for the GPU, for how long, and where (top sites)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Label, Static

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import NO_VALUE, format_count, format_ns_ms, format_rate, format_site
from mrv2_prof.views.snapshot import Snapshot


class SyncPanel(Panel):
    KEY, NAME, TITLE = "5", "syncs", "sync points"

    def compose(self) -> ComposeResult:
        yield ValueRow("syncs", "num-syncs")
        yield ValueRow("per step", "syncs-per-step")
        yield ValueRow("blocked", "sync-blocked")
        yield Label("top sites", classes="subhead")
        yield Static(NO_VALUE, id="sync-sites", classes="list", markup=False)

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        self.set_value("num-syncs", format_count(s.num_syncs))
        per_step = format_rate(s.num_syncs / s.steps, 2) if s.steps else NO_VALUE
        self.set_value("syncs-per-step", per_step)
        self.set_value("sync-blocked", format_ns_ms(s.sync_blocked_ns))
        width = max((len(format_count(n)) for _, n in s.top_sync_sites), default=0)
        lines = [f"{format_count(n):>{width}}  {format_site(site)}" for site, n in s.top_sync_sites]
        self.set_lines("sync-sites", lines or [NO_VALUE])
