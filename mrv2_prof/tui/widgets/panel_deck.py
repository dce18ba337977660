"""The dashboard's panels and how they share the screen.

Narrow (below ``WIDE_MIN`` columns × rows, e.g. 80×24): one panel at a time fills the body, the
overview by default; keys 1..9 and tab pick another. Wide: the eight detail panels side by side
in a 4×2 grid (the overview, their digest, is left out) and the selected one is highlighted.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual import events
from textual.app import ComposeResult
from textual.containers import Container

from mrv2_prof.snapshot import Snapshot
from mrv2_prof.tui.widgets.gpu_panel import GpuPanel
from mrv2_prof.tui.widgets.graph_panel import GraphPanel
from mrv2_prof.tui.widgets.kv_panel import KvPanel
from mrv2_prof.tui.widgets.latency_panel import LatencyPanel
from mrv2_prof.tui.widgets.overlap_panel import OverlapPanel
from mrv2_prof.tui.widgets.overview_panel import OverviewPanel
from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.staged_panel import StagedPanel
from mrv2_prof.tui.widgets.sync_panel import SyncPanel
from mrv2_prof.tui.widgets.throughput_panel import ThroughputPanel

PANELS: tuple[type[Panel], ...] = (
    OverviewPanel,
    ThroughputPanel,
    LatencyPanel,
    OverlapPanel,
    SyncPanel,
    GraphPanel,
    StagedPanel,
    KvPanel,
    GpuPanel,
)
WIDE_MIN = (120, 24)  # the deck's own width and height for the grid of all panels


class PanelDeck(Container):
    def __init__(self) -> None:
        super().__init__(id="deck")
        self.selected = 0  # index into PANELS
        self.wide = False

    def compose(self) -> ComposeResult:
        for panel in PANELS:
            yield panel()

    @property
    def panels(self) -> list[Panel]:
        return [w for w in self.children if isinstance(w, Panel)]

    def on_mount(self) -> None:
        self._arrange()

    def on_resize(self, event: events.Resize) -> None:
        wide = event.size.width >= WIDE_MIN[0] and event.size.height >= WIDE_MIN[1]
        if wide != self.wide:
            self.wide = wide
            self.set_class(wide, "-wide")
            self._arrange()

    def select(self, index: int) -> None:
        """Select panel ``index`` (wrapping around)."""
        self.selected = index % len(PANELS)
        self._arrange()

    def _arrange(self) -> None:
        for i, panel in enumerate(self.panels):
            if self.wide:
                panel.display = not isinstance(panel, OverviewPanel)
            else:
                panel.display = i == self.selected
            panel.set_class(i == self.selected, "-selected")

    def show(self, snapshot: Snapshot) -> None:
        for panel in self.panels:
            panel.show(snapshot)

    def show_gpu(self, samples: Sequence[Sequence[float]], note: str | None, device: str) -> None:
        self.query_one(OverviewPanel).show_gpu(samples, note, device)
        self.query_one(GpuPanel).show_gpu(samples, note, device)
