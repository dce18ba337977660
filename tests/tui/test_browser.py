"""The run browser driven through Textual's pilot over a hand-built run database.

Expected numbers are worked out in the ``runs_db`` fixture's docstring (tests/tui/conftest.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable, TabbedContent
from tui_helpers import svg_text, text, wait_for

from mrv2_prof.store import Store
from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.screens.compare_screen import CompareScreen
from mrv2_prof.tui.screens.help_screen import HelpScreen
from mrv2_prof.tui.screens.run_screen import RunScreen
from mrv2_prof.tui.screens.runs_screen import HINT, RunsScreen

NARROW = (80, 24)
WIDE = (160, 48)


async def settle(app: BrowserApp, pilot) -> None:
    """Wait for the screens' store workers and the messages they posted."""
    await app.workers.wait_for_complete()
    await pilot.pause()


def cells(table: DataTable, row_key: str, *columns: str) -> list[str]:
    return [str(table.get_cell(row_key, c)) for c in columns]


def row_keys(table: DataTable) -> list[str]:
    return [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [NARROW, WIDE])
async def test_lists_the_runs_newest_first_with_headline_numbers(runs_db, size) -> None:
    app = BrowserApp(runs_db)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, RunsScreen) and screen.loaded
        table = app.screen.query_one("#runs", DataTable)
        assert row_keys(table) == ["bbb222", "aaa111", "ccc333"]
        columns = ("label", "status", "started", "device", "requests", "tok_s", "itl_p99")
        assert cells(table, "bbb222", *columns) == [
            "candidate", "completed", "01-02 11:00", "cuda:0", "2", "30.0", "50.0 ms",
        ]  # fmt: skip
        assert cells(table, "aaa111", *columns) == [
            "baseline", "completed", "01-02 10:00", "cuda:0", "2", "15.0", "148.5 ms",
        ]  # fmt: skip
        assert cells(table, "ccc333", *columns) == [
            "crashed", "failed", "01-01 09:00", "cpu", "0", "—", "—",
        ]  # fmt: skip


@pytest.mark.asyncio
async def test_enter_opens_a_run_with_its_step_timeline_and_escape_goes_back(runs_db) -> None:
    app = BrowserApp(runs_db)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter")  # the second row: aaa111
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.run_id == "aaa111" and screen.loaded
        assert text(app, "run-title") == "run aaa111  baseline  [completed]  5 steps"
        assert app.screen.query_one(TabbedContent).active == "summary"
        assert "5.00 req/s, 15.0 output tok/s" in svg_text(app.export_screenshot())

        await pilot.press("t")
        assert app.screen.query_one(TabbedContent).active == "steps"
        steps = app.screen.query_one("#steps-table", DataTable)
        assert steps.row_count == 5
        columns = ("step", "mode", "tokens", "overlap", "bubble", "kind", "syncs")
        rows = [[str(c) for c in steps.get_row_at(i)] for i in range(5)]
        keys = [c.key.value for c in steps.ordered_columns]
        picked = [[row[keys.index(c)] for c in columns] for row in rows]
        assert picked[0] == ["0", "full", "2", "50.0 %", "0.00 ms", "other", "2"]
        assert picked[3] == ["3", "none", "5", "50.0 %", "0.75 ms", "host_bound", "1"]
        assert [r[-1] for r in picked] == ["2", "0", "0", "1", "0"]
        assert text(app, "steps-note") == ""  # every step is shown

        await pilot.press("s")
        assert app.screen.query_one(TabbedContent).active == "summary"
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)


@pytest.mark.asyncio
async def test_a_long_run_is_paged_with_brackets(runs_db, monkeypatch) -> None:
    monkeypatch.setattr("mrv2_prof.analysis.run_queries.STEP_PAGE", 2)
    app = BrowserApp(runs_db)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter", "t")
        await settle(app, pilot)
        table = app.screen.query_one("#steps-table", DataTable)

        def first_column() -> list[str]:
            return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]

        assert first_column() == ["0", "1"]
        assert text(app, "steps-note") == "steps 0–1 of 5 (by position)  ·  ] next  [ previous"
        for _ in range(3):  # the third press finds no page after the last
            await pilot.press("right_square_bracket")
            await settle(app, pilot)
        assert first_column() == ["4"]
        assert text(app, "steps-note").startswith("steps 4–4 of 5")
        await pilot.press("left_square_bracket")
        await settle(app, pilot)
        assert first_column() == ["2", "3"]


@pytest.mark.asyncio
async def test_c_on_two_runs_compares_them_side_by_side(runs_db) -> None:
    app = BrowserApp(runs_db)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "c")  # A = aaa111 (baseline)
        table = app.screen.query_one("#runs", DataTable)
        assert str(table.get_cell("aaa111", "mark")) == "A"
        assert "A = aaa111" in text(app, "runs-status")
        await pilot.press("up", "c")  # B = bbb222 (candidate)
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen) and screen.loaded
        assert (screen.run_a, screen.run_b) == ("aaa111", "bbb222")
        assert text(app, "compare-title") == (
            "A = aaa111  baseline  [completed]\nB = bbb222  candidate  [completed]"
        )
        compare = app.screen.query_one("#compare-table", DataTable)
        columns = ("a", "b", "delta", "pct", "verdict")
        # ITL p99 148.5 → 50 ms: -98.5 ms, -98.5 / 148.5 = -66.3 %; B's four gaps are all 50 ms:
        # one distinct value, too few for a verdict from one run's samples
        assert cells(compare, "p99_itl", *columns)[:4] == [
            "148.50 ms", "50.00 ms", "-98.50 ms", "-66.3%",
        ]  # fmt: skip
        assert cells(compare, "p99_itl", "verdict")[0].startswith("inconclusive")
        # one run a side and no per-request distribution: no test, inconclusive
        assert cells(compare, "tok_throughput", *columns)[:4] == [
            "15.0 tok/s", "30.0 tok/s", "+15.0 tok/s", "+100.0%",
        ]  # fmt: skip
        assert cells(compare, "tok_throughput", "verdict")[0].startswith("inconclusive")
        assert cells(compare, "sync_count", *columns)[:4] == ["3", "1", "-2", "-66.7%"]
        assert cells(compare, "overlap", *columns)[:2] == ["-", "-"]  # the steps' sums, NULL
        labels = {c.key.value: str(c.label) for c in compare.columns.values()}
        assert labels["a"] == "A aaa111" and labels["b"] == "B bbb222"

        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)
        assert str(table.get_cell("aaa111", "mark")) == ""  # the mark went with the comparison


@pytest.mark.asyncio
async def test_c_again_or_escape_clears_the_mark(runs_db) -> None:
    app = BrowserApp(runs_db)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)
        table = app.screen.query_one("#runs", DataTable)
        await pilot.press("c")
        assert str(table.get_cell("bbb222", "mark")) == "A"
        await pilot.press("c")
        assert str(table.get_cell("bbb222", "mark")) == ""
        await pilot.press("down", "c", "escape")
        assert str(table.get_cell("aaa111", "mark")) == ""
        assert text(app, "runs-status") == HINT
        assert isinstance(app.screen, RunsScreen)


@pytest.mark.asyncio
async def test_help_lists_the_keys_and_q_quits(runs_db) -> None:
    app = BrowserApp(runs_db)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert {"enter", "c", "escape", "q"} <= {key for key, _ in app.screen.keys}
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
        assert not app.is_running


@pytest.mark.asyncio
async def test_an_unreadable_database_is_reported_on_screen(tmp_path: Path) -> None:
    missing = tmp_path / "gone.duckdb"
    app = BrowserApp(missing)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)
        assert app.screen.loaded
        assert text(app, "runs-status") == (
            f"error: {missing}: no such run database (pass --db with a file runs wrote)"
        )
        assert app.screen.query_one("#runs", DataTable).row_count == 0


@pytest.mark.asyncio
async def test_a_real_quickstart_run_can_be_listed_and_opened(run_in_process) -> None:
    job, _ = run_in_process()
    with Store.open(job.db_path, read_only=True) as store:
        (run_id, steps, syncs) = store.connection.execute(
            "SELECT r.run_id, (SELECT count(*) FROM steps), (SELECT count(*) FROM syncs) "
            "FROM runs r"
        ).fetchone()
    app = BrowserApp(Path(job.db_path))
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        table = app.screen.query_one("#runs", DataTable)
        assert row_keys(table) == [run_id]
        assert cells(table, run_id, "label", "status", "device") == [
            "quickstart", "completed", "cpu",
        ]  # fmt: skip
        await pilot.press("enter")
        await settle(app, pilot)
        await pilot.press("t")
        step_table = app.screen.query_one("#steps-table", DataTable)
        assert step_table.row_count == steps
        col = [c.key.value for c in step_table.ordered_columns].index("syncs")
        assert sum(int(str(step_table.get_row_at(i)[col])) for i in range(steps)) == syncs


def test_the_browser_queries_import_without_textual() -> None:
    code = "import sys, mrv2_prof.analysis.run_queries; assert 'textual' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
