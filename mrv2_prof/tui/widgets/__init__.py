"""Dashboard widgets, one per module."""

from mrv2_prof.tui.widgets.run_progress import RunProgress
from mrv2_prof.tui.widgets.stats_panel import StatsPanel

__all__ = ["RunProgress", "StatsPanel"]
