"""SVG snapshots of the key screens (text compared, see ``tui_helpers.assert_snapshot``).

Fixed data, fixed sizes, no clocks: the dashboard gets one hand-made snapshot and NVML series,
the browser the hand-built database opened by a relative path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import (
    GPU_SAMPLES,
    POLL_S,
    FakeSource,
    assert_snapshot,
    make_gpu_snapshot,
    text,
    wait_for,
)

from mrv2_prof.tui.browser import BrowserApp
from mrv2_prof.tui.dashboard import DashboardApp
from mrv2_prof.tui.widgets import PanelDeck
from mrv2_prof.tui.widgets.panel_deck import layout_for


async def _dashboard(size: tuple[int, int], name: str) -> None:
    source = FakeSource(samples=GPU_SAMPLES)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=size) as pilot:
        # The layout first (a progress bar rounds its fill to the width it has when set).
        layout = layout_for(size[0], size[1] - 5)  # the deck: less header, progress, status, footer
        await wait_for(pilot, lambda: app.query_one(PanelDeck).layout_name == layout)
        await pilot.pause()
        source.push(make_gpu_snapshot(tokens_due=65_536, tokens_left=56_536))  # 9,000 settled
        await wait_for(pilot, lambda: text(app, "ov-gpu").startswith("util 80"))
        await pilot.pause()
        await assert_snapshot(pilot, app, name)


@pytest.mark.asyncio
async def test_dashboard_overview_at_80x24() -> None:
    await _dashboard((80, 24), "dashboard_overview_80x24")


@pytest.mark.asyncio
async def test_dashboard_overview_beside_a_panel_at_120x40() -> None:
    await _dashboard((120, 40), "dashboard_side_120x40")


@pytest.mark.asyncio
async def test_dashboard_all_panels_at_160x48() -> None:
    await _dashboard((160, 48), "dashboard_wide_160x48")


async def _browser(keys: tuple[str, ...], name: str) -> None:
    app = BrowserApp(Path("runs.duckdb"))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await pilot.pause()
        await wait_for(pilot, lambda: app.screen.loaded)
        await assert_snapshot(pilot, app, name)


@pytest.mark.asyncio
async def test_browser_run_list(runs_db: Path, monkeypatch) -> None:
    monkeypatch.chdir(runs_db.parent)
    await _browser((), "browser_runs_80x24")


@pytest.mark.asyncio
async def test_browser_step_timeline(runs_db: Path, monkeypatch) -> None:
    monkeypatch.chdir(runs_db.parent)
    await _browser(("down", "enter", "t"), "browser_steps_80x24")


@pytest.mark.asyncio
async def test_browser_comparison(runs_db: Path, monkeypatch) -> None:
    monkeypatch.chdir(runs_db.parent)
    await _browser(("down", "c", "up", "c"), "browser_compare_80x24")
