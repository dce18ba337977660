"""The runner process's bookkeeping when things go wrong: nothing already recorded is lost."""

from __future__ import annotations

import json
import os
import signal
import time

import duckdb

from mrv2_prof.launcher import RunnerProcess
from mrv2_prof.runner.engine import Engine


def test_a_runner_crash_marks_the_run_failed_and_keeps_its_steps(run_in_process, monkeypatch):
    original = Engine.step

    def failing_step(self):
        if self.step_index == 5:
            raise RuntimeError("injected failure in step 5")
        return original(self)

    monkeypatch.setattr(Engine, "step", failing_step)
    job, sent = run_in_process()
    kinds = [k for k, _ in sent]
    assert kinds[0] == "begun" and kinds[-1] == "done" and "started" in kinds
    outcome = sent[-1][1]
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error == "RuntimeError: injected failure in step 5"
    with duckdb.connect(job.db_path, read_only=True) as con:
        status, error, info = con.execute("SELECT status, error, info FROM runs").fetchone()
        steps = con.execute("SELECT list(step ORDER BY step) FROM steps").fetchone()[0]
        tokens, outputs = con.execute(
            "SELECT (SELECT count(*) FROM tokens), (SELECT sum(output_tokens) FROM requests)"
        ).fetchone()
        unfinished = con.execute(
            "SELECT count(*) FROM requests WHERE finish_ns IS NULL"
        ).fetchone()[0]
    assert (status, error) == ("failed", "RuntimeError: injected failure in step 5")
    assert "injected failure" in json.loads(info)["traceback"]
    assert steps == [0, 1, 2, 3, 4]  # every step before the failure
    assert tokens == outputs == 16 * 5  # steps 0-4 each gave every request one token
    assert unfinished == 16


def test_a_killed_runner_is_marked_failed_by_the_parent(quickstart_job):
    job = quickstart_job(
        "workload.num_requests=300", "workload.output_len={dist: fixed, value: 300}"
    )
    runner = RunnerProcess(job)
    runner.start()
    deadline = time.monotonic() + 120
    snapshots = 0
    while snapshots < 6:  # past the first store flush (one a second)
        runner.pump(0.2)
        snap, _ = runner.poll()
        snapshots += snap is not None
        assert time.monotonic() < deadline and not runner.done
    os.kill(runner.process.pid, signal.SIGKILL)
    outcome = runner.join()
    assert outcome.status == "failed" and outcome.error == "runner process died (exit code -9)"
    with duckdb.connect(job.db_path, read_only=True) as con:
        status, error = con.execute("SELECT status, error FROM runs").fetchone()
        steps, hi = con.execute("SELECT count(*), max(step) FROM steps").fetchone()
    assert status == "failed" and "exit code -9" in error
    assert steps > 0 and hi == steps - 1  # what was flushed before the kill is kept
