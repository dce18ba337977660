"""A sweep's progress while its cells run side by side (``--max-parallel``, ``--executor ray``):
each cell's own line (started, landed, with where it ran and the counts) and, on a terminal, a
bar of the cells landed under them, saying how many are done, running and failed. Off a
terminal (a log, CI) only the lines are printed, as before.

``done`` counts the cells landed that did not fail (completed or stopped), ``failed`` the
failed ones, ``running`` the cells started and not landed (on Ray: the tasks submitted and not
returned, some of which may wait for a worker); the bar's position is ``done + failed``.
"""

from __future__ import annotations

from rich.console import Console


class SweepProgress:
    """``with SweepProgress(console, count) as progress:`` then ``progress.update(...)`` as
    the counts change and ``progress.say(line)`` for each cell's line."""

    def __init__(self, console: Console, count: int) -> None:
        self.console = console
        self.count = count
        self.counts = {"done": 0, "running": 0, "failed": 0}
        self._bar = None
        self._task = None

    def __enter__(self) -> SweepProgress:
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("cells"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[state]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task("cells", total=self.count, state=self.state())
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def state(self) -> str:
        c = self.counts
        return f"done {c['done']}, running {c['running']}, failed {c['failed']}"

    def update(self, *, done: int, running: int, failed: int) -> None:
        self.counts = {"done": done, "running": running, "failed": failed}
        if self._bar is not None:
            self._bar.update(self._task, completed=done + failed, state=self.state())

    def say(self, text: str) -> None:
        """A cell's line (rich markup), above the bar while it shows."""
        self.console.print(text, highlight=False, soft_wrap=True)
