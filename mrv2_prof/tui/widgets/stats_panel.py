"""The live numbers of one snapshot: queue, throughput, latency, KV cache and staged writes.

Each value is its own ``Static`` with an id (``#num-waiting``, ``#ttft-p99``, ...), grouped in
bordered cards.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Label, Static

from mrv2_prof.snapshot import Snapshot
from mrv2_prof.tui.format import (
    NO_VALUE,
    format_bytes,
    format_count,
    format_ms,
    format_percent,
    format_rate,
    staged_ratio,
)

# card title -> rows of (value id, row name, formatter of the snapshot)
_CARDS: dict[str, list[tuple[str, str, Callable[[Snapshot], str]]]] = {
    "requests": [
        ("num-waiting", "waiting", lambda s: format_count(s.num_waiting)),
        ("num-running", "running", lambda s: format_count(s.num_running)),
        ("num-finished", "finished", lambda s: format_count(s.num_finished)),
        ("num-aborted", "aborted", lambda s: format_count(s.num_aborted)),
    ],
    "throughput": [
        ("steps-per-s", "steps/s", lambda s: format_rate(s.steps_per_s)),
        ("tokens-per-s", "output tok/s", lambda s: format_rate(s.tokens_per_s)),
        ("num-steps", "steps", lambda s: format_count(s.steps)),
        ("output-tokens", "output tokens", lambda s: format_count(s.output_tokens)),
    ],
    "latency": [
        ("ttft-p50", "TTFT p50", lambda s: format_ms(s.ttft_ms_p50)),
        ("ttft-p99", "TTFT p99", lambda s: format_ms(s.ttft_ms_p99)),
        ("itl-p50", "ITL p50", lambda s: format_ms(s.itl_ms_p50)),
        ("itl-p99", "ITL p99", lambda s: format_ms(s.itl_ms_p99)),
    ],
    "KV cache": [
        ("kv-usage", "usage", lambda s: format_percent(s.kv_usage)),
        ("num-preemptions", "preemptions", lambda s: format_count(s.num_preemptions)),
    ],
    "staged writes": [
        ("staged-bytes", "staged", lambda s: format_bytes(s.staged_bytes)),
        ("dense-bytes", "dense", lambda s: format_bytes(s.dense_bytes)),
        (
            "staged-ratio",
            "staged/dense",
            lambda s: format_percent(staged_ratio(s.staged_bytes, s.dense_bytes)),
        ),
    ],
}


class StatsPanel(Grid):
    """Cards of named values; ``show(snapshot)`` rewrites every value."""

    def compose(self) -> ComposeResult:
        for title, rows in _CARDS.items():
            card = Vertical(classes="card")
            card.border_title = title
            with card:
                for value_id, name, _ in rows:
                    with Horizontal(classes="row"):
                        yield Label(name, classes="name")
                        yield Static(NO_VALUE, id=value_id, classes="value", markup=False)

    def show(self, snapshot: Snapshot) -> None:
        for rows in _CARDS.values():
            for value_id, _, render in rows:
                self.query_one(f"#{value_id}", Static).update(render(snapshot))
