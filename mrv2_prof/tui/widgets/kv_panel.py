"""KV cache and scheduling: block usage, preemptions, and the waiting / running queues."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import ProgressBar

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import format_count, format_percent
from mrv2_prof.views.snapshot import Snapshot


class KvPanel(Panel):
    KEY, NAME, TITLE = "8", "kv", "KV cache & queue"

    def compose(self) -> ComposeResult:
        yield ValueRow("KV blocks used", "kv-usage")
        yield ProgressBar(total=100, show_eta=False, show_percentage=False, id="kv-bar")
        yield ValueRow("preemptions", "num-preemptions")
        yield ValueRow("running", "num-running")
        yield ValueRow("waiting", "num-waiting")

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        self.set_value("kv-usage", format_percent(s.kv_usage))
        self.query_one("#kv-bar", ProgressBar).update(progress=round(100 * s.kv_usage, 1))
        self.set_value("num-preemptions", format_count(s.num_preemptions))
        self.set_value("num-running", format_count(s.num_running))
        self.set_value("num-waiting", format_count(s.num_waiting))
