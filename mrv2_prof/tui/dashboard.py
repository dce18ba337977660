"""The live run dashboard: polls a ``SnapshotSource`` and shows the newest snapshot.

The app only renders; the run lives in another process (DESIGN.md §1). Quitting asks the runner
to stop cleanly and waits for it to report done, so the data recorded so far is kept.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from mrv2_prof.snapshot import Snapshot
from mrv2_prof.tui.source import SnapshotSource
from mrv2_prof.tui.widgets import RunProgress, StatsPanel

STOPPING_TEXT = "stopping… (data so far is kept)"
PAUSED_TEXT = "display paused — the run continues (p to resume)"


class DashboardApp(App[str]):
    """Exits with ``"done"`` when the run ends by itself, ``"stopped"`` after the user quit."""

    CSS_PATH = "dashboard.tcss"
    BINDINGS = [
        Binding("q", "stop", "Stop run"),
        Binding("ctrl+q", "stop", "Stop run", show=False, priority=True),
        # The terminal is in raw mode: Ctrl-C arrives as a key, not as SIGINT.
        Binding("ctrl+c", "stop", "Stop run", show=False, priority=True),
        Binding("p", "toggle_pause", "Pause display"),
    ]

    def __init__(self, source: SnapshotSource, title: str, poll_interval_s: float = 0.1) -> None:
        super().__init__()
        self.title = title
        self.source = source
        self.poll_interval_s = poll_interval_s
        self.latest: Snapshot | None = None  # newest received, shown or not (paused)
        self.paused = False
        self.stopping = False
        self._poll_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunProgress()
        yield StatsPanel()
        yield Static("", id="status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self._poll_timer = self.set_interval(self.poll_interval_s, self.poll_source)

    def poll_source(self) -> None:
        """Take the newest snapshot (kept while paused, so nothing piles up) and exit when done."""
        snapshot, done = self.source.poll()
        if snapshot is not None:
            self.latest = snapshot
            if not self.paused:
                self._show(snapshot)
        if done:
            if self._poll_timer is not None:
                self._poll_timer.stop()
            self.exit("stopped" if self.stopping else "done")

    def action_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.source.request_stop()
        self._show_status()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused and self.latest is not None:
            self._show(self.latest)
        self._show_status()

    def _show(self, snapshot: Snapshot) -> None:
        self.sub_title = snapshot.label
        self.query_one(RunProgress).show(snapshot)
        self.query_one(StatsPanel).show(snapshot)

    def _show_status(self) -> None:
        flags = ((self.stopping, STOPPING_TEXT), (self.paused, PAUSED_TEXT))
        parts = [text for on, text in flags if on]
        self.query_one("#status", Static).update("   ".join(parts))
