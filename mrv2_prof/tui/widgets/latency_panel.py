"""Latency so far: TTFT, TPOT and ITL at p50 and p99 (the definitions of ``store.latency``)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Label, Static

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.views.format import NO_VALUE, format_ms
from mrv2_prof.views.snapshot import Snapshot

METRICS = (
    ("ttft", "TTFT", "time to first token"),
    ("tpot", "TPOT", "per output token"),
    ("itl", "ITL", "between tokens"),
)


class LatencyPanel(Panel):
    KEY, NAME, TITLE = "3", "latency", "latency so far"

    def compose(self) -> ComposeResult:
        with Grid(id="latency-grid"):
            yield Label("")
            yield Label("p50", classes="head")
            yield Label("p99", classes="head")
            for key, name, _ in METRICS:
                yield Label(name, classes="name")
                for q in ("p50", "p99"):
                    yield Static(NO_VALUE, id=f"{key}-{q}", classes="value", markup=False)
        yield Static(
            "TTFT: arrival → first token · TPOT: per token after the first · ITL: token gaps",
            classes="hint",
            markup=False,
        )

    def show(self, snapshot: Snapshot) -> None:
        for key, _, _ in METRICS:
            for q in ("p50", "p99"):
                self.set_value(f"{key}-{q}", format_ms(getattr(snapshot, f"{key}_ms_{q}")))
