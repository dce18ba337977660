"""The run browser (``mrv2-prof tui``): list the runs of a database, open one, compare two.

A thin app: each screen owns its table and reads the store in worker threads
(``screens/runs_screen.py``, ``run_screen.py``, ``compare_screen.py``).
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from mrv2_prof.tui.screens.help_screen import HelpScreen
from mrv2_prof.tui.screens.runs_screen import RunsScreen
from mrv2_prof.views.safe_text import plain

KEYS = [
    ("enter", "open the run under the cursor: summary and step timeline"),
    ("c", "mark the run as A; c on another run compares the two side by side"),
    ("s / t / r", "in a run: its summary / its step timeline / its requests"),
    ("o", "in a step timeline: the slowest steps first (again: step order)"),
    ("click a header", "in a step timeline or the requests: sort by it (again: the other way)"),
    ("/", "in a step timeline: filter, e.g. host>2, mode=none, syncs>0 or host_bound"),
    ("g", "in a step timeline: go to a step number"),
    ("] / [", "in a long step timeline: the next / previous page of steps"),
    ("r", "reload the run list"),
    ("escape", "back (or clear the A mark)"),
    ("q", "quit"),
    ("?", "this help"),
]


class BrowserApp(App[None]):
    CSS_PATH = "browser.tcss"
    TITLE = "mrv2-prof runs"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, db_path: Path) -> None:
        super().__init__()
        self.db_path = Path(db_path)
        self.sub_title = plain(self.db_path)

    def get_default_screen(self) -> Screen:
        return RunsScreen(self.db_path)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen("run browser keys", KEYS))
