"""The live run dashboard: polls a ``SnapshotSource`` and shows the newest snapshot in panels.

The app only renders; the run lives in another process, the runner's. Quitting asks the runner
to stop cleanly and waits for it to report done, so the data recorded so far is kept. Which
panels are on screen depends on the size (``PanelDeck``): one at a time at 80×24, the overview
beside the picked one at 120 columns, all nine from 160.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from mrv2_prof.tui.screens.help_screen import HelpScreen
from mrv2_prof.tui.source import SnapshotSource
from mrv2_prof.tui.widgets import PANELS, PanelDeck, RunProgress
from mrv2_prof.views.safe_text import plain
from mrv2_prof.views.snapshot import Snapshot

STOPPING_TEXT = "stopping… (data so far is kept)"
PAUSED_TEXT = "display paused — the run continues (p to resume)"

KEYS = [
    ("q", "stop the run (the data so far is kept) and quit"),
    ("p", "pause / resume the display (the run goes on)"),
    ("tab / shift+tab", "next / previous panel"),
    *((panel.KEY, f"{panel.TITLE} panel") for panel in PANELS),
    ("?", "this help"),
]
NOTES = [
    "A picked panel shows alone below 120 columns, beside the overview below 160, and is "
    "highlighted among all nine from 160.",
    "The bar: output tokens settled (made, or no longer due as a request ended) of the sum of "
    "every request's max_tokens.",
    "Sparklines: oldest at the left (its age and the peak are under it), now at the right.",
]


class DashboardApp(App[str]):
    """Exits with ``"done"`` when the run ends by itself, ``"stopped"`` after the user quit."""

    CSS_PATH = "dashboard.tcss"
    BINDINGS = [
        Binding("q", "stop", "Stop run"),
        Binding("ctrl+q", "stop", "Stop run", show=False, priority=True),
        # The terminal is in raw mode: Ctrl-C arrives as a key, not as SIGINT; it stops the run
        # as SIGINT would (the CLI exits 130), q stops it as a plain quit.
        Binding("ctrl+c", "interrupt", "Stop run", show=False, priority=True),
        Binding("p", "toggle_pause", "Pause"),
        Binding("tab", "cycle_panel(1)", "Next panel", priority=True),
        Binding("shift+tab", "cycle_panel(-1)", "Previous panel", show=False, priority=True),
        *(
            Binding(panel.KEY, f"select_panel({i})", panel.TITLE, show=False)
            for i, panel in enumerate(PANELS)
        ),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, source: SnapshotSource, title: str, poll_interval_s: float = 0.1) -> None:
        super().__init__()
        self.title = plain(title)
        self.source = source
        self.poll_interval_s = poll_interval_s
        self.latest: Snapshot | None = None  # newest received, shown or not (paused)
        self.paused = False
        self.stopping = False
        self._poll_timer: Timer | None = None
        self._gpu_shown: tuple[object, ...] | None = None  # what the GPU panels show now

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunProgress()
        yield PanelDeck()
        yield Static("", id="status", markup=False)
        yield Footer()

    @property
    def deck(self) -> PanelDeck:
        return self.query_one(PanelDeck)

    def on_mount(self) -> None:
        self._poll_timer = self.set_interval(self.poll_interval_s, self.poll_source)

    def poll_source(self) -> None:
        """Take the newest snapshot (kept while paused, so nothing piles up) and exit when done."""
        snapshot, done = self.source.poll()
        if snapshot is not None:
            self.latest = snapshot
            if not self.paused:
                self._show(snapshot)
        if not self.paused:
            self._show_gpu()
        if done:
            if self._poll_timer is not None:
                self._poll_timer.stop()
            self.exit("stopped" if self.stopping else "done")

    def action_stop(self, signum: int = 0) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.source.request_stop(signum)
        self._show_status()

    def action_interrupt(self) -> None:
        self.action_stop(signal.SIGINT)

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused and self.latest is not None:
            self._show(self.latest)
            self._show_gpu()
        self._show_status()

    def action_cycle_panel(self, step: int) -> None:
        self.deck.select(self.deck.selected + step)

    def action_select_panel(self, index: int) -> None:
        self.deck.select(index)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen("dashboard keys", KEYS, quit_action="stop", notes=NOTES))

    def _show(self, snapshot: Snapshot) -> None:
        label = plain(snapshot.label)
        self.sub_title = "" if label == self.title else label  # the header names the run once
        self.query_one(RunProgress).show(snapshot)
        self.deck.show(snapshot)

    def _show_gpu(self) -> None:
        samples: Sequence[Sequence[float]]
        samples, note = self.source.gpu_samples()
        device = self.latest.device if self.latest is not None else ""
        key = (len(samples), samples[-1][0] if samples else None, note, device)
        if key != self._gpu_shown:
            self._gpu_shown = key
            self.deck.show_gpu(samples, note, device)

    def _show_status(self) -> None:
        flags = ((self.stopping, STOPPING_TEXT), (self.paused, PAUSED_TEXT))
        parts = [text for on, text in flags if on]
        self.query_one("#status", Static).update("   ".join(parts))
