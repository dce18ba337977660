"""The overview: one line per panel with its headline numbers (the view that fits 80×24), and
under them the output tokens/s of the last ~30 s on a time axis (left out in the full grid,
where the throughput panel beside it draws the same)."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.widgets import Static

from mrv2_prof.tui import digest
from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.spark_history import SparkHistory
from mrv2_prof.tui.widgets.throughput_panel import tok_per_s
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.snapshot import Snapshot

# value id (ov-NAME) -> row name, line of a snapshot
LINES = {
    "throughput": ("throughput", digest.throughput_line),
    "requests": ("requests", digest.requests_line),
    "latency": ("p50 / p99", digest.latency_line),
    "overlap": ("overlap", digest.overlap_line),
    "syncs": ("syncs", digest.syncs_line),
    "graphs": ("CUDA graphs", digest.graphs_line),
    "staged": ("staged", digest.staged_line),
    "kv": ("KV cache", digest.kv_line),
}


class OverviewPanel(Panel):
    KEY, NAME, TITLE = "1", "overview", "overview"

    def compose(self) -> ComposeResult:
        for key, (name, _) in LINES.items():
            yield ValueRow(name, f"ov-{key}")
            if key == "throughput":  # speculative decoding's row, shown once the run speculates
                spec = ValueRow("spec decode", "ov-spec")
                spec.display = False
                yield spec
        yield ValueRow("GPU", "ov-gpu")
        yield SparkHistory("ov-tokens-spark", name="output tok/s")

    def show(self, snapshot: Snapshot) -> None:
        for key, (_, line) in LINES.items():
            self.set_value(f"ov-{key}", line(snapshot))
        spec = digest.spec_line(snapshot)
        row = self.query_one("#ov-spec", Static).parent
        if row is not None:
            row.display = spec is not None
        if spec is not None:
            self.set_value("ov-spec", spec)
        self.query_one(SparkHistory).append(snapshot.elapsed_s, snapshot.tokens_per_s, tok_per_s)

    def show_gpu(self, samples: Sequence[Sequence[float]], note: str | None, device: str) -> None:
        self.set_value("ov-gpu", digest.gpu_line(samples, note, device))
