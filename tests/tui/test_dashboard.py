"""DashboardApp driven by a fake snapshot source through Textual's pilot."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys

import pytest
from textual.widgets import ProgressBar, Sparkline
from tui_helpers import (
    GPU_SAMPLES,
    POLL_S,
    FakeSource,
    ScriptedSource,
    make_gpu_snapshot,
    make_snapshot,
    text,
    wait_for,
    wait_polls,
)

from mrv2_prof.tui.dashboard import PAUSED_TEXT, STOPPING_TEXT, DashboardApp
from mrv2_prof.tui.screens.help_screen import HelpScreen
from mrv2_prof.tui.widgets import PANELS, PanelDeck

NARROW = (80, 24)
MEDIUM = (120, 40)
WIDE = (160, 48)
ALL = [p.NAME for p in PANELS]


def visible(app: DashboardApp) -> list[str]:
    return [type(p).NAME for p in app.query_one(PanelDeck).panels if p.display]


def on_screen(app: DashboardApp, widget) -> bool:
    region = widget.region
    return region.width > 0 and region.height > 0 and app.screen.region.contains_region(region)


@pytest.mark.asyncio
async def test_shows_placeholders_before_the_first_snapshot() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        await wait_polls(pilot, source)
        assert text(app, "ttft-p50") == "—"
        assert text(app, "staged-ratio") == "—"
        assert text(app, "ov-throughput") == "—"
        assert text(app, "gpu-note") == "waiting for samples…"
        assert "waiting for the first snapshot" in text(app, "run-label")
        assert app.title == "mrv2-prof"


@pytest.mark.asyncio
async def test_shows_the_latest_snapshot_and_follows_the_next() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=WIDE) as pilot:
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
        assert text(app, "tpot-p50") == "—"  # a producer that does not measure TPOT
        assert text(app, "kv-usage") == "42.5 %"
        assert text(app, "num-preemptions") == "1"
        assert text(app, "staged-bytes") == "1.5 MiB"
        assert text(app, "dense-bytes") == "48.0 MiB"
        assert text(app, "staged-ratio") == "3.1 %"
        assert text(app, "saved-bytes") == "46.5 MiB"
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
        assert app.query_one("#tokens-spark", Sparkline).data == [2048.0, 2048.0]
        assert app.return_value is None  # still running: the source is not done


@pytest.mark.asyncio
async def test_gpu_run_values_in_the_panels_and_the_overview() -> None:
    source = FakeSource(samples=GPU_SAMPLES)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=WIDE) as pilot:
        source.push(make_gpu_snapshot())
        await wait_for(pilot, lambda: text(app, "num-syncs") == "412")
        assert text(app, "tpot-p50") == "4.00 ms"
        assert text(app, "tpot-p99") == "8.50 ms"
        # overlap and bubbles: 1.2 ms of 1.5 ms idle was host-bound
        assert text(app, "overlap-frac") == "62.0 %"
        assert text(app, "bubble-host-bound") == "1.20 ms"
        assert text(app, "bubble-other") == "0.30 ms"
        assert text(app, "bubble-share") == "80.0 %"
        # syncs: 412 over 400 steps, sites without their directories, counts right-aligned
        assert text(app, "syncs-per-step") == "1.03"
        assert text(app, "sync-blocked") == "10.2 ms"
        assert text(app, "sync-sites") == (
            "400  model_runner.py:ModelRunner.wait_output\n 12  sampler.py:123"
        )
        # graphs: 400 dispatches, 380 / 12 / 8 of them
        assert text(app, "graph-hit-rate") == "98.0 %"
        assert text(app, "num-dispatches") == "400"
        assert text(app, "graph-modes") == (
            "full       380 (95.0 %)\npiecewise  12 (3.0 %)\nnone       8 (2.0 %)"
        )
        assert text(app, "graph-reasons") == "8  num_tokens 9000 > largest capture size 512"
        # NVML: the newest of 8 samples is 80 %, 16 GiB, 300 W
        assert text(app, "gpu-util") == "80 %"
        assert text(app, "gpu-mem") == "16.0 GiB"
        assert text(app, "gpu-power") == "300 W"
        assert app.query_one("#gpu-util-spark", Sparkline).data == [10.0 * i for i in range(1, 9)]
        assert app.query_one("#gpu-power-spark", Sparkline).data[-1] == 300.0
        assert not app.query_one("#gpu-note").display
        # the overview says the same in one line per panel
        assert text(app, "ov-throughput") == "2,048.0 tok/s · 31.5 steps/s · 400 steps"
        assert text(app, "ov-requests") == "40 done · 2 aborted · 8 running · 3 waiting"
        assert text(app, "ov-latency") == (
            "TTFT 12.5 / 80.2 ms · ITL 4.12 / 9.50 ms · TPOT 4.00 / 8.50 ms"
        )
        assert text(app, "ov-overlap") == (
            "62.0 % hidden · bubbles 1.20 ms host-bound, 0.30 ms other"
        )
        assert text(app, "ov-syncs") == (
            "412 · 10.2 ms blocked · top model_runner.py:ModelRunner.wait_output (400)"
        )
        assert text(app, "ov-graphs") == "98.0 % replayed · full 380, piecewise 12, none 8"
        assert text(app, "ov-staged") == "1.5 MiB vs 48.0 MiB dense (3.1 %)"
        assert text(app, "ov-kv") == "42.5 % used · 1 preemption"
        assert text(app, "ov-gpu") == "util 80 % · mem 16.0 GiB · 300 W"


@pytest.mark.asyncio
async def test_cpu_run_says_what_it_cannot_measure() -> None:
    note = "probes.nvml_hz: the run is on the CPU; no GPU telemetry"
    source = FakeSource(note=note)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=WIDE) as pilot:
        source.push(make_snapshot(device="cpu", num_preemptions=2))
        await wait_for(pilot, lambda: text(app, "overlap-frac") == "n/a on CPU")
        for value_id in ("bubble-host-bound", "bubble-other", "gpu-util", "gpu-mem"):
            assert text(app, value_id) == "n/a on CPU"
        assert text(app, "gpu-note") == "n/a on CPU: no GPU telemetry"
        assert text(app, "ov-overlap") == "n/a on CPU (no GPU timeline)"
        assert text(app, "ov-gpu") == "n/a on CPU"
        assert text(app, "ov-graphs") == "—"  # no dispatch yet
        assert text(app, "ov-syncs") == "0 · 0.00 ms blocked"
        assert text(app, "ov-kv") == "42.5 % used · 2 preemptions"
        assert text(app, "graph-modes") == "—"
        assert "on cpu" in text(app, "run-label")


@pytest.mark.asyncio
async def test_at_80x24_one_panel_at_a_time_keys_and_tab_switch() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        source.push(make_gpu_snapshot())
        await wait_for(pilot, lambda: text(app, "num-syncs") == "412")
        assert visible(app) == ["overview"]
        await pilot.press("5")
        assert visible(app) == ["syncs"]
        await pilot.press("tab")
        assert visible(app) == ["graphs"]
        await pilot.press("shift+tab", "shift+tab")
        assert visible(app) == ["overlap"]
        await pilot.press("9", "tab")  # wraps around to the first panel
        assert visible(app) == ["overview"]
        await pilot.press("shift+tab")
        assert visible(app) == ["gpu"]


@pytest.mark.asyncio
async def test_every_panel_fits_80x24_when_selected() -> None:
    source = FakeSource(samples=GPU_SAMPLES)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        # speculating: the overview's spec-decode row is shown too
        source.push(make_gpu_snapshot(spec_num_drafts=4, spec_reserved_slots=8, spec_sat_out=1))
        await wait_for(pilot, lambda: text(app, "num-syncs") == "412")
        for panel in PANELS:
            await pilot.press(panel.KEY)
            assert visible(app) == [panel.NAME]
            shown = app.query_one(f"#panel-{panel.NAME}")
            values = list(shown.query(".value, .list, Sparkline"))
            assert values, panel.NAME
            for widget in values:
                assert on_screen(app, widget), (panel.NAME, widget)
        for widget in app.query("#run-bar, #run-counts, #run-label"):
            assert on_screen(app, widget), widget


@pytest.mark.asyncio
async def test_a_wide_terminal_shows_all_nine_panels_in_a_grid() -> None:
    source = FakeSource(samples=GPU_SAMPLES)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=WIDE) as pilot:
        source.push(make_gpu_snapshot())
        await wait_for(pilot, lambda: text(app, "num-syncs") == "412")
        assert visible(app) == ALL
        for name in ALL:
            panel = app.query_one(f"#panel-{name}")
            for widget in panel.query(".value, .list, Sparkline"):
                hidden = not all(node.display for node in widget.ancestors_with_self[:-2])
                if hidden:  # the spec row (no speculation) and the overview's sparkline
                    assert widget.id in {"ov-spec", "ov-tokens-spark"}
                    continue
                assert on_screen(app, widget), (name, widget)
        # three rows of 4 cells of 40 columns; the overview, syncs and graphs take two cells
        rows: dict[int, list] = {}
        for name in ALL:
            region = app.query_one(f"#panel-{name}").region
            rows.setdefault(region.y, []).append((name, region.width))
        assert list(rows.values()) == [
            [("overview", 80), ("throughput", 40), ("latency", 40)],
            [("overlap", 40), ("syncs", 80), ("staged", 40)],
            [("graphs", 80), ("kv", 40), ("gpu", 40)],
        ]
        await pilot.press("6")  # selecting highlights, everything stays on screen
        assert visible(app) == ALL
        assert app.query_one("#panel-graphs").has_class("-selected")
        assert not app.query_one("#panel-syncs").has_class("-selected")


@pytest.mark.asyncio
async def test_at_120_columns_the_overview_sits_beside_the_picked_panel() -> None:
    source = FakeSource(samples=GPU_SAMPLES)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=MEDIUM) as pilot:
        source.push(make_gpu_snapshot())
        await wait_for(pilot, lambda: text(app, "num-syncs") == "412")
        assert visible(app) == ["overview", "throughput"]
        overview, right = (app.query_one(f"#panel-{n}").region for n in ("overview", "throughput"))
        assert (overview.width, right.x, right.width) == (80, 80, 40)
        await pilot.press("5")
        assert visible(app) == ["overview", "syncs"]
        await pilot.press("1")  # the overview is picked: highlighted, the last detail stays
        assert visible(app) == ["overview", "syncs"]
        assert app.query_one("#panel-overview").has_class("-selected")
        await pilot.press("shift+tab")  # from the overview back to the last panel, the GPU's
        assert visible(app) == ["overview", "gpu"]


@pytest.mark.asyncio
async def test_resizing_switches_between_the_layouts() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        await pilot.press("3")
        assert visible(app) == ["latency"]
        await pilot.resize_terminal(*WIDE)
        await wait_for(pilot, lambda: visible(app) == ALL)
        await pilot.resize_terminal(*MEDIUM)
        await wait_for(pilot, lambda: visible(app) == ["overview", "latency"])
        await pilot.resize_terminal(*NARROW)
        await wait_for(pilot, lambda: visible(app) == ["latency"])  # the selection is kept


@pytest.mark.asyncio
async def test_question_mark_opens_help_and_escape_closes_it() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = [key for key, _ in app.screen.keys]
        assert {"q", "p", "tab / shift+tab", "?"} <= set(keys)
        assert [str(i) for i in range(1, 10)] == [k for k in keys if k.isdigit()]
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        await pilot.press("question_mark")  # ? toggles it
        assert not isinstance(app.screen, HelpScreen)
        assert source.num_stop_requests == 0


@pytest.mark.asyncio
async def test_q_in_the_help_screen_still_stops_the_run() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        await pilot.press("question_mark", "q")
        assert source.num_stop_requests == 1
        assert not isinstance(app.screen, HelpScreen)
        assert STOPPING_TEXT in text(app, "status")


@pytest.mark.asyncio
async def test_q_requests_stop_once_and_exits_when_the_source_is_done() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
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
    async with app.run_test(size=NARROW) as pilot:
        await pilot.press("ctrl+q")
        await wait_polls(pilot, source)
        assert source.num_stop_requests == 1
        assert app.return_value is None
        source.finish()
        await wait_for(pilot, lambda: app.return_value is not None)
    assert app.return_value == "stopped"


@pytest.mark.asyncio
async def test_ctrl_c_stops_the_run_as_sigint_and_q_as_a_plain_quit() -> None:
    """Ctrl-C in the raw-mode terminal is a key: it asks for the stop as SIGINT (the CLI then
    exits 130, as for a Ctrl-C outside the dashboard); q asks with no signal."""
    for key, want in (("ctrl+c", [signal.SIGINT]), ("q", [0])):
        source = FakeSource()
        app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
        async with app.run_test(size=NARROW) as pilot:
            await pilot.press(key)
            await pilot.press(key)  # a second press while stopping changes nothing
            await wait_polls(pilot, source)
            source.finish()
            await wait_for(pilot, lambda app=app: app.return_value is not None)
        assert source.stop_signals == want, key
        assert app.return_value == "stopped"


@pytest.mark.asyncio
async def test_exits_with_done_when_the_run_ends_by_itself() -> None:
    last = make_snapshot(num_waiting=0, num_running=0, num_finished=510, num_aborted=2)
    script = [make_snapshot(), None, make_snapshot(num_finished=200), last]
    source = ScriptedSource(script)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        await wait_for(pilot, lambda: app.return_value is not None)
        assert text(app, "num-finished") == "510"
    assert app.return_value == "done"
    assert app.latest == last
    assert source.num_stop_requests == 0
    assert source.num_polls == len(script)  # no poll after done


@pytest.mark.asyncio
async def test_p_freezes_the_display_but_keeps_polling() -> None:
    source = FakeSource(samples=GPU_SAMPLES[:4])
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        first = make_gpu_snapshot()
        source.push(first)
        await wait_for(pilot, lambda: text(app, "num-running") == "8")
        assert text(app, "gpu-util") == "40 %"

        await pilot.press("p")
        assert PAUSED_TEXT in text(app, "status")
        second = dataclasses.replace(first, num_running=1, num_finished=99, itl_ms_p99=20.0)
        source.push(second)
        source.samples = GPU_SAMPLES  # newer NVML samples arrive too
        await wait_for(pilot, lambda: app.latest == second)  # taken from the source...
        await wait_polls(pilot, source)
        assert text(app, "num-running") == "8"  # ...but not shown
        assert text(app, "num-finished") == "40"
        assert text(app, "itl-p99") == "9.50 ms"
        assert text(app, "gpu-util") == "40 %"
        await pilot.press("3")  # switching panels works while paused
        assert visible(app) == ["latency"]

        await pilot.press("p")  # resume shows the newest at once
        assert text(app, "num-running") == "1"
        assert text(app, "itl-p99") == "20.0 ms"
        assert text(app, "gpu-util") == "80 %"
        assert "paused" not in text(app, "status")


def test_importing_the_dashboard_does_not_import_torch_or_the_runner() -> None:
    code = (
        "import sys, mrv2_prof.tui.dashboard; "
        "bad = [m for m in ('torch', 'mrv2_prof.runner') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_source_format_and_digest_import_without_textual() -> None:
    code = (
        "import sys, mrv2_prof.tui.source, mrv2_prof.views.format, mrv2_prof.tui.digest; "
        "assert 'textual' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
