"""Starved time and perturbed steps in the views: the report's bubbles figure and header, and
the Perfetto export's GPU slices (a hand-built run: two steps, the second perturbed)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mrv2_prof.analysis.run_data import load_run_data
from mrv2_prof.report.figures import bubbles
from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.report.trace_export import export_trace
from mrv2_prof.store import Store

MS = 1_000_000
T0 = 7_000_000_000


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "r.duckdb"
    with Store.open(path) as store:
        store.begin_run("s1", scenario_name="x", label="x", matrix_combo=None, scenario_yaml="",
                        device="cuda", versions={}, started_ns=T0)  # fmt: skip
        store.update_run("s1", environment={"cpu_model": "EPYC", "cpu_count": 16,
                                            "torch": "2.9", "cuda": "12.8"})  # fmt: skip
        store.append("s1", "steps", {
            "step": [0, 1], "cpu_start_ns": [T0, T0 + 10 * MS], "cpu_end_ns": [T0 + 9 * MS,
            T0 + 19 * MS], "gpu_start_ns": [T0 + MS, T0 + 11 * MS],
            "gpu_end_ns": [T0 + 8 * MS, T0 + 18 * MS], "num_tokens": [4, 4],
            "graph_mode": ["none", "none"], "bubble_ns": [None, 3 * MS],
            "bubble_kind": [None, "host_bound"], "starved_ns": [2 * MS, MS // 2],
            "perturbed": [False, True],
        })  # fmt: skip
        store.append("s1", "spans", {
            "step": [0, 1], "track": ["gpu", "gpu"], "name": ["forward", "forward"],
            "start_ns": [T0 + MS, T0 + 11 * MS], "end_ns": [T0 + 8 * MS, T0 + 18 * MS],
            "starved_ns": [2 * MS, MS // 2],
        })  # fmt: skip
        store.finish_run("s1", "completed", ended_ns=T0 + 20 * MS)
    return path


def test_the_bubbles_figure_counts_starved_time_and_the_header_says_it(db: Path):
    with Store.open(db, read_only=True) as store:
        fig = bubbles(load_run_data(store, "s1"))
        page = render_run_report(store, "s1")
    assert fig.layout.meta["totals_ms"] == {"host_bound": 3.0, "starved": 2.5}
    assert any("1 perturbed steps" in n for n in fig.layout.meta["notes"])
    assert "GPU starved" in page and "2.0 ms inside steps waiting for the host" in page
    assert "1 steps (traced or capturing) left out" in page
    assert "EPYC x16" in page and "torch 2.9 / CUDA 12.8" in page


def test_the_trace_export_carries_starved_time_and_the_perturbed_flag(db: Path):
    buf = io.StringIO()
    with Store.open(db, read_only=True) as store:
        export_trace(store, "s1", buf, None)
    events = [e for e in json.loads(buf.getvalue())["traceEvents"] if e.get("ph") == "X"]
    gpu = {
        (e["args"].get("step"), e["name"]): e["args"] for e in events if "starved_ns" in e["args"]
    }
    steps = {k[0]: a for k, a in gpu.items() if k[1] == "step"}
    assert steps[0]["starved_ns"] == 2 * MS and "perturbed" not in steps[0]
    assert steps[1]["starved_ns"] == MS // 2 and steps[1]["perturbed"] is True
    phases = [a["starved_ns"] for k, a in sorted(gpu.items()) if k[1] != "step"]
    assert phases == [2 * MS, MS // 2]
