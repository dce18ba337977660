"""DashboardApp driven by a fake snapshot source through Textual's pilot."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import ProgressBar, Static

from mrv2_prof.snapshot import Snapshot
from mrv2_prof.tui.dashboard import STOPPING_TEXT, DashboardApp

SIZE = (120, 40)
POLL_S = 0.01


def make_snapshot(**overrides: object) -> Snapshot:
    values: dict[str, object] = dict(
        run_id="run-1",
        label="decode-heavy",
        elapsed_s=12.3,
        steps=400,
        steps_per_s=31.5,
        output_tokens=9000,
        tokens_per_s=2048.0,
        num_requests=512,
        num_waiting=3,
        num_running=8,
        num_finished=40,
        num_aborted=2,
        ttft_ms_p50=12.5,
        ttft_ms_p99=80.25,
        itl_ms_p50=4.125,
        itl_ms_p99=9.5,
        kv_usage=0.425,
        num_preemptions=1,
        staged_bytes=3 * 1024 * 1024 // 2,
        dense_bytes=48 * 1024 * 1024,
    )
    values.update(overrides)
    return Snapshot(**values)  # type: ignore[arg-type]


class FakeSource:
    """The test decides what the next poll returns: ``push`` a snapshot, ``finish`` the run."""

    def __init__(self) -> None:
        self.pending: Snapshot | None = None
        self.done = False
        self.num_polls = 0
        self.num_stop_requests = 0

    def push(self, snapshot: Snapshot) -> None:
        self.pending = snapshot

    def finish(self) -> None:
        self.done = True

    def poll(self) -> tuple[Snapshot | None, bool]:
        self.num_polls += 1
        snapshot, self.pending = self.pending, None
        return snapshot, self.done

    def request_stop(self) -> None:
        self.num_stop_requests += 1


class ScriptedSource(FakeSource):
    """Returns one scripted item per poll, then reports done."""

    def __init__(self, script: list[Snapshot | None]) -> None:
        super().__init__()
        self.script = list(script)

    def poll(self) -> tuple[Snapshot | None, bool]:
        self.num_polls += 1
        snapshot = self.script.pop(0) if self.script else None
        return snapshot, not self.script


def text(app: DashboardApp, widget_id: str) -> str:
    """The plain text a Static currently renders."""
    return str(app.query_one(f"#{widget_id}", Static).render())


async def wait_for(pilot: Pilot, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(POLL_S)


async def wait_polls(pilot: Pilot, source: FakeSource, n: int = 3) -> None:
    """Let the app poll the source ``n`` more times."""
    target = source.num_polls + n
    await wait_for(pilot, lambda: source.num_polls >= target)


@pytest.mark.asyncio
async def test_shows_placeholders_before_the_first_snapshot() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        await wait_polls(pilot, source)
        assert text(app, "ttft-p50") == "—"
        assert text(app, "staged-ratio") == "—"
        assert "waiting for the first snapshot" in text(app, "run-label")
        assert app.title == "mrv2-prof"


@pytest.mark.asyncio
async def test_shows_the_latest_snapshot_and_follows_the_next() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        source.push(make_snapshot())
        await wait_for(pilot, lambda: text(app, "num-running") == "8")
        assert text(app, "num-waiting") == "3"
        assert text(app, "num-finished") == "40"
        assert text(app, "num-aborted") == "2"
        assert text(app, "steps-per-s") == "31.5"
        assert text(app, "tokens-per-s") == "2,048.0"
        assert text(app, "ttft-p50") == "12.5 ms"
        assert text(app, "ttft-p99") == "80.2 ms"
        assert text(app, "itl-p50") == "4.12 ms"
        assert text(app, "itl-p99") == "9.50 ms"
        assert text(app, "kv-usage") == "42.5 %"
        assert text(app, "num-preemptions") == "1"
        assert text(app, "staged-bytes") == "1.5 MiB"
        assert text(app, "dense-bytes") == "48.0 MiB"
        assert text(app, "staged-ratio") == "3.1 %"
        assert text(app, "run-counts") == "42 / 512 requests  ·  elapsed 12.3 s"
        assert "decode-heavy" in text(app, "run-label")
        bar = app.query_one("#run-bar", ProgressBar)
        assert (bar.total, bar.progress) == (512, 42)

        source.push(
            make_snapshot(
                elapsed_s=75.0,
                num_running=5,
                num_finished=300,
                ttft_ms_p99=None,
                kv_usage=0.9,
                staged_bytes=512,
                dense_bytes=0,
            )
        )
        await wait_for(pilot, lambda: text(app, "num-running") == "5")
        assert text(app, "num-finished") == "300"
        assert text(app, "ttft-p99") == "—"
        assert text(app, "kv-usage") == "90.0 %"
        assert text(app, "staged-bytes") == "512 B"
        assert text(app, "staged-ratio") == "—"
        assert text(app, "run-counts") == "302 / 512 requests  ·  elapsed 1m 15s"
        assert app.query_one("#run-bar", ProgressBar).progress == 302
        assert app.return_value is None  # still running: the source is not done


@pytest.mark.asyncio
async def test_every_value_is_on_screen_at_120x40() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        source.push(make_snapshot())
        await wait_for(pilot, lambda: text(app, "num-running") == "8")
        screen_region = app.screen.region
        for widget in app.query(".value, #run-bar, #run-counts, #run-label"):
            region = widget.region
            assert region.width > 0 and region.height > 0, widget
            assert screen_region.contains_region(region), widget


@pytest.mark.asyncio
async def test_q_requests_stop_once_and_exits_when_the_source_is_done() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        source.push(make_snapshot())
        await wait_for(pilot, lambda: text(app, "num-running") == "8")

        await pilot.press("q")
        assert source.num_stop_requests == 1
        assert STOPPING_TEXT in text(app, "status")

        await pilot.press("q")  # a second q while stopping changes nothing
        await wait_polls(pilot, source)
        assert source.num_stop_requests == 1
        assert app.return_value is None  # waits for the runner to report done

        source.push(make_snapshot(num_running=0, num_finished=120))  # still shown while stopping
        await wait_for(pilot, lambda: text(app, "num-finished") == "120")

        source.finish()
        await wait_for(pilot, lambda: app.return_value is not None)
    assert app.return_value == "stopped"
    assert source.num_stop_requests == 1


@pytest.mark.asyncio
async def test_ctrl_q_also_stops_the_run_cleanly() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+q")
        await wait_polls(pilot, source)
        assert source.num_stop_requests == 1
        assert app.return_value is None
        source.finish()
        await wait_for(pilot, lambda: app.return_value is not None)
    assert app.return_value == "stopped"


@pytest.mark.asyncio
async def test_exits_with_done_when_the_run_ends_by_itself() -> None:
    last = make_snapshot(num_waiting=0, num_running=0, num_finished=510, num_aborted=2)
    script = [make_snapshot(), None, make_snapshot(num_finished=200), last]
    source = ScriptedSource(script)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.return_value is not None)
        assert text(app, "num-finished") == "510"
    assert app.return_value == "done"
    assert app.latest == last
    assert source.num_stop_requests == 0
    assert source.num_polls == len(script)  # no poll after done


@pytest.mark.asyncio
async def test_p_freezes_the_display_but_keeps_polling() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=SIZE) as pilot:
        first = make_snapshot()
        source.push(first)
        await wait_for(pilot, lambda: text(app, "num-running") == "8")

        await pilot.press("p")
        assert "paused" in text(app, "status")
        second = dataclasses.replace(first, num_running=1, num_finished=99, itl_ms_p99=20.0)
        source.push(second)
        await wait_for(pilot, lambda: app.latest == second)  # taken from the source...
        await wait_polls(pilot, source)
        assert text(app, "num-running") == "8"  # ...but not shown
        assert text(app, "num-finished") == "40"
        assert text(app, "itl-p99") == "9.50 ms"

        await pilot.press("p")  # resume shows the newest at once
        assert text(app, "num-running") == "1"
        assert text(app, "itl-p99") == "20.0 ms"
        assert "paused" not in text(app, "status")


def test_importing_the_dashboard_does_not_import_torch_or_the_runner() -> None:
    code = (
        "import sys, mrv2_prof.tui.dashboard; "
        "bad = [m for m in ('torch', 'mrv2_prof.runner') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_source_and_format_import_without_textual() -> None:
    code = (
        "import sys, mrv2_prof.tui.source, mrv2_prof.tui.format; "
        "assert 'textual' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
