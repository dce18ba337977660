"""A modal list of the keys of the screen below it, and notes on what it shows; escape or ?
closes it, q still quits."""

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
        width: 76;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        padding: 0 1;
        border: round $accent;
        background: $surface;
    }
    #help-notes {
        margin-top: 1;
        color: $text-muted;
    }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "quit_app", "Quit", show=False),
    ]

    def __init__(
        self,
        title: str,
        keys: Sequence[tuple[str, str]],
        quit_action: str = "quit",
        notes: Sequence[str] = (),
    ) -> None:
        """``quit_action``: the app's action that ``q`` runs (after closing the help); ``notes``:
        lines under the keys (what the screen's figures are)."""
        super().__init__()
        self.help_title = title
        self.keys = keys
        self.quit_action = quit_action
        self.notes = notes

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
            if self.notes:
                yield Static("\n".join(self.notes), id="help-notes", markup=False)

    def action_close(self) -> None:
        self.dismiss()

    async def action_quit_app(self) -> None:
        self.dismiss()
        await self.app.run_action(self.quit_action)
