"""Throughput: steps/s and output tokens/s (with their recent history on a time axis), steps,
tokens, requests."""

from __future__ import annotations

from textual.app import ComposeResult

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.spark_history import SparkHistory
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import format_count, format_rate
from mrv2_prof.views.snapshot import Snapshot


def tok_per_s(rate: float) -> str:
    return f"{format_rate(rate)} tok/s"


class ThroughputPanel(Panel):
    KEY, NAME, TITLE = "2", "throughput", "throughput"

    def compose(self) -> ComposeResult:
        yield ValueRow("output tok/s", "tokens-per-s")
        yield ValueRow("steps/s", "steps-per-s")
        yield ValueRow("steps", "num-steps")
        yield ValueRow("output tokens", "output-tokens")
        yield ValueRow("finished", "num-finished")
        yield ValueRow("aborted", "num-aborted")
        yield SparkHistory("tokens-spark")

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        self.set_value("tokens-per-s", format_rate(s.tokens_per_s))
        self.set_value("steps-per-s", format_rate(s.steps_per_s))
        self.set_value("num-steps", format_count(s.steps))
        self.set_value("output-tokens", format_count(s.output_tokens))
        self.set_value("num-finished", format_count(s.num_finished))
        self.set_value("num-aborted", format_count(s.num_aborted))
        self.query_one(SparkHistory).append(s.elapsed_s, s.tokens_per_s, tok_per_s)
