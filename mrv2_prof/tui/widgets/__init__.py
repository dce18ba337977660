"""Dashboard widgets, one per module."""

from mrv2_prof.tui.widgets.panel_deck import PANELS, PanelDeck
from mrv2_prof.tui.widgets.run_progress import RunProgress

__all__ = ["PANELS", "PanelDeck", "RunProgress"]
