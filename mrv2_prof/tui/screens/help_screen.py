"""A modal list of the keys of the screen below it; escape or ? closes it, q still quits."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    #help-box {
        width: 72;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        padding: 1 2;
        border: round $accent;
        background: $surface;
    }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "quit_app", "Quit", show=False),
    ]

    def __init__(
        self, title: str, keys: Sequence[tuple[str, str]], quit_action: str = "quit"
    ) -> None:
        """``quit_action``: the app's action that ``q`` runs (after closing the help)."""
        super().__init__()
        self.help_title = title
        self.keys = keys
        self.quit_action = quit_action

    def compose(self) -> ComposeResult:
        table = Table(show_header=False, box=None, pad_edge=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for key, what in self.keys:
            table.add_row(key, what)
        box = Vertical(id="help-box")
        box.border_title = self.help_title
        box.border_subtitle = "escape or ? closes"
        with box:
            yield Static(table, id="help-keys")

    def action_close(self) -> None:
        self.dismiss()

    async def action_quit_app(self) -> None:
        self.dismiss()
        await self.app.run_action(self.quit_action)
