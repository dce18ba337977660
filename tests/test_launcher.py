"""The parent side of a run: a real runner process behind the live dashboard."""

from __future__ import annotations

import duckdb
import pytest

from mrv2_prof.pipeline.launcher import RunnerProcess
from mrv2_prof.tui.dashboard import DashboardApp
from mrv2_prof.views.format import format_count


@pytest.mark.asyncio
async def test_dashboard_shows_a_live_run_and_q_stops_it(quickstart_job):
    job = quickstart_job(
        "workload.num_requests=300", "workload.output_len={dist: fixed, value: 300}"
    )
    runner = RunnerProcess(job)
    runner.start()
    app = DashboardApp(runner, title=job.label)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(1200):  # the runner process imports torch and loads the model first
            await pilot.pause(0.1)
            if app.latest is not None and app.latest.output_tokens > 0:
                break
        live = app.latest
        assert live is not None and live.steps > 0 and live.num_requests == 300
        shown = str(app.query_one("#num-steps").render())
        assert shown == format_count(app.latest.steps)  # the screen shows the newest snapshot
        await pilot.press("q")
        for _ in range(600):
            await pilot.pause(0.1)
            if runner.done:
                break
        await pilot.pause(0.3)
    assert app.return_value == "stopped"
    outcome = runner.join()
    assert outcome.status == "aborted" and outcome.error == "stopped by the user"
    with duckdb.connect(job.db_path, read_only=True) as con:
        status, steps = con.execute(
            "SELECT status, (SELECT count(*) FROM steps) FROM runs"
        ).fetchone()
    assert status == "aborted" and steps >= live.steps


def test_headless_runner_reports_snapshots_and_done(quickstart_job):
    runner = RunnerProcess(quickstart_job("workload.num_requests=4"))
    seen = []
    runner.start()
    while not runner.done:
        runner.pump(0.2)
        snap, _ = runner.poll()
        if snap is not None:
            seen.append(snap)
    outcome = runner.join()
    assert outcome.status == "completed" and outcome.exit_code == 0
    assert runner.facts is not None and runner.facts["num_requests"] == 4
    final = seen[-1]
    assert (final.num_finished, final.num_requests, final.output_tokens) == (4, 4, 4 * 32)
    assert final.staged_bytes < final.dense_bytes
