"""The dashboard read off the screen at 80×24, 120×40 and 160×48: no value or label is cut, every
key the help names does what it says, the progress bar moves while a burst of requests decodes,
and each sparkline says the time it spans."""

from __future__ import annotations

import contextlib

import pytest
from textual.widgets import ProgressBar, Sparkline
from tui_helpers import POLL_S, FakeSource, make_gpu_snapshot, svg_text, text, wait_for

from mrv2_prof.pipeline.live_stats import LiveStats
from mrv2_prof.tui.dashboard import DashboardApp
from mrv2_prof.tui.screens.help_screen import HelpScreen
from mrv2_prof.tui.widgets import PANELS, PanelDeck

SIZES = ((80, 24), (120, 40), (160, 48))
# NVML samples one second apart: 7 s from the oldest to the newest
SAMPLES = [(i * 1_000_000_000, 10.0 * i, (8 + i) * 2**30, 100.0 + 25 * i, 1800.0) for i in range(8)]
LONG_SITE = "mrv2_prof/runner/worker/async_output.py:AsyncOutput.wait_for_the_device_copy"
at_every_size = pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])


def busy_snapshot(**overrides: object):
    """Every optional field measured, long site names and reasons, speculation on."""
    values: dict[str, object] = dict(
        top_sync_sites=(
            (LONG_SITE, 123_456),
            ("mrv2_prof/runner/worker/model_runner.py:ModelRunner.wait_output", 400),
            ("mrv2_prof/runner/worker/sampler.py:Sampler.sample_the_next_tokens", 12),
            ("mrv2_prof/runner/worker/staged_writes.py:StagedWriteTensor.flush", 3),
            ("mrv2_prof/runner/worker/uva.py:123", 1),
        ),
        top_fallback_reasons=(
            ("num_tokens 9000 > largest capture size 512", 8),
            ("spec decode verify with a draft length the graphs were not captured for", 3),
            ("prefill chunk", 1),
        ),
        spec_num_drafts=4,
        spec_num_accepted_tokens=6,
        spec_reserved_slots=8,
        spec_reclaimed_slots=2,
        spec_sat_out=1,
        spec_k=3,
        tokens_due=65_536,
        tokens_left=56_536,
    )
    values.update(overrides)
    return make_gpu_snapshot(**values)


@contextlib.asynccontextmanager
async def busy_dashboard(label: str, size: tuple[int, int]):
    """The dashboard of run ``label`` at ``size`` showing ``busy_snapshot()`` (its syncs counted):
    the app, its source and the test pilot."""
    source = FakeSource(samples=SAMPLES)
    app = DashboardApp(source, label, poll_interval_s=POLL_S)
    async with app.run_test(size=size) as pilot:
        source.push(busy_snapshot())
        await wait_for(pilot, lambda: text(app, "num-syncs") == "412")
        yield app, source, pilot


def screen_lines(app: DashboardApp) -> list[str]:
    return svg_text(app.export_screenshot()).splitlines()


def shown_in(lines: list[str], region) -> str:
    """The characters on screen inside ``region``, row by row."""
    rows = lines[region.y : region.y + region.height]
    return "\n".join(row[region.x : region.x + region.width] for row in rows)


def squeeze(s: str) -> str:
    return "".join(s.split())


def assert_nothing_cut(app: DashboardApp, where: str) -> None:
    """Every text widget on screen shows its whole text in its own region (wrapped or folded
    onto more lines is fine, an ellipsis or a clipped row is not), inside the screen."""
    lines = screen_lines(app)
    screen = app.screen.region
    checked = 0
    for widget in app.screen.query("Static, Label"):
        if not all(node.display for node in widget.ancestors_with_self if node is not app):
            continue
        full = str(widget.render())
        if not squeeze(full) or widget.id in {"run-label"}:
            continue  # the run's label is cut deliberately; the header names it in full
        region = widget.region
        assert screen.contains_region(region), (where, widget.id, full)
        parent = widget.parent
        while parent is not None and parent is not app.screen:
            assert parent.region.contains_region(region), (where, widget.id, full)  # not clipped
            parent = parent.parent
        shown = shown_in(lines, region)
        assert squeeze(shown) == squeeze(full), (where, widget.id, full, shown)
        assert "…" not in shown or "…" in full, (where, widget.id, shown)
        checked += 1
    assert checked > 10, where
    for widget in app.query(".panel"):
        if widget.display:
            title = widget.border_title
            assert any(f"─ {title} ─" in line for line in lines), (where, title)


@pytest.mark.asyncio
@at_every_size
async def test_no_value_or_label_is_cut(size: tuple[int, int]) -> None:
    async with busy_dashboard("decode-heavy", size) as (app, _, pilot):
        await wait_for(pilot, lambda: text(app, "gpu-util") == "70 %")
        for panel in PANELS:  # one panel each at 80×24, beside the overview at 120
            await pilot.press(panel.KEY)
            await pilot.pause()
            assert_nothing_cut(app, f"{size} panel {panel.KEY}")
        await pilot.press("1")  # the cut line: the overview's top sync site, whole
        shown = "\n".join(screen_lines(app))
        assert "AsyncOutput.wait_for_the_device_copy (123,456)" in shown


@pytest.mark.asyncio
@at_every_size
async def test_every_key_the_help_names_shows_what_it_says(size: tuple[int, int]) -> None:
    async with busy_dashboard("mrv2-prof", size) as (app, source, pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = "\n".join(screen_lines(app))
        keys = dict(app.screen.keys)
        for key, what in keys.items():
            assert what in help_text, (size, key)  # the help fits: every line is on screen
        await pilot.press("escape")
        deck = app.query_one(PanelDeck)
        for panel in PANELS:
            assert keys[panel.KEY] == f"{panel.TITLE} panel"
            await pilot.press(panel.KEY)
            widget = app.query_one(f"#panel-{panel.NAME}")
            assert widget.display and widget.has_class("-selected"), (size, panel.KEY)
            assert any(f"{panel.KEY} {panel.TITLE}" in line for line in screen_lines(app))
            if deck.layout_name != "narrow":  # the overview is always there when it fits
                assert app.query_one("#panel-overview").display
        await pilot.press("1", "tab")  # "next / previous panel"
        assert app.query_one("#panel-throughput").has_class("-selected")
        await pilot.press("shift+tab", "shift+tab")
        assert app.query_one("#panel-gpu").has_class("-selected")
        await pilot.press("p")  # "pause / resume the display"
        assert "paused" in text(app, "status")
        await pilot.press("p")
        await pilot.press("q")  # "stop the run ... and quit"
        assert source.num_stop_requests == 1


@pytest.mark.asyncio
async def test_the_bar_moves_in_tokens_while_no_request_has_finished() -> None:
    """A burst of 512 requests of max_tokens 128 (65,536 tokens due) that all finish at the last
    step: requests done stay 0 while the bar moves with the tokens settled."""
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "waiting" in text(app, "run-label"))
        bar = app.query_one("#run-bar", ProgressBar)
        for settled in (0, 16_384, 49_152):  # 0 %, 25 %, 75 %
            source.push(busy_snapshot(num_finished=0, num_aborted=0, tokens_left=65_536 - settled))
            want = f"tokens {settled:,} / 65,536"
            await wait_for(pilot, lambda w=want: text(app, "run-measure") == w)
            assert (bar.total, bar.progress) == (65_536, settled)
            assert text(app, "run-counts").startswith("0 / 512 requests")
        assert "75%" in screen_lines(app)[2]
        # a producer without max_tokens: the bar counts requests and says so
        source.push(busy_snapshot(num_finished=40, num_aborted=2, tokens_due=None))
        await wait_for(pilot, lambda: text(app, "run-measure") == "requests 42 / 512")
        assert (bar.total, bar.progress) == (512, 42)


def test_live_stats_sends_the_sum_of_max_tokens_as_due() -> None:
    from types import SimpleNamespace

    engine = SimpleNamespace(
        num_waiting=0,
        num_running=0,
        num_kv_blocks_used=0,
        scheduler=SimpleNamespace(num_preemptions=0),
        info=SimpleNamespace(device="cpu"),
    )
    live = LiveStats("r", "label", 3, 10, max_tokens={"a": 10, "b": 5, "c": 4})
    live.on_abort("c")
    snap = live.snapshot(engine)
    assert (snap.tokens_due, snap.tokens_left) == (19, 15)  # c's 4 are no longer due
    assert LiveStats("r", "label", 1, 10).snapshot(engine).tokens_due is None


@pytest.mark.asyncio
async def test_sparklines_say_the_time_they_span_and_their_peak() -> None:
    source = FakeSource(samples=SAMPLES)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=(160, 48)) as pilot:
        for elapsed, rate in ((10.0, 100.0), (12.5, 3000.0), (22.5, 50.0)):
            source.push(busy_snapshot(elapsed_s=elapsed, tokens_per_s=rate))
            await wait_for(pilot, lambda e=elapsed: f"elapsed {e:.1f} s" in text(app, "run-counts"))
        spark = app.query_one("#tokens-spark", Sparkline)
        assert spark.data == [100.0, 3000.0, 50.0]
        # 22.5 - 10.0 s from the oldest value to the newest; the full height is 3,000 tok/s
        assert text(app, "tokens-spark-axis") == "12.5 s ago · peak 3,000.0 tok/s"
        # NVML: 8 samples a second apart, peaks 70 %, 15 GiB, 275 W
        assert text(app, "gpu-util-spark-axis") == "7.0 s ago · peak 70 %"
        assert text(app, "gpu-mem-spark-axis") == "7.0 s ago · peak 15.0 GiB"
        assert text(app, "gpu-power-spark-axis") == "7.0 s ago · peak 275 W"
        shown = "\n".join(screen_lines(app))
        assert "12.5 s ago · peak 3,000.0 tok/s" in shown and "now" in shown
        await pilot.resize_terminal(80, 24)  # the overview draws the same series, named
        await wait_for(pilot, lambda: app.query_one(PanelDeck).layout_name == "narrow")
        await pilot.press("1")
        assert text(app, "ov-tokens-spark-axis") == "output tok/s: 12.5 s ago · peak 3,000.0 tok/s"
