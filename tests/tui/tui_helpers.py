"""Shared by the TUI tests: fake snapshot sources, waiting on the pilot, SVG screen snapshots.

SVG snapshots: ``assert_snapshot(app, name)`` exports the screen as SVG and compares its text
(the characters on each line, recovered from the SVG) with ``snapshots/<name>.svg``; colours
and fonts are not compared, so a Textual upgrade that only restyles does not fail. Set
``MRV2_UPDATE_SNAPSHOTS=1`` to write the files anew (then look at them in a browser).
"""

from __future__ import annotations

import html
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from textual.app import App
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from mrv2_prof.views.snapshot import Snapshot

POLL_S = 0.01
SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
_CHAR_WIDTH = 12.2  # rich's export_svg: 0.61 × the 20 px font size per cell


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


def make_gpu_snapshot(**overrides: object) -> Snapshot:
    """A snapshot of a GPU run with every optional field measured."""
    values: dict[str, object] = dict(
        device="cuda:0",
        tpot_ms_p50=4.0,
        tpot_ms_p99=8.5,
        overlap_frac=0.62,
        bubble_host_bound_ns=1_200_000,
        bubble_other_ns=300_000,
        num_syncs=412,
        sync_blocked_ns=10_200_000,
        top_sync_sites=(
            ("mrv2_prof/runner/worker/model_runner.py:ModelRunner.wait_output", 400),
            ("mrv2_prof/runner/worker/sampler.py:123", 12),
        ),
        graph_mode_counts=(("full", 380), ("piecewise", 12), ("none", 8)),
        graph_hit_rate=0.98,
        top_fallback_reasons=(("num_tokens 9000 > largest capture size 512", 8),),
    )
    values.update(overrides)
    return make_snapshot(**values)


# (t_ns, gpu_util %, mem_used_bytes, power_w, sm_clock_mhz)
GPU_SAMPLES = [(1000 * i, 10.0 * i, (8 + i) * 2**30, 100.0 + 25 * i, 1800.0) for i in range(1, 9)]


class FakeSource:
    """The test decides what the next poll returns: ``push`` a snapshot, ``finish`` the run."""

    def __init__(self, samples: Sequence[Sequence[float]] = (), note: str | None = None) -> None:
        self.pending: Snapshot | None = None
        self.done = False
        self.num_polls = 0
        self.num_stop_requests = 0
        self.stop_signals: list[int] = []
        self.samples = list(samples)
        self.note = note

    def push(self, snapshot: Snapshot) -> None:
        self.pending = snapshot

    def finish(self) -> None:
        self.done = True

    def poll(self) -> tuple[Snapshot | None, bool]:
        self.num_polls += 1
        snapshot, self.pending = self.pending, None
        return snapshot, self.done

    def request_stop(self, signum: int = 0) -> None:
        self.num_stop_requests += 1
        self.stop_signals.append(signum)

    def gpu_samples(self) -> tuple[list[Sequence[float]], str | None]:
        return list(self.samples), self.note


class ScriptedSource(FakeSource):
    """Returns one scripted item per poll, then reports done."""

    def __init__(self, script: list[Snapshot | None]) -> None:
        super().__init__()
        self.script = list(script)

    def poll(self) -> tuple[Snapshot | None, bool]:
        self.num_polls += 1
        snapshot = self.script.pop(0) if self.script else None
        return snapshot, not self.script


def paint_after(
    monkeypatch, cls: type, method: str, table_id: str, rows: int, *, width: int = 0,
    on_screen_only: bool = False,
) -> list[int]:  # fmt: skip
    """``cls.method`` (a fill, or the handler of a loaded page) patched to paint the table
    ``#table_id`` (its first ``rows`` lines, ``width`` or its own width wide) right after it, as
    a screen refresh between a fill and the table's measure of its columns does on a loaded
    machine. ``on_screen_only``: a call while the table is hidden (width 0) is dropped, so the
    first fill happens on screen. Returns the table's row count at each paint."""
    original = getattr(cls, method)
    paints: list[int] = []

    def patched(self, *args) -> None:
        table = self.query_one(f"#{table_id}", DataTable)
        if on_screen_only and not table.size.width:
            return
        original(self, *args)
        table.render_lines(Region(0, 0, width or table.size.width, rows))
        paints.append(table.row_count)

    monkeypatch.setattr(cls, method, patched)
    return paints


def text(app: App, widget_id: str) -> str:
    """The plain text a Static of the active screen currently renders."""
    return str(app.screen.query_one(f"#{widget_id}", Static).render())


async def wait_for(pilot: Pilot, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll until ``predicate`` holds; the deadline is long because a loaded 2-core machine
    running tests in parallel paints late (a pass costs only the time the condition takes)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(POLL_S)


async def wait_polls(pilot: Pilot, source: FakeSource, n: int = 3) -> None:
    """Let the app poll the source ``n`` more times."""
    target = source.num_polls + n
    await wait_for(pilot, lambda: source.num_polls >= target)


_TEXT = re.compile(
    r'<text [^>]*?x="([\d.]+)"[^>]*?clip-path="url\(#[\w-]+?-line-(\d+)\)"[^>]*>(.*?)</text>'
)


def svg_text(svg: str) -> str:
    """The characters on screen, line by line, as placed in a rich SVG export."""
    lines: dict[int, list[str]] = {}
    for x, line, content in _TEXT.findall(svg):
        row = lines.setdefault(int(line), [])
        col = round(float(x) / _CHAR_WIDTH)
        chars = html.unescape(content).replace("\xa0", " ")
        if len(row) < col + len(chars):
            row.extend(" " * (col + len(chars) - len(row)))
        row[col : col + len(chars)] = chars
    if not lines:
        return ""
    return "\n".join("".join(lines.get(i, [])).rstrip() for i in range(max(lines) + 1))


async def stable_svg(pilot: Pilot, app: App, timeout_s: float = 5.0) -> str:
    """The screen as SVG once two exports 50 ms apart show the same text (no frame pending)."""
    deadline = time.monotonic() + timeout_s
    svg = app.export_screenshot(simplify=True)
    while True:
        await pilot.pause(0.05)
        again = app.export_screenshot(simplify=True)
        if svg_text(again) == svg_text(svg) or time.monotonic() > deadline:
            return again
        svg = again


async def assert_snapshot(pilot: Pilot, app: App, name: str) -> None:
    """The screen's text equals that of ``snapshots/<name>.svg`` (written when updating)."""
    svg = re.sub(r"\bterminal-\d+", "terminal", await stable_svg(pilot, app))
    path = SNAPSHOT_DIR / f"{name}.svg"
    if os.environ.get("MRV2_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT_DIR.mkdir(exist_ok=True)
        path.write_text(svg, encoding="utf-8")
    assert path.exists(), f"no snapshot {path}; run with MRV2_UPDATE_SNAPSHOTS=1 to write it"
    expected = svg_text(path.read_text(encoding="utf-8"))
    actual = svg_text(svg)
    assert actual == expected, f"screen differs from {path.name}:\n{actual}"
