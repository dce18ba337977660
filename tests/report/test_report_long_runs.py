"""The report of a long run: phase detail kept for a window around the slowest step, and a
10,000-step run rendered in bounded time and size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_html_report import MS, T0, _begin, figures_of, segments_of, trace

from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.store import Store


def test_many_steps_keep_phase_detail_for_a_window_around_the_slowest(tmp_path):
    # 10 steps of 1 ms each, step 6 takes 5 ms; detail for 4 steps: 6 - 4 // 2 = 4 -> steps 4..7
    path = tmp_path / "runs.duckdb"
    durations = [1, 1, 1, 1, 1, 1, 5, 1, 1, 1]
    starts = np.cumsum([0, *durations[:-1]])
    with Store.open(path) as store:
        _begin(store, "0b0001")
        store.append("0b0001", "steps", {
            "step": np.arange(10), "cpu_start_ns": T0 + starts * MS,
            "cpu_end_ns": T0 + (starts + durations) * MS,
        })  # fmt: skip
        store.append("0b0001", "spans", {
            "step": np.arange(10), "track": ["cpu"] * 10, "name": ["forward"] * 10,
            "start_ns": T0 + starts * MS, "end_ns": T0 + (starts + durations) * MS,
        })  # fmt: skip
        page = render_run_report(store, "0b0001", detail_steps=4)
        moved = render_run_report(store, "0b0001", detail_steps=4, detail_window=(0, 1))
    fig = figures_of(page)["timeline"]
    assert fig["layout"]["meta"]["detail_window"] == [4, 7]
    assert len(segments_of(trace(fig, "CPU step"))) == 10  # every step's overall span
    forward = np.asarray(trace(fig, "forward (CPU)")["customdata"])[0::3, 0]
    assert forward.tolist() == [4, 5, 6, 7]
    assert fig["layout"]["xaxis"]["range"] == [4.0, 12.0]  # opens on steps 4..7 (ms 4 to 12)
    assert any("steps 4–7 only" in n for n in fig["layout"]["meta"]["notes"])
    forward = np.asarray(trace(figures_of(moved)["timeline"], "forward (CPU)")["customdata"])
    assert forward[0::3, 0].tolist() == [0, 1]


@pytest.mark.slow
def test_a_10k_step_run_reports_in_bounded_time(tmp_path):
    """The benchmark's 10,000-step run (benchmarks/report_10k.py): well under 30 s and 20 MiB."""
    import importlib.util
    import time

    path = Path(__file__).resolve().parents[2] / "benchmarks/report_10k.py"
    spec = importlib.util.spec_from_file_location("report_10k", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with Store.open(tmp_path / "runs.duckdb") as store:
        bench.build_run(store, "b10k01", 10_000)
        t = time.perf_counter()
        page = render_run_report(store, "b10k01")
        elapsed_s = time.perf_counter() - t
    assert elapsed_s < 30 and len(page) < 20 * 2**20
    timeline = figures_of(page)["timeline"]
    assert len(segments_of(trace(timeline, "CPU step"))) == 10_000
    assert len(segments_of(trace(timeline, "forward (CPU)"))) == 2_000
