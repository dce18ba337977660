"""The run browser over a run whose label, error and step values hold rich markup and escape
sequences: every screen renders them literally (no MarkupError, no escape sequence)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text
from textual.widgets import DataTable
from tui_helpers import text

from mrv2_prof.store import Store
from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.screens.run_screen import RunScreen

ESC = "\x1b"
LABEL = f"[/x]{ESC}[31mred[bold]"
SHOWN = "[/x][31mred[bold]"


def rendered(cells: list) -> list[str]:
    """What a DataTable shows for its cells (a string cell is read as markup)."""
    return [Text.from_markup(c).plain if isinstance(c, str) else str(c) for c in cells]


@pytest.fixture
def hostile_db(tmp_path: Path) -> Path:
    path = tmp_path / "[b]runs.duckdb"
    with Store.open(path) as store:
        store.begin_run("bad001", scenario_name=LABEL, label=LABEL, matrix_combo=None,
                        scenario_yaml="name: x\n", device="cpu[/]", versions={}, started_ns=0,
                        info={"notes": ["[/note]"]})  # fmt: skip
        store.append("bad001", "steps", {"step": [0], "graph_mode": ["[/mode]"]})
        store.finish_run("bad001", "failed", ended_ns=1, error=f"[/oops] {ESC}[2J")
    return path


@pytest.mark.asyncio
async def test_hostile_strings_render_literally(hostile_db: Path) -> None:
    app = BrowserApp(hostile_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        table = app.screen.query_one("#runs", DataTable)
        row = rendered(table.get_row("bad001"))
        assert SHOWN in row and "cpu[/]" in row
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, RunScreen) and app.screen.loaded
        assert SHOWN in text(app, "run-title") and ESC not in text(app, "run-title")
        await pilot.press("t")
        await app.workers.wait_for_complete()
        await pilot.pause()
        steps = app.screen.query_one("#steps-table", DataTable)
        assert "[/mode]" in rendered(steps.get_row_at(0))
