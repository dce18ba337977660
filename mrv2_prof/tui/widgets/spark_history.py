"""A sparkline with its time scale: the span it covers and its peak under it, newest at the right.

A bare sparkline says neither how far back it reaches nor what its full height means; the axis
line under it does (``12.3 s ago · peak 2,048 tok/s ... now``). The history is stretched over
the width: the left edge is the oldest value shown, the right edge the newest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from mrv2_prof.views.format import format_duration

HISTORY = 120  # values a series keeps (~30 s of snapshots at 4 a second)


def axis_text(span_s: float, peak: str, name: str = "") -> str:
    """The axis's left end: what is drawn (``name``), how long ago its oldest value was, and the
    peak (the full height)."""
    head = f"{name}: " if name else ""
    return f"{head}{format_duration(max(span_s, 0.0))} ago · peak {peak}"


class SparkHistory(Vertical):
    """A ``Sparkline`` (id ``spark_id``) over an axis line (id ``spark_id-axis``); its own id is
    ``spark_id-history``."""

    def __init__(self, spark_id: str, shown: bool = True, name: str = "") -> None:
        super().__init__(id=f"{spark_id}-history", classes="spark-history")
        self.spark_id, self.series = spark_id, name
        if not shown:  # an inline style: set only when hidden, so the stylesheet can hide it too
            self.display = False
        self.history: deque[tuple[float, float]] = deque(maxlen=HISTORY)  # (t_s, value)

    def compose(self) -> ComposeResult:
        spark = Sparkline([], id=self.spark_id, summary_function=max)
        if not self.display:
            spark.display = False
        yield spark
        with Horizontal(classes="spark-axis"):
            yield Static("", id=f"{self.spark_id}-axis", classes="axis-span", markup=False)
            yield Static("now", classes="axis-now", markup=False)

    def plot(self, values: Sequence[float], span_s: float, peak: str) -> None:
        """``values`` oldest first, the oldest ``span_s`` seconds before the newest."""
        self.query_one(f"#{self.spark_id}", Sparkline).data = list(values)
        self.query_one(f"#{self.spark_id}-axis", Static).update(
            axis_text(span_s, peak, self.series)
        )

    def append(self, t_s: float, value: float, peak: Callable[[float], str]) -> None:
        """Add the newest value (at ``t_s`` seconds) to the series this widget keeps and draw
        the last ``HISTORY`` of them; ``peak`` formats the largest for the axis."""
        self.history.append((t_s, value))
        values = [v for _, v in self.history]
        self.plot(values, self.history[-1][0] - self.history[0][0], peak(max(values)))

    def set_shown(self, shown: bool) -> None:
        self.display = shown
        self.query_one(f"#{self.spark_id}", Sparkline).display = shown
