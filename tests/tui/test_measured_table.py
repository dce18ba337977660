"""MeasuredTable: rows painted before the table measures its columns are painted again at the
measured widths, where a plain DataTable keeps showing them cut at the header's width."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import DataTable
from tui_helpers import wait_for

from mrv2_prof.tui.widgets.measured_table import MeasuredTable

WIDE_CELL = "1,376.20 ms"  # wider than the column's header "n"


class TableApp(App[None]):
    CSS = "#table { height: 1fr; }"  # as the browser's tables: no resize when rows come in

    def __init__(self, table_class: type[DataTable]) -> None:
        super().__init__()
        self.table_class = table_class

    def compose(self) -> ComposeResult:
        yield self.table_class(id="table")


def painted(table: DataTable) -> str:
    """The table's header and first row as its next paint draws them."""
    strips = table.render_lines(Region(0, 0, table.size.width, 2))
    return "\n".join(strip.text for strip in strips)


@pytest.mark.asyncio
@pytest.mark.parametrize(("table_class", "whole"), [(MeasuredTable, True), (DataTable, False)])
async def test_a_row_painted_before_the_measure_is_shown_whole_once_measured(
    table_class: type[DataTable], whole: bool
) -> None:
    app = TableApp(table_class)
    async with app.run_test(size=(40, 6)) as pilot:
        table = app.query_one("#table", DataTable)
        table.add_column("n", key="n")
        await pilot.pause()
        assert table.size.width > 0
        table.add_row(WIDE_CELL)
        lines = painted(table).splitlines()  # a paint before the measure: the header's width
        assert lines[1].split() == [WIDE_CELL[0]], lines
        await wait_for(pilot, lambda: not table._require_update_dimensions)
        await pilot.pause()
        assert table.columns["n"].content_width == len(WIDE_CELL)  # measured
        lines = painted(table).splitlines()
        assert (WIDE_CELL in lines[1]) is whole, lines  # a plain DataTable: cut until it changes
