"""Throughput: steps/s and output tokens/s (with their recent history), steps, tokens, requests."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.widgets import Sparkline

from mrv2_prof.snapshot import Snapshot
from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import format_count, format_rate

HISTORY = 120  # snapshots of tokens/s in the sparkline (~30 s at 4 snapshots/s)


class ThroughputPanel(Panel):
    KEY, NAME, TITLE = "2", "throughput", "throughput"

    def __init__(self) -> None:
        super().__init__()
        self.history: deque[float] = deque(maxlen=HISTORY)

    def compose(self) -> ComposeResult:
        yield ValueRow("output tok/s", "tokens-per-s")
        yield ValueRow("steps/s", "steps-per-s")
        yield ValueRow("steps", "num-steps")
        yield ValueRow("output tokens", "output-tokens")
        yield ValueRow("finished", "num-finished")
        yield ValueRow("aborted", "num-aborted")
        yield Sparkline([], id="tokens-spark", summary_function=max)

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        self.set_value("tokens-per-s", format_rate(s.tokens_per_s))
        self.set_value("steps-per-s", format_rate(s.steps_per_s))
        self.set_value("num-steps", format_count(s.steps))
        self.set_value("output-tokens", format_count(s.output_tokens))
        self.set_value("num-finished", format_count(s.num_finished))
        self.set_value("num-aborted", format_count(s.num_aborted))
        self.history.append(s.tokens_per_s)
        self.query_one("#tokens-spark", Sparkline).data = list(self.history)
