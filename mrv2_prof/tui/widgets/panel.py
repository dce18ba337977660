"""The base of every dashboard panel: a bordered card that shows part of a snapshot."""

from __future__ import annotations

from typing import ClassVar

from textual.containers import Vertical
from textual.widgets import Static

from mrv2_prof.views.safe_text import plain
from mrv2_prof.views.snapshot import Snapshot


class Panel(Vertical):
    """A card titled ``KEY NAME``; ``KEY`` (1..9) selects it. Subclasses compose their values
    (ids unique in the app) and fill them in ``show``."""

    KEY: ClassVar[str] = ""
    NAME: ClassVar[str] = ""  # also the widget id: panel-NAME
    TITLE: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__(id=f"panel-{self.NAME}", classes="panel")

    def on_mount(self) -> None:
        self.border_title = f"{self.KEY} {self.TITLE}"

    def show(self, snapshot: Snapshot) -> None:
        raise NotImplementedError

    def set_value(self, value_id: str, text: str) -> None:
        self.query_one(f"#{value_id}", Static).update(plain(text))

    def set_lines(self, value_id: str, lines: list[str]) -> None:
        """A ``.list`` value: one line each, cut with an ellipsis when the panel is narrow."""
        self.query_one(f"#{value_id}", Static).update("\n".join(map(plain, lines)))
