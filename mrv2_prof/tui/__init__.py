"""Textual views: the live run dashboard (``dashboard``) and the run browser (``browser``).

Nothing here is imported eagerly: ``source``, ``format`` and ``digest`` stay importable
without Textual, so a headless progress bar (and tests) can share them. Widgets and screens
live one per module under ``widgets/`` and ``screens/``.
"""
