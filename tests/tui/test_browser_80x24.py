"""The run browser at 80×24 with long labels and wide numbers: no value is cut on screen; the
step table sorts (slowest first, by a header), filters and jumps to a step.

Numbers are worked out in the fixtures' comments; what is on screen is read back from the
screen's SVG export (``tui_helpers.svg_text``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Input
from tui_helpers import paint_after, svg_text, text, wait_for

from mrv2_prof.report.verdict import BETTER, INCONCLUSIVE, NOISE, WORSE
from mrv2_prof.store import Store
from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.screens.compare_screen import CompareScreen
from mrv2_prof.tui.screens.run_screen import RunScreen
from mrv2_prof.tui.screens.runs_screen import RunsScreen

NARROW = (80, 24)
MS = 1_000_000
LABELS = {
    "e00001": "ablation[runner.kernels=triton,runner.staged_writes=true,"
    "runner.async_scheduling=true]",
    "e00002": "ablation[runner.kernels=torch,runner.staged_writes=false,"
    "runner.async_scheduling=false]",
}
# e00001: r0 tokens at 10 and 1,400 ms, r1 at 10 and 20 ms -> ITL gaps 1,390 and 10 ms,
#   p99 = 10 + 0.99 x 1,380 = 1,376.2 ms ("1,376 ms"); 4 tokens over 1.4 s = 2.857 ("2.9" tok/s)
# e00002: r0 at 10 and 50 ms, r1 at 10 and 30 ms -> gaps 40 and 20, p99 = 20 + 0.99 x 20 =
#   39.8 ms ("39.8 ms"); 4 tokens over 0.05 s = 80.0 tok/s
TOKENS = {"e00001": {"r0": [10, 1400], "r1": [10, 20]}, "e00002": {"r0": [10, 50], "r1": [10, 30]}}
SHOWN = {"e00001": ("2.9", "1,376 ms"), "e00002": ("80.0", "39.8 ms")}
# e00001's steps: host times (ms) 3, 9, 1, 7, 5, 2 -> slowest first: steps 1, 3, 4, 0, 5, 2
HOST_MS = [3, 9, 1, 7, 5, 2]
MODES = ["full", "none", "piecewise", "none", "full", "full"]
BUBBLE_MS = [0.5, 0.1, 2.0, 0.25, 1.0, 0.0]


def _fill(store: Store, run_id: str, when: str) -> None:
    store.begin_run(
        run_id, scenario_name="ablation", label=LABELS[run_id], matrix_combo=None,
        scenario_yaml="name: ablation", device="cpu", versions={}, started_ns=0,
        info={"num_kv_blocks": 64},
    )  # fmt: skip
    store.connection.execute(
        "UPDATE runs SET started_at = CAST(? AS TIMESTAMP) WHERE run_id = ?", [when, run_id]
    )
    tokens = TOKENS[run_id]
    ids = list(tokens)
    store.append(run_id, "requests", {
        "req_id": ids, "arrival_ns": [0] * 2, "first_token_ns": [tokens[r][0] * MS for r in ids],
        "finish_ns": [tokens[r][-1] * MS for r in ids], "prompt_tokens": [8] * 2,
        "output_tokens": [2] * 2, "num_preemptions": [0] * 2, "finish_reason": ["length"] * 2,
        "cached_tokens": [0] * 2,
    })  # fmt: skip
    store.append(run_id, "tokens", {
        "req_id": [r for r in ids for _ in tokens[r]], "idx": [0, 1] * 2,
        "t_ns": [t * MS for r in ids for t in tokens[r]], "token_id": [7] * 4,
    })  # fmt: skip
    n = len(HOST_MS)
    store.append(run_id, "steps", {
        "step": list(range(n)), "cpu_start_ns": [20 * MS * i for i in range(n)],
        "cpu_end_ns": [20 * MS * i + h * MS for i, h in enumerate(HOST_MS)],
        "num_tokens": [4] * n, "graph_mode": MODES,
        "bubble_ns": [int(b * MS) for b in BUBBLE_MS],
        "bubble_kind": ["host_bound" if b > 0.4 else "other" for b in BUBBLE_MS],
    })  # fmt: skip
    store.finish_run(run_id, "completed", ended_ns=1)


@pytest.fixture
def long_db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.duckdb"
    with Store.open(path) as store:
        _fill(store, "e00001", "2025-03-01 10:00:00")
        _fill(store, "e00002", "2025-03-01 09:00:00")
    return path


async def settle(app: BrowserApp, pilot) -> None:
    await app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause(0.05)


def screen_lines(app: BrowserApp) -> list[str]:
    return svg_text(app.export_screenshot()).splitlines()


async def lines_showing(app: BrowserApp, pilot, prefixes: list[str]) -> list[str]:
    """The screen's lines once a line starts with each of ``prefixes`` (a loaded 2-core machine
    can paint a table's rows after ``settle``); the last lines read after 30 s otherwise."""
    for _ in range(600):
        lines = screen_lines(app)
        if all(any(x.startswith(p) for x in lines) for p in prefixes):
            break
        await pilot.pause(0.05)
    return lines


@pytest.mark.asyncio
async def test_the_run_list_at_80x24_cuts_no_number_and_shows_the_whole_label(long_db):
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)

        # the rows with their loaded headlines (a loaded machine paints them after ``settle``)
        def shown() -> bool:
            on_screen = "\n".join(screen_lines(app))
            return all(f" {r} " in on_screen and itl in on_screen for r, (_, itl) in SHOWN.items())

        await wait_for(pilot, shown)
        lines = screen_lines(app)
        for run_id, (tok_s, itl) in SHOWN.items():
            (row,) = [line for line in lines if f" {run_id} " in line]
            for value in ("completed", "03-01", "cpu", tok_s, itl):
                assert f" {value}" in row, (value, row)
            shown = row.split()[1]  # the label cell: a start of the label and an ellipsis
            assert shown.endswith("…") and LABELS[run_id].startswith(shown[:-1]), shown
            assert len(row) <= NARROW[0]
        # the run under the cursor (the newest) has its whole label under the table
        assert text(app, "runs-status") == f"e00001: {LABELS['e00001']}"
        assert "".join(lines[-4:]).replace(" ", "").count(LABELS["e00001"].replace(" ", "")) == 1
        await pilot.press("down")
        await wait_for(pilot, lambda: text(app, "runs-status") == f"e00002: {LABELS['e00002']}")


@pytest.mark.asyncio
async def test_rows_painted_before_the_table_measures_its_columns_end_with_every_number_whole(
    long_db, monkeypatch
):
    """A screen refresh between a fill of the run list and the table's measure of its columns
    (what a loaded machine does now and then) paints the rows at the headers' widths; the
    measure paints them anew, so no number stays cut ("1,376 m")."""
    paint_after(monkeypatch, RunsScreen, "_fill", "runs", 4, width=NARROW[0])
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)

        def shown() -> bool:
            on_screen = "\n".join(screen_lines(app))
            return all(f" {itl}" in on_screen for _, itl in SHOWN.values())

        await wait_for(pilot, shown)
        lines = screen_lines(app)
        for run_id, (tok_s, itl) in SHOWN.items():
            (row,) = [line for line in lines if f" {run_id} " in line]
            for value in ("completed", "03-01", tok_s, itl):
                assert f" {value}" in row, (value, row)


SCROLLBAR = "▁▂▃▄▅▆▇█▉▊▋▌▍▎▏▐ "


async def _comparison(app, pilot) -> tuple[CompareScreen, DataTable, list, list[str]]:
    """The first two runs compared at 80x24: the screen, its table, the rows on screen and the
    screen's lines once they all show."""
    await settle(app, pilot)
    await pilot.press("c", "down", "c")
    await settle(app, pilot)
    screen = app.screen
    assert isinstance(screen, CompareScreen) and screen.loaded
    table = screen.query_one("#compare-table", DataTable)
    on_screen = list(table.rows)[:8]  # the rows on screen at 80x24
    lines = await lines_showing(app, pilot, [f" {k.value} " for k in on_screen])
    return screen, table, on_screen, lines


@pytest.mark.asyncio
async def test_the_comparison_at_80x24_keeps_every_verdict_whole(long_db):
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        screen, table, on_screen, lines = await _comparison(app, pilot)
        verdicts = 0
        for row_key in on_screen:
            verdict = str(table.get_cell(row_key, "verdict"))
            pct = str(table.get_cell(row_key, "pct"))
            (line,) = [x for x in lines if x.startswith(f" {row_key.value} ")]
            cells = line.rstrip().rstrip(SCROLLBAR).rstrip()  # the table's scroll bar is no value
            assert cells.endswith(f"{pct}  {verdict}".rstrip()), line
            verdicts += verdict.startswith((BETTER, WORSE, NOISE, INCONCLUSIVE))
        assert verdicts == 8
        # p99_itl: 1,376.20 ms (A) against 39.80 ms (B): too wide for B − A at 80 columns
        assert not screen.with_delta and "delta" not in [c.value for c in table.columns]
        await pilot.resize_terminal(160, 40)
        await wait_for(pilot, lambda: screen.with_delta)
        assert screen.with_delta and str(table.get_cell("p99_itl", "delta")) == "-1,336.40 ms"


async def _steps(app: BrowserApp, pilot) -> tuple[RunScreen, DataTable]:
    await settle(app, pilot)
    await pilot.press("enter", "t")  # e00001
    await settle(app, pilot)
    screen = app.screen
    assert isinstance(screen, RunScreen) and screen.run_id == "e00001"
    return screen, screen.query_one("#steps-table", DataTable)


def steps_shown(table: DataTable) -> list[int]:
    return [int(str(table.get_row_at(i)[0])) for i in range(table.row_count)]


@pytest.mark.asyncio
async def test_the_step_table_shows_the_slowest_steps_first_and_back(long_db):
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        screen, table = await _steps(app, pilot)
        assert steps_shown(table) == [0, 1, 2, 3, 4, 5]
        await pilot.press("o")
        await settle(app, pilot)
        assert steps_shown(table) == [1, 3, 4, 0, 5, 2]  # host 9, 7, 5, 3, 2, 1 ms
        assert text(app, "steps-note") == "sorted by host ↓ (o: step order)"
        await pilot.press("o")
        await settle(app, pilot)
        assert steps_shown(table) == [0, 1, 2, 3, 4, 5] and text(app, "steps-note") == ""


@pytest.mark.asyncio
async def test_a_click_on_a_header_sorts_by_that_column(long_db):
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        screen, table = await _steps(app, pilot)
        columns = list(table.ordered_columns)
        bubble = [c.key.value for c in columns].index("bubble")
        x = sum(c.get_render_width(table) for c in columns[:bubble]) + 1
        await pilot.click("#steps-table", offset=(x, 0))
        await settle(app, pilot)
        assert steps_shown(table) == [2, 4, 0, 3, 1, 5]  # bubble 2, 1, 0.5, 0.25, 0.1, 0 ms
        await pilot.click("#steps-table", offset=(x, 0))  # again: the other way
        await settle(app, pilot)
        assert steps_shown(table) == [5, 1, 3, 0, 4, 2]


@pytest.mark.asyncio
async def test_the_step_table_filters(long_db):
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        screen, table = await _steps(app, pilot)
        for typed, expected in (
            ("mode=none", [1, 3]),
            ("host>=5", [1, 3, 4]),  # host 9, 7, 5
            ("host_bound", [0, 2, 4]),  # a word of the bubble kind: bubbles over 0.4 ms
            ("", [0, 1, 2, 3, 4, 5]),  # an empty filter shows every step
        ):
            await pilot.press("slash")
            box = screen.query_one("#steps-input", Input)
            assert box.display and box.has_focus
            box.value = typed
            await pilot.press("enter")
            await settle(app, pilot)
            assert steps_shown(table) == expected, typed
            assert not box.display
        await pilot.press("slash")
        screen.query_one("#steps-input", Input).value = "nope>1"
        await pilot.press("enter")
        await settle(app, pilot)
        assert screen.where is None and screen.query_one("#steps-input", Input).display
        await pilot.press("escape")  # closes the input, stays on the run
        assert app.screen is screen and not screen.query_one("#steps-input", Input).display


@pytest.mark.asyncio
async def test_g_jumps_to_a_step_across_pages_and_orders(long_db, monkeypatch):
    monkeypatch.setattr("mrv2_prof.analysis.run_queries.STEP_PAGE", 2)
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        screen, table = await _steps(app, pilot)
        assert steps_shown(table) == [0, 1]
        await pilot.press("g")
        screen.query_one("#steps-input", Input).value = "4"
        await pilot.press("enter")
        await settle(app, pilot)
        assert steps_shown(table) == [4, 5]  # the page holding step 4
        assert str(table.get_row_at(table.cursor_row)[0]) == "4"
        await pilot.press("o")  # slowest first: 1, 3 | 4, 0 | 5, 2
        await settle(app, pilot)
        await pilot.press("g")
        screen.query_one("#steps-input", Input).value = "5"
        await pilot.press("enter")
        await settle(app, pilot)
        assert steps_shown(table) == [5, 2] and str(table.get_row_at(table.cursor_row)[0]) == "5"


@pytest.mark.asyncio
async def test_the_run_summary_in_the_browser_opens_with_the_findings(long_db):
    app = BrowserApp(long_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        lines = screen_lines(app)
        first = next(i for i, line in enumerate(lines) if line.strip().startswith("findings"))
        assert first < next(i for i, x in enumerate(lines) if x.strip().startswith("status "))


@pytest.mark.asyncio
async def test_a_comparison_painted_before_its_table_measures_its_columns_ends_whole(
    long_db, monkeypatch
):
    """As the run list: a paint between the comparison's fill and its table's measure (the
    headers' widths) is painted anew at the widths measured, so no value stays cut."""
    paint_after(monkeypatch, CompareScreen, "_fill", "compare-table", 10, width=NARROW[0])
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        _, table, on_screen, lines = await _comparison(app, pilot)
        for row_key in on_screen:
            (line,) = [x for x in lines if x.startswith(f" {row_key.value} ")]
            for column in ("a", "b", "pct"):
                assert f" {table.get_cell(row_key, column)}" in line, (column, line)


@pytest.mark.asyncio
async def test_steps_painted_before_the_table_measures_its_columns_end_whole(long_db, monkeypatch):
    """As the run list, for the step table: a page of steps painted before the table measures
    its columns is painted anew at the widths measured. A page that comes while the steps tab
    is hidden is dropped, so the table is first filled on screen (by ``o``)."""
    paints = paint_after(
        monkeypatch, RunScreen, "on_run_screen_steps_loaded", "steps-table", 8, on_screen_only=True
    )
    app = BrowserApp(long_db)
    async with app.run_test(size=NARROW) as pilot:
        screen, table = await _steps(app, pilot)
        await pilot.press("o")
        await settle(app, pilot)
        assert paints and paints[0] == len(HOST_MS)  # the first fill was painted on screen
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]

        def whole() -> bool:
            lines = screen_lines(app)
            return all(
                any(line.startswith(f" {r[0]} ") and f" {r[3]}" in line for line in lines)
                for r in rows
            )

        await wait_for(pilot, whole)
        lines = screen_lines(app)
        for r in rows:
            (line,) = [x for x in lines if x.startswith(f" {r[0]} ")]
            for cell in r[1:]:
                assert f" {cell}" in line, (cell, line)
