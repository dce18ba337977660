"""The run browser's requests tab over the hand-made text run of tests/text_runs.py: each
request's asked and answer text, its numbers, and under the table the one under the cursor in
full with its token times; markup and escapes in the text shown as text."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text
from textual.widgets import DataTable, TabbedContent
from tui_helpers import paint_after, svg_text, text, wait_for

from mrv2_prof.store import Store
from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.screens.run_screen import RunScreen
from mrv2_prof.tui.widgets.request_view import RequestView
from tests.text_runs import PLAIN_RUN, add_text_run, answer, question

COLUMNS = ("req_id", "asked", "answer", "ttft", "e2e", "output_tokens", "finish")


@pytest.fixture
def text_db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        add_text_run(store, PLAIN_RUN, with_text=False)
        add_text_run(store)  # begun last: the newest, first in the list
    return path


async def _open_requests(app: BrowserApp, pilot, row: int = 0) -> RequestView:
    await app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.press(*["down"] * row, "enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.loaded)
    await pilot.press("r")
    assert app.screen.query_one(TabbedContent).active == "requests"
    view = app.screen.query_one(RequestView)
    await wait_for(pilot, lambda: view.loaded)
    return view


def _row(table: DataTable, key: str) -> list[str]:
    """What the table shows of a row (a string cell is read as markup)."""
    return [Text.from_markup(c).plain if isinstance(c, str) else str(c) for c in table.get_row(key)]


@pytest.mark.asyncio
async def test_the_requests_tab_lists_each_request_with_its_text(text_db: Path) -> None:
    app = BrowserApp(text_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await _open_requests(app, pilot)
        table = app.screen.query_one("#requests-table", DataTable)
        assert table.row_count == 11
        assert [c.key.value for c in table.ordered_columns] == list(COLUMNS)
        keys = [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(11)]
        assert keys == [f"r{i:02d}" for i in range(11)]  # arrival order
        # the user message's start and the output's start, markup shown as text, 22 characters
        assert _row(table, "r01") == [
            "r01", "What is <b>1</b> [red…", "1 <script>alert(1)</s…", "10.0 ms", "200.0 ms",
            "21→3", "length",
        ]  # fmt: skip
        assert _row(table, "r10")[2:] == ["—", "10.0 ms", "—", "30→2", "unfinished"]
        assert text(app, "requests-note") == "11 requests  ·  click a header to sort"


@pytest.mark.asyncio
async def test_the_request_under_the_cursor_is_shown_in_full_with_its_token_times(
    text_db: Path,
) -> None:
    app = BrowserApp(text_db)
    async with app.run_test(size=(160, 48)) as pilot:
        view = await _open_requests(app, pilot)
        detail = text(app, "request-detail")
        # r00: arrival 0, tokens at 10, 55 and 100 ms; TPOT (100 - 10) / 2 = 45 ms
        assert detail.splitlines()[0] == (
            "request r00  length  TTFT 10.0 ms  TPOT 45.0 ms  E2E 100.0 ms  "
            "20 prompt, 3 output tokens"
        )
        assert "  <|im_start|>user" in detail.splitlines()  # the whole prompt, line by line
        assert f"  {question(0)}<|im_end|>" in detail.splitlines()
        assert f"  {answer(0)}" in detail.splitlines()
        assert detail.splitlines()[-1] == (
            "tokens (after arrival, gap, id): #0 10.0 ms (id 100) · "
            "#1 55.0 ms +45.0 ms (id 101) · #2 100.0 ms +45.0 ms (id 102)"
        )
        view.loaded = False
        await pilot.press(*["down"] * 10)  # r10: never finished
        await wait_for(pilot, lambda: view.loaded and "request r10" in text(app, "request-detail"))
        detail = text(app, "request-detail")
        assert "output: — (unfinished)" in detail
        assert detail.splitlines()[-1].endswith("#1 11.0 ms +1.00 ms (id 101)")  # 21 ms - 10 ms


@pytest.mark.asyncio
async def test_a_click_on_a_header_sorts_the_whole_run(text_db: Path) -> None:
    app = BrowserApp(text_db)
    async with app.run_test(size=(160, 48)) as pilot:
        view = await _open_requests(app, pilot)
        table = app.screen.query_one("#requests-table", DataTable)
        columns = table.ordered_columns
        e2e = [c.key.value for c in columns].index("e2e")
        x = sum(c.get_render_width(table) for c in columns[:e2e]) + 1
        for descending in (True, False):  # biggest first, then the other way
            view.loaded = False
            await pilot.click("#requests-table", offset=(x, 0))  # the E2E header
            await wait_for(pilot, lambda: view.loaded)
            assert (view.order, view.descending) == ("e2e", descending)
        ends = [table.coordinate_to_cell_key((i, 0)).row_key.value for i in (0, 9, 10)]
        assert ends == ["r00", "r09", "r10"]  # the unfinished request (no E2E) last either way
        view.loaded = False
        await pilot.click("#requests-table", offset=(x, 0))
        await wait_for(pilot, lambda: view.loaded)
        first = [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(3)]
        assert first == ["r09", "r08", "r07"]
        assert text(app, "requests-note").startswith("sorted by e2e; 11 requests")


@pytest.mark.asyncio
async def test_a_run_without_text_lists_its_requests_without_text(text_db: Path) -> None:
    app = BrowserApp(text_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_requests(app, pilot, row=1)  # the plain run
        table = app.screen.query_one("#requests-table", DataTable)
        assert _row(table, "r00")[:3] == ["r00", "—", "—"]
        assert "prompt: — (no text: no tokenizer)" in text(app, "request-detail")
        assert "output: — (no tokenizer)" in text(app, "request-detail")


@pytest.mark.asyncio
async def test_requests_painted_before_the_table_measures_its_columns_end_whole(
    text_db: Path, monkeypatch
) -> None:
    """A page of requests painted before the table measures its columns (the headers' widths:
    "TTFT" for "10.0 ms") is painted anew at the widths measured, so no cell stays cut. A page
    that comes while the tab is hidden is dropped, so the table is first filled on screen."""
    paints = paint_after(
        monkeypatch, RequestView, "on_request_view_page_loaded", "requests-table", 14,
        on_screen_only=True,
    )  # fmt: skip
    app = BrowserApp(text_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.loaded)
        await pilot.press("r")
        view = app.screen.query_one(RequestView)
        await wait_for(pilot, lambda: view.query_one("#requests-table", DataTable).size.width > 0)
        view.load_page()
        await wait_for(pilot, lambda: view.loaded)
        assert paints and paints[0] == 11  # the first fill, painted on screen
        table = app.screen.query_one("#requests-table", DataTable)
        rows = {key: _row(table, key) for key in ("r01", "r10")}

        def whole() -> bool:
            lines = svg_text(app.export_screenshot()).splitlines()
            return all(
                any(line.startswith(f" {key} ") and all(f" {c}" in line for c in cells[3:])
                    for line in lines)
                for key, cells in rows.items()
            )  # fmt: skip

        await wait_for(pilot, whole)
