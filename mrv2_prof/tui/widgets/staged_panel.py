"""Staged writes: bytes the StagedWriteTensor writes moved vs what dense copies would have."""

from __future__ import annotations

from textual.app import ComposeResult

from mrv2_prof.tui.widgets.panel import Panel
from mrv2_prof.tui.widgets.value_row import ValueRow
from mrv2_prof.views.format import format_bytes, format_percent, staged_ratio
from mrv2_prof.views.snapshot import Snapshot


class StagedPanel(Panel):
    KEY, NAME, TITLE = "7", "staged", "staged writes"

    def compose(self) -> ComposeResult:
        yield ValueRow("staged", "staged-bytes")
        yield ValueRow("dense", "dense-bytes")
        yield ValueRow("staged/dense", "staged-ratio")
        yield ValueRow("not copied", "saved-bytes")

    def show(self, snapshot: Snapshot) -> None:
        s = snapshot
        self.set_value("staged-bytes", format_bytes(s.staged_bytes))
        self.set_value("dense-bytes", format_bytes(s.dense_bytes))
        self.set_value("staged-ratio", format_percent(staged_ratio(s.staged_bytes, s.dense_bytes)))
        self.set_value("saved-bytes", format_bytes(max(s.dense_bytes - s.staged_bytes, 0)))
