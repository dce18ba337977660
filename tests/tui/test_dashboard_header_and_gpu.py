"""The dashboard's header names the run once; on a CPU run the NVML panel says there is no GPU
instead of drawing flat sparklines (which read as zeros)."""

from __future__ import annotations

import pytest
from textual.widgets import Sparkline
from tui_helpers import (
    GPU_SAMPLES,
    POLL_S,
    FakeSource,
    make_gpu_snapshot,
    make_snapshot,
    svg_text,
    text,
    wait_for,
)

from mrv2_prof.tui.dashboard import DashboardApp

NARROW = (80, 24)
SPARKS = ("#gpu-util-spark", "#gpu-mem-spark", "#gpu-power-spark")


@pytest.mark.asyncio
async def test_the_header_names_the_run_once() -> None:
    source = FakeSource(samples=GPU_SAMPLES)
    app = DashboardApp(source, "decode-heavy", poll_interval_s=POLL_S)  # the CLI's title
    async with app.run_test(size=NARROW) as pilot:
        source.push(make_gpu_snapshot(label="decode-heavy"))
        await wait_for(pilot, lambda: text(app, "ov-gpu").startswith("util 80"))
        await pilot.pause()
        header = svg_text(app.export_screenshot()).splitlines()[0]
        assert header.count("decode-heavy") == 1 and app.sub_title == ""


@pytest.mark.asyncio
async def test_a_label_other_than_the_title_is_the_sub_title() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        source.push(make_snapshot(label="decode-heavy"))
        await wait_for(pilot, lambda: app.sub_title == "decode-heavy")
        assert app.title == "mrv2-prof"


@pytest.mark.asyncio
async def test_a_cpu_run_has_no_gpu_sparklines() -> None:
    note = "probes.nvml_hz: the run is on the CPU; no GPU telemetry"
    source = FakeSource(note=note)
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        source.push(make_snapshot(device="cpu"))
        await wait_for(pilot, lambda: text(app, "gpu-note") == "n/a on CPU: no GPU telemetry")
        await pilot.press("9")  # the GPU panel
        await wait_for(pilot, lambda: not any(app.query_one(s, Sparkline).display for s in SPARKS))
        assert all(not app.query_one(s, Sparkline).display for s in SPARKS)
        screen = svg_text(app.export_screenshot())
        assert "n/a on CPU: no GPU telemetry" in screen
        assert not any(ch in screen for ch in "▁▂▃▄▅▆▇█")  # no sparkline drawn anywhere


@pytest.mark.asyncio
async def test_sparklines_appear_with_the_first_samples() -> None:
    source = FakeSource()
    app = DashboardApp(source, "mrv2-prof", poll_interval_s=POLL_S)
    async with app.run_test(size=NARROW) as pilot:
        source.push(make_gpu_snapshot())
        await wait_for(pilot, lambda: text(app, "gpu-note") == "waiting for samples…")
        assert all(not app.query_one(s, Sparkline).display for s in SPARKS)
        source.samples = list(GPU_SAMPLES)
        await wait_for(pilot, lambda: text(app, "gpu-util") == "80 %")
        assert all(app.query_one(s, Sparkline).display for s in SPARKS)
