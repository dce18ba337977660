"""``runs`` and the summary each name the duration they show: the wall time of the run
(start-up included) and the serving time (first arrival to last finish)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from mrv2_prof.analysis.summary import render_runs, render_summary
from mrv2_prof.store import Store


def _text(renderable) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_runs_show_the_wall_time_and_the_summary_the_serving_time(tmp_path: Path):
    db = tmp_path / "runs.duckdb"
    with Store.open(db) as store:
        store.begin_run("d0d0d0", scenario_name="d", label="d", matrix_combo=None,
                        scenario_yaml="", device="cpu", versions={}, started_ns=1)  # fmt: skip
        # start-up 1.0 s, then two requests: first arrival 1.0 s, last finish 1.1 s
        store.append("d0d0d0", "requests", {
            "req_id": ["a", "b"], "arrival_ns": [1_000_000_000, 1_020_000_000],
            "finish_ns": [1_080_000_000, 1_100_000_000], "prompt_tokens": [4, 4],
            "output_tokens": [2, 2], "finish_reason": ["length", "length"],
        })  # fmt: skip
        store.finish_run("d0d0d0", "completed", ended_ns=1_100_000_000)
        runs = _text(render_runs(store.list_runs(), str(db)))
        summary = _text(render_summary(store, "d0d0d0"))
    words = " ".join(runs.split())
    assert "wall time" in words and "│ 1.1 s │" in words and "start-up included" in words
    assert "serving time 0.10 s (first arrival to last finish)" in " ".join(summary.split())
