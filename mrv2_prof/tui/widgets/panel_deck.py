"""The dashboard's panels and how they share the screen, in three layouts by the deck's size.

* narrow (below ``SIDE_MIN``, e.g. 80×24): one panel at a time fills the body, the overview by
  default; keys 1..9 and tab pick another.
* side (``SIDE_MIN`` up to ``GRID_MIN``, e.g. 120×40): the overview beside the selected detail
  panel (the last one picked while the overview itself is selected).
* grid (``GRID_MIN`` and up, e.g. 160×48): all nine panels, the overview, sync points and CUDA
  graphs two cells wide (their lines are long), the selected one highlighted.

In every layout the selected panel is on screen and highlighted, so a key does what the help
says at any size.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual import events
from textual.app import ComposeResult
from textual.containers import Container

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
from mrv2_prof.views.snapshot import Snapshot

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
# the deck's own width and height (the terminal less 5 rows of header, progress, status, footer)
SIDE_MIN = (120, 19)  # the overview (80 columns) beside a detail panel
GRID_MIN = (160, 40)  # all nine: rows of 12+ lines inside, columns of 36+ (76+ for the wide ones)
LAYOUTS = ("narrow", "side", "grid")
# the grid's order (4 columns, 3 rows; the wide panels take two cells)
GRID_ORDER = (
    *("overview", "throughput", "latency"),
    *("overlap", "syncs", "staged"),
    *("graphs", "kv", "gpu"),
)


def layout_for(width: int, height: int) -> str:
    if width >= GRID_MIN[0] and height >= GRID_MIN[1]:
        return "grid"
    if width >= SIDE_MIN[0] and height >= SIDE_MIN[1]:
        return "side"
    return "narrow"


class PanelDeck(Container):
    def __init__(self) -> None:
        super().__init__(id="deck")
        self.selected = 0  # index into PANELS
        self.detail = 1  # the detail panel the side layout shows (the last one selected)
        self.layout_name = "narrow"

    def compose(self) -> ComposeResult:
        by_name = {panel.NAME: panel for panel in PANELS}
        for name in GRID_ORDER:
            yield by_name[name]()

    @property
    def panels(self) -> list[Panel]:
        """The panels in key order (``PANELS``), not in the grid's."""
        return [self.query_one(f"#panel-{panel.NAME}", Panel) for panel in PANELS]

    @property
    def wide(self) -> bool:
        """More than one panel on screen."""
        return self.layout_name != "narrow"

    def on_mount(self) -> None:
        self._arrange()

    def on_resize(self, event: events.Resize) -> None:
        name = layout_for(event.size.width, event.size.height)
        if name != self.layout_name:
            self.layout_name = name
            for other in LAYOUTS:
                self.set_class(other == name, f"-{other}")
            self._arrange()

    def select(self, index: int) -> None:
        """Select panel ``index`` (wrapping around)."""
        self.selected = index % len(PANELS)
        if self.selected:
            self.detail = self.selected
        self._arrange()

    def _arrange(self) -> None:
        shown = {
            "narrow": {self.selected},
            "side": {0, self.detail},
            "grid": set(range(len(PANELS))),
        }[self.layout_name]
        for i, panel in enumerate(self.panels):
            panel.display = i in shown
            panel.set_class(i == self.selected, "-selected")

    def show(self, snapshot: Snapshot) -> None:
        for panel in self.panels:
            panel.show(snapshot)

    def show_gpu(self, samples: Sequence[Sequence[float]], note: str | None, device: str) -> None:
        self.query_one(OverviewPanel).show_gpu(samples, note, device)
        self.query_one(GpuPanel).show_gpu(samples, note, device)
