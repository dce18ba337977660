"""The HTML report of a real quickstart run (CPU): every figure it draws recomputed in Python from
the run's stored rows, and the figures a CPU run cannot have said why."""

from __future__ import annotations

import numpy as np
import pytest

from mrv2_prof.report.html_report import render_run_report
from mrv2_prof.store import Store
from tests.report.test_html_report import (
    assert_self_contained,
    figures_of,
    not_measured,
    segments_of,
    trace,
)


def test_quickstart_report_draws_the_stored_rows(run_in_process):
    job, _ = run_in_process()
    with Store.open(job.db_path, read_only=True) as store:
        run_id = store.resolve_run("latest")
        page = render_run_report(store, run_id)
        con = store.connection
        steps = con.execute(
            "SELECT cpu_start_ns, cpu_end_ns FROM steps WHERE run_id = ? ORDER BY step", [run_id]
        ).fetchall()
        requests = con.execute(
            "SELECT arrival_ns, first_token_ns, finish_ns, finish_reason FROM requests "
            "WHERE run_id = ?", [run_id],
        ).fetchall()  # fmt: skip
        staged = con.execute(
            "SELECT tensor, staged_bytes FROM staged_writes WHERE run_id = ?", [run_id]
        ).fetchall()
        running = con.execute(
            "SELECT num_running FROM steps WHERE run_id = ? ORDER BY step", [run_id]
        ).fetchall()
    assert_self_contained(page)
    figs = figures_of(page)
    # a CPU run: no GPU timeline, NVML or graphs, and the page says why
    assert set(figs) == {
        "timeline", "scheduler", "sync_sites", "graph_modes", "staged_writes", "latency_cdf",
    }  # fmt: skip
    missing = not_measured(page)
    assert set(missing) == {
        "overlap", "bubbles", "graph_capture", "nvml", "host_flame", "spec_decode", "spec_steps",
        "roofline", "kernel_ops",
    }  # fmt: skip
    assert all(why.startswith("not measured on this run: ") for why in missing.values())
    assert missing["host_flame"].endswith("probes.host_sampling_hz was 0")
    assert "cpu" in missing["nvml"] and "mode none requested" in missing["graph_capture"]
    timeline = figs["timeline"]
    assert any(n.startswith("GPU lanes: not measured") for n in timeline["layout"]["meta"]["notes"])
    t0 = steps[0][0]
    expected = [((s - t0) / 1e6, (e - t0) / 1e6) for s, e in steps]
    drawn = segments_of(trace(timeline, "CPU step"))
    assert np.asarray(drawn) == pytest.approx(np.asarray(expected))
    done = [r for r in requests if r[3] in ("stop", "length")]
    ttft = sorted((first - arrival) / 1e6 for arrival, first, _, _ in done)
    e2e = sorted((finish - arrival) / 1e6 for arrival, _, finish, _ in done)
    cdf = figs["latency_cdf"]
    for name, values in (("TTFT", ttft), ("E2E", e2e)):
        x, y = np.asarray(trace(cdf, name)["x"]), np.asarray(trace(cdf, name)["y"])
        assert (x[0], x[-1], y[0], y[-1]) == pytest.approx((values[0], values[-1], 1 / 16, 1))
    totals: dict[str, int] = {}
    for tensor, nbytes in staged:
        totals[tensor] = totals.get(tensor, 0) + nbytes
    bars = trace(figs["staged_writes"], "staged bytes")
    assert dict(zip(bars["x"], np.asarray(bars["y"]).tolist(), strict=True)) == totals
    # the scheduler panel draws the stored queue, step by step
    assert list(trace(figs["scheduler"], "running")["y"]) == [r for (r,) in running]
