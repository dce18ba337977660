"""One named value of a dashboard panel: ``name ...... value``."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Static

from mrv2_prof.views.format import NO_VALUE


class ValueRow(Horizontal):
    """A muted name and a bold value; the value is a ``Static`` with id ``value_id``."""

    def __init__(self, name: str, value_id: str) -> None:
        super().__init__(classes="row")
        self._name = name
        self._value_id = value_id

    def compose(self) -> ComposeResult:
        yield Label(self._name, classes="name")
        yield Static(NO_VALUE, id=self._value_id, classes="value", markup=False)
