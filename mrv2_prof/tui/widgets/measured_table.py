"""A DataTable whose rows are painted again once it has measured its columns.

A DataTable measures its auto-sized columns when idle (``_update_dimensions``), not when rows
are added. If the screen paints between a fill and that measure (a loaded machine does now and
then), the new rows are drawn at the widths from before (after a fill: each column's header)
and those lines are cached under the table's update count. The measure widens the columns but
leaves the update count as it is, so the cached lines are used again and a value wider than its
header stays cut on screen ("1,376 m") until the table next changes. Here a measure counts as
a change: the count goes up and the table repaints, so the rows are drawn at the measured widths.

Use it for any table filled with rows whose cells can be wider than its headers.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import DataTable
from textual.widgets.data_table import RowKey


class MeasuredTable(DataTable):
    """A DataTable that paints its rows anew after each measure of its columns."""

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        super()._update_dimensions(new_rows)
        self._update_count += 1  # the lines cached at the widths before are not used again
        self.refresh()
