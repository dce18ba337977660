"""Textual views: the live run dashboard (and, later, the run browser).

Nothing here is imported eagerly: ``mrv2_prof.tui.source`` and ``mrv2_prof.tui.format`` stay
importable without Textual, so a headless progress bar can share them.
"""
